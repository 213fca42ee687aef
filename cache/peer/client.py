"""The peer-first source of a fill: a shard a node lacks is read from peers, then the store.

``PeerTier`` is a node's view of its cluster: the peers' announcements (fetched at most
every ``announce_ttl`` seconds), the peers it no longer trusts with a shard, and where the
cluster warm's placement says each shard comes from. ``PeerTier.attempt`` gives one fill
its source (``PeerAttempt``): ranged reads from a peer holding the shard complete, else, with
``delegate``, from the node that single-flights the shard's store read for the cluster (the
placement's, or the highest rendezvous hash among the live nodes), asked to fill it and
streaming its fill as it lands; the store last (``attempt.py``). Only the node that reads
the store is streamed from, never a fill that itself streams from a peer: no two fills wait
on each other. The fill checks the manifest's checksum as always; on a mismatch the
peers that served bytes are not trusted with that shard again and the fill runs anew.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import xxhash

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.s3.directget import FsObject, RangedReader, reader_for_url

from ..layout import DatasetDir
from .announce import MAX_ANNOUNCEMENT
from .attempt import PeerAttempt, PeerError
from .auth import sign
from .holdings import Held, apply, since_param

__all__ = ["PeerTier", "rendezvous_owner"]

log = logging.getLogger("flashfeed.cache.peer")


def rendezvous_owner(nodes: Collection[str], key: str, shard: int) -> str:
    """The node of ``nodes`` with the highest rendezvous hash for shard ``shard`` of the
    dataset ``key``: where the cluster single-flights its store read, placement aside."""
    if not nodes:
        raise ValueError(f"no node to own shard {shard} of {key}")
    return max(nodes, key=lambda p: xxhash.xxh3_64_intdigest(f"{p}\x00{key}\x00{shard}"))


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a peer address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


class PeerTier:
    """This node's peers (``host:port`` of their ``PeerServer``) and what they hold."""

    def __init__(
        self,
        *,
        peers: Sequence[str],
        token: bytes,
        self_address: str | None = None,
        delegate: bool = True,
        timeout: float = 10.0,
        announce_ttl: float = 1.0,
        down_for: float = 5.0,
    ) -> None:
        for p in peers:
            _split(p)
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.self_address = self_address
        self.peers = [p for p in dict.fromkeys(peers) if p != self_address]
        self.token = token
        self.delegate = delegate
        self.timeout = timeout
        self.announce_ttl = announce_ttl
        self.down_for = down_for
        self._lock = threading.Lock()
        self._held: dict[str, dict[str, Held]] = {}
        self._held_at = -1e9
        self._down: dict[str, float] = {}
        self._strikes: dict[str, int] = {}
        self._distrusted: dict[tuple[str, int], set[str]] = defaultdict(set)
        self._owners: dict[str, dict[int, str]] = {}
        self._sources: dict[str, dict[int, str]] = {}
        self._known: dict[str, tuple[str, int, dict[str, Held]]] = {}  # peer -> its version
        self._counts: dict[str, int] = defaultdict(int)
        self._owning = threading.local()

    def spec(self) -> dict[str, Any]:
        """What another process needs to make the same tier (the token included: it
        travels in a ``CacheHandle`` to the node's own reader processes)."""
        return {
            "peers": list(self.peers),
            "token": self.token,
            "self_address": self.self_address,
            "delegate": self.delegate,
            "timeout": self.timeout,
            "announce_ttl": self.announce_ttl,
            "down_for": self.down_for,
        }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> PeerTier:
        """The tier ``spec()`` describes, in this process."""
        return cls(**dict(spec))

    # -- what the others hold ------------------------------------------------------------------
    def request(
        self,
        peer: str,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One signed request to ``peer``; the response (its connection closes with it)."""
        host, port = _split(peer)
        conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        headers = dict(headers or {})
        if body is not None:
            headers["Content-Length"] = str(len(body))
        try:
            conn.request(
                method,
                path,
                body=body,
                headers={
                    "Authorization": sign(self.token, method, path),
                    "Connection": "close",
                    **headers,
                },
            )
            return conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def _announcement(self, peer: str) -> dict[str, Held] | None:
        """What ``peer`` holds: the changes since the version this node knows (a delta),
        or its full announcement the first time and when the peer no longer has them."""
        with self._lock:
            known = self._known.get(peer)
        path = "/v1/have"
        if known is not None:
            path += f"?since={since_param(known[0], known[1])}"
        try:
            resp = self.request(peer, "GET", path)
            data = resp.read(MAX_ANNOUNCEMENT + 1)
            resp.close()
            if resp.status != 200 or len(data) > MAX_ANNOUNCEMENT:
                raise PeerError(f"peer {peer} answered {resp.status} to /v1/have")
            answer = json.loads(data)
            state = apply(known, answer)
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
            with self._lock:
                self._known.pop(peer, None)
            self.mark_down(peer, f"announcement: {exc}")
            return None
        with self._lock:
            self._known[peer] = state
            self._counts["announce_bytes"] += len(data)
            self._counts["announce_full" if answer.get("full") else "announce_delta"] += 1
        return state[2]

    def holdings(self, *, fresh: bool = False) -> dict[str, dict[str, Held]]:
        """Peer -> dataset key -> what it announced (peers down are left out)."""
        with self._lock:
            if not fresh and time.monotonic() - self._held_at < self.announce_ttl:
                return self._held
            now = time.monotonic()
            asked = [p for p in self.peers if self._down.get(p, 0) <= now]
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(asked)))) as pool:
            answers = list(pool.map(self._announcement, asked))
        held = {p: a for p, a in zip(asked, answers, strict=True) if a is not None}
        with self._lock:
            for p in held:
                self._strikes.pop(p, None)
            self._held, self._held_at = held, time.monotonic()
        return held

    def mark_down(self, peer: str, why: str) -> None:
        """Leave ``peer`` out of announcements and ownership for ``down_for`` seconds,
        doubled at each failure in a row (at most 5 minutes): a peer that does not answer
        costs a reader one timeout now and then, not one every refresh."""
        with self._lock:
            strikes = self._strikes[peer] = self._strikes.get(peer, 0) + 1
            pause = min(300.0, self.down_for * 2 ** (strikes - 1))
            self._down[peer] = time.monotonic() + pause
            self._counts["peers_down"] += 1
        log.warning("peer %s is left out for %.0f s: %s", peer, pause, why)

    def alive(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return [p for p in self.peers if self._down.get(p, 0) <= now]

    def assign(
        self, key: str, owners: Mapping[int, str], sources: Mapping[int, str] | None = None
    ) -> None:
        """Shard -> the node that reads it from the store (a cluster warm's placement), and
        shard -> the node this one copies it from (a sweep warm's plan: ``sweep.py``)."""
        with self._lock:
            self._owners[key] = dict(owners)
            if sources is not None:
                self._sources[key] = dict(sources)

    def planned(self, key: str, shard: int) -> list[str]:
        """The nodes the placement names for this node's copy of ``shard``: its planned
        source, then the shard's store reader (either may be absent)."""
        with self._lock:
            out = [self._sources.get(key, {}).get(shard), self._owners.get(key, {}).get(shard)]
        return [p for p in dict.fromkeys(out) if p is not None and p != self.self_address]

    def owner(self, key: str, shard: int, excluded: set[str]) -> str | None:
        """The node that single-flights the store read of ``shard``: the placement's when it
        is alive, else the highest rendezvous hash among the live nodes (this one too)."""
        live = [p for p in self.alive() if p not in excluded]
        if self.self_address is not None:
            live.append(self.self_address)
        with self._lock:
            placed = self._owners.get(key, {}).get(shard)
        if placed is not None and placed in live:
            return placed
        if not live:
            return None
        return rendezvous_owner(live, key, shard)

    def distrusted(self, key: str, shard: int) -> set[str]:
        with self._lock:
            return set(self._distrusted.get((key, shard), ()))

    def distrust(self, attempt: PeerAttempt, why: str) -> None:
        """The peers that served ``attempt`` bytes are not trusted with its shard again."""
        with self._lock:
            self._distrusted[(attempt.key, attempt.shard)].update(attempt.used)
            self._counts["corrupt_copies"] += 1
        log.warning(
            "peers %s served shard %d of %s with bytes that do not match the manifest (%s): "
            "not trusted with it again",
            ", ".join(sorted(attempt.used)),
            attempt.shard,
            attempt.dataset.url,
            why,
        )

    @contextmanager
    def owning(self) -> Iterator[None]:
        """Fills of this thread inside the block were asked for by a peer (``POST /v1/fill``):
        they take holders, then the store, and never hand the shard on again."""
        self._owning.on = True
        try:
            yield
        finally:
            self._owning.on = False

    def count(self, **values: int) -> None:
        with self._lock:
            for k, v in values.items():
                self._counts[k] += v

    def stats(self) -> dict[str, int]:
        """Bytes from peers and from the store, peers dropped, corrupt copies, fills asked,
        announcements read (full, delta, bytes)."""
        with self._lock:
            return dict(self._counts)

    def attempt(
        self,
        dataset: Dataset,
        d: DatasetDir,
        shard: int,
        *,
        storage_options: dict[str, Any] | None,
        connections: int,
    ) -> PeerAttempt | None:
        """The source of one fill of ``shard``, or None where peers may not serve it."""
        if dataset.encrypted or (not self.peers and self.self_address is None):
            return None
        info = dataset.shards[shard]
        opts = storage_options if storage_options is not None else dataset.storage_options

        def store() -> RangedReader:
            url = dataset.shard_url(info)
            reader = None
            if url.startswith(("s3://", "s3a://")):
                reader = reader_for_url(url, opts, connections=connections)
            if reader is None:
                fs, path = storage.filesystem(url, opts)
                reader = FsObject(fs, path)
            return reader

        attempt = PeerAttempt(self, dataset, d.key, shard, store)
        if getattr(self._owning, "on", False):
            attempt.delegate = False
        return attempt

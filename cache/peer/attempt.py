"""One fill's source on the cluster tier: peers in turn, then the store (``PeerAttempt``).

``PeerTier.attempt`` makes one per fill. Its ranges come from a peer holding the shard
complete, else from the node that single-flights the shard's store read (asked to fill it,
then streamed from its fill in progress), else from the store; a peer that fails mid-range
is dropped and the range goes on from the next source at the byte where it stopped. A peer
serving all the copies it may at once (503) is not dropped: the read takes another holder
that is free, or waits for one (``BUSY_LIMIT`` at most), and never goes to the store for
it: a shard leaves the store once, and no node serves more copies at once than it allows.
The peers whose bytes went into the fill are ``used``: the fill's checksum judges them.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import xxhash

from flashfeed.dataset import Dataset
from flashfeed.s3.directget import RangedReader

if TYPE_CHECKING:
    from .client import PeerTier

__all__ = ["PeerAttempt", "PeerBusy", "PeerError"]

log = logging.getLogger("flashfeed.cache.peer")

_MAX_INDEX = 64 << 20
#: seconds a read waits, in all, for peers that are busy before it drops them
BUSY_LIMIT = 60.0
#: the first and the longest pause before a busy peer is asked again
_BUSY_FIRST, _BUSY_MOST = 0.01, 0.25


class PeerError(ConnectionError):
    """A peer refused, failed or cut a transfer short: the read goes on elsewhere."""


class PeerBusy(PeerError):
    """A peer serves as many copies at once as it may (503): asked again soon."""


class PeerAttempt:
    """One fill's source: peers in turn, then the store (a ``RangedReader`` with ``index``)."""

    def __init__(
        self,
        tier: PeerTier,
        dataset: Dataset,
        key: str,
        shard: int,
        store: Callable[[], RangedReader],
    ) -> None:
        self.tier = tier
        self.dataset = dataset
        self.key = key
        self.shard = shard
        self.path = f"{dataset.url} shard {shard}"
        self._store_factory = store
        self._store: RangedReader | None = None
        self.used: set[str] = set()  # peers whose bytes went into this fill
        self.index_from: str | None = None
        self.delegate = tier.delegate
        self._dead = tier.distrusted(key, shard)
        self._asked: set[str] = set()
        self._busy: dict[str, tuple[float, float]] = {}  # peer -> (free again at, its pause)
        self._busy_waited = 0.0
        self._lock = threading.Lock()

    def size(self) -> int:
        return self.dataset.shards[self.shard].bytes

    def store(self) -> RangedReader:
        with self._lock:
            if self._store is None:
                self._store = self._store_factory()
            return self._store

    def _drop(self, peer: str, why: str) -> None:
        with self._lock:
            self._dead.add(peer)
        self.tier.count(peers_dropped=1)
        log.warning(
            "peer %s dropped from shard %d of %s: %s", peer, self.shard, self.dataset.url, why
        )

    def _busy_now(self, peer: str) -> None:
        """``peer`` answered 503: leave it out for a pause that doubles while it stays
        busy; past ``BUSY_LIMIT`` seconds of such pauses, drop it."""
        with self._lock:
            _, pause = self._busy.get(peer, (0.0, _BUSY_FIRST / 2))
            pause = min(_BUSY_MOST, pause * 2)
            self._busy[peer] = (time.monotonic() + pause, pause)
            self._busy_waited += pause
            over = self._busy_waited > BUSY_LIMIT
        self.tier.count(peers_busy=1)
        if over:
            self._drop(peer, f"busy (503) for over {BUSY_LIMIT:.0f} s")

    def _wait_free(self, peers: list[str]) -> str:
        """The first of ``peers`` free now, after sleeping until one is."""
        with self._lock:
            until = {p: self._busy.get(p, (0.0, 0.0))[0] for p in peers}
        first = min(peers, key=lambda p: until[p])
        time.sleep(max(0.0, until[first] - time.monotonic()))
        return first

    def next_peer(self) -> str | None:
        """The peer to read from now, or None for the store."""
        while True:
            with self._lock:
                dead = set(self._dead)
            held = self.tier.holdings()
            spread = lambda p: xxhash.xxh3_64_intdigest(f"{p}\x00{self.shard}")  # noqa: E731
            found = [
                p
                for p, sets in held.items()
                if p not in dead and self.shard in getattr(sets.get(self.key), "complete", ())
            ]
            now = time.monotonic()
            with self._lock:
                free = [p for p in found if self._busy.get(p, (0.0, 0.0))[0] <= now]
            # the plan's source first, then its store reader: copies follow the placement,
            # so no node serves far more than the plan gave it
            for planned in self.tier.planned(self.key, self.shard):
                if planned in free:
                    return planned
            if free:
                return min(free, key=spread)
            if found:  # every holder is busy: wait for the first to be free
                return self._wait_free(found)
            if not self.delegate:
                return None
            owner = self.tier.owner(self.key, self.shard, dead)
            if owner is None or owner == self.tier.self_address:
                return None
            with self._lock:
                asked = owner in self._asked
                self._asked.add(owner)
            if asked:
                return self._wait_free([owner])
            if self._ask_fill(owner):
                return owner
            self._drop(owner, "it did not take the fill")

    def _ask_fill(self, owner: str) -> bool:
        path = f"/v1/fill/{self.key}/{self.shard}"
        body = json.dumps({"url": self.dataset.url}).encode()
        try:
            resp = self.tier.request(
                owner,
                "POST",
                path,
                body=body,
            )
            resp.read()
            resp.close()
        except (OSError, http.client.HTTPException) as exc:
            self.tier.mark_down(owner, f"fill request: {exc}")
            return False
        self.tier.count(fills_asked=1)
        return resp.status in (200, 202)

    def chunks(self, start: int, end: int, buffer: memoryview) -> Iterator[memoryview]:
        """Bytes ``[start, end)`` in order, from peers while they answer, then the store."""
        at = start
        while at < end:
            peer = self.next_peer()
            if peer is None:
                for chunk in self.store().chunks(at, end, buffer):
                    self.tier.count(bytes_from_store=len(chunk))
                    yield chunk
                return
            try:
                for chunk in self._ranged(peer, at, end, buffer):
                    with self._lock:
                        self.used.add(peer)
                    self.tier.count(bytes_from_peers=len(chunk))
                    at += len(chunk)
                    yield chunk
            except PeerBusy:
                self._busy_now(peer)
            except (OSError, http.client.HTTPException) as exc:
                self._drop(peer, f"{type(exc).__name__}: {exc}")

    def read_into(self, start: int, end: int, view: memoryview) -> None:
        at = 0
        for chunk in self.chunks(start, end, view[: min(len(view), 1 << 20)]):
            view[at : at + len(chunk)] = chunk
            at += len(chunk)

    def _ranged(self, peer: str, start: int, end: int, buffer: memoryview) -> Iterator[memoryview]:
        path = f"/v1/shard/{self.key}/{self.shard}"
        resp = self.tier.request(peer, "GET", path, headers={"Range": f"bytes={start}-{end - 1}"})
        try:
            if resp.status == 503:
                raise PeerBusy(f"answered 503 {resp.reason}")
            if resp.status != 206:
                raise PeerError(f"answered {resp.status} {resp.reason}")
            if resp.length != end - start:
                raise PeerError(f"sends {resp.length} bytes of the {end - start} asked for")
            left = end - start
            while left:
                chunk = buffer[: min(left, len(buffer))]
                got = 0
                while got < len(chunk):
                    n = resp.readinto(chunk[got:])
                    if not n:
                        raise PeerError(
                            f"cut short {end - left + got - start} bytes into the range"
                        )
                    got += n
                left -= len(chunk)
                yield chunk
        finally:
            resp.close()

    def read(self) -> bytes:
        """The whole shard (a small one): the store's reader's ``read``."""
        return self.store().read()

    def index(self) -> bytes | None:
        """The shard's index from a peer (checked against the shard once it is verified),
        or None: the fill reads the store's."""
        for _ in range(3):
            peer = self.next_peer()
            if peer is None:
                return None
            try:
                resp = self.tier.request(peer, "GET", f"/v1/index/{self.key}/{self.shard}")
                data = resp.read(_MAX_INDEX + 1)
                resp.close()
                if resp.status == 200 and len(data) <= _MAX_INDEX:
                    with self._lock:
                        self.used.add(peer)
                        self.index_from = peer
                    return data
                if resp.status != 404:
                    raise PeerError(f"answered {resp.status}")
                return None
            except (OSError, http.client.HTTPException) as exc:
                self._drop(peer, f"index: {type(exc).__name__}: {exc}")
        return None

"""Fills of the node service: a shard filled for an owner inside its quota (room made first,
its charge on disk before the fill starts); the reads of a shard being filled, answered as
its fill ends without holding a fill worker; and the fill queue, where each job's reads go
before its fetches ahead and every fill is one turn of the job weights."""

from __future__ import annotations

import os
from typing import Any

from .adminops import settle
from .ledger import Key, Owner
from .room import make_room
from .server import Connection, NodeService

__all__ = ["PEERS", "fill_for", "fill_for_peers", "needs_fill", "queue_fill", "wait_for_fill"]

#: the account of the fills this node makes for its peers (no Unix user has this name)
PEERS: Owner = ("(peers)", "cluster")


def queue_fill(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """Queue ``request`` in its job's flow of fills, weighted by the job's weight; a fetch
    ahead goes behind the job's requests that someone waits for."""
    weight = svc.config.tenant(conn.tenant).weight(conn.job)
    urgent = request.get("op") != "prefetch"
    svc.fills.put(conn.owner, (conn, request), weight=weight, urgent=urgent)


def wait_for_fill(svc: NodeService, conn: Connection, request: dict[str, Any], key: Key) -> bool:
    """When ``key`` is being filled: ``request`` waits for that fill (answered as it ends,
    holding no fill worker meanwhile) and True; else False."""
    with svc.ledger.lock:
        if key not in svc.filling:
            return False
        svc.waiters.setdefault(key, []).append((conn, request))
        return True


def needs_fill(svc: NodeService, dataset: Any, i: int) -> bool:
    """Whether shard ``i`` is neither being filled nor here and verified (then its place in
    the LRU order is refreshed: it is about to be read)."""
    d = svc.cache.dataset_dir(dataset)
    key = (d.key, i)
    if key in svc.filling:
        return False
    if key in svc.verified and key in svc.ledger.charges and os.path.exists(d.shard_path(i)):
        svc.ledger.touch(key)
        return False
    return True


def fill_for_peers(svc: NodeService, dataset: Any, i: int) -> None:
    """A fill another node asked for (this node single-flights the shard's store read for
    the cluster): charged to ``PEERS`` within the config's ``peers.fill_quota``, making room
    by evicting that account's own shards first. It takes holders, then the store (through
    the service's peer tier): it never hands the shard on again."""
    if svc.peer is None:  # wired only as a peer server's fill: cannot happen otherwise
        raise RuntimeError("this node service has no peers section: it fills for no node")
    tier = svc.peer.tier
    d = svc.cache.dataset_dir(dataset)
    with svc.lock:
        svc.dirs.setdefault(d.key, d)
    what = f"a peer's fill of shard {i} of {dataset.url}"
    with tier.owning():
        fill_for(svc, PEERS, svc.config.peer_fill_quota, dataset, i, what=what)


def fill_for(
    svc: NodeService, owner: Owner, quota: int, dataset: Any, i: int, *, what: str
) -> tuple[str, bool]:
    """A verified copy of shard ``i``, filled if needed for ``owner`` with room made in
    ``quota``: ``(path, fetched here)``."""
    d = svc.cache.dataset_dir(dataset)
    key, size = (d.key, i), dataset.shards[i].bytes
    fresh = False
    with svc.ledger.lock:
        present = key in svc.ledger.charges and os.path.exists(d.shard_path(i))
        if not present and key not in svc.filling:
            make_room(ledger=svc.ledger, accounts=svc.accounts, dirs=svc.dirs, owner=owner,
                      quota=quota, capacity=svc.config.capacity, need=size,
                      what=what, busy=svc.filling.__contains__)  # fmt: skip
            svc.ledger.charge(key, owner, size)  # on disk before the fill starts
            svc.filling.add(key)
            fresh = True
    failed = True
    try:
        path = svc.cache.get(dataset, i)
        failed = False
    finally:
        if fresh:
            _fill_ended(svc, key, d.shard_path(i), failed=failed)
    if fresh:
        svc.accounts.add(owner, fetched_bytes=size)
        svc.ledger.resize(key, _held_bytes(path))  # the index's bytes are known now
        settle(svc, owner)
    svc.ledger.touch(key)
    svc.verified.add(key)
    return path, fresh


def _fill_ended(svc: NodeService, key: Key, path: str, *, failed: bool) -> None:
    """The fill of ``key`` ended: a failed one that left nothing at ``path`` is charged no
    more; the reads that waited for it are answered now, or, when nothing arrived, queued as
    fills of their own (each then fails with its own reason)."""
    from .handlers import serve_fill

    arrived = os.path.exists(path)  # looked at once: the charge and the waiters agree
    try:
        if failed and not arrived:
            svc.ledger.drop(key)
    finally:
        with svc.ledger.lock:
            svc.filling.discard(key)
            waiting = svc.waiters.pop(key, [])
        for conn, request in waiting:
            if arrived:
                serve_fill(svc, conn, request)
            else:
                queue_fill(svc, conn, request)


def _held_bytes(path: str) -> int:
    """A cached shard's bytes with its index's, as the embedded cache counts them."""
    total = 0
    for p in (path, path + ".idx"):
        try:
            total += os.stat(p).st_size
        except FileNotFoundError:
            pass
    return total

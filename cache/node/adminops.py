"""The node service's ``verify`` (admins: every cached shard's checksum) and ``evict`` (a
tenant: its own pins and shards of one dataset or of all), keeping the charges true."""

from __future__ import annotations

import os
from typing import Any

from ..cli import admin
from ..space import remove_entry
from .ledger import Charge, Owner
from .server import Connection, NodeService

__all__ = ["evict_own", "reconcile", "settle", "verify_all"]


def reconcile(svc: NodeService) -> list[Charge]:
    """Drop the charges of shards no longer on disk (removed by a verify, or evicted by the
    embedded cache's own capacity check); the charges dropped."""
    gone: list[Charge] = []
    with svc.ledger.lock:
        for key in list(svc.ledger.charges):
            d = svc.dirs.get(key[0])
            if key in svc.filling or d is None:
                continue
            if not os.path.exists(d.shard_path(key[1])):
                charge = svc.ledger.drop(key)
                svc.verified.discard(key)
                if charge is not None:
                    gone.append(charge)
    return gone


def settle(svc: NodeService, cause: Owner) -> None:
    """After a fill: when the embedded cache evicted shards itself (the bytes it counts,
    indexes and fills in flight included, reached the capacity first), drop their charges
    and count the evictions, caused by ``cause``."""
    seen = int(svc.cache.counters.snapshot().get("evictions", 0))
    if seen == svc.embedded_evictions:
        return
    svc.embedded_evictions = seen
    for charge in reconcile(svc):
        svc.accounts.add(charge.owner, evictions_suffered=1)
        svc.accounts.add(cause, evictions_caused=1)


def verify_all(svc: NodeService) -> dict[str, Any]:
    """``flashfeed cache verify`` of the service's cache: corrupt shards removed (fetched
    again on their next read), their charges dropped. Paths are left out of the answer."""
    report = admin.verify(svc.cache.root)
    dropped = len(reconcile(svc))
    svc.verified.clear()  # checked again at the next read, as after a start
    return {"checked": report["checked"], "corrupt": len(report["corrupt"]),
            "in_use": len(report["not_removed_in_use"]), "charges_dropped": dropped}  # fmt: skip


def evict_own(svc: NodeService, conn: Connection, key: str | None) -> dict[str, Any]:
    """Release every pin of ``conn``'s tenant (all its jobs) on dataset ``key`` (None: on
    every dataset) and evict the shards charged to it there that no other tenant pins."""
    tenant = conn.tenant
    released = evicted = kept = freed = 0
    with svc.ledger.lock:
        for k, c in list(svc.ledger.charges.items()):
            if key is not None and k[0] != key:
                continue
            mine = {o for o in c.pins if o[0] == tenant}
            for owner in mine:
                svc.ledger.set_pin(k, owner, False)
                released += 1
            if c.owner[0] != tenant or k in svc.filling:
                continue
            if c.pins:  # another tenant pins it: the charge goes to that tenant's job
                svc.ledger.move(k, sorted(c.pins)[0])
                kept += 1
                continue
            d = svc.dirs.get(k[0])
            got = None if d is None else remove_entry(d, k[1])
            if got is None:
                kept += 1
                continue
            svc.ledger.drop(k)
            evicted += 1
            freed += c.size
        for k, c in svc.ledger.charges.items():  # the embedded cache's pin files follow
            d = svc.dirs.get(k[0])
            if d is not None and not c.pins and os.path.exists(d.pin_path(k[1])):
                os.unlink(d.pin_path(k[1]))
    return {"released_pins": released, "evicted": evicted, "kept": kept, "bytes": freed}

"""Room for a tenant's fill: its quota first (evicting its own unpinned shards, never
another tenant's), then the node's capacity (evicting anyone's unpinned shards, the least
recently used first, and saying whose). Every eviction is counted for both sides."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flashfeed.units import format_size

from ..layout import DatasetDir
from ..space import remove_entry
from .accounting import Accounts
from .ledger import Key, Ledger, Owner

__all__ = ["QuotaError", "make_room", "quota_usage", "warm_fits"]


class QuotaError(RuntimeError):
    """A fill or warm does not fit in the tenant's quota (one line naming what uses it)."""


def quota_usage(ledger: Ledger, tenant: str) -> str:
    """What uses a tenant's quota, in words: pinned bytes per job, then the unpinned."""
    pinned = ledger.pinned(tenant)
    used = ledger.used(tenant)
    jobs = ", ".join(f"{format_size(n)} by job {j}" for j, n in sorted(pinned.items()))
    spare = used - sum(pinned.values())
    pins = f"pinned {jobs}" if jobs else "nothing pinned"
    return f"{format_size(used)} in use ({pins}; {format_size(spare)} unpinned)"


def make_room(
    *,
    ledger: Ledger,
    accounts: Accounts,
    dirs: dict[str, DatasetDir],
    owner: Owner,
    quota: int,
    capacity: int,
    need: int,
    what: str,
    busy: Callable[[Key], bool],
) -> None:
    """Evict until ``need`` more bytes fit in ``owner``'s tenant's quota and the node's
    capacity; ``QuotaError`` (nothing evicted beyond what was) when they cannot."""
    tenant = owner[0]
    with ledger.lock:
        over = ledger.used(tenant) + need - quota
        if over > 0:
            over -= _evict(ledger, accounts, dirs, ledger.evictable(tenant, busy), over, owner)
        if over > 0:
            raise QuotaError(
                f"quota of tenant {tenant} is {format_size(quota)}: "
                f"{quota_usage(ledger, tenant)}, and {what} needs {format_size(need)}: "
                "unpin shards or raise the quota"
            )
        over = ledger.used() + need - capacity
        if over > 0:
            over -= _evict(ledger, accounts, dirs, ledger.evictable(None, busy), over, owner)
        if over > 0:
            raise QuotaError(
                f"node cache is full: {format_size(ledger.used())} of "
                f"{format_size(capacity)} pinned or being filled, and {what} needs "
                f"{format_size(need)}"
            )


def warm_fits(ledger: Ledger, tenant: str, quota: int, keys: dict[Key, int], what: str) -> None:
    """Fail at once when the shards ``keys`` (key -> bytes) cannot all be held in the
    tenant's quota beside its pins on other shards."""
    total = sum(keys.values())
    with ledger.lock:
        pinned_elsewhere = sum(
            c.size
            for k, c in ledger.charges.items()
            if c.owner[0] == tenant and c.pins and k not in keys
        )
    if pinned_elsewhere + total > quota:
        raise QuotaError(
            f"{what} ({format_size(total)}) cannot fit in the quota of tenant {tenant} "
            f"({format_size(quota)}): {quota_usage(ledger, tenant)}"
        )


def _evict(
    ledger: Ledger,
    accounts: Accounts,
    dirs: dict[str, DatasetDir],
    candidates: Iterable[Key],
    amount: int,
    cause: Owner,
) -> int:
    freed = 0
    for key in candidates:
        if freed >= amount:
            break
        d = dirs.get(key[0])
        got = 0 if d is None else remove_entry(d, key[1])
        if got is None:
            continue  # being filled or used by an embedded reader: keep it
        charge = ledger.drop(key)
        if charge is None:
            continue
        freed += charge.size
        accounts.add(charge.owner, evictions_suffered=1)
        accounts.add(cause, evictions_caused=1)
    return freed

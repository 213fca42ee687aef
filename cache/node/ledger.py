"""Whose quota pays for each shard in the node cache, and which jobs pin it.

The files are the state, as in the cache itself: ``<state>/charges/<dataset key>.<shard>``
names the tenant and job a shard is charged to and its bytes (its index's included), written
before its fill starts (so a shard on disk always has an owner, whatever kills the service),
removed after it is evicted; ``<state>/pins/<dataset key>.<shard>`` lists the jobs pinning
it. A restart reads both and drops the charges of shards that never arrived.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..layout import atomic_write_json, make_private_dir, read_json

__all__ = ["UNOWNED", "Charge", "Ledger"]

Key = tuple[str, int]
Owner = tuple[str, str]  # (tenant, job)
#: the owner of shards found on disk with no charge (a cache adopted by the service)
UNOWNED: Owner = ("-", "-")


@dataclass
class Charge:
    """One shard's charge: its owner, its size, its last use (monotonic), its pinning jobs."""

    owner: Owner
    size: int
    last_used: float
    pins: set[Owner] = field(default_factory=set)


def _name(key: Key) -> str:
    return f"{key[0]}.{key[1]}"


def _key(name: str) -> Key | None:
    base, _, shard = name.rpartition(".")
    return (base, int(shard)) if base and shard.isdigit() else None


class Ledger:
    """The charges and pins of the node, in memory and on disk (see the module docstring)."""

    def __init__(self, state_dir: str) -> None:
        self.charges_dir = make_private_dir(os.path.join(state_dir, "charges"))
        self.pins_dir = make_private_dir(os.path.join(state_dir, "pins"))
        self.lock = threading.RLock()
        self.charges: dict[Key, Charge] = {}

    # -- recovery ---------------------------------------------------------------------------
    def recover(self, resident: dict[Key, int]) -> tuple[int, int]:
        """Load the files; keep charges of the shards in ``resident`` (key -> bytes), drop
        the rest, charge resident shards without one to ``UNOWNED``. ``(dropped, adopted)``."""
        dropped = adopted = 0
        with self.lock:
            for name in os.listdir(self.charges_dir):
                key = _key(name)
                data = read_json(os.path.join(self.charges_dir, name))
                if key is None or key not in resident or not isinstance(data, dict):
                    self._unlink(self.charges_dir, name)
                    dropped += 1
                    continue
                owner = (str(data.get("tenant", "-")), str(data.get("job", "-")))
                self.charges[key] = Charge(owner, resident[key], time.monotonic())
            for key, size in resident.items():
                if key not in self.charges:
                    self.charge(key, UNOWNED, size)
                    adopted += 1
            for name in os.listdir(self.pins_dir):
                key = _key(name)
                data = read_json(os.path.join(self.pins_dir, name))
                if key is None or key not in self.charges or not isinstance(data, list):
                    continue  # kept on disk: the shard may come back (a warm refetches it)
                self.charges[key].pins = {(str(t), str(j)) for t, j in data}
        return dropped, adopted

    # -- charges ----------------------------------------------------------------------------
    def charge(self, key: Key, owner: Owner, size: int) -> Charge:
        """Charge ``key`` to ``owner`` (on disk first); an existing charge is kept."""
        with self.lock:
            known = self.charges.get(key)
            if known is not None:
                return known
            atomic_write_json(
                os.path.join(self.charges_dir, _name(key)),
                {"tenant": owner[0], "job": owner[1], "bytes": size},
            )
            pins = read_json(os.path.join(self.pins_dir, _name(key)), [])
            c = Charge(owner, size, time.monotonic(), {(str(t), str(j)) for t, j in pins})
            self.charges[key] = c
            return c

    def move(self, key: Key, owner: Owner) -> None:
        """Charge ``key`` to another owner."""
        with self.lock:
            c = self.charges[key]
            if c.owner == owner:
                return
            atomic_write_json(
                os.path.join(self.charges_dir, _name(key)),
                {"tenant": owner[0], "job": owner[1], "bytes": c.size},
            )
            c.owner = owner

    def resize(self, key: Key, size: int) -> None:
        """The bytes a filled shard holds (its index included), known once it is there."""
        with self.lock:
            c = self.charges.get(key)
            if c is None or c.size == size:
                return
            atomic_write_json(
                os.path.join(self.charges_dir, _name(key)),
                {"tenant": c.owner[0], "job": c.owner[1], "bytes": size},
            )
            c.size = size

    def drop(self, key: Key) -> Charge | None:
        """Forget ``key``'s charge (evicted, or its fill failed)."""
        with self.lock:
            c = self.charges.pop(key, None)
            self._unlink(self.charges_dir, _name(key))
            return c

    def touch(self, key: Key) -> None:
        c = self.charges.get(key)
        if c is not None:
            c.last_used = time.monotonic()

    # -- pins -------------------------------------------------------------------------------
    def set_pin(self, key: Key, owner: Owner, pinned: bool) -> Charge | None:
        """Pin or unpin ``key`` for ``owner``'s job; the charge follows a pin when its owner
        pins it not. Returns the charge (None: the shard is not here)."""
        with self.lock:
            c = self.charges.get(key)
            pins = set() if c is None else set(c.pins)
            (pins.add if pinned else pins.discard)(owner)
            path = os.path.join(self.pins_dir, _name(key))
            if pins:
                atomic_write_json(path, sorted(pins))
            else:
                self._unlink(self.pins_dir, _name(key))
            if c is None:
                return None
            c.pins = pins
            if pinned and c.owner not in pins:
                self.move(key, owner)
            return c

    # -- figures ----------------------------------------------------------------------------
    def used(self, tenant: str | None = None) -> int:
        """Bytes charged to ``tenant`` (None: to anyone)."""
        with self.lock:
            return sum(c.size for c in self.charges.values() if tenant in (None, c.owner[0]))

    def pinned(self, tenant: str) -> dict[str, int]:
        """Bytes of shards charged to ``tenant`` that are pinned, per job of the charge."""
        out: dict[str, int] = {}
        with self.lock:
            for c in self.charges.values():
                if c.owner[0] == tenant and c.pins:
                    out[c.owner[1]] = out.get(c.owner[1], 0) + c.size
        return out

    def by_owner(self) -> dict[Owner, tuple[int, int]]:
        """``(bytes resident, bytes pinned)`` per owner."""
        out: dict[Owner, tuple[int, int]] = {}
        with self.lock:
            for c in self.charges.values():
                r, p = out.get(c.owner, (0, 0))
                out[c.owner] = (r + c.size, p + (c.size if c.pins else 0))
        return out

    def evictable(self, tenant: str | None, busy: Callable[[Key], bool]) -> Iterable[Key]:
        """Unpinned shards charged to ``tenant`` (None: anyone's), least recently used first,
        ``busy`` ones (being filled) left out."""
        with self.lock:
            found = [
                (c.last_used, k)
                for k, c in self.charges.items()
                if not c.pins and tenant in (None, c.owner[0]) and not busy(k)
            ]
        return [k for _, k in sorted(found)]

    @staticmethod
    def _unlink(directory: str, name: str) -> None:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass

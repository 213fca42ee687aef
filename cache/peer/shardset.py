"""The shard numbers a peer announced, kept compact: ``ShardSet``.

A reader keeps, for every peer and dataset, the shards it holds complete. As Python sets
those cost about 70 bytes a number (a hash slot and an int object each); a ``ShardSet`` keeps
k of n numbers as a sorted uint32 array (4 k bytes) or a bitmap (n / 8 bytes), whichever is
smaller, and never more: 125 KB for any holdings of a million-shard dataset. It is an
immutable ``Set`` (membership, iteration in order, equality with other sets); ``updated``
applies an announcement's delta, vectorized, into a new one.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Set
from typing import Any

import numpy as np

from .announce import MAX_SHARDS, unique_shards, unpack_held

__all__ = ["ShardSet"]

#: set bits of each byte value
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


class ShardSet(Set[int]):
    """Shard numbers in ``[0, count)``: a sorted uint32 array or a bitmap, the smaller."""

    __slots__ = ("_data", "_dense", "_len", "count")

    def __init__(self, shards: Iterable[int] = (), *, count: int) -> None:
        if not 0 <= count <= MAX_SHARDS:
            raise ValueError(f"count must be in [0, {MAX_SHARDS}], got {count}")
        self._keep(count, unique_shards(shards, count), bitmap=False)

    # -- building ------------------------------------------------------------------------------
    def _keep(self, count: int, values: np.ndarray, *, bitmap: bool) -> None:
        """Take a packed bitmap (``bitmap``) or sorted unique numbers; keep the smaller form."""
        self.count = count
        self._len = int(_POPCOUNT[values].sum(dtype=np.int64)) if bitmap else len(values)
        self._dense = 4 * self._len > -(-count // 8)
        if self._dense and not bitmap:
            flags = np.zeros(count, dtype=bool)
            flags[values] = True
            values = np.packbits(flags)
        elif bitmap and not self._dense:
            values = np.flatnonzero(np.unpackbits(values, count=count))
        if self._dense:
            self._data = memoryview(values.tobytes())
        else:
            self._data = memoryview(values.astype(np.uint32).tobytes()).cast("I")

    @classmethod
    def _made(cls, count: int, values: np.ndarray, *, bitmap: bool) -> ShardSet:
        out = cls.__new__(cls)
        out._keep(count, values, bitmap=bitmap)
        return out

    @classmethod
    def from_blob(cls, blob: bytes, count: int) -> ShardSet:
        """The shards an announcement's blob (``announce.encode_held``) names; ValueError on
        anything malformed."""
        bitmap, values = unpack_held(blob, count)
        return cls._made(count, values, bitmap=bitmap)

    def updated(self, added: ShardSet, removed: ShardSet) -> ShardSet:
        """These shards, then ``added``, less ``removed`` (a delta's two sets): a new set,
        or this one when nothing changes."""
        if added.count != self.count or removed.count != self.count:
            raise ValueError(
                f"a delta over {added.count} and {removed.count} shards to a set of {self.count}"
            )
        add, rem = added.array(), removed.array()
        if len(rem) and len(add):
            add = add[~removed.contains(add)]
        new = add[~self.contains(add)]
        gone = rem[self.contains(rem)]
        if not len(new) and not len(gone):
            return self
        if self._dense:
            bits = np.frombuffer(self._data, dtype=np.uint8).copy()
            np.bitwise_or.at(bits, new >> 3, (0x80 >> (new & 7)).astype(np.uint8))
            np.bitwise_and.at(bits, gone >> 3, ~(0x80 >> (gone & 7)).astype(np.uint8))
            return ShardSet._made(self.count, bits, bitmap=True)
        nums = np.frombuffer(self._data, dtype=np.uint32)
        nums = np.delete(nums, np.searchsorted(nums, gone))
        nums = np.insert(nums, np.searchsorted(nums, new), new.astype(np.uint32))
        return ShardSet._made(self.count, nums, bitmap=False)

    # -- reading -------------------------------------------------------------------------------
    def array(self) -> np.ndarray:
        """The shard numbers, sorted (int64)."""
        if self._dense:
            bits = np.frombuffer(self._data, dtype=np.uint8)
            return np.flatnonzero(np.unpackbits(bits, count=self.count))
        return np.frombuffer(self._data, dtype=np.uint32).astype(np.int64)

    def contains(self, shards: np.ndarray) -> np.ndarray:
        """Membership of each of ``shards`` (an integer array), as booleans."""
        q = np.asarray(shards, dtype=np.int64)
        inside = (q >= 0) & (q < self.count)
        if not len(q) or not self._len:
            return np.zeros(len(q), dtype=bool)
        q = np.where(inside, q, 0)
        if self._dense:
            bits = np.frombuffer(self._data, dtype=np.uint8)
            return inside & ((bits[q >> 3] >> (7 - (q & 7))) & 1).astype(bool)
        nums = np.frombuffer(self._data, dtype=np.uint32)
        at = np.minimum(np.searchsorted(nums, q), len(nums) - 1)
        return inside & (nums[at] == q)

    @property
    def form(self) -> str:
        """How it is kept: ``"bitmap"`` or ``"array"`` (sorted uint32)."""
        return "bitmap" if self._dense else "array"

    @property
    def nbytes(self) -> int:
        """Bytes of its numbers: at most min(4 k, n / 8) for k of n shards."""
        return self._data.nbytes

    def __contains__(self, shard: object) -> bool:
        if type(shard) is not int:  # the usual case first: this runs once a peer a lookup
            if not isinstance(shard, (int, np.integer)):
                return False
            shard = int(shard)
        if not 0 <= shard < self.count:
            return False
        data = self._data
        if self._dense:
            return bool(data[shard >> 3] >> (7 - (shard & 7)) & 1)
        at = bisect_left(data, shard)
        return at < self._len and data[at] == shard

    def __iter__(self) -> Iterator[int]:
        return iter(self.array().tolist())

    def __len__(self) -> int:
        return self._len

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardSet):
            return self._len == other._len and np.array_equal(self.array(), other.array())
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(frozenset(self))  # equal to an equal frozenset's

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.count, self.array().astype(np.uint32).tobytes()))

    def __repr__(self) -> str:
        return f"ShardSet({self._len} of {self.count}, {self.form} of {self.nbytes} bytes)"

    @classmethod
    def _from_iterable(cls, it: Iterable[int]) -> frozenset[int]:  # type: ignore[override]
        return frozenset(it)  # the results of the Set mixins (| & - ^): plain sets


def _restore(count: int, data: bytes) -> ShardSet:
    """A pickled ``ShardSet`` back: its count and its numbers as uint32 bytes."""
    return ShardSet._made(count, np.frombuffer(data, dtype=np.uint32), bitmap=False)

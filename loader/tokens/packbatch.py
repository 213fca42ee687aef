"""A ``PackedLoader`` pass, batch by batch: the layout of the run of documents a batch takes
and its tokens and document outputs come from two compiled passes (``packkernel.py``), so
what is left in Python per batch is a few calls and the units the batch reads from. The
keys (one string per segment) are made when the batch's ``__key__`` is first read
(``SegmentKeys``): a training step that never reads them does not pay for them.

Units of a batch whose ids are not all of one integer type are copied by numpy steps per
piece instead; the outputs are the same either way. ``PassDocs``: the pass's documents as
arrays (each one's length and start in its unit, known once its unit is read), and what a
resume on another world size left to skip or continue.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import torch

from ..image.convert import HostPool
from ..passorder import first_uses
from .packkernel import (
    DOCUMENTS,
    LABELS,
    OFFSETS,
    PIECE_COLUMNS,
    POSITIONS,
    fill_jit,
    layout_jit,
    warm_packing,
)

__all__ = ["PassDocs", "SegmentKeys", "packed_batches"]

_BITS = {
    "position_ids": POSITIONS,
    "document_ids": DOCUMENTS,
    "labels": LABELS,
    "document_offsets": OFFSETS,
}
_NONE2 = np.empty((0, 0), np.int64)
_NONE1 = np.empty(0, np.int64)


def packed_batches(
    loader: Any, ids: np.ndarray, shards: np.ndarray, rows: np.ndarray
) -> Iterator[dict[str, Any]]:
    """The batches of ``loader`` (a ``PackedLoader``) over its pass of documents ``ids``
    (rows ``rows`` of units ``shards``), from ``loader.doc_offset`` tokens into the first."""
    warm_packing().wait()
    B, L = loader.batch_size, loader.seq_len
    need, pad, outputs, columns = B * L, loader.pad_id, loader.outputs, loader.columns
    want = sum(_BITS.get(o, 0) for o in outputs)
    wanted = [o for o in outputs if o in _BITS]
    pool = HostPool(per_shape=4)
    p, off = 0, loader.doc_offset
    pass_ = PassDocs(loader, ids, shards, rows)
    loader._firsts = first_uses(shards)
    lens, first, skipped, starts = pass_.lens, pass_.first, pass_.skipped, pass_.starts
    ids = np.ascontiguousarray(ids, np.int64)
    shards = np.ascontiguousarray(shards, np.int64)
    rows = np.ascontiguousarray(rows, np.int64)
    mark = np.full(len(loader._starts), -1, np.int64)
    cap = 256
    piece = np.empty((cap, PIECE_COLUMNS), np.int64)
    seg = np.empty((cap + B, 2), np.int64)
    units = np.empty(cap, np.int64)
    bounds = np.empty(B + 1, np.int64)
    names: dict[int, str] = loader._names
    seen: dict[int, tuple[Any, int, np.dtype | None]] = {}  # unit -> (values, address, type)
    next_hint, span = 0, 64  # where the next unit is first needed; documents looked at
    while True:
        while True:
            got = layout_jit(lens, first, skipped, shards, p, off, need, span, next_hint,
                             piece, units, mark)  # fmt: skip
            status, span, end = got[0], got[1], got[2]
            if status == 0:
                break
            if status == 2:  # more pieces than the table holds: a bigger one
                cap *= 2
                piece = np.empty((cap, PIECE_COLUMNS), np.int64)
                seg = np.empty((cap + B, 2), np.int64)
                units = np.empty(cap, np.int64)
                continue
            while next_hint < end:
                next_hint = loader._ahead(max(p, next_hint))
            pass_.fill(p, end, off)
        consumed, offset, at, pieces, used = got[3], got[4], got[5], got[6], got[7]
        span = max(64, 2 * consumed + 8)
        pass_.begun(p, consumed, offset, started_inside=off > 0)
        if at == 0 or (at < need and loader.parts.options.drop_last):
            begun = piece[:pieces][piece[:pieces, 1] == 0, 0] + p
            loader._end(ids[begun].tolist())
            return
        used_units = units[:used].tolist()
        got_units = [loader._unit(u) for u in used_units]
        # the tokens and the (B, L) outputs: planes of one pooled block, reused once
        # nothing refers to its batch (``HostPool``): no new pages to fault in per batch
        planes = iter(pool.array((len(wanted) + 1, B, L), np.dtype(np.int64)))
        tokens = next(planes)
        like, addrs = _addresses(got_units, used_units, seen)
        if like is None:  # units of several types: copied here
            flat = tokens.reshape(-1)
            for d, f, k, a, u in piece[:pieces].tolist():
                lo = int(starts[p + d]) + f
                flat[a : a + k] = got_units[u].values[lo : lo + k]
        outs = [next(planes) if want & bit else _NONE2 for bit in _BITS.values()]
        cu, longest, nseg = fill_jit(
            like if like is not None else _NONE1, addrs, piece, pieces, p, starts, ids,
            shards, rows, like is not None, pad, want, tokens, *outs, seg, bounds,
        )  # fmt: skip
        used_names = {u: loader.key_prefix(u) for u in used_units}
        cut = bounds.tolist()
        keys = SegmentKeys(used_names, seg[:nseg].copy(), cut)
        batch: dict[str, Any] = {"tokens": torch.from_numpy(tokens), "__key__": keys}
        if columns:
            # flat lists of ints (no container per segment: those would wake the collector)
            where = (seg[:nseg, 0].tolist(), seg[:nseg, 1].tolist())
            values = [got_units[u].extra for u in range(used)]
            slot = dict(zip(used_units, range(used), strict=True))
            for c in columns:
                got_c = [values[slot[s]][c][r] for s, r in zip(*where, strict=True)]
                batch[c] = [got_c[cut[r] : cut[r + 1]] for r in range(B)]
        loader.position.advance(consumed)
        p, off = p + consumed, offset
        loader.doc_offset = off
        if loader.ledger is not None:
            started = _started(piece[:pieces], p - consumed, shards, rows, names)
            if started:
                loader.ledger.record(loader.position.epoch, started)
        loader.tokens_delivered += at
        for name in outputs:
            if name == "max_seqlen":
                batch[name] = int(longest)
            elif name == "cu_seqlens":
                batch[name] = torch.from_numpy(cu)
            else:
                batch[name] = torch.from_numpy(outs[list(_BITS).index(name)])
        yield batch
        if at < need:
            loader._end([])
            return


class SegmentKeys(Sequence[list[str]]):
    """A packed batch's ``__key__``: per row, the ``<unit>/<row>`` key of each of its
    segments, in order. A sequence of lists of strings, made from the batch's (unit, row)
    pairs when first read; equal to the list of lists it stands for (``tolist()``)."""

    __slots__ = ("_cut", "_names", "_rows", "_seg")

    def __init__(self, names: dict[int, str], seg: np.ndarray, cut: list[int]) -> None:
        self._names = names  # each unit of the batch: its path and "/"
        self._seg = seg  # (segments, 2): unit and row of each segment, rows end to end
        self._cut = cut  # row r's segments are seg[cut[r]:cut[r + 1]]
        self._rows: list[list[str]] | None = None

    def tolist(self) -> list[list[str]]:
        """The keys, one list per row."""
        if self._rows is None:
            names, cut = self._names, self._cut
            flat = [
                f"{names[s]}{r}"
                for s, r in zip(self._seg[:, 0].tolist(), self._seg[:, 1].tolist(), strict=True)
            ]
            self._rows = [flat[cut[r] : cut[r + 1]] for r in range(len(cut) - 1)]
        return self._rows

    def __len__(self) -> int:
        return len(self._cut) - 1

    @overload
    def __getitem__(self, i: int) -> list[str]: ...
    @overload
    def __getitem__(self, i: slice) -> list[list[str]]: ...
    def __getitem__(self, i: int | slice) -> list[str] | list[list[str]]:
        return self.tolist()[i]

    def __iter__(self) -> Iterator[list[str]]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SegmentKeys):
            other = other.tolist()
        if isinstance(other, list):
            return self.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.tolist())

    def __reduce__(self) -> tuple[Any, ...]:
        return (SegmentKeys, (self._names, self._seg, self._cut))


def _addresses(
    units: list[Any], shards: list[int], seen: dict[int, tuple[Any, int, np.dtype | None]]
) -> tuple[np.ndarray | None, np.ndarray]:
    """A 0-length array of the units' id type and each one's address, or (None, ...) when
    their ids are not all contiguous arrays of one integer type. ``seen``: the address and
    type of each unit's ids, by unit (worked out again when its ids are another array)."""
    dtype = None
    addrs = np.empty(len(units), np.int64)
    for k, (u, s) in enumerate(zip(units, shards, strict=True)):
        v = u.values
        known = seen.get(s)
        if known is None or known[0] is not v:
            if len(seen) > 64:  # units long gone: not held here
                seen.clear()
            ok = isinstance(v, np.ndarray) and v.ndim == 1 and v.flags.c_contiguous
            ok = ok and v.dtype.kind in "iu"
            known = seen[s] = (v, v.ctypes.data if ok else 0, v.dtype if ok else None)
        if known[2] is None or (dtype is not None and known[2] != dtype):
            return None, addrs
        dtype = known[2]
        addrs[k] = known[1]
    return (np.empty(0, dtype) if dtype is not None else None), addrs


def _started(
    piece: np.ndarray, p: int, shards: np.ndarray, rows: np.ndarray, names: dict[int, str]
) -> list[str]:
    """The keys of the documents a batch begins (its pieces from their first token)."""
    at = (piece[piece[:, 1] == 0, 0] + p).tolist()
    return [f"{names[s]}{r}" for s, r in zip(shards[at].tolist(), rows[at].tolist(), strict=True)]


def _group_order(shards: np.ndarray) -> np.ndarray:
    """The order that groups documents by unit, keeping pass order within each: a radix
    sort when unit numbers fit 16 bits (a pass holds hundreds of thousands of documents)."""
    if len(shards) and shards.min() >= 0 and shards.max() < 1 << 16:
        return np.argsort(shards.astype(np.uint16), kind="stable")
    return np.argsort(shards, kind="stable")


class PassDocs:
    """Documents ``ids`` (rows ``rows`` of units ``shards``) of one pass of ``loader``."""

    def __init__(self, loader: Any, ids: np.ndarray, shards: np.ndarray, rows: np.ndarray):
        self.loader, self.ids, self.shards, self.rows = loader, ids, shards, rows
        n = len(ids)
        self.lens = np.full(n, -1, np.int64)  # -1: its unit not read yet
        self.starts = np.zeros(n, np.int64)
        self._order = _group_order(shards)
        grouped = shards[self._order]
        at = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]]) if n else _NONE1
        self._units = grouped[at]
        self._bounds = np.append(at, n)
        skip = loader.skip
        self.skipped = (
            np.isin(ids, np.fromiter(skip, np.int64, len(skip))) if skip else np.zeros(n, bool)
        )
        self.first = np.zeros(n, np.int64)  # the token each document starts at
        for d, o in loader.resume_at.items():
            self.first[ids == d] = o

    def _fill(self, unit: int) -> None:
        got = self.loader._unit(unit)
        i = int(np.searchsorted(self._units, unit))
        where = self._order[self._bounds[i] : self._bounds[i + 1]]
        r = self.rows[where]
        self.starts[where] = got.offsets[r]
        self.lens[where] = got.offsets[r + 1] - got.offsets[r]

    def fill(self, p: int, end: int, off: int) -> None:
        """The lengths of documents ``p`` to ``end`` known: their units read, but for the
        documents to skip (document ``p`` is not skipped when ``off`` > 0: it was begun)."""
        need = (self.lens[p:end] < 0) & ~self.skipped[p:end]
        if off > 0:
            need[0] = self.lens[p] < 0
        for unit in np.unique(self.shards[p:end][need]).tolist():
            self._fill(unit)

    def begun(self, p: int, consumed: int, offset: int, *, started_inside: bool) -> None:
        """What the resume left to continue is used up for the documents this batch began
        (``consumed`` from ``p``, and one more when it stops ``offset`` tokens inside it)."""
        resume = self.loader.resume_at
        if not resume:
            return
        lo, hi = p + (1 if started_inside else 0), p + consumed + (1 if offset else 0)
        for d in self.ids[lo:hi][~self.skipped[lo:hi]].tolist():
            resume.pop(d, None)

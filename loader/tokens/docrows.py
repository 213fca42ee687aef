"""A ``TokenLoader`` batch's document outputs straight from its open shards: one table of
where each record batch's token rows and segment table lie, made when the open shards
change, and one compiled pass per batch that locates each row's tokens and segments there
and writes every output of the row (``docfill.py``'s per-row work), with no per-row Python.

A batch of 256 rows paid about as much for Python and numpy steps per row (locating rows,
their addresses, gathering their segments into arrays) as the kernel spent writing a
quarter of its outputs; here those steps are a ``searchsorted`` and the kernel's own loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
from numba import carray

from flashfeed.errors import CorruptShardError

from .arrowcols import ArrowShardView
from .docfill import (
    DOCUMENTS,
    LABELS,
    OFFSETS,
    POSITIONS,
    TOKENS,
    _at_like,
    _compile,
    _const,
    _fence,
    _int64_at,
    _ramp,
    _widen,
    cache_bytes,
)
from .segments import DOC_OUTPUTS, IGNORE_INDEX

__all__ = ["DocRows", "row_outputs", "streams"]

#: the (B, L) outputs, one pooled buffer each, and the kernel's bit for each
_ROW_BITS = {
    "position_ids": POSITIONS,
    "document_ids": DOCUMENTS,
    "labels": LABELS,
    "document_offsets": OFFSETS,
}
#: columns of ``DocRows.info``: token rows' address, row stride in bytes, rows; the segment
#: offsets' address and length; the segment table's address and rows
_ADDR, _STRIDE, _ROWS, _OFF, _OFFLEN, _TAB, _TABROWS = range(7)


class OpenShard(Protocol):
    """What the table reads of an open shard (``openshard.OpenShard``)."""

    view: ArrowShardView
    firsts: np.ndarray  # ``(shard << 32) + first row`` of each record batch

    def segments(self) -> list[tuple[np.ndarray, np.ndarray]]: ...


class DocRows:
    """Every record batch of the shards ``opened``, in ``(shard << 32) + first row`` order:
    its token rows (``column``) and its segment table (offsets, ``(segments, width)``
    int64 rows), as addresses the kernel reads. Holds what those addresses point to (a
    contiguous int64 copy of offsets or rows where they are not already so)."""

    def __init__(self, opened: Mapping[int, OpenShard], column: str = "tokens") -> None:
        order = sorted(opened)
        firsts, rows, keep = [], [], []
        like: np.ndarray | None = None
        width = 0
        for s in order:
            o = opened[s]
            arrays, segs = o.view.columns[column], o.segments()
            for c, first in enumerate(o.firsts.tolist()):
                toks = arrays[c] if c < len(arrays) else None
                if toks is not None and len(toks) and not toks.flags.c_contiguous:
                    toks = np.ascontiguousarray(toks)
                if toks is not None and toks.ndim == 2 and like is None:
                    like = np.empty((0, toks.shape[1]), toks.dtype)
                off, tab = segs[c] if c < len(segs) else (np.zeros(0, np.int64), None)
                off = np.ascontiguousarray(off, np.int64)
                if tab is not None:
                    tab = np.ascontiguousarray(tab, np.int64)
                    width = width or tab.shape[1]
                    if tab.ndim != 2 or tab.shape[1] != width:
                        raise ValueError(f"a segment table of shape {tab.shape}: one width for all")
                keep += [toks, off, tab]
                rows.append(_info(toks, off, tab))
                firsts.append(first)
        if like is None:
            raise ValueError(f"no record batch holds rows of column {column!r}")
        self.like = like  # a (0, L) array of the stored type
        self.width = width
        self.firsts = np.asarray(firsts, np.int64)
        self.info = np.asarray(rows, np.int64).reshape(-1, 7)
        self._keep = keep


def _info(toks: np.ndarray | None, off: np.ndarray, tab: np.ndarray | None) -> list[int]:
    ok = toks is not None and toks.ndim == 2 and len(toks) > 0
    return [
        toks.ctypes.data if ok else 0,  # type: ignore[union-attr]
        toks.strides[0] if ok else 0,  # type: ignore[union-attr]
        len(toks) if ok else 0,  # type: ignore[arg-type]
        off.ctypes.data if len(off) else 0,
        len(off),
        tab.ctypes.data if tab is not None and len(tab) else 0,
        len(tab) if tab is not None else 0,
    ]


def _fill_rows(  # pragma: no cover - compiled; run through row_outputs
    like: np.ndarray,
    shards: np.ndarray,
    rows: np.ndarray,
    firsts: np.ndarray,
    info: np.ndarray,
    width: int,
    want: int,
    stream: bool,
    tok: np.ndarray,
    pos: np.ndarray,
    doc: np.ndarray,
    lab: np.ndarray,
    offs: np.ndarray,
) -> tuple[np.ndarray, int, int, int, int]:
    """Row ``r`` is row ``rows[r]`` of shard ``shards[r]``: row ``i`` of the record batch
    ``g`` of ``info`` whose ``firsts`` entry is the last at or before it, its tokens at that
    record batch's address, its segments that row's slice of the segment table. Checks
    every row first (nothing is written for a batch with a bad row), then writes the
    wanted outputs row by row as ``docfill._fill`` does; ``stream``: with stores that
    bypass the cache (a batch too big to stay there, ``streams``). Returns ``(cu_seqlens
    as int32, max_seqlen, error, row, value)``: ``error`` 0, else that of batch row
    ``row``: 1 (not a row of its record batch, which holds ``value`` rows), 2 (not within
    its segment offsets) or 3 (its segments do not fit: ``value`` tokens, 0 for an empty
    segment)."""
    L = like.shape[1]
    B = len(rows)
    index = np.empty(B, np.int64)
    inner = np.empty(B, np.int64)
    total = 0
    for r in range(B):
        at = (shards[r] << 32) + rows[r]
        g = np.searchsorted(firsts, at, side="right") - 1
        i = at - firsts[max(g, 0)]
        if g < 0 or i < 0 or i >= info[g, 2]:
            return np.empty(1, np.int32), 0, 1, r, info[g, 2] if g >= 0 else 0
        if i + 1 >= info[g, 4]:
            return np.empty(1, np.int32), 0, 2, r, 0
        off = carray(_int64_at(info[g, 3]), info[g, 4])
        a, b = off[i], off[i + 1]
        if not 0 <= a <= b <= info[g, 6]:
            return np.empty(1, np.int32), 0, 2, r, 0
        table = carray(_int64_at(info[g, 5]), info[g, 6] * width)
        used = 0
        for q in range(a, b):
            n = table[q * width]
            if n <= 0:
                return np.empty(1, np.int32), 0, 3, r, 0
            used += n
        if used > L:
            return np.empty(1, np.int32), 0, 3, r, used
        total += b - a
        index[r] = g
        inner[r] = i
    cu = np.empty(total + B + 1, np.int32)
    cu[0] = 0
    s = 0
    longest = 0
    for r in range(B):
        g, i = index[r], inner[r]
        row = carray(_at_like(info[g, 0] + i * info[g, 1], like), L)
        if want & TOKENS:
            _widen(row, tok[r], stream)
        off = carray(_int64_at(info[g, 3]), info[g, 4])
        table = carray(_int64_at(info[g, 5]), info[g, 6] * width)
        p = 0
        for q in range(off[i], off[i + 1]):
            n = table[q * width]
            e = p + n
            if want & POSITIONS:
                _ramp(pos[r, p:e], 0, stream)
            if want & DOCUMENTS:
                _const(doc[r, p:e], table[q * width + 1], stream)
            if want & LABELS:
                _const(lab[r, p : p + 1], IGNORE_INDEX, stream)  # each place written once
                _widen(row[p + 1 : e], lab[r, p + 1 : e], stream)
            if want & OFFSETS:
                _ramp(offs[r, p:e], table[q * width + 2], stream)
            p = e
            s += 1
            cu[s] = cu[s - 1] + n
            longest = max(longest, n)
        if p < L:  # the row's padding: one more sequence
            if want & POSITIONS:
                _ramp(pos[r, p:], 0, stream)
            if want & DOCUMENTS:
                _const(doc[r, p:], -1, stream)
            if want & LABELS:
                _const(lab[r, p:], IGNORE_INDEX, stream)
            if want & OFFSETS:
                _const(offs[r, p:], -1, stream)
            s += 1
            cu[s] = cu[s - 1] + L - p
            longest = max(longest, L - p)
    if stream:
        _fence()  # the streamed stores visible to the thread that reads the batch
    return cu[: s + 1], longest, 0, 0, 0


_fill_rows_jit = _compile(_fill_rows)


def streams(nbytes: int) -> bool:
    """Whether a batch that writes ``nbytes`` is written past the cache: when three such
    batches (one being read, one being written, one free in the pool) do not fit the
    last-level cache, a batch is evicted before it is read, and a normal store would first
    read each of its lines from memory for nothing. Measured on batches of 256 x 2,048
    tokens (16 MiB of outputs, 32 MiB of cache): 0.94 of memcpy streamed, 0.73 not."""
    return 3 * nbytes > cache_bytes()


_NONE2 = np.empty((0, 0), np.int64)


@functools.cache
def _wanted(outputs: tuple[str, ...]) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """The kernel's bits for ``outputs``, the (B, L) ones among them in kernel order, and
    all of them in ``DOC_OUTPUTS`` order (a batch's): worked out once per set of outputs."""
    names = tuple(n for n in _ROW_BITS if n in outputs)
    want = TOKENS
    for name in names:
        want |= _ROW_BITS[name]
    return want, names, tuple(n for n in DOC_OUTPUTS if n in outputs)


def row_outputs(
    table: DocRows,
    shards: np.ndarray,
    rows: np.ndarray,
    outputs: tuple[str, ...],
    tokens: np.ndarray,
    alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray],
    *,
    where: Callable[[], str],
) -> dict[str, Any]:
    """The tokens of rows ``rows`` of shards ``shards`` written into ``tokens`` (a (B, L)
    buffer of any integer type), and ``outputs`` (names from ``DOC_OUTPUTS``), each (B, L)
    one in a buffer from ``alloc(shape, dtype)``, all in one compiled pass. ``where()``
    names the batch in an error."""
    B, L = tokens.shape
    if table.like.shape[1] != L or not tokens.flags.c_contiguous:
        raise ValueError(f"tokens: a C-contiguous ({B}, {table.like.shape[1]}) buffer")
    if table.width < 3 and "document_offsets" in outputs:
        raise ValueError("document_offsets needs the segments' starts")
    want, names, order = _wanted(tuple(outputs))
    shape, wide = (B, L), np.dtype(np.int64)
    bufs = [alloc(shape, wide) for _ in names]
    arrays: dict[str, Any] = dict(zip(names, bufs, strict=True))
    shards, rows = np.ascontiguousarray(shards, np.int64), np.ascontiguousarray(rows, np.int64)
    stream = streams(tokens.nbytes + B * L * 8 * len(bufs))
    cu, longest, error, at, value = _fill_rows_jit(
        table.like, shards, rows, table.firsts, table.info, table.width, want, stream, tokens,
        *[arrays.get(n, _NONE2) for n in _ROW_BITS],
    )  # fmt: skip
    if error in (1, 2):
        row = f"{where()}: row {int(rows[at])} of shard number {int(shards[at])}"
        raise IndexError(
            f"{row} is not within its record batch of {value} rows" if error == 1 else
            f"{row} is not within its segment offsets"
        )  # fmt: skip
    if error == 3:
        raise CorruptShardError(
            f"{where()}: the document columns do not fit the rows (segments of {value} tokens "
            f"in a row of {L}, or an empty segment)"
        )
    if "cu_seqlens" in outputs:  # small, and its length changes: not from the pools
        arrays["cu_seqlens"] = cu
    if "max_seqlen" in outputs:
        arrays["max_seqlen"] = int(longest)
    return {n: arrays[n] for n in order}


def warm_rows(rows: np.dtype, tokens: np.dtype) -> None:
    """The kernel run once on two rows stored as ``rows`` written as ``tokens``, with every
    output (the types a batch calls it with, so the signature a batch finds compiled)."""
    stored = np.zeros((2, 4), rows)
    off, tab = np.array([0, 1, 1], np.int64), np.array([[2, 7, 0]], np.int64)
    info = np.array([_info(stored, off, tab)], np.int64)
    outs = [np.empty((2, 4), np.int64) for _ in _ROW_BITS]
    want = TOKENS | POSITIONS | DOCUMENTS | LABELS | OFFSETS
    zero = np.zeros(2, np.int64)
    got = _fill_rows_jit(stored[:0].copy(), zero, np.arange(2), zero[:1], info, 3, want,
                         False, np.empty((2, 4), tokens), *outs)  # fmt: skip
    if got[2]:
        raise RuntimeError(f"the document kernel's warm-up failed (error {got[2]})")

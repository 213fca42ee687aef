"""One pass per row for the document outputs: a compiled kernel (numba) that, row by row,
widens the tokens and writes ``position_ids``, ``document_ids``, ``labels`` and
``document_offsets`` while the row is in cache, and the varlen offsets as it goes.

Each separate numpy pass over a batch reads or writes the whole batch again, and the batch
is larger than the cache at the sizes training uses: one pass that writes every output of a
row is what brings the loader to memcpy speed (benchmarks/stages/tokenize_bench.py).

The kernel is compiled on first use and cached on disk (numba's cache: ``NUMBA_CACHE_DIR``,
else the package's ``__pycache__``, else the user's cache directory); where none of those
is writable (a read-only install, no home) it is compiled in memory, once per process.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from .segments import IGNORE_INDEX, MappedRows

__all__ = ["fill_documents", "gather_segments"]

#: which outputs the kernel writes (a bit each)
TOKENS, POSITIONS, DOCUMENTS, LABELS, OFFSETS = 1, 2, 4, 8, 16


def _compile(fn: Callable[..., Any]) -> Any:
    """``fn`` compiled without the GIL, cached on disk where a cache directory is writable
    (else compiled in memory, said once per process)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # numba found no writable cache directory
        if not _UNCACHED:
            warnings.warn(
                "flashfeed: no writable numba cache directory (NUMBA_CACHE_DIR, the "
                "package's __pycache__, the user's cache): the document kernel compiles "
                "once per process",
                RuntimeWarning,
                stacklevel=2,
            )
        _UNCACHED.append(fn.__name__)
        return njit(nogil=True)(fn)


_UNCACHED: list[str] = []  # functions compiled without a disk cache


def _widen_py(src: np.ndarray, dst: np.ndarray) -> None:
    """``dst[:] = src``, any integer types (a loop the compiler vectorises)."""
    for k in range(len(dst)):
        dst[k] = src[k]


def _ramp_py(dst: np.ndarray, first: int) -> None:
    """``dst[:] = first, first + 1, ...`` (indices from 0 within the slice, so vectorised)."""
    for k in range(len(dst)):
        dst[k] = first + k


def _const_py(dst: np.ndarray, value: int) -> None:
    """``dst[:] = value`` (a loop: numba compiles a broadcast slice assignment slowly)."""
    for k in range(len(dst)):
        dst[k] = value


_widen = _compile(_widen_py)
_const = _compile(_const_py)
_ramp = _compile(_ramp_py)


def _fill(  # pragma: no cover - compiled; run through fill_documents
    rows: np.ndarray,
    addrs: np.ndarray,
    counts: np.ndarray,
    lengths: np.ndarray,
    ids: np.ndarray,
    starts: np.ndarray,
    want: int,
    tok: np.ndarray,
    pos: np.ndarray,
    doc: np.ndarray,
    lab: np.ndarray,
    offs: np.ndarray,
    cu: np.ndarray,
) -> tuple[int, int, int]:
    """Row by row: check its segments fit, then write each wanted output of the row (a
    loop per output over the row's segments, all of it in cache). Returns ``(sequences,
    max_seqlen, bad)``: ``cu[: sequences + 1]`` is filled; ``bad`` is ``-1``, else the
    tokens the first bad row's segments use (``0`` for an empty segment) and nothing of
    that row is written. With ``addrs``, row ``r`` is read at address ``addrs[r]`` (a
    mapped shard's row: no gather into a buffer first), ``rows`` a (0, L) array of its
    type."""
    L = rows.shape[1]
    B = len(addrs) if len(addrs) else rows.shape[0]
    nseg = len(lengths)
    j = 0
    s = 0
    longest = 0
    cu[0] = 0
    for r in range(B):
        c = counts[r]
        if c < 0 or j + c > nseg:
            return s, longest, 0
        used = 0
        for q in range(j, j + c):
            if lengths[q] <= 0:
                return s, longest, 0
            used += lengths[q]
        if used > L:
            return s, longest, used
        row = carray(_at_like(addrs[r], rows), L) if len(addrs) else rows[r]
        if want & TOKENS:
            _widen(row, tok[r])
        p = 0
        for q in range(j, j + c):
            n = lengths[q]
            e = p + n
            if want & POSITIONS:
                _ramp(pos[r, p:e], 0)
            if want & DOCUMENTS:
                _const(doc[r, p:e], ids[q])
            if want & LABELS:
                o = lab[r, p:e]
                _widen(row[p:e], o)
                o[0] = IGNORE_INDEX
            if want & OFFSETS:
                _ramp(offs[r, p:e], starts[q])
            p = e
            s += 1
            cu[s] = cu[s - 1] + n
            longest = max(longest, n)
        j += c
        if p < L:  # the row's padding: one more sequence
            if want & POSITIONS:
                _ramp(pos[r, p:], 0)
            if want & DOCUMENTS:
                _const(doc[r, p:], -1)
            if want & LABELS:
                _const(lab[r, p:], IGNORE_INDEX)
            if want & OFFSETS:
                _const(offs[r, p:], -1)
            s += 1
            cu[s] = cu[s - 1] + L - p
            longest = max(longest, L - p)
    return s, longest, -1


def _at_like_typed(typingctx: Any, address: Any, like: Any) -> Any:  # pragma: no cover
    """A pointer to ``like``'s item type at ``address`` (an address numpy gave)."""
    sig = types.CPointer(like.dtype)(address, like)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


_at_like: Any = intrinsic(_at_like_typed)
_fill_jit = _compile(_fill)
_NONE2 = np.empty((0, 0), np.int64)
_NONE1 = np.empty(0, np.int64)


def fill_documents(
    rows: np.ndarray | MappedRows,
    counts: np.ndarray,
    lengths: np.ndarray,
    ids: np.ndarray,
    starts: np.ndarray | None,
    out: dict[str, np.ndarray],
) -> tuple[np.ndarray, int, int]:
    """Write into ``out``'s (B, L) int64 buffers (any of ``tokens`` (any integer type),
    ``position_ids``, ``document_ids``, ``labels``, ``document_offsets``) from the rows'
    tokens ``rows`` (an array, or ``MappedRows`` read in place) and their segments; returns
    ``(cu_seqlens as int64, max_seqlen, bad)`` as ``_fill`` does."""
    if isinstance(rows, MappedRows):  # read in place: a (0, L) array gives their type
        like, addrs, shape = rows.like, rows.addresses, rows.shape
    else:
        like, addrs = np.ascontiguousarray(rows), _NONE1
        shape = like.shape
    segs = [np.ascontiguousarray(a, np.int64) for a in (counts, lengths, ids)]
    first = _NONE1 if starts is None else np.ascontiguousarray(starts, np.int64)
    want, arrays = 0, []
    for bit, name in (
        (TOKENS, "tokens"),
        (POSITIONS, "position_ids"),
        (DOCUMENTS, "document_ids"),
        (LABELS, "labels"),
        (OFFSETS, "document_offsets"),
    ):
        a = out.get(name)
        if a is None:
            arrays.append(_NONE2)
            continue
        if a.shape != shape or not a.flags.c_contiguous:
            raise ValueError(f"{name}: a C-contiguous {shape} buffer, got {a.shape}")
        want |= bit
        arrays.append(a)
    if want & OFFSETS and starts is None:
        raise ValueError("document_offsets needs the segments' starts")
    cu = np.empty(len(segs[1]) + shape[0] + 1, np.int64)
    n, longest, bad = _fill_jit(like, addrs, *segs, first, want, *arrays, cu)
    return cu[: n + 1], int(longest), int(bad)


def _int64_at_typed(typingctx: Any, address: Any) -> Any:  # pragma: no cover - compiled
    """The int64 array at ``address`` (an address numpy gave) as a pointer."""
    sig = types.CPointer(types.int64)(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


_int64_at: Any = intrinsic(_int64_at_typed)


def _gather_py(
    group: np.ndarray, inner: np.ndarray, tables: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Row ``r``'s segments are rows ``offsets[i]:offsets[i + 1]`` (``i = inner[r]``) of
    the segment table of its group ``g = group[r]``, whose ``tables[g]`` holds the offsets'
    and the table's addresses, lengths and the table's width. Returns the rows' segment
    counts, their segments in batch order (flat, row-major), and ``-1``, else the first
    row out of range. (Plain loops: numba compiles a 2-D slice copy ten times slower.)"""
    rows = len(group)
    counts = np.empty(rows, np.int64)
    total = 0
    for r in range(rows):
        g, i = group[r], inner[r]
        if i < 0 or i + 1 >= tables[g, 2]:
            return counts, np.empty(0, np.int64), r
        off = carray(_int64_at(tables[g, 0]), tables[g, 2])
        if not 0 <= off[i] <= off[i + 1] <= tables[g, 3]:
            return counts, np.empty(0, np.int64), r
        counts[r] = off[i + 1] - off[i]
        total += counts[r]
    width = tables[0, 4] if rows else 0
    flat = np.empty(total * width, np.int64)
    at = 0
    for r in range(rows):
        g, i = group[r], inner[r]
        off = carray(_int64_at(tables[g, 0]), tables[g, 2])
        table = carray(_int64_at(tables[g, 1]), tables[g, 3] * width)
        for q in range(off[i] * width, off[i + 1] * width):
            flat[at] = table[q]
            at += 1
    return counts, flat, -1


_gather_jit = _compile(_gather_py)


#: (offsets, table) pairs as the kernel reads them, by the identity of the pair given:
#: converted once, not per batch. An entry holds only its own copies and weak references
#: to the caller's arrays (a shard's arrays stay the loader's to let go of), and leaves
#: when the table goes.
_PREPARED: dict[tuple[int, int], tuple[Any, ...]] = {}


def _prepared(offsets: np.ndarray, table: np.ndarray, width: int) -> tuple[int, ...]:
    """The kernel's row for one segment table: its offsets' and table's addresses (int64,
    contiguous copies where they are not), lengths and width."""
    key = (id(offsets), id(table))
    got = _PREPARED.get(key)
    if got is not None and got[0]() is offsets and got[1]() is table:
        return got[-1]
    off = np.ascontiguousarray(offsets, np.int64)
    tab = np.ascontiguousarray(table, np.int64)
    if tab.ndim != 2 or tab.shape[1] != width:
        raise ValueError(f"a segment table of shape {tab.shape}: one width ({width}) for all")
    row = (off.ctypes.data, tab.ctypes.data, len(off), len(tab), width)
    copies = [a for a, given in ((off, offsets), (tab, table)) if a is not given]

    def gone(_: Any, key: tuple[int, int] = key) -> None:
        _PREPARED.pop(key, None)

    _PREPARED[key] = (weakref.ref(offsets), weakref.ref(table, gone), copies, row)
    return row


def gather_segments(
    group: np.ndarray, inner: np.ndarray, tables: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The segments of rows ``inner`` of the ``tables`` (one (offsets, (segments, k) int64
    table) pair per group, all of one width) that ``group`` names, in row order: per row
    its count, and the rows' table rows one after the other, in one compiled loop (no
    per-row slicing in Python). Raises ``IndexError`` for a row its offsets do not hold."""
    if not len(group):
        return np.zeros(0, np.int64), np.zeros((0, tables[0][1].shape[1] if tables else 0))
    width = tables[0][1].shape[1]
    info = np.array([_prepared(off, tab, width) for off, tab in tables], np.int64)
    group = np.ascontiguousarray(group, np.int64)
    inner = np.ascontiguousarray(inner, np.int64)
    if not 0 <= group.min() <= group.max() < len(tables):
        raise ValueError(f"group numbers must be within the {len(tables)} tables")
    counts, flat, bad = _gather_jit(group, inner, info)  # _PREPARED holds what it reads
    if bad >= 0:
        raise IndexError(f"row {int(inner[bad])} is not within its segment offsets")
    return counts, flat.reshape(-1, width)

"""Packing plans: which piece of which document goes where in rows of ``seq_len`` tokens.

Pure functions of document lengths (no tokens, no I/O), so they are cheap to test and the
same on every machine. A plan is a list of *segments*, in row order: each one a piece
``[start, start + length)`` of one document placed at the next free position of one row.
Nothing is dropped: a document longer than a row is split into pieces (the split is the
piece's ``start``), and a row that is not full is padded at its end (counted).

- ``concat``: the documents one after the other, cut every ``seq_len`` tokens (the classic
  layout, now with its boundaries). Only the last row pads; documents split at row ends.
- ``best-fit``: a document's whole rows first, then its remainder placed, longest first, in
  the open row it fills best (best-fit decreasing) over a bounded window of documents, so
  it streams; a row leaves the window once full, or when too many are open (the fullest
  leaves first). Documents split only when longer than a row.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

__all__ = ["PACKING_MODES", "PackOptions", "PackPlan", "plan_packing"]

PACKING_MODES = ("concat", "best-fit")


@dataclass(frozen=True)
class PackOptions:
    """How documents become rows: ``mode`` (``concat`` | ``best-fit``), ``seq_len`` tokens
    per row, and for best-fit the documents sorted at once (``window``) and the rows held
    open at most (``max_open``)."""

    seq_len: int
    mode: str = "concat"
    window: int = 4096
    max_open: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in PACKING_MODES:
            raise ValueError(f"packing must be one of {PACKING_MODES}, got {self.mode!r}")
        for name in ("seq_len", "window", "max_open"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be an integer > 0, got {value!r}")


@dataclass(frozen=True)
class PackPlan:
    """Segments in row order (``row`` non-decreasing): document ``doc`` (an index into the
    lengths), its tokens ``[start, start + length)``, placed at ``offset`` of ``row``."""

    seq_len: int
    rows: int
    row: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    offset: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.length.sum())

    @property
    def padding(self) -> int:
        """Pad tokens at row ends."""
        return self.rows * self.seq_len - self.tokens

    @property
    def split_documents(self) -> int:
        """Documents placed in more than one piece."""
        return int(np.unique(self.doc[self.start > 0]).size)


def plan_packing(lengths: np.ndarray | list[int], options: PackOptions) -> PackPlan:
    """The packing plan of documents of ``lengths`` tokens (zero-length ones get no segment)."""
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.ndim != 1 or (lens < 0).any():
        raise ValueError("lengths must be a 1-D sequence of token counts >= 0")
    if options.mode == "concat":
        return _concat(lens, options.seq_len)
    return _best_fit(lens, options)


def _concat(lens: np.ndarray, seq_len: int) -> PackPlan:
    total = int(lens.sum())
    rows = -(-total // seq_len)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    nonempty = lens > 0
    cuts = np.union1d(starts[nonempty], np.arange(rows, dtype=np.int64) * seq_len)
    ends = np.append(cuts[1:], total)
    doc = np.searchsorted(starts, cuts, side="right") - 1
    # a zero-length document shares its start with the next one: searchsorted picks the last
    return PackPlan(
        seq_len=seq_len,
        rows=rows,
        row=cuts // seq_len,
        doc=doc,
        start=cuts - starts[doc],
        length=ends - cuts,
        offset=cuts % seq_len,
    )


def _best_fit(lens: np.ndarray, opts: PackOptions) -> PackPlan:
    seq_len = opts.seq_len
    out_row: list[int] = []
    out_doc: list[int] = []
    out_start: list[int] = []
    out_len: list[int] = []
    out_off: list[int] = []
    rows = 0
    #: open rows: their segments, and (free, id) sorted for the best-fit search
    open_rows: dict[int, list[tuple[int, int, int]]] = {}
    free: list[tuple[int, int]] = []
    next_id = 0

    def emit(segments: list[tuple[int, int, int]]) -> None:
        nonlocal rows
        off = 0
        for d, s, n in segments:
            out_row.append(rows)
            out_doc.append(d)
            out_start.append(s)
            out_len.append(n)
            out_off.append(off)
            off += n
        rows += 1

    for w0 in range(0, len(lens), opts.window):
        window = lens[w0 : w0 + opts.window]
        whole, rest = np.divmod(window, seq_len)
        for d in np.flatnonzero(whole).tolist():  # a long document's full rows: no padding
            for k in range(int(whole[d])):
                emit([(w0 + d, k * seq_len, seq_len)])
        # the remainders, longest first; ties in document order
        ds = np.flatnonzero(rest)
        ds = ds[np.lexsort((ds, -rest[ds]))]
        pieces = zip(
            rest[ds].tolist(), (ds + w0).tolist(), (whole[ds] * seq_len).tolist(), strict=True
        )
        for n, d, s in pieces:
            i = bisect.bisect_left(free, (n, -1))
            if i == len(free):
                rid, room = next_id, seq_len
                next_id += 1
                open_rows[rid] = []
            else:
                room, rid = free.pop(i)
            open_rows[rid].append((d, s, n))
            if room - n == 0:
                emit(open_rows.pop(rid))
            else:
                bisect.insort(free, (room - n, rid))
        while len(free) > opts.max_open:  # too many open: the fullest rows leave first
            _, rid = free.pop(0)
            emit(open_rows.pop(rid))
    for _, rid in sorted(free, key=lambda f: f[1]):
        emit(open_rows.pop(rid))
    i64 = np.int64
    return PackPlan(
        seq_len=seq_len,
        rows=rows,
        row=np.asarray(out_row, dtype=i64),
        doc=np.asarray(out_doc, dtype=i64),
        start=np.asarray(out_start, dtype=i64),
        length=np.asarray(out_len, dtype=i64),
        offset=np.asarray(out_off, dtype=i64),
    )

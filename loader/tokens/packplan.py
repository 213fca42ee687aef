"""Where a run of documents goes in a packed batch, for the whole run at once.

Given the tokens each next document still has to give (``left``: 0 for one skipped, empty or
already delivered) and where each starts in its document (``first``), ``pack_run`` says how
many documents the batch consumes, where the one it stops inside continues, and the pieces
(one per document: place in the flattened batch, length) and segments (one per row a piece
touches: its row, column, length and token of the document). A run of many documents is
laid out by numpy steps per batch; a few (long) ones by a short loop, which costs less.

``PackedLoader`` lays its batches out with the compiled pass of ``packkernel.py`` (the same
layout, with no Python step per batch or piece); this one is that layout's plain form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PackedRun", "pack_run"]


@dataclass(frozen=True)
class PackedRun:
    """A batch's share of a run: ``consumed`` documents finished, and ``offset`` (> 0) tokens
    of the next one delivered when it stops inside one; ``filled`` tokens placed. Pieces:
    document ``doc[k]`` (an index into the run) gives ``size[k]`` tokens from its token
    ``start[k]`` to the flattened batch at ``at[k]``. Segments: per row a piece touches, its
    ``row``, ``col``, ``length``, piece (``piece``) and token of the document (``doc_off``)."""

    consumed: int
    offset: int
    filled: int
    doc: list[int]
    start: list[int]
    size: list[int]
    at: list[int]
    row: list[int]
    col: list[int]
    length: list[int]
    piece: list[int]
    doc_off: list[int]


#: runs of up to this many documents are laid out by a loop (measured: cheaper than numpy)
SMALL_RUN = 24


def pack_run(left: np.ndarray, first: np.ndarray, *, need: int, seq_len: int) -> PackedRun:
    """``need`` tokens (a batch) from documents giving ``left`` tokens from token ``first``
    each, in order, rows of ``seq_len``: a batch full at a document's end consumes it (the
    empty ones after it wait for the next batch); a run that ends short fills what it has."""
    if need < 1 or seq_len < 1:
        raise ValueError(f"need and seq_len must be >= 1, got {need!r} and {seq_len!r}")
    left = np.asarray(left, np.int64)
    ends = np.cumsum(left)
    k = int(np.searchsorted(ends, need, side="left"))
    if k < len(left):  # document k completes the batch
        take = need - int(ends[k] - left[k])
        whole = take == int(left[k])
        consumed, offset = (k + 1, 0) if whole else (k, int(first[k]) + take)
        sizes = left[: k + 1].copy()
        sizes[k] = take
        filled = need
    else:  # the run ends before the batch is full
        consumed, offset, sizes = len(left), 0, left.copy()
        filled = int(ends[-1]) if len(left) else 0
    if len(sizes) <= SMALL_RUN:
        return _loop(sizes.tolist(), first[: len(sizes)].tolist(), consumed, offset, filled,
                     seq_len)  # fmt: skip
    doc = np.flatnonzero(sizes > 0)
    size = sizes[doc]
    at = np.cumsum(sizes)[doc] - size
    start = np.asarray(first, np.int64)[doc]
    row0, row1 = at // seq_len, (at + size - 1) // seq_len
    count = row1 - row0 + 1
    piece = np.repeat(np.arange(len(doc)), count)
    step = np.arange(len(piece)) - np.repeat(np.cumsum(count) - count, count)
    row = row0[piece] + step
    lo = np.maximum(at[piece], row * seq_len)
    hi = np.minimum(at[piece] + size[piece], (row + 1) * seq_len)
    return PackedRun(
        consumed, offset, filled, doc.tolist(), start.tolist(), size.tolist(), at.tolist(),
        row.tolist(), (lo - row * seq_len).tolist(), (hi - lo).tolist(), piece.tolist(),
        (start[piece] + (lo - at[piece])).tolist(),
    )  # fmt: skip


def _loop(
    sizes: list[int], first: list[int], consumed: int, offset: int, filled: int, L: int
) -> PackedRun:
    """``pack_run``'s layout of a few documents, one step per piece and row."""
    doc: list[int] = []
    start: list[int] = []
    size: list[int] = []
    at: list[int] = []
    row: list[int] = []
    col: list[int] = []
    length: list[int] = []
    piece: list[int] = []
    doc_off: list[int] = []
    pos = 0
    for i, n in enumerate(sizes):
        if n <= 0:
            continue
        k = len(doc)
        doc.append(i)
        start.append(first[i])
        size.append(n)
        at.append(pos)
        a, b = pos, pos + n
        while a < b:
            r, c = divmod(a, L)
            t = min(L - c, b - a)
            row.append(r)
            col.append(c)
            length.append(t)
            piece.append(k)
            doc_off.append(first[i] + a - pos)
            a += t
        pos = b
    return PackedRun(consumed, offset, filled, doc, start, size, at, row, col, length, piece,
                     doc_off)  # fmt: skip

"""The compiled passes of a ``PackedLoader`` batch (``packbatch.py``): the layout of a run of
documents into a batch, then the batch's tokens and document outputs written in one pass
(numba, compiled on first use and cached on disk as the document kernel is: ``docfill.py``).

A document's tokens still to give are its length less the token it starts at (``off`` for
the one begun at ``p``), none for one skipped; a length of -1 is a unit not read yet.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import carray

from .docfill import _at_like, _compile, _const, _prefetch, _ramp, _widen
from .segments import IGNORE_INDEX

__all__ = ["PIECE_COLUMNS", "fill_jit", "layout_jit", "warm_packing"]

#: columns of the piece table: document (from ``p``), its first token, tokens, place in the
#: flattened batch, slot of its unit (in ``units``)
PIECE_COLUMNS = 5
#: pieces between the one copied and the one whose first tokens are fetched ahead
AHEAD = 8
#: the outputs the fill writes (a bit each)
POSITIONS, DOCUMENTS, LABELS, OFFSETS = 1, 2, 4, 8


def _layout(  # pragma: no cover - compiled; run through packbatch
    lens: np.ndarray,
    first: np.ndarray,
    skipped: np.ndarray,
    shards: np.ndarray,
    p: int,
    off: int,
    need: int,
    span: int,
    hint: int,
    piece: np.ndarray,
    units: np.ndarray,
    mark: np.ndarray,
) -> tuple[int, int, int, int, int, int, int, int]:
    """The documents from ``p`` holding ``need`` tokens, looked at in windows of ``span``
    documents (doubled until one holds them or the pass ends). Returns ``(status, span, end,
    consumed, offset, filled, pieces, units)``: status 1 when the window up to ``end``
    needs the caller first (``hint`` before ``end``, or a unit to read), 2 when ``piece``
    is too small, else 0 with the pieces written to ``piece`` and their distinct units, in
    order of first use, to ``units`` (``mark``: -1 per unit, left so)."""
    n = len(lens)
    while True:
        end = min(n, p + span)
        if hint < end:
            return 1, span, end, 0, 0, 0, 0, 0
        total = 0
        for q in range(p, end):
            begun = q == p and off > 0
            if lens[q] < 0 and (begun or not skipped[q]):
                return 1, span, end, 0, 0, 0, 0, 0
            if begun:
                total += max(lens[q] - off, 0)
            elif not skipped[q]:
                total += max(lens[q] - first[q], 0)
        if end == n or total >= need:
            break
        span *= 2
    acc, k, used = 0, 0, 0
    consumed, offset = end - p, 0
    for q in range(p, end):
        begun = q == p and off > 0
        if skipped[q] and not begun:
            continue
        f = off if begun else first[q]
        left = lens[q] - f
        if left <= 0:
            continue
        if k == len(piece):
            for u in range(used):
                mark[units[u]] = -1
            return 2, span, end, 0, 0, 0, 0, 0
        take = min(left, need - acc)
        s = shards[q]
        if mark[s] < 0:
            mark[s] = used
            units[used] = s
            used += 1
        piece[k, 0] = q - p
        piece[k, 1] = f
        piece[k, 2] = take
        piece[k, 3] = acc
        piece[k, 4] = mark[s]
        k += 1
        acc += take
        if acc >= need:
            consumed, offset = (q + 1 - p, 0) if take == left else (q - p, f + take)
            break
    for u in range(used):
        mark[units[u]] = -1
    return 0, span, end, consumed, offset, acc, k, used


def _fill(  # pragma: no cover - compiled; run through packbatch
    like: np.ndarray,
    addrs: np.ndarray,
    piece: np.ndarray,
    pieces: int,
    p: int,
    starts: np.ndarray,
    ids: np.ndarray,
    shards: np.ndarray,
    rows: np.ndarray,
    copy: bool,
    pad: int,
    want: int,
    tok: np.ndarray,
    pos: np.ndarray,
    doc: np.ndarray,
    lab: np.ndarray,
    offs: np.ndarray,
    seg: np.ndarray,
    bounds: np.ndarray,
) -> tuple[np.ndarray, int, int]:
    """The batch ``tok`` (B, L) from the pieces (``copy``: read from unit ``slot``'s values
    at ``addrs[slot]``, of ``like``'s type; else already in ``tok``), padded with ``pad``,
    and the outputs of ``want``. Writes each segment's (unit, row) to ``seg`` and each row's
    first segment to ``bounds``. Returns ``(cu_seqlens as int32, max_seqlen, segments)``."""
    B, L = tok.shape
    size = B * L
    flat = tok.reshape(size)
    fpos = pos.reshape(pos.size)
    fdoc = doc.reshape(doc.size)
    flab = lab.reshape(lab.size)
    foff = offs.reshape(offs.size)
    cu = np.empty(pieces + 2 * B + 1, np.int32)
    cu[0] = 0
    bounds[:] = 0
    item = like.itemsize
    s, longest, filled = 0, 0, 0
    for j in range(pieces):
        d = p + piece[j, 0]
        a, n = piece[j, 3], piece[j, 2]
        if copy and j + AHEAD < pieces:  # the piece AHEAD on: its first tokens asked for now
            q = piece[j + AHEAD]
            _prefetch(addrs[q[4]] + (starts[p + q[0]] + q[1]) * item)
        if copy:
            src = carray(_at_like(addrs[piece[j, 4]] + (starts[d] + piece[j, 1]) * item, like), n)
            if n < 128:  # a short piece: no slice made
                for t in range(n):
                    flat[a + t] = src[t]
            else:
                _widen(src, flat[a : a + n], False)
        b = a + n
        filled = b
        while a < b:
            r = a // L
            t = min(L - (a - r * L), b - a)
            e = a + t
            first = piece[j, 1] + a - piece[j, 3]
            if want:
                if want & POSITIONS:
                    _ramp(fpos[a:e], 0, False)
                if want & DOCUMENTS:
                    _const(fdoc[a:e], ids[d], False)
                if want & LABELS:
                    flab[a] = IGNORE_INDEX
                    _widen(flat[a + 1 : e], flab[a + 1 : e], False)
                if want & OFFSETS:
                    _ramp(foff[a:e], first, False)
            seg[s, 0] = shards[d]
            seg[s, 1] = rows[d]
            bounds[r + 1] += 1
            s += 1
            cu[s] = cu[s - 1] + t
            longest = max(longest, t)
            a = e
    segments, c = s, s
    _const(flat[filled:], pad, False)
    a = filled
    while a < size:  # the padding: the rest of the row begun, then whole rows
        t = L - a % L
        e = a + t
        if want & POSITIONS:
            _ramp(fpos[a:e], 0, False)
        if want & DOCUMENTS:
            _const(fdoc[a:e], -1, False)
        if want & LABELS:
            _const(flab[a:e], IGNORE_INDEX, False)
        if want & OFFSETS:
            _const(foff[a:e], -1, False)
        c += 1
        cu[c] = cu[c - 1] + t
        longest = max(longest, t)
        a = e
    for r in range(B):
        bounds[r + 1] += bounds[r]
    return cu[: c + 1], longest, segments


layout_jit = _compile(_layout)
fill_jit = _compile(_fill)

_NONE2 = np.empty((0, 0), np.int64)


def _warm() -> None:
    """Both passes run once on a tiny batch, for units of int32 and of int64 ids."""
    lens = np.array([3, 0, 4], np.int64)
    zero = np.zeros(3, np.int64)
    piece = np.zeros((4, PIECE_COLUMNS), np.int64)
    units, mark = np.zeros(4, np.int64), np.full(1, -1, np.int64)
    got = layout_jit(lens, zero, np.zeros(3, bool), zero, 0, 0, 6, 64, 1 << 62, piece, units,
                     mark)  # fmt: skip
    for dtype in (np.int32, np.int64):
        values = np.arange(7, dtype=dtype)
        outs = [np.empty((2, 3), np.int64) for _ in range(4)]
        fill_jit(values[:0], np.array([values.ctypes.data], np.int64), piece, got[6], 0, zero,
                 zero, zero, zero, True, 0, 15, np.empty((2, 3), np.int64), *outs,
                 np.empty((8, 2), np.int64), np.empty(3, np.int64))  # fmt: skip


class _Warmup:
    """``_warm`` in a daemon thread; ``wait()`` raises what it raised."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ff-packwarm", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            _warm()
        except BaseException as e:  # kept for the first batch (raised there)
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


_STARTED: list[_Warmup] = []
_LOCK = threading.Lock()


def warm_packing() -> _Warmup:
    """The passes compiled (or loaded from numba's disk cache) in a daemon thread, started
    by the first loader of the process (again after one that failed)."""
    with _LOCK:
        if not _STARTED or _STARTED[0].error is not None:
            _STARTED[:] = [_Warmup()]
        return _STARTED[0]

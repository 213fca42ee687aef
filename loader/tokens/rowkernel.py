"""The compiled pass of ``rowgather.py``: a batch's rows located in its open shards, then
copied one after the other into the batch (numba, compiled on first use and cached on disk
as the document kernel is: ``docfill.py``)."""

from __future__ import annotations

import numpy as np
from numba import carray

from .docfill import _at_like, _compile, _fence, _widen

__all__ = ["gather_jit"]


def _gather(  # pragma: no cover - compiled; run through gather_rows
    like: np.ndarray,
    shards: np.ndarray,
    rows: np.ndarray,
    firsts: np.ndarray,
    info: np.ndarray,
    out: np.ndarray,
    stream: bool,
) -> tuple[int, int]:
    """Row ``r`` of ``out`` is row ``rows[r]`` of shard ``shards[r]``: row ``i`` of the
    record batch ``g`` of ``info`` whose ``firsts`` entry is the last at or before it.
    Every row is located first (nothing is written for a batch with a bad row), then the
    rows are copied in batch order (measured faster than reading them in address order:
    ``rowgather.py``). Returns ``(-1, 0)``, else ``(r, rows)`` for a batch
    row ``r`` outside its record batch of ``rows`` rows."""
    B = len(rows)
    L = like.shape[1]
    addr = np.empty(B, np.int64)
    for r in range(B):
        at = (shards[r] << 32) + rows[r]
        g = np.searchsorted(firsts, at, side="right") - 1
        i = at - firsts[max(g, 0)]
        if g < 0 or i < 0 or i >= info[g, 2]:
            return r, info[g, 2] if g >= 0 else 0
        addr[r] = info[g, 0] + i * info[g, 1]
    for r in range(B):
        _widen(carray(_at_like(addr[r], like), L), out[r], stream)
    if stream:
        _fence()  # the streamed stores visible to the thread that reads the batch
    return -1, 0


gather_jit = _compile(_gather)

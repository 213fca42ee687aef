"""A reference for the token loader's batches: the same rows gathered with no loader."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

__all__ = ["row_gather_rate"]


def row_gather_rate(prefix: Path, batches: list[list[str]], arrays: int) -> float:
    """GB/s of the same rows, in the same order and batches, gathered from the mapped
    shards into a preallocated buffer (one ``np.concatenate`` of row views, the fastest
    gather measured) and widened into ``arrays`` preallocated int64 buffers: the (B, L)
    bytes a batch delivers, written with no loader and nothing computed. Not a limit: its
    buffers are written again every batch (cache-resident where a batch fits the cache),
    where a loader's batches stay alive in new or pooled buffers."""
    from flashfeed.dataset import Dataset
    from flashfeed.loader.tokens.arrowcols import open_arrow_view

    ds = Dataset.open(str(prefix))
    views = {s.path: open_arrow_view(ds.shard_url(i), ("tokens",), name=s.path)
             for i, s in enumerate(ds.shards)}  # fmt: skip

    def where(key: str) -> tuple[np.ndarray, int]:  # the row's record batch, row in it
        shard, row = key.rsplit("/", 1)
        view = views[shard]
        chunk, inner = view.locate(np.array([int(row)]))
        return view.columns["tokens"][int(chunk[0])], int(inner[0])

    plan = [[where(k) for k in b] for b in batches]
    first = plan[0][0][0]
    bufs: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
    for b in plan:  # buffers made and faulted in before the clock starts
        n = len(b)
        if n not in bufs:
            wide = [np.zeros((n, first.shape[1]), np.int64) for _ in range(arrays)]
            bufs[n] = (np.zeros((n, first.shape[1]), first.dtype), wide)
    t0 = time.perf_counter()
    for b in plan:
        narrow, wide = bufs[len(b)]
        np.concatenate([a[r : r + 1] for a, r in b], out=narrow)
        for w in wide:
            np.copyto(w, narrow, casting="unsafe")
    seconds = time.perf_counter() - t0
    return sum(len(b) * first.shape[1] * 8 * arrays for b in plan) / seconds / 1e9

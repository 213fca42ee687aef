"""Candidate pairs of near-duplicate removal, and their check.

Documents sharing an LSH band key are only candidates: a collision of unrelated documents
would, through the union-find, chain their clusters. Each candidate pair is kept only when
the exact Jaccard similarity of its shingle sets reaches the threshold
(``shinglesets.exact_pairs``); identical texts need no check. ``check_pairs``, the estimate
from two MinHash signatures, is what the benchmark compares the exact check with.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .shinglesets import exact_pairs
from .sources import Item
from .taskerrors import get, where_items

__all__ = ["GROUP_PAIRS", "candidate_pairs", "check_pairs", "checked_pairs"]

_ROW = np.dtype([("key", np.uint64), ("band", np.int32), ("doc", np.int64)])
GROUP_PAIRS = 64
"""A bucket group of up to ``GROUP_PAIRS + 1`` documents gives all its pairs as candidates;
in a larger one each document pairs with the ``GROUP_PAIRS`` before it (bounded work)."""


def candidate_pairs(exact_band: int, *parts: np.ndarray) -> np.ndarray:
    """``(n, 3)`` int64 candidate pairs ``(a, b, exact)``, ``a < b``, of one bucket: every
    pair of documents sharing a band key (in a larger group, each document with the
    ``GROUP_PAIRS`` before it), ``exact`` 1 for the same text."""
    rows = np.concatenate(parts) if parts else np.empty(0, dtype=_ROW)
    if len(rows) == 0:
        return np.empty((0, 3), dtype=np.int64)
    rows = rows[np.lexsort((rows["doc"], rows["key"], rows["band"]))]
    size = np.diff(np.flatnonzero(np.r_[_starts(rows), True]))
    rows = rows[np.repeat(size > 1, size)]  # groups of one document pair with nothing
    head = np.maximum.accumulate(np.where(_starts(rows), np.arange(len(rows)), 0))
    out = []
    for lag in range(1, GROUP_PAIRS + 1):  # member j pairs with member j - lag of its group
        j = np.arange(lag, len(rows))
        j = j[j - lag >= head[j]]
        if len(j) == 0:
            break
        out.append(np.stack([rows["doc"][j - lag], rows["doc"][j],
                             np.full(len(j), rows["band"][j] == exact_band)], axis=1))  # fmt: skip
    pairs = np.concatenate(out).astype(np.int64) if out else np.empty((0, 3), dtype=np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(pairs, axis=0)


def _starts(rows: np.ndarray) -> np.ndarray:
    """Where a new ``(band, key)`` group begins in sorted rows."""
    start = np.ones(len(rows), dtype=bool)
    start[1:] = (rows["key"][1:] != rows["key"][:-1]) | (rows["band"][1:] != rows["band"][:-1])
    return start


def check_pairs(threshold: float, pairs: np.ndarray, *signed: tuple[np.ndarray, np.ndarray]) -> Any:
    """The ``pairs`` whose signatures (from the chunks ``signed``) agree on at least
    ``threshold`` of their values: the estimated Jaccard similarity."""
    ids = np.concatenate([d for d, _ in signed])
    sigs = np.concatenate([g for _, g in signed])
    order = np.argsort(ids, kind="stable")
    ids, sigs = ids[order], sigs[order]
    a = sigs[np.searchsorted(ids, pairs[:, 0])]
    b = sigs[np.searchsorted(ids, pairs[:, 1])]
    return pairs[(a == b).mean(axis=1) >= threshold]


def checked_pairs(
    candidates: np.ndarray, threshold: float, chunks: list[list[Item]], signed: list[Any]
) -> np.ndarray:
    """The candidate pairs whose exact Jaccard similarity reaches ``threshold`` (same texts
    need no check): one Ray task per chunk of a pair's first document, given the shingle
    objects (``shinglesets.Shingled``) of the chunks its pairs touch."""
    import ray

    same = candidates[candidates[:, 2] == 1]
    rest = candidates[candidates[:, 2] == 0]
    if len(rest) == 0:
        return same
    chunk_of = {it.index: c for c, chunk in enumerate(chunks) for it in chunk}
    first = np.fromiter((chunk_of[d] for d in rest[:, 0].tolist()), np.int64, len(rest))
    second = np.fromiter((chunk_of[d] for d in rest[:, 1].tolist()), np.int64, len(rest))
    task = ray.remote(max_retries=3)(exact_pairs)
    refs, where = [], []
    for c in np.unique(first).tolist():
        mine = first == c
        touched = sorted({c, *np.unique(second[mine]).tolist()})
        refs.append(task.remote(threshold, rest[mine], *[signed[t] for t in touched]))
        where.append(where_items(chunks[c]))
    kept = [same, *get(refs, stage="near-dup check", where=where)]
    return np.unique(np.concatenate(kept), axis=0)

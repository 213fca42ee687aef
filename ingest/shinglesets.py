"""The exact check of near-duplicate candidates: Jaccard similarity of their shingle sets.

A MinHash estimate from 128 values has a standard error of about 0.04 near J = 0.7, so a
check on it lets pairs at J = 0.75 through only nine times in ten and some at 0.65 in.
Instead each sign task keeps its documents' shingle hashes (the low 32 bits: 4 bytes a
shingle) beside the LSH keys, and a candidate pair is a link only when the Jaccard
similarity of the two hash sets reaches the threshold. Two distinct shingles of one pair
share a 32-bit hash with probability about ``|A| |B| / 2**32``: for documents of a
thousand shingles, one pair in four thousand moves by one shingle.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["Shingled", "exact_pairs", "pair_similarity", "shingled"]

#: one chunk's documents: ``(doc ids, flat uint32 shingle hashes, offsets)``
Shingled = tuple[np.ndarray, np.ndarray, np.ndarray]


def shingled(ids: np.ndarray, hashes: Sequence[np.ndarray]) -> Shingled:
    """Documents ``ids`` with their 64-bit shingle hashes, packed flat as 32-bit values."""
    offsets = np.zeros(len(hashes) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])
    flat = np.concatenate(hashes).astype(np.uint32) if len(hashes) else np.empty(0, dtype=np.uint32)
    return np.asarray(ids, dtype=np.int64), flat, offsets


class _Sets:
    """Each document's sorted distinct hashes, made on first use."""

    def __init__(self, parts: Sequence[Shingled]) -> None:
        self.where: dict[int, tuple[int, int]] = {}
        for k, (ids, _, _) in enumerate(parts):
            for j, doc in enumerate(ids.tolist()):
                self.where[doc] = (k, j)
        self.parts = parts
        self.cache: dict[int, np.ndarray] = {}

    def __getitem__(self, doc: int) -> np.ndarray:
        found = self.cache.get(doc)
        if found is None:
            k, j = self.where[doc]
            _, flat, offsets = self.parts[k]
            found = self.cache[doc] = np.unique(flat[offsets[j] : offsets[j + 1]])
        return found


def pair_similarity(pairs: np.ndarray, *parts: Shingled) -> np.ndarray:
    """The Jaccard similarity of the shingle-hash sets of each ``(a, b, ...)`` pair."""
    sets = _Sets(parts)
    out = np.empty(len(pairs), dtype=np.float64)
    for n, (a, b) in enumerate(pairs[:, :2].tolist()):
        x, y = sets[a], sets[b]
        if len(x) > len(y):
            x, y = y, x
        if len(y) == 0:
            out[n] = 1.0
            continue
        at = np.searchsorted(y, x)
        at[at == len(y)] = 0
        both = int(np.count_nonzero(y[at] == x))
        out[n] = both / (len(x) + len(y) - both)
    return out


def exact_pairs(threshold: float, pairs: np.ndarray, *parts: Shingled) -> np.ndarray:
    """The ``pairs`` whose shingle sets (from the chunks ``parts``) have a Jaccard
    similarity of at least ``threshold``."""
    if len(pairs) == 0:
        return pairs
    return pairs[pair_similarity(pairs, *parts) >= threshold]

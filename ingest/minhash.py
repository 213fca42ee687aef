"""MinHash over shingles, and LSH banding: pure numpy functions, no I/O.

A document's shingles (``size`` consecutive words or characters) are hashed to 64-bit
integers in bulk; a batch of documents becomes one ``(docs, num_perm)`` signature matrix
(``rensa``'s Rust kernel by default, or an own numpy kernel: both are measured in
``benchmarks/stages/neardup.py``); ``band_keys`` folds each band of ``rows`` signature values into
one 64-bit bucket key. Two documents share a band key with probability ``s**rows`` per band
for Jaccard similarity ``s``. ``lsh_for_recall`` sizes ``bands x rows`` so that a pair at the
threshold is a candidate with probability >= 0.99 (the candidates are then confirmed on
their exact shingle sets, ``shinglesets.exact_pairs``); ``lsh_params`` is the S-curve that turns
at the threshold, the way datasketch sizes it (the benchmark's comparison).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import xxhash

__all__ = [
    "BACKENDS",
    "UNITS",
    "band_keys",
    "candidate_probability",
    "jaccard",
    "lsh_for_recall",
    "lsh_params",
    "shingle_hashes",
    "shingles",
    "signatures",
]

BACKENDS = ("rensa", "numpy")
UNITS = ("word", "char")
_WORD = re.compile(r"\w+")
_U64 = np.uint64
# odd 64-bit multipliers (from splitmix64 / xxh64 primes) for position-dependent mixing
_MULTS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xBF58476D1CE4E5B9],
    dtype=_U64,
)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised (uint64 arithmetic wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> _U64(30))
        x = x * _U64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> _U64(27))
        x = x * _U64(0x94D049BB133111EB)
        return x ^ (x >> _U64(31))


def _tokens(text: str, unit: str) -> np.ndarray:
    """64-bit hashes of the words (lowercased ``\\w+`` runs) or characters (lowercased,
    whitespace collapsed) of a text."""
    if unit == "word":
        words = _WORD.findall(text.lower())
        return np.fromiter(map(xxhash.xxh3_64_intdigest, words), dtype=_U64, count=len(words))
    norm = " ".join(text.lower().split())
    return np.frombuffer(norm.encode("utf-32-le"), dtype=np.uint32).astype(_U64)


def shingle_hashes(text: str, *, size: int, unit: str = "word") -> np.ndarray:
    """The 64-bit hashes of every shingle of ``size`` consecutive tokens (a shorter text is
    one shingle of all its tokens; an empty one has none). Duplicates are kept: MinHash of a
    multiset equals MinHash of its set."""
    tok = _tokens(text, unit)
    if len(tok) == 0:
        return tok
    if len(tok) < size:
        size = len(tok)
    n = len(tok) - size + 1
    acc = np.zeros(n, dtype=_U64)
    with np.errstate(over="ignore"):
        for j in range(size):
            acc = (acc ^ tok[j : j + n]) * _MULTS[j % len(_MULTS)]
            acc = acc ^ (acc >> _U64(29))
    return _mix(acc + _U64(size))


def shingles(text: str, *, size: int, unit: str = "word") -> set[str]:
    """The shingles as strings (for exact Jaccard in tests and benchmarks, and peers that
    take strings)."""
    if unit == "word":
        toks: Sequence[str] = _WORD.findall(text.lower())
        sep = " "
    else:
        toks = " ".join(text.lower().split())
        sep = ""
    if not toks:
        return set()
    size = min(size, len(toks))
    return {sep.join(toks[i : i + size]) for i in range(len(toks) - size + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    """Exact Jaccard similarity of two shingle sets (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@lru_cache(maxsize=16)
def _perms(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**63, num_perm, dtype=np.uint64) | _U64(1)  # odd multipliers
    b = rng.integers(0, 2**63, num_perm, dtype=np.uint64)
    return a, b


def _numpy_signatures(
    flat: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int
) -> np.ndarray:
    """Multiply-shift hashing ``(a*h + b) >> 32`` per permutation, minimum per document,
    in blocks of documents that keep the temporary under ~32 MiB."""
    a, b = _perms(num_perm, seed)
    n = len(offsets) - 1
    out = np.empty((n, num_perm), dtype=_U64)
    budget = max(1, (1 << 22) // num_perm)
    d = 0
    while d < n:
        e = d + 1
        while e < n and offsets[e + 1] - offsets[d] <= budget:
            e += 1
        block = flat[offsets[d] : offsets[e]]
        with np.errstate(over="ignore"):
            v = (block[:, None] * a[None, :] + b[None, :]) >> _U64(32)
        out[d:e] = np.minimum.reduceat(v, offsets[d:e] - offsets[d], axis=0)
        d = e
    return out


def signatures(
    hashes: Sequence[np.ndarray], *, num_perm: int, seed: int, backend: str = "rensa"
) -> np.ndarray:
    """``(len(hashes), num_perm)`` uint64 MinHash signatures of non-empty shingle-hash
    arrays, computed in one batch."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if any(len(h) == 0 for h in hashes):
        raise ValueError("signatures need at least one shingle per document")
    if not hashes:
        return np.empty((0, num_perm), dtype=_U64)
    flat = np.concatenate(hashes).astype(_U64, copy=False)
    offsets = np.zeros(len(hashes) + 1, dtype=_U64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])
    if backend == "numpy":
        return _numpy_signatures(flat, offsets.astype(np.int64), num_perm, seed)
    import rensa

    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(flat, offsets, num_perm, seed)
    return np.asarray(matrix.to_rows(), dtype=_U64).reshape(len(hashes), num_perm)


def band_keys(sigs: np.ndarray, *, bands: int, rows: int) -> np.ndarray:
    """``(docs, bands)`` uint64 bucket keys: band ``i`` folds signature columns
    ``[i*rows, (i+1)*rows)`` with the band number, so equal keys in different bands differ."""
    if sigs.shape[1] < bands * rows:
        raise ValueError(f"{bands} bands x {rows} rows need {bands * rows} permutations")
    n = sigs.shape[0]
    v = sigs[:, : bands * rows].reshape(n, bands, rows).astype(_U64)
    acc = np.broadcast_to(np.arange(1, bands + 1, dtype=_U64), (n, bands)).copy()
    with np.errstate(over="ignore"):
        for j in range(rows):
            acc = _mix(acc * _MULTS[j % len(_MULTS)] + v[:, :, j])
    return acc


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """The chance that two documents of Jaccard ``similarity`` share a band key."""
    return float(1.0 - (1.0 - similarity**rows) ** bands)


@lru_cache(maxsize=64)
def lsh_for_recall(threshold: float, num_perm: int, *, recall: float = 0.99) -> tuple[int, int]:
    """``(bands, rows)``: the longest bands (fewest chance candidates) with which a pair at
    ``threshold`` is still a candidate with probability >= ``recall``; ``num_perm // rows``
    bands (``num_perm`` bands of one row when even those fall short)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold!r}")
    if not 0.0 < recall < 1.0:
        raise ValueError(f"recall must be in (0, 1), got {recall!r}")
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if candidate_probability(threshold, bands, rows) >= recall:
            best = (bands, rows)
    return best


def _integral(fn: np.ndarray, xs: np.ndarray) -> float:
    return float(np.sum((fn[1:] + fn[:-1]) * np.diff(xs)) / 2)


@lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """``(bands, rows)`` with ``bands * rows <= num_perm`` that minimise the area of false
    positives below ``threshold`` plus false negatives above it (equal weights), the way
    datasketch chooses them."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold!r}")
    lo = np.linspace(0.0, threshold, 201)
    hi = np.linspace(threshold, 1.0, 201)
    best = (float("inf"), 1, 1)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = _integral(1 - (1 - lo**r) ** b, lo)
            fn = _integral((1 - hi**r) ** b, hi)
            if fp + fn < best[0]:
                best = (fp + fn, b, r)
    return best[1], best[2]

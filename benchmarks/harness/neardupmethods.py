"""Near-duplicate removal methods side by side on one document list, in this process, and
their accuracy against exact Jaccard ground truth on a planted corpus.

Methods (word 5-shingles, 128 permutations):
  flashfeed            LSH sized for recall (``lsh_for_recall``), exact check of candidates
                       (``shinglesets.exact_pairs``): what ``flashfeed ingest`` runs
  flashfeed-estimate   the same LSH, candidates checked on the signature estimate
  s-curve-exact        LSH sized the way datasketch sizes it (``lsh_params``), exact check
  s-curve-estimate     that LSH and the estimate check: flashfeed before the exact check
  datasketch           ``MinHash.update_batch`` per document + ``MinHashLSH`` (its sizing)
  rensa                ``RMinHash.from_token_sets`` + ``RMinHashLSH`` (16 bands) with
                       rensa's own Jaccard estimate as the check
Each returns the union-find roots (``neardup.clusters``) and its candidate pair count.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashfeed.ingest.minhash import (
    band_keys,
    jaccard,
    lsh_for_recall,
    lsh_params,
    shingle_hashes,
    shingles,
    signatures,
)
from flashfeed.ingest.neardup import clusters
from flashfeed.ingest.nearpairs import candidate_pairs, check_pairs
from flashfeed.ingest.shinglesets import exact_pairs, shingled

__all__ = [
    "METHODS",
    "PERM",
    "SIZE",
    "GroundTruth",
    "accuracy",
    "ground_truth",
    "removal_curve",
    "run_method",
]

SIZE, PERM, SEED = 5, 128, 1
Roots = dict[int, int]


def _flashfeed(docs: list[str], threshold: float, sizing: str, check: str) -> tuple[Roots, int]:
    hashes = [shingle_hashes(d, size=SIZE) for d in docs]
    sigs = signatures(hashes, num_perm=PERM, seed=SEED)
    size = lsh_for_recall if sizing == "recall" else lsh_params
    bands, rows = size(threshold, PERM)
    keys = band_keys(sigs, bands=bands, rows=rows)
    n = len(docs)
    table = np.empty(keys.size, dtype=[("key", np.uint64), ("band", np.int32), ("doc", np.int64)])
    table["key"] = keys.ravel()
    table["band"] = np.tile(np.arange(bands, dtype=np.int32), n)
    table["doc"] = np.repeat(np.arange(n, dtype=np.int64), bands)
    cands = candidate_pairs(bands, table)
    ids = np.arange(n, dtype=np.int64)
    if check == "exact":
        edges = exact_pairs(threshold, cands, shingled(ids, hashes))
    else:
        edges = check_pairs(threshold, cands, (ids, sigs))
    return clusters(edges), len(cands)


def _datasketch(docs: list[str], threshold: float) -> tuple[Roots, int]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=PERM)
    hashes = []
    for i, d in enumerate(docs):
        m = MinHash(num_perm=PERM, seed=SEED)
        m.update_batch([s.encode() for s in shingles(d, size=SIZE)])
        lsh.insert(i, m)
        hashes.append(m)
    edges = {(min(i, j), max(i, j)) for i, m in enumerate(hashes) for j in lsh.query(m) if j != i}
    arr = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
    return clusters(arr), len(edges)


def _rensa(docs: list[str], threshold: float) -> tuple[Roots, int]:
    import rensa

    sets = [list(shingles(d, size=SIZE)) for d in docs]
    mhs = rensa.RMinHash.from_token_sets(sets, PERM, SEED)
    lsh = rensa.RMinHashLSH(threshold, PERM, 16)
    lsh.insert_many(mhs)
    cands = {
        (min(i, j), max(i, j))
        for i, found in enumerate(lsh.query_all(mhs))
        for j in found
        if j != i
    }
    edges = [(a, b) for a, b in sorted(cands) if mhs[a].jaccard(mhs[b]) >= threshold]
    return clusters(np.array(edges, dtype=np.int64).reshape(-1, 2)), len(cands)


METHODS: dict[str, Callable[[list[str], float], tuple[Roots, int]]] = {
    "flashfeed": lambda d, t: _flashfeed(d, t, "recall", "exact"),
    "flashfeed-estimate": lambda d, t: _flashfeed(d, t, "recall", "estimate"),
    "s-curve-exact": lambda d, t: _flashfeed(d, t, "s-curve", "exact"),
    "s-curve-estimate": lambda d, t: _flashfeed(d, t, "s-curve", "estimate"),
    "datasketch": _datasketch,
    "rensa": _rensa,
}


def run_method(name: str, docs: list[str], threshold: float) -> tuple[Roots, int]:
    return METHODS[name](docs, threshold)


@dataclass
class GroundTruth:
    """Exact Jaccard of every pair inside each planted family (a base and its copies);
    documents of different families share (next to) no 5-shingle."""

    pairs: dict[tuple[int, int], float]
    best: np.ndarray  # each document's highest J to another document of its family
    nearest: np.ndarray  # the document of that J (-1: a base without copies)
    sets: list[set[str]]

    def j(self, a: int, b: int) -> float:
        a, b = min(a, b), max(a, b)
        found = self.pairs.get((a, b))
        return found if found is not None else jaccard(self.sets[a], self.sets[b])


def ground_truth(docs: list[str], planted: list[tuple[int, int]]) -> GroundTruth:
    """Families from the planted ``(doc, doc)`` pairs; every pair inside one, measured."""
    parent = list(range(len(docs)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in planted:
        parent[find(a)] = find(b)
    family: dict[int, list[int]] = defaultdict(list)
    for d in range(len(docs)):
        family[find(d)].append(d)
    sets = [shingles(d, size=SIZE) for d in docs]
    pairs: dict[tuple[int, int], float] = {}
    best = np.zeros(len(docs))
    nearest = np.full(len(docs), -1, dtype=np.int64)
    for members in family.values():
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                j = pairs[(a, b)] = jaccard(sets[a], sets[b])
                for x, y in ((a, b), (b, a)):
                    if j > best[x] or nearest[x] < 0:
                        best[x], nearest[x] = j, y
    return GroundTruth(pairs, best, nearest, sets)


def accuracy(truth: GroundTruth, roots: Roots, threshold: float) -> dict[str, Any]:
    """Recall by J band, removals below the threshold, cluster precision."""
    of = {d: roots.get(d, d) for d in range(len(truth.best))}
    members: dict[int, list[int]] = defaultdict(list)
    for d, r in roots.items():
        members[r].append(d)
    removed = [d for d, r in roots.items() if d != r]

    def recall(lo: float, hi: float = 1.01) -> tuple[float, int]:
        hit = [of[a] == of[b] for (a, b), j in truth.pairs.items() if lo <= j < hi]
        return (float(np.mean(hit)) if hit else float("nan")), len(hit)

    # a removed document's best J: its family's, or a cluster member's if higher
    best = {
        d: max([truth.best[d], *(truth.j(d, x) for x in members[of[d]] if x != d)]) for d in removed
    }
    in_cluster = [
        any(truth.j(d, x) >= threshold for x in members[of[d]] if x != d) for d in removed
    ]
    to_kept = [truth.j(d, of[d]) >= threshold for d in removed]
    r_hi, n_hi = recall(threshold + 0.05)
    r_at, n_at = recall(threshold)
    return {
        "recall_above": r_hi,
        "pairs_above": n_hi,
        "recall_at": r_at,
        "pairs_at": n_at,
        "removed": len(removed),
        "removed_below": sum(1 for d in removed if best[d] < threshold - 0.05),
        "removed_under_t": sum(1 for d in removed if best[d] < threshold),
        "worst_removed_j": min(best.values(), default=float("nan")),
        "cluster_precision": float(np.mean(in_cluster)) if removed else 1.0,
        "kept_precision": float(np.mean(to_kept)) if removed else 1.0,
    }


def removal_curve(
    truth: GroundTruth, roots: Roots, edges: np.ndarray
) -> list[tuple[float, float, float, int]]:
    """Per J bin ``[lo, hi)`` of a document's best exact J: the share of planted documents
    that end in one cluster with their nearest document (so one of the two is removed), and
    how many documents the bin holds."""
    docs = np.flatnonzero(truth.nearest >= 0)
    js = truth.best[docs]
    near = truth.nearest[docs].tolist()
    pairs = zip(docs.tolist(), near, strict=True)
    same = np.array([roots.get(d, d) == roots.get(n, n) for d, n in pairs])
    out = []
    for lo, hi in itertools.pairwise(edges.tolist()):
        sel = (js >= lo) & (js < hi)
        share = float(same[sel].mean()) if sel.any() else float("nan")
        out.append((lo, hi, share, int(sel.sum())))
    return out

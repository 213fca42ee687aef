"""Near-duplicate removal meets its stated accuracy on planted edits that crowd the
threshold, on real Ray: recall >= 0.98 for pairs at J >= t + 0.05, no document removed whose
best exact J is below t - 0.05, cluster precision >= 0.99 (ground truth: the exact Jaccard
of every pair inside each planted family). Seeded; nothing is timed."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from benchmarks.harness.plantedcorpus import make_planted_corpus, write_jsonl
from flashfeed.ingest.minhash import (
    candidate_probability,
    jaccard,
    lsh_for_recall,
    shingle_hashes,
    shingles,
)
from flashfeed.ingest.neardup import NearDupOptions, screen
from flashfeed.ingest.shinglesets import exact_pairs, pair_similarity, shingled
from flashfeed.ingest.sources import StorageContext, scan_source
from flashfeed.ingest.transforms import TransformOptions

T = 0.7
TARGETS = (0.6, 0.65, 0.68, 0.7, 0.72, 0.75, 0.8, 0.9)


def _families(n: int, planted: list[tuple[int, int]]) -> list[list[int]]:
    root = list(range(n))

    def find(x: int) -> int:
        while root[x] != x:
            x = root[x]
        return x

    for a, b in planted:
        root[find(a)] = find(b)
    out: dict[int, list[int]] = defaultdict(list)
    for d in range(n):
        out[find(d)].append(d)
    return [f for f in out.values() if len(f) > 1]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("backend", ["rensa", "numpy"])
def test_stated_accuracy_on_edits_around_the_threshold(tmp_path: Path, backend: str) -> None:
    corpus = make_planted_corpus(
        bases=120, copies_above=TARGETS, copies_below=(0.3,), planted_share=0.6, seed=11
    )
    write_jsonl(corpus.docs, str(tmp_path / "src" / "c.jsonl"))
    ctx = StorageContext()
    scan = scan_source(str(tmp_path / "src"), "text", ctx)
    found = screen(
        scan.items, fmt="text", shared=scan.shared, ctx=ctx, kinds=scan.fields,
        transform=TransformOptions(), text_field="txt",
        near_dup=NearDupOptions(threshold=T, backend=backend), chunk_docs=150,
    )  # fmt: skip
    sets = [shingles(d, size=5) for d in corpus.docs]
    pairs: dict[tuple[int, int], float] = {}
    for fam in _families(len(corpus.docs), [(p.base, p.copy) for p in corpus.pairs]):
        for i, a in enumerate(fam):
            for b in fam[i + 1 :]:
                pairs[(a, b)] = jaccard(sets[a], sets[b])
    js = np.array(list(pairs.values()))
    # the corpus crowds the threshold: pairs just below it and just above it
    assert ((js >= T - 0.05) & (js < T)).sum() > 50 and (js >= T + 0.05).sum() > 200
    root = found.kept_for
    of = {d: root.get(d, d) for d in range(len(corpus.docs))}
    above = [of[a] == of[b] for (a, b), j in pairs.items() if j >= T + 0.05]
    assert np.mean(above) >= 0.98, np.mean(above)
    members: dict[int, list[int]] = defaultdict(list)
    for d, r in root.items():
        members[r].append(d)
        members[r].append(r)
    removed = sorted(root)
    assert len(removed) > 200, len(removed)
    for d in removed:  # best J: over its family and its cluster (documents of other
        # families share next to nothing, and a cluster member is checked directly)
        best = max(
            [j for (a, b), j in pairs.items() if d in (a, b)]
            + [jaccard(sets[d], sets[x]) for x in set(members[of[d]]) - {d}]
        )
        assert best >= T - 0.05, (d, best)
    precise = [
        any(jaccard(sets[d], sets[x]) >= T for x in set(members[of[d]]) - {d}) for d in removed
    ]
    assert np.mean(precise) >= 0.99
    assert found.stats["checked_below"] > 0  # the check dropped LSH candidates below T


def test_lsh_is_sized_for_recall_and_the_check_is_exact() -> None:
    for t in (0.5, 0.7, 0.8, 0.9):
        bands, rows = lsh_for_recall(t, 128)
        assert bands * rows <= 128
        assert candidate_probability(t, bands, rows) >= 0.99
        assert candidate_probability(t, 128 // (rows + 1), rows + 1) < 0.99  # the longest
    a = " ".join(f"w{i}" for i in range(40))  # 36 shingles
    b = " ".join(f"w{i}" for i in range(4, 44))  # 32 of them shared: J = 32 / 40
    c = "completely other words here and there again"
    part = shingled(np.array([10, 11, 12]), [shingle_hashes(x, size=5) for x in (a, b, c)])
    pairs = np.array([[10, 11, 0], [10, 12, 0]], dtype=np.int64)
    assert pair_similarity(pairs, part).tolist() == [
        jaccard(shingles(a, size=5), shingles(b, size=5)),
        0.0,
    ]
    assert pair_similarity(pairs, part)[0] == 32 / 40
    assert exact_pairs(0.8, pairs, part).tolist() == [[10, 11, 0]]
    assert exact_pairs(0.81, pairs, part).tolist() == []

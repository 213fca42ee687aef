"""Near-duplicate removal: stated accuracy on planted edits, the removal curve, and
documents per CPU second beside datasketch and rensa used directly.

On seeded corpora with planted edited copies (``flashfeed.ingest.plantedcorpus``; copies
aimed at Jaccard 0.3 and 0.55-0.95, so that pairs crowd the threshold), with ground truth
from the exact Jaccard of every pair inside each planted family, for each method of
``benchmarks.harness.neardupmethods`` (flashfeed's exact check and the alternatives: the
signature estimate as the check, LSH sized the datasketch way, datasketch, rensa):

  accuracy  recall of pairs at J >= t + 0.05 and at J >= t, removed documents whose best J
            is below t - 0.05 (and below t), cluster precision (a removed document has a
            member of its cluster at least t similar) and the stricter share whose kept
            document is at least t similar
  curve     per bin of a document's best exact J, the share of planted documents that end
            in one cluster with their nearest document (one of the two removed)
  speed     documents per CPU second (``time.process_time``: every thread of this process),
            from text to clusters, shingling and the check included; rounds rotate and the
            median is reported, with flashfeed's ratio to the faster peer

Prints tables and writes JSON. Not a timed test: run it by hand.

    python -m benchmarks.stages.neardupcurve --bases 2000 --seeds 0,1 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from benchmarks.harness.neardupmethods import (
    METHODS,
    PERM,
    SIZE,
    accuracy,
    ground_truth,
    removal_curve,
    run_method,
)
from benchmarks.harness.plantedcorpus import make_planted_corpus
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from flashfeed.ingest.minhash import lsh_for_recall, lsh_params

__all__ = ["TARGETS", "main", "planted", "speed"]

TARGETS = (0.55, 0.6, 0.65, 0.68, 0.7, 0.72, 0.75, 0.8, 0.9, 0.95)
SPEED_METHODS = ("flashfeed", "datasketch", "rensa")


def planted(bases: int, seed: int) -> Any:
    """A corpus whose copies crowd the threshold, with its exact ground truth."""
    corpus = make_planted_corpus(
        bases=bases, copies_above=TARGETS, copies_below=(0.3,), planted_share=0.5, seed=seed
    )
    truth = ground_truth(corpus.docs, [(p.base, p.copy) for p in corpus.pairs])
    return corpus, truth


def speed(
    docs: list[str], threshold: float, rounds: int, methods: tuple[str, ...] = SPEED_METHODS
) -> dict[str, list[float]]:
    """Documents per CPU second of each of ``methods``, ``rounds`` rotated rounds."""
    out: dict[str, list[float]] = {m: [] for m in methods}
    for r in range(rounds):
        for m in rotated(methods, r):
            t0 = time.process_time()
            run_method(m, docs, threshold)
            out[m].append(len(docs) / max(time.process_time() - t0, 1e-9))
    return out


def _print_accuracy(seed: int, ndocs: int, rows: dict[str, dict[str, Any]], t: float) -> None:
    print(f"\nplanting seed {seed}: {ndocs} documents, threshold {t}")
    print(
        f"{'method':>19} {'recall J>=t+.05':>15} {'recall J>=t':>11} {'removed':>7}"
        f" {'best J<t-.05':>12} {'best J<t':>8} {'worst J':>7} {'cluster prec':>12}"
        f" {'kept prec':>9} {'candidates':>10}"
    )
    for m, a in rows.items():
        print(
            f"{m:>19} {a['recall_above']:15.4f} {a['recall_at']:11.4f} {a['removed']:7d}"
            f" {a['removed_below']:12d} {a['removed_under_t']:8d} {a['worst_removed_j']:7.3f}"
            f" {a['cluster_precision']:12.4f} {a['kept_precision']:9.4f} {a['candidates']:10d}"
        )


def _print_curve(curves: dict[str, list[tuple[float, float, float, int]]]) -> None:
    names = list(curves)
    print("\nP(document and its nearest end in one cluster) by its best exact J")
    print(f"{'J bin':>11} {'docs':>6} " + " ".join(f"{m:>18}" for m in names))
    first = curves[names[0]]
    for k, (lo, hi, _, n) in enumerate(first):
        cells = " ".join(f"{curves[m][k][2]:18.3f}" for m in names)
        print(f"{lo:.2f}-{hi:.2f} {n:6d} {cells}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bases", type=int, default=2000, help="base documents (copies added)")
    p.add_argument("--seeds", default="0,1", help="plantings, one corpus each")
    p.add_argument("--threshold", type=float, default=0.7)
    p.add_argument("--rounds", type=int, default=3, help="rotated rounds of the speed table")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", default=".bench/neardupcurve.json", help="where to write the JSON")
    args = p.parse_args(argv)
    t = args.threshold
    methods = args.methods.split(",")
    edges = np.round(np.arange(0.40, 1.0001, 0.025), 3)
    result: dict[str, Any] = {
        "threshold": t,
        "shingle": f"{SIZE} words",
        "num_perm": PERM,
        "lsh_for_recall": list(lsh_for_recall(t, PERM)),
        "lsh_params": list(lsh_params(t, PERM)),
        "plantings": [],
        "unavailable": {},
        "cpu_count": os.cpu_count(),
    }
    print(
        f"word {SIZE}-shingles, {PERM} permutations; bands x rows: flashfeed "
        f"{lsh_for_recall(t, PERM)}, s-curve {lsh_params(t, PERM)}, rensa (16, 8)"
    )
    docs: list[str] = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        corpus, truth = planted(args.bases, seed)
        docs = docs or corpus.docs
        rows, curves = {}, {}
        for m in methods:
            try:
                roots, candidates = run_method(m, corpus.docs, t)
            except ImportError as exc:  # a peer not installed here (.bench-venv has them)
                result["unavailable"][m] = str(exc)
                continue
            rows[m] = {**accuracy(truth, roots, t), "candidates": candidates}
            curves[m] = removal_curve(truth, roots, edges)
        _print_accuracy(seed, len(corpus.docs), rows, t)
        _print_curve(curves)
        result["plantings"].append(
            {"seed": seed, "docs": len(corpus.docs), "accuracy": rows, "curve": curves}
        )
    timed = tuple(m for m in SPEED_METHODS if m not in result["unavailable"])
    runs = speed(docs, t, args.rounds, timed)
    med = {m: statistics.median(v) for m, v in runs.items()}
    peer = max([med[m] for m in timed if m != "flashfeed"], default=med["flashfeed"])
    print(f"\ndocuments per CPU second ({len(docs)} documents, median of {args.rounds} rounds)")
    print(f"{'method':>12} {'docs/CPU s':>10} {'vs faster peer':>14} {'rounds':>24}")
    for m in timed:
        each = " ".join(f"{x:.0f}" for x in runs[m])
        print(f"{m:>12} {med[m]:10.0f} {med[m] / peer:13.2f}x {each:>24}")
    for m, why in result["unavailable"].items():
        print(f"{m:>12} unavailable ({why})")
    result.update(
        speed={"docs": len(docs), "rounds": runs, "median": med},
        speed_ratio=med["flashfeed"] / peer,
        load_average=os.getloadavg(),
    )
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

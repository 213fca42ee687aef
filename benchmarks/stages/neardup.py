"""Near-duplicate removal: MinHash kernels side by side, and the Ray stage's scaling.

On one seeded corpus with planted edited copies (``flashfeed.ingest.plantedcorpus``; the
exact Jaccard of every planted pair is known), with word 5-shingles, 128 permutations and
one threshold:

  kernels   in one process: shingling + signatures + LSH candidates + clusters, docs/s,
            recall of the planted pairs at or above the threshold, cluster precision (a
            removed document has a member of its cluster at least that similar), and how
            far the signature estimate of planted pairs lies from the exact Jaccard:
              flashfeed-rensa  shingle hashes into rensa's flat-hash batch kernel (default)
              flashfeed-numpy  the same hashes into flashfeed's own numpy kernel
              rensa-strings    rensa on shingle strings (its plain API)
              datasketch       MinHash.update_batch per document + MinHashLSH
  ray       ``flashfeed ingest --near-dup-threshold`` (text source, embedded Ray) with 1
            and 2 Ray CPUs in fresh processes, rounds interleaved: docs/s of the near-dup
            stage (reading the documents back, MinHash, bucket shuffle, union-find)

Prints tables and writes JSON. Not a timed test: run it by hand or through suite.py.

    python -m benchmarks.stages.neardup --bases 10000 --rounds 3 --out .bench/neardup.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.child import REPO, module_command
from benchmarks.harness.plantedcorpus import PlantedCorpus, make_planted_corpus, write_jsonl
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from flashfeed.ingest.minhash import band_keys, jaccard, lsh_params, shingle_hashes, shingles
from flashfeed.ingest.minhash import signatures as minhash_signatures
from flashfeed.ingest.neardup import clusters
from flashfeed.ingest.nearpairs import candidate_pairs, check_pairs

__all__ = ["KERNELS", "kernel_rounds", "kernel_run", "main", "quality", "ray_run"]

KERNELS = ("flashfeed-rensa", "flashfeed-numpy", "rensa-strings", "datasketch")
SIZE, PERM = 5, 128


def _lsh_roots(sigs: np.ndarray, threshold: float) -> dict[int, int]:
    """Bands of the signatures (the S-curve sizing) -> candidate pairs checked against their
    signatures -> union-find: the same path for every kernel. flashfeed ingest itself sizes
    the LSH for recall and checks candidates exactly (``neardupcurve.py`` measures that)."""
    bands, rows = lsh_params(threshold, PERM)
    keys = band_keys(sigs, bands=bands, rows=rows)
    n = len(sigs)
    table = np.empty(keys.size, dtype=[("key", np.uint64), ("band", np.int32), ("doc", np.int64)])
    table["key"] = keys.ravel()
    table["band"] = np.tile(np.arange(bands, dtype=np.int32), n)
    table["doc"] = np.repeat(np.arange(n, dtype=np.int64), bands)
    ids = np.arange(n, dtype=np.int64)
    return clusters(check_pairs(threshold, candidate_pairs(bands, table), (ids, sigs)))


def _signatures(kernel: str, docs: list[str]) -> np.ndarray:
    if kernel.startswith("flashfeed-"):
        hashes = [shingle_hashes(d, size=SIZE) for d in docs]
        return minhash_signatures(hashes, num_perm=PERM, seed=1, backend=kernel.split("-")[1])
    if kernel == "rensa-strings":
        import rensa

        sets = [list(shingles(d, size=SIZE)) for d in docs]
        m = rensa.RMinHash.digest_matrix_from_token_sets(sets, PERM, 1)
        return np.asarray(m.to_rows(), dtype=np.uint64)
    raise ValueError(kernel)


def _datasketch(docs: list[str], threshold: float) -> tuple[dict[int, int], np.ndarray]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=PERM)
    hashes = []
    for i, d in enumerate(docs):
        m = MinHash(num_perm=PERM, seed=1)
        m.update_batch([s.encode() for s in shingles(d, size=SIZE)])
        lsh.insert(i, m)
        hashes.append(m)
    edges = []
    for i, m in enumerate(hashes):
        edges += [(min(i, j), max(i, j), 0) for j in lsh.query(m) if j != i]
    sigs = [m.hashvalues for m in hashes]
    arr = np.array(sorted(set(edges)), dtype=np.int64).reshape(-1, 3)
    return clusters(arr), np.asarray(sigs)


def quality(corpus: PlantedCorpus, roots: dict[int, int], threshold: float) -> dict[str, float]:
    """Recall of planted pairs >= threshold, cluster precision, pairs wrongly merged below."""
    of = {d: roots.get(d, d) for d in range(len(corpus.docs))}
    above = [p for p in corpus.pairs if p.jaccard >= threshold]
    below = [p for p in corpus.pairs if p.jaccard < threshold - 0.2]
    members: dict[int, list[int]] = defaultdict(list)
    for d, r in roots.items():
        if d != r:
            members[r].append(d)
    sh: dict[int, set[str]] = {}

    def s(i: int) -> set[str]:
        if i not in sh:
            sh[i] = shingles(corpus.docs[i], size=SIZE)
        return sh[i]

    removed = [(d, r) for d, r in roots.items() if d != r]
    good = sum(
        any(jaccard(s(d), s(x)) >= threshold for x in [r, *members[r]] if x != d)
        for d, r in removed
    )
    return {
        "recall": float(np.mean([of[p.base] == of[p.copy] for p in above])) if above else 1.0,
        "precision": good / len(removed) if removed else 1.0,
        "merged_below": float(np.mean([of[p.base] == of[p.copy] for p in below])) if below else 0.0,
        "removed": len(removed),
    }


def kernel_run(kernel: str, corpus: PlantedCorpus, threshold: float) -> dict[str, Any]:
    """One kernel over the whole corpus in this process: time, quality, estimate error."""
    t0 = time.perf_counter()
    if kernel == "datasketch":
        roots, sigs = _datasketch(corpus.docs, threshold)
    else:
        sigs = _signatures(kernel, corpus.docs)
        roots = _lsh_roots(sigs, threshold)
    seconds = time.perf_counter() - t0
    err = [abs(float(np.mean(sigs[p.base] == sigs[p.copy])) - p.jaccard) for p in corpus.pairs]
    return {
        "kernel": kernel,
        "seconds": seconds,
        "docs_per_s": len(corpus.docs) / seconds,
        "estimate_mae": float(np.mean(err)),
        **quality(corpus, roots, threshold),
    }


def kernel_rounds(
    names: list[str], corpus: PlantedCorpus, threshold: float, rounds: int
) -> list[dict[str, Any]]:
    """Every kernel ``rounds`` times, the order rotating each round; docs/s is the median
    (quality is the same every round: the kernels are deterministic)."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    missing: dict[str, str] = {}
    for i in range(rounds):
        for k in rotated(names, i):
            if k in missing:
                continue
            try:
                runs[k].append(kernel_run(k, corpus, threshold))
            except ImportError as exc:
                missing[k] = str(exc)
    out: list[dict[str, Any]] = []
    for k in names:
        if k in missing:
            out.append({"kernel": k, "unavailable": missing[k]})
            continue
        speeds = [r["docs_per_s"] for r in runs[k]]
        out.append({**runs[k][0], "docs_per_s": statistics.median(speeds), "rounds": speeds})
    return out


def ray_run(src: str, dest: str, cpus: int, threshold: float) -> dict[str, Any]:
    """One ingest with near-dup removal on an embedded Ray of ``cpus`` CPUs (this process)."""
    from flashfeed.ingest import IngestConfig, run

    result = run(
        IngestConfig(
            source=src,
            dest=dest,
            source_format="text",
            format="arrow",
            near_dup_threshold=threshold,
            num_cpus=cpus,
            overwrite=True,
            progress="none",
            source_options={"text": {"part_bytes": "8MiB"}},
        )
    )
    nd = result.manifest.extra["near_dup"]
    secs = result.phases["neardup"]
    return {
        "cpus": cpus,
        "neardup_s": secs,
        "docs": nd["docs_in"],
        "docs_per_s": nd["docs_in"] / secs,
        "chunks": nd["chunks"],
        "removed": sum(v for k, v in result.manifest.skipped.items() if "duplicate" in k),
        "phases": result.phases,
    }


def _child(src: str, dest: str, cpus: int, threshold: float) -> dict[str, Any]:
    out = subprocess.run(
        module_command(
            "benchmarks.stages.neardup",
            "--child",
            os.path.abspath(src),
            os.path.abspath(dest),
            str(cpus),
            str(threshold),
        ),
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--bases", type=int, default=10000, help="base documents (copies added)")
    p.add_argument("--threshold", type=float, default=0.7)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the Ray runs")
    p.add_argument("--cpus", default="1,2", help="Ray CPU counts to compare")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--kernel-rounds", type=int, default=3, help="rounds of the kernel table")
    p.add_argument("--work", default="", help="scratch folder (default: a temp dir)")
    p.add_argument("--out", default=".bench/neardup.json", help="where to write the JSON")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        src, dest, cpus, thr = args.child
        print(json.dumps(ray_run(src, dest, int(cpus), float(thr))))
        return 0
    corpus = make_planted_corpus(bases=args.bases, seed=0)
    work = Path(args.work or tempfile.mkdtemp(prefix="ffneardup-"))
    try:
        src = work / "src"
        half = len(corpus.docs) // 2
        write_jsonl(corpus.docs[:half], str(src / "a.jsonl"))
        write_jsonl(corpus.docs[half:], str(src / "b.jsonl"))
        mb = sum(f.stat().st_size for f in src.iterdir()) / 1e6
        print(f"corpus: {len(corpus.docs)} docs, {mb:.1f} MB, {len(corpus.pairs)} planted pairs")
        kernels = kernel_rounds(args.kernels.split(","), corpus, args.threshold, args.kernel_rounds)
        base = kernels[0].get("docs_per_s") or 1.0
        print(
            f"\n{'kernel':>16} {'docs/s':>8} {'x first':>7} {'recall':>6} {'precision':>9}"
            f" {'merged<t-.2':>11} {'est. MAE':>8}"
        )
        for r in kernels:
            if "unavailable" in r:
                print(f"{r['kernel']:>16} unavailable ({r['unavailable']})")
                continue
            print(
                f"{r['kernel']:>16} {r['docs_per_s']:8.0f} {r['docs_per_s'] / base:6.2f}x"
                f" {r['recall']:6.3f} {r['precision']:9.3f} {r['merged_below']:11.3f}"
                f" {r['estimate_mae']:8.4f}"
            )
        cpus = [int(c) for c in args.cpus.split(",")]
        runs: dict[int, list[dict[str, Any]]] = {c: [] for c in cpus}
        for i in range(args.rounds):
            for c in cpus if i % 2 == 0 else cpus[::-1]:
                runs[c].append(_child(str(src), str(work / f"ds{c}"), c, args.threshold))
        med = {c: statistics.median(r["docs_per_s"] for r in runs[c]) for c in cpus}
        print(
            f"\n{'Ray CPUs':>8} {'docs/s':>8} {'scaling':>7} {'rounds':>20}"
            f" {'sign s':>7} {'buckets s':>9} {'union s':>7}"
        )
        for c in cpus:
            rounds = " ".join(f"{r['docs_per_s']:.0f}" for r in runs[c])
            step = {
                k: statistics.median(r["phases"].get(f"neardup_{k}", 0.0) for r in runs[c])
                for k in ("sign", "buckets", "union_find")
            }
            print(
                f"{c:8d} {med[c]:8.0f} {med[c] / med[cpus[0]]:6.2f}x {rounds:>20}"
                f" {step['sign']:7.2f} {step['buckets']:9.2f} {step['union_find']:7.2f}"
            )
        result = {
            "docs": len(corpus.docs),
            "mb": mb,
            "planted_pairs": len(corpus.pairs),
            "threshold": args.threshold,
            "shingle": f"{SIZE} words",
            "num_perm": PERM,
            "bands_rows": list(lsh_params(args.threshold, PERM)),
            "kernels": kernels,
            "ray": {str(c): runs[c] for c in cpus},
            "ray_docs_per_s": {str(c): med[c] for c in cpus},
            "scaling": med[cpus[-1]] / med[cpus[0]],
            "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg(),
        }
        write_json(args.out, result)
        print(f"\nwrote {args.out}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

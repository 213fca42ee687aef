"""Token ingest per CPU beside the bare tokenizer, on corpora of three shapes (median
document 300 B, 3 KB, 100 KB), with 1 and 2 Ray CPUs: the ``per_cpu`` part of
``tokenize_bench``.

What is measured, in CPU seconds (the machine's wall clock is shared with other jobs):

  ingest             ``flashfeed.ingest.run`` on the already started Ray, JSONL in, best-fit
                     packed Arrow shards PUT to a local SeaweedFS, committed: the CPU of this
                     process (the driver) and of Ray's task workers during the run. Ray's
                     own daemons (raylet, GCS, agents) are counted apart; the store is not
                     counted
  encode_batch_fast  ``tokenizers`` on the same texts already in memory, one process (a
                     fresh one per run), the second of two calls (its word cache warm, as
                     a worker's is): its CPU seconds, on one thread (``fast 1 thread``)
                     and on every core (``fast all threads``)
  encode_batch       the same with character offsets, one thread
  ... jemalloc       ``encode_batch_fast`` on one thread with Ray's jemalloc preloaded, as
                     an embedded Ray starts ingest's workers (``fast je``)

The corpora are JSONL (``--percpu-input parquet``: Parquet) with one ``text`` column.
Rate per CPU = MB of text / CPU seconds. Ray's start-up (``ray.init``) and the first,
cold run on fresh workers (their imports) are reported apart. Then where the CPU goes,
stage by stage, in one process (``benchmarks.harness.tokstages``).

    python -m benchmarks.stages.tokpercpu JSONL TOKENIZER --kernel fast --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.cputime import TreeCPU
from benchmarks.harness.rounds import rotated
from benchmarks.harness.textshapes import SHAPES, machine_text, shaped_documents
from benchmarks.harness.tokstages import KERNEL, STAGES, stage_profile

__all__ = ["bench_per_cpu", "per_cpu_on_own_store", "print_per_cpu"]

JEMALLOC_FAST = "encode_batch_fast jemalloc"
KERNELS = {  # name -> (kernel, all threads, Ray's jemalloc preloaded as ingest's workers do)
    "encode_batch_fast": ("fast", False, False),
    "encode_batch_fast all threads": ("fast", True, False),
    "encode_batch": ("batch", False, False),
    JEMALLOC_FAST: ("fast", False, True),
}
INGEST = "ingest"


def kernel_cpu(
    src: Path, tok: Path, kernel: str, threads: bool, jemalloc: bool = False
) -> dict[str, float]:
    """CPU and wall seconds of one bare tokenizer call over the texts of ``src``, in a
    fresh process (its start and the reading of the texts are not counted); ``jemalloc``:
    with Ray's jemalloc preloaded, as an embedded Ray starts ingest's workers."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true" if threads else "false")
    env.pop("LD_PRELOAD", None)
    if jemalloc:
        from flashfeed.ingest.raysetup import ray_jemalloc

        lib = ray_jemalloc()
        if lib is None:
            raise RuntimeError("this Ray build ships no libjemalloc.so")
        env["LD_PRELOAD"] = lib
    cmd = [sys.executable, "-m", "benchmarks.stages.tokpercpu", str(src), str(tok)]
    out = subprocess.run(
        [*cmd, "--kernel", kernel], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_corpus(stem: Path, docs: list[str], fmt: str) -> Path:
    """``docs`` as one file of a ``text`` column: ``<stem>.jsonl`` or ``<stem>.parquet``."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        src = stem.with_suffix(".parquet")
        pq.write_table(pa.table({"text": docs}), src)
        return src
    src = stem.with_suffix(".jsonl")
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return src


def read_texts(src: str) -> list[str]:
    """The ``text`` column of a corpus ``write_corpus`` made."""
    if src.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(src, columns=["text"]).column("text").to_pylist()
    with open(src) as f:
        return [json.loads(line)["text"] for line in f]


def _kernel_main(src: str, tok: str, kernel: str) -> None:
    from tokenizers import Tokenizer

    texts = read_texts(src)
    t = Tokenizer.from_file(tok)
    t.encode_special_tokens = True  # as ingest encodes by default (special_tokens="text")
    fn = t.encode_batch_fast if kernel == "fast" else t.encode_batch
    # once untimed: the BPE's word cache warm, as in an ingest worker that has tokenized
    # shards before (a cold cache costs the first call 6-9% more on these corpora)
    fn(texts, add_special_tokens=False)
    c0, w0 = time.process_time(), time.perf_counter()
    fn(texts, add_special_tokens=False)
    print(json.dumps({"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}))


def ingest_cpu(src: Path, tok: Path, dest: str, args: argparse.Namespace) -> dict[str, float]:
    """CPU seconds (driver, Ray's workers, Ray's daemons) and wall seconds of one ingest
    run on the Ray already started, its phases and task timings beside."""
    from flashfeed.ingest import IngestConfig, run

    config = IngestConfig(
        source=str(src), dest=dest, format="arrow", tokenizer=str(tok), seq_len=args.seq_len,
        packing="best-fit", shard_size=args.shard_size, progress="none", overwrite=True,
    )  # fmt: skip
    meter = TreeCPU()
    before, w0 = meter.sample(), time.perf_counter()
    result = run(config)
    wall = time.perf_counter() - w0
    cpu = meter.sample() - before
    return {
        "cpu": cpu.driver + cpu.workers,
        "driver": cpu.driver,
        "workers": cpu.workers,
        "ray_daemons": cpu.ray,
        "new_workers": cpu.new_workers,  # started during the run: their imports count
        "wall": wall,
        "shards": len(result.manifest.shards),
        "phases": dict(result.phases),
        "timings": dict(result.timings),
    }


def make_corpora(work: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """One JSONL per shape in ``args.shapes`` (``args.mb`` MB each) and its figures."""
    pool = machine_text()
    out = {}
    for k, shape in enumerate(args.shapes):
        docs = shaped_documents(pool, median=SHAPES[shape], total_bytes=int(args.mb * 1e6), seed=k)
        src = write_corpus(work / f"corpus-{shape}", docs, getattr(args, "percpu_input", "jsonl"))
        sizes = sorted(len(d.encode()) for d in docs)
        out[shape] = {
            "src": src,
            "documents": len(docs),
            "mb": sum(sizes) / 1e6,
            "median_bytes": sizes[len(sizes) // 2],
            "max_bytes": sizes[-1],
        }
    return out


def per_cpu_on_own_store(tok: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``bench_per_cpu`` with its shards PUT to a SeaweedFS of its own (``args.percpu_mb``
    MB of each corpus shape)."""
    from benchmarks.harness.store import start_store

    store = start_store(work / "store", export_env=True)
    try:
        per = argparse.Namespace(**{**vars(args), "mb": args.percpu_mb})
        return bench_per_cpu(tok, work, store.bucket, per)
    finally:
        store.stop()


def bench_per_cpu(tok: Path, work: Path, store_bucket: str, args: argparse.Namespace) -> dict:
    """Every shape with each of ``args.ray_cpus``: ingest and the kernels, rotated rounds."""
    from flashfeed.ingest.raysetup import ray_session

    corpora = make_corpora(work, args)
    out: dict[str, Any] = {"corpora": {}, "runs": {}, "ray_start_s": {}, "cold_run": {}}
    for shape, c in corpora.items():
        out["corpora"][shape] = {k: v for k, v in c.items() if k != "src"}
    kernels: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {}
    for cpus in args.ray_cpus:
        t0 = time.perf_counter()
        with ray_session(num_cpus=cpus):
            out["ray_start_s"][str(cpus)] = time.perf_counter() - t0
            first = next(iter(corpora))
            cold = ingest_cpu(corpora[first]["src"], tok, f"{store_bucket}/cold-{cpus}", args)
            out["cold_run"][str(cpus)] = {"shape": first, **cold}
            for shape, c in corpora.items():
                runs: dict[str, list[dict[str, Any]]] = {n: [] for n in [INGEST, *KERNELS]}
                names = list(runs)
                for r in range(args.rounds):
                    for name in rotated(names, r + len(shape)):
                        if name == INGEST:
                            dest = f"{store_bucket}/{shape}-{cpus}-{r}"
                            got = ingest_cpu(c["src"], tok, dest, args)
                        else:
                            got = kernel_cpu(c["src"], tok, *KERNELS[name])
                        runs[name].append(got)
                        print(
                            f"  {cpus} CPU {shape:6s} round {r} {name:30s} CPU "
                            f"{got['cpu']:6.2f} s  wall {got['wall']:6.2f} s",
                            file=sys.stderr,
                        )
                # each Ray CPU count beside the kernels of its own rounds: the load
                # other jobs put on the machine moves between sessions
                kernels.setdefault(shape, {})[str(cpus)] = {n: runs.pop(n) for n in KERNELS}
                out["runs"].setdefault(shape, {})[str(cpus)] = runs[INGEST]
    out["kernels"] = kernels
    out["table"] = per_cpu_table(out)
    out["stages"] = {
        shape: stage_profile(c["src"], tok, f"{store_bucket}/stages-{shape}", seq_len=args.seq_len)
        for shape, c in corpora.items()
    }
    return out


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def per_cpu_table(out: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per shape and Ray CPU count: MB per CPU second of ingest and of the kernels
    run in the same rounds (medians, and the best round), and the ratios."""
    rows = []
    for shape, by_cpus in out["runs"].items():
        mb = out["corpora"][shape]["mb"]
        for cpus, runs in by_cpus.items():
            kern = out["kernels"][shape][cpus]
            k = {n: mb / _med(v, "cpu") for n, v in kern.items()}
            best = {n: mb / min(r["cpu"] for r in v) for n, v in kern.items()}
            ingest = mb / _med(runs, "cpu")
            ingest_best = mb / min(r["cpu"] for r in runs)
            rows.append(
                {
                    "shape": shape,
                    "ray_cpus": int(cpus),
                    "documents": out["corpora"][shape]["documents"],
                    "mb": mb,
                    "shards": runs[0]["shards"],
                    "ingest_mb_per_cpu_s": ingest,
                    "kernel_mb_per_cpu_s": k,
                    "vs_fast": ingest / k["encode_batch_fast"],
                    "vs_fast_all_threads": ingest / k["encode_batch_fast all threads"],
                    "vs_encode_batch": ingest / k["encode_batch"],
                    "vs_fast_jemalloc": ingest / k[JEMALLOC_FAST],
                    # best of rounds: other jobs only ever add CPU time (caches, memory)
                    "ingest_best_mb_per_cpu_s": ingest_best,
                    "kernel_best_mb_per_cpu_s": best,
                    "vs_fast_best": ingest_best / best["encode_batch_fast"],
                    "vs_fast_all_threads_best": ingest_best / best["encode_batch_fast all threads"],
                    "vs_fast_jemalloc_best": ingest_best / best[JEMALLOC_FAST],
                    "driver_cpu_s": _med(runs, "driver"),
                    "workers_cpu_s": _med(runs, "workers"),
                    "ray_daemons_cpu_s": _med(runs, "ray_daemons"),
                    "ingest_wall_mb_s": mb / _med(runs, "wall"),
                    "ingest_wall_mb_s_per_ray_cpu": mb / _med(runs, "wall") / int(cpus),
                }
            )
    return rows


def print_per_cpu(p: dict[str, Any]) -> None:
    print("\ntoken ingest per CPU: MB of text per CPU second (median of rounds; best of rounds)")
    print("  ingest CPU = driver + Ray workers; Ray's daemons apart; kernels: one process")
    head = (
        f"  {'shape':6s} {'Ray CPUs':>8s} {'docs':>6s} {'shards':>6s} {'ingest':>7s} "
        f"{'fast':>7s} {'fast all':>8s} {'batch':>7s} {'vs fast':>7s} {'best':>6s} "
        f"{'vs fast all':>11s} {'best':>6s} {'vs batch':>8s} {'fast je':>7s} "
        f"{'vs fast je':>10s} {'best':>6s} {'daemons s':>9s} {'wall MB/s/CPU':>13s}"
    )
    print(head)
    for r in p["table"]:
        k = r["kernel_mb_per_cpu_s"]
        print(
            f"  {r['shape']:6s} {r['ray_cpus']:8d} {r['documents']:6d} {r['shards']:6d} "
            f"{r['ingest_mb_per_cpu_s']:7.2f} {k['encode_batch_fast']:7.2f} "
            f"{k['encode_batch_fast all threads']:8.2f} {k['encode_batch']:7.2f} "
            f"{r['vs_fast']:6.2f}x {r['vs_fast_best']:5.2f}x "
            f"{r['vs_fast_all_threads']:10.2f}x {r['vs_fast_all_threads_best']:5.2f}x "
            f"{r['vs_encode_batch']:7.2f}x {k[JEMALLOC_FAST]:7.2f} "
            f"{r['vs_fast_jemalloc']:9.2f}x {r['vs_fast_jemalloc_best']:5.2f}x "
            f"{r['ray_daemons_cpu_s']:9.2f} "
            f"{r['ingest_wall_mb_s_per_ray_cpu']:13.2f}"
        )
    if p.get("stages"):
        print_stages(p)
    for cpus, secs in p["ray_start_s"].items():
        cold = p["cold_run"][cpus]
        print(
            f"  Ray start-up, {cpus} CPU(s): {secs:.2f} s; then the first run ({cold['shape']}, "
            f"fresh workers) {cold['wall']:.2f} s wall, {cold['cpu']:.2f} CPU s"
        )


def print_stages(p: dict[str, Any]) -> None:
    """CPU seconds per stage, one process, no Ray (best of 5), as % of the kernel; then
    what a run on 1 Ray CPU spent beyond them (Ray's task round trip, the commit, ...)."""
    shapes = list(p["stages"])
    print("\nwhere the CPU goes, one process, no Ray: CPU s (% of encode_batch_fast)")
    print(f"  {'stage':28s} {'where':6s}" + "".join(f" {s:>16s}" for s in shapes))
    kernel = [f"{p['stages'][shape][KERNEL]:7.3f} (100.0%)" for shape in shapes]
    print(f"  {'the kernel, one call':28s} {'':6s}" + "".join(f" {c:>16s}" for c in kernel))
    for name, where in STAGES:
        cells = []
        for shape in shapes:
            st = p["stages"][shape]
            cells.append(f"{st[name]:7.3f} ({100 * st[name] / st[KERNEL]:5.1f}%)")
        print(f"  {name:28s} {where:6s}" + "".join(f" {c:>16s}" for c in cells))
    cells = []
    for shape in shapes:
        st = p["stages"][shape]
        runs = p["runs"][shape].get("1")
        staged = sum(st[name] for name, _ in STAGES)
        rest = _med(runs, "cpu") - staged if runs else float("nan")
        cells.append(f"{rest:7.3f} ({100 * rest / st[KERNEL]:5.1f}%)")
    print(f"  {'1 Ray CPU run, the rest':28s} {'both':6s}" + "".join(f" {c:>16s}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one bare tokenizer call, timed (a child process)")
    p.add_argument("src")
    p.add_argument("tok")
    p.add_argument("--kernel", choices=("fast", "batch"), required=True)
    args = p.parse_args(argv)
    _kernel_main(args.src, args.tok, args.kernel)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak: N loader processes on one node share one cache dir for many epochs; each samples
its open files, resident memory, threads and child processes after every epoch.

Prints a table of first-vs-last (after ``--warmup`` epochs) per process and whether
anything grew; writes JSON; exits 1 on growth beyond the tolerances or on any error.

    python -m benchmarks.stages.soak --processes 4 --epochs 40 --out .bench/soak.json

Without ``--dataset`` it starts a private SeaweedFS server and writes a small JPEG dataset
to it, so the cache fills from a real S3 endpoint.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness.child import REPO, module_command
from benchmarks.harness.datasets import noise_jpeg_dataset
from benchmarks.harness.results import write_json
from benchmarks.harness.store import start_store

__all__ = ["main"]


def _proc_sample() -> dict[str, float]:
    """Open fds, RSS (MiB), threads and live child processes of this process."""
    status: dict[str, str] = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    children = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                children += len(f.read().split())
        except OSError:
            pass
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "threads": int(status["Threads"]),
        "children": children,
    }


def settled(read: Callable[[], dict[str, float]], *, readings: int = 5,
            gap: float = 0.1) -> dict[str, float]:  # fmt: skip
    """``read()`` again ``gap`` seconds later until two readings agree (at most
    ``readings``); fds, threads and children are the fewest seen, resident memory the last.
    A leaked fd or thread is in every reading; one that is ending with the epoch (a fetch
    thread of a pass that just finished) is not. A settled process costs one more reading."""
    keys = ("fds", "threads", "children")
    got = [read()]
    while len(got) < readings:
        time.sleep(gap)
        got.append(read())
        if all(got[-1][k] == got[-2][k] for k in keys):
            break
    out = dict(got[-1])
    for k in keys:
        out[k] = min(g[k] for g in got)
    return out


def _thread_pools() -> dict[str, int]:
    """Python threads by name, numbers stripped: which pool holds how many (a diagnosis)."""
    names = collections.Counter(re.sub(r"[-_]?\d+$", "", t.name) for t in threading.enumerate())
    return dict(sorted(names.items()))


def _child(args: argparse.Namespace) -> int:
    from flashfeed.cache import ShardCache
    from flashfeed.loader import Loader

    cache = ShardCache(args.cache_dir, capacity=args.capacity)
    loader = Loader(
        args.dataset,
        batch_size=args.batch_size,
        image_size=args.image_size,
        rank=args.rank,
        world_size=args.processes,
        cache=cache,
        py_workers=args.py_workers,
        seed=1,
    )
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        samples = sum(len(b["label"]) for b in loader)
        line = {"rank": args.rank, "epoch": epoch, "samples": samples}
        line["seconds"] = time.perf_counter() - t0
        line.update(settled(_proc_sample))
        line["pools"] = _thread_pools()
        print(json.dumps(line), flush=True)
    cache.close()
    return 0


def judge(lines: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per rank: the sample after warm-up epochs vs the last one, and what grew."""
    out: dict[str, Any] = {"ranks": {}, "grew": [], "errors": []}
    limits = {
        "fds": args.fd_tolerance,
        "threads": args.thread_tolerance,
        "children": 0,
        "rss_mib": args.rss_tolerance_mib,
    }
    for rank in range(args.processes):
        mine = sorted((ln for ln in lines if ln["rank"] == rank), key=lambda ln: ln["epoch"])
        if len(mine) != args.epochs:
            out["errors"].append(f"rank {rank} reported {len(mine)} of {args.epochs} epochs")
            continue
        base = mine[min(args.warmup, len(mine) - 1)]
        last = mine[-1]
        peak = {k: max(ln[k] for ln in mine[args.warmup :] or mine) for k in limits}
        row = {k: {"after_warmup": base[k], "last": last[k], "peak": peak[k]} for k in limits}
        row["samples_per_epoch"] = sorted({ln["samples"] for ln in mine})
        out["ranks"][rank] = row
        for k, tol in limits.items():
            if peak[k] - base[k] > tol:
                said = f"rank {rank}: {k} {base[k]:.1f} -> peak {peak[k]:.1f}"
                if k == "threads" and "pools" in base:
                    top = max(mine[args.warmup :], key=lambda ln: ln[k])
                    said += f" (threads by name {base['pools']} -> {top.get('pools')})"
                out["grew"].append(said)
        if len(row["samples_per_epoch"]) != 1:
            out["errors"].append(f"rank {rank}: samples per epoch vary {row['samples_per_epoch']}")
    return out


def thin(lines: list[dict[str, Any]], epochs: int, keep: int = 100) -> list[dict[str, Any]]:
    """About ``keep`` epochs of samples per rank for the JSON (every one when few)."""
    step = max(1, -(-epochs // keep))
    return [ln for ln in lines if ln["epoch"] % step == 0 or ln["epoch"] == epochs - 1]


def _print_table(result: dict[str, Any]) -> None:
    print(f"{'rank':>4}  {'metric':<8} {'after warm-up':>14} {'last':>10} {'peak':>10}")
    for rank, row in result["ranks"].items():
        for k in ("fds", "threads", "children", "rss_mib"):
            v = row[k]
            base, last, peak = v["after_warmup"], v["last"], v["peak"]
            print(f"{rank:>4}  {k:<8} {base:>14.1f} {last:>10.1f} {peak:>10.1f}")
    verdict = "GREW: " + "; ".join(result["grew"]) if result["grew"] else "nothing grew"
    print(verdict)
    for e in result["errors"]:
        print("ERROR:", e)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--warmup", type=int, default=2, help="epochs before the baseline sample")
    p.add_argument("--dataset", help="dataset URL (default: a private store and a new dataset)")
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--per-shard", type=int, default=64)
    p.add_argument("--side", type=int, default=64, help="stored image side in pixels")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--py-workers", type=int, default=1)
    p.add_argument("--capacity", default="1GiB")
    p.add_argument("--cache-dir")
    p.add_argument("--fd-tolerance", type=int, default=2)
    p.add_argument("--thread-tolerance", type=int, default=2)
    p.add_argument("--rss-tolerance-mib", type=float, default=48.0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole soak")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("processes", "epochs", "shards", "per_shard", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.warmup < args.epochs:
        p.error(f"--warmup must be in [0, epochs={args.epochs})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.child:
        return _child(args)
    tmp = tempfile.mkdtemp(prefix="ffsoak-", dir="/tmp")
    store = None
    try:
        if args.dataset is None:
            store = start_store(tmp, bucket="soak", export_env=True)
            args.dataset = "s3://soak/ds"
            side, shards, per_shard = args.side, args.shards, args.per_shard
            noise_jpeg_dataset(args.dataset, shards=shards, per_shard=per_shard, height=side,
                               width=side, quality=85)  # fmt: skip
        elif "://" not in args.dataset:  # the children run from the repository root
            args.dataset = os.path.abspath(args.dataset)
        cache_dir = args.cache_dir or os.path.join(tmp, "cache")
        base = module_command(
            "benchmarks.stages.soak", "--child", "--cache-dir", os.path.abspath(cache_dir)
        )
        for name in ("processes", "epochs", "dataset", "image_size", "batch_size", "py_workers",
                     "capacity"):  # fmt: skip
            base += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        t0 = time.monotonic()
        procs = [
            subprocess.Popen([*base, "--rank", str(r)], stdout=subprocess.PIPE, text=True, cwd=REPO)
            for r in range(args.processes)
        ]
        lines: list[dict[str, Any]] = []
        codes = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            codes.append(p.returncode)
            lines += [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        result = judge(lines, args)
        result["seconds"] = time.monotonic() - t0
        result["exit_codes"] = codes
        result["samples"] = thin(lines, args.epochs)
        result["errors"] += [f"rank {r} exited {c}" for r, c in enumerate(codes) if c != 0]
        _print_table(result)
        if args.out:
            write_json(args.out, result)
        return 1 if result["grew"] or result["errors"] else 0
    finally:
        if store is not None:
            store.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

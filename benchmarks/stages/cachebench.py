"""Cache benchmark: the node cache against the physical limits measured in the same run.

  cold warm-up   ``warm`` into an empty cache from a private SeaweedFS server, vs raw
                 parallel GETs of the same objects through s3fs (same ranges, same
                 concurrency, bytes dropped on arrival: no disk, no checksum); its limit is
                 the same GETs through the fill's own reader, bytes dropped; rounds
                 interleaved
  hit path       ``cache.get`` + reading the file, vs reading the same files directly
  single flight  8 processes ask for one shard at once: how many downloads
  eviction       hit rate of plan-aware (Belady on the plan's order) vs LRU at 50% and 75%
                 of the dataset over 3 epochs, with Belady's optimum

Prints a table and writes JSON. Not a timed test: run it by hand.

    python -m benchmarks.stages.cachebench --shards 12 --shard-size 32MiB --out .bench/cache.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.harness.datasets import random_dataset
from benchmarks.harness.results import write_json
from benchmarks.harness.store import start_store
from benchmarks.stages.limits import ranged_get  # the GETs of a fill, bytes dropped
from flashfeed import Dataset, Manifest, commit_manifest, storage
from flashfeed.cache import ShardCache
from flashfeed.cache.fetch.ranged import split_ranges
from flashfeed.cache.options import CacheOptions
from flashfeed.cache.policy import belady_hits, lru_hits
from flashfeed.cache.stats import read_persisted
from flashfeed.cache.warm.warm import warm
from flashfeed.plan.plan import PlanOptions, Topology, node_shard_order
from flashfeed.shardio import shard_name, write_tar_shard
from flashfeed.units import parse_size


def raw_parallel_get(
    ds: Dataset,
    opts: dict[str, Any],
    concurrency: int,
    part_size: int,
    write_to: str | None,
    *,
    lean: bool = False,
) -> float:
    """GB/s of the same ranged GETs the cache makes through s3fs (flashfeed's storage
    layer): data dropped on arrival, or only written to plain files in ``write_to`` (no
    checksum, no locks, no rename). ``lean``: through the fill's own reader instead, bytes
    dropped (the GET limit of a warm-up: a fill makes these GETs and more)."""
    jobs = []
    fds = []
    if write_to:
        shutil.rmtree(write_to, ignore_errors=True)
        os.makedirs(write_to)
    for i, info in enumerate(ds.shards):
        fs, path = storage.filesystem(ds.shard_url(i), opts)
        fd = os.open(os.path.join(write_to, str(i)), os.O_WRONLY | os.O_CREAT) if write_to else -1
        fds.append(fd)
        jobs += [(fs, path, lo, hi, fd) for lo, hi in split_ranges(info.bytes, part_size)]

    def one(job: tuple[Any, str, int, int, int]) -> int:
        fs, path, lo, hi, fd = job
        data = fs.cat_file(path, start=lo, end=hi)
        if fd >= 0:
            os.pwrite(fd, data, lo)
        return len(data)

    if lean:  # the GETs a fill makes, through its own reader, bytes dropped
        get = ranged_get(concurrency)
        one = lambda job: get(job[:4])  # noqa: E731

    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        got = sum(pool.map(one, jobs))
    secs = time.perf_counter() - t
    for fd in fds:
        if fd >= 0:
            os.close(fd)
    if write_to:
        shutil.rmtree(write_to, ignore_errors=True)
    assert got == ds.manifest.num_bytes
    return got / secs / 1e9


def cold_warm(ds: Dataset, opts: dict[str, Any], root: str, concurrency: int, part: int) -> float:
    shutil.rmtree(root, ignore_errors=True)
    t = time.perf_counter()
    with ShardCache(
        root,
        capacity=2 * ds.manifest.num_bytes,
        storage_options=opts,
        concurrency=concurrency,
        part_size=part,
    ) as cache:
        result = warm(cache, ds, list(range(len(ds.shards))), progress=False)
    secs = time.perf_counter() - t
    assert result.ok and result.fetched == len(ds.shards)
    return ds.manifest.num_bytes / secs / 1e9


def read_file(path: str, buf: bytearray) -> int:
    with open(path, "rb", buffering=0) as f:
        n = total = 0
        view = memoryview(buf)
        while n := f.readinto(view):
            total += n
        return total


def hit_path(ds: Dataset, opts: dict[str, Any], root: str, rounds: int) -> dict[str, float]:
    cache = ShardCache(root, capacity=2 * ds.manifest.num_bytes, storage_options=opts)
    paths = [cache.get(ds, i) for i in range(len(ds.shards))]  # verified once: the hit path
    buf = bytearray(max(s.bytes for s in ds.shards))
    total = ds.manifest.num_bytes
    plain, cached = [], []

    def read_plain() -> None:
        t = time.perf_counter()
        assert sum(read_file(p, buf) for p in paths) == total
        plain.append(total / (time.perf_counter() - t) / 1e9)

    def read_cached() -> None:
        t = time.perf_counter()
        assert sum(read_file(cache.get(ds, i), buf) for i in range(len(paths))) == total
        cached.append(total / (time.perf_counter() - t) / 1e9)

    for r in range(rounds):  # the order alternates: neither read always goes first
        for run in (read_plain, read_cached) if r % 2 == 0 else (read_cached, read_plain):
            run()
    cache.close()
    fresh = ShardCache(root, capacity=2 * ds.manifest.num_bytes, storage_options=opts)
    t = time.perf_counter()
    assert sum(read_file(fresh.get(ds, i), buf) for i in range(len(paths))) == total
    first = total / (time.perf_counter() - t) / 1e9
    fresh.close()
    return {
        "plain_gbps": statistics.median(plain),
        "plain_best_gbps": max(plain),
        "plain_rounds_gbps": plain,
        "cache_rounds_gbps": cached,
        "cache_gbps": statistics.median(cached),
        "first_get_in_process_gbps": first,
    }


WORKER = """
import os, sys, time
from flashfeed import Dataset
from flashfeed.cache import ShardCache
from flashfeed.cache.options import CacheOptions
root, url, barrier = sys.argv[1:4]
ds = Dataset.open(url)
cache = ShardCache(root, capacity="4GiB", part_size="4MiB")
while not os.path.exists(barrier):
    time.sleep(0.002)
cache.get(ds, 0)
cache.close()
"""


def single_flight(ds: Dataset, env: dict[str, str], work: str, procs: int) -> dict[str, Any]:
    root = os.path.join(work, "sf-cache")
    barrier = os.path.join(work, "sf-go")
    argv = [sys.executable, "-c", WORKER, root, ds.url, barrier]
    ps = [subprocess.Popen(argv, env={**os.environ, **env}) for _ in range(procs)]
    time.sleep(3.0)
    open(barrier, "w").close()
    rcs = [p.wait() for p in ps]
    s = read_persisted(root)
    return {
        "processes": procs,
        "ok": rcs.count(0),
        "downloads": s["misses"],
        "bytes_fetched": s["bytes_fetched"],
        "shard_bytes": ds.shards[0].bytes,
        "waited_for_another": s["shared_waits"],
    }


def eviction(
    work: str, shards: int, epochs: int, fractions: tuple[float, ...] = (0.5, 0.75)
) -> list[dict[str, Any]]:
    """Hit rates of the real ShardCache on a local dataset: LRU vs the plan's order, at each
    capacity given as a fraction of the dataset."""
    prefix = os.path.join(work, "evict-ds")
    infos = []
    for i in range(shards):
        samples = [(f"s{i:04d}-{j:04d}", {"bin": bytes([i % 256]) * 16000}) for j in range(4)]
        infos.append(write_tar_shard(prefix, shard_name(i, "tar"), samples))
    m = Manifest(name="ev", shard_format="webdataset", schema={"bin": "bytes"}, shards=tuple(infos))
    commit_manifest(prefix, m)
    ds = Dataset.open(prefix)
    order = node_shard_order(
        [s.samples for s in ds.shards],
        options=PlanOptions(),
        epochs=range(epochs),
        topology=Topology(),
    )
    entry = ds.shards[0].bytes + len(storage.read_bytes(ds.index_url(0)))
    rows = []
    for fraction in fractions:
        slots = max(1, int(shards * fraction))
        hits = {}
        for mode in ("lru", "plan"):
            root = os.path.join(work, f"ev-{mode}-{fraction}")
            with ShardCache(root, capacity=slots * entry) as cache:
                if mode == "plan":
                    cache.set_future(ds, order)
                for i in order:
                    cache.get(ds, i)
                hits[mode] = cache.stats()["hits"]
        n = len(order)
        rows.append(
            {
                "capacity": fraction,
                "slots": slots,
                "reads": n,
                "lru": hits["lru"] / n,
                "plan_aware": hits["plan"] / n,
                "optimum": belady_hits(order, slots) / n,
                "lru_simulated": lru_hits(order, slots) / n,
                "ratio_vs_lru": hits["plan"] / max(1, hits["lru"]),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shards", type=int, default=12)
    ap.add_argument("--shard-size", default="32MiB")
    defaults = CacheOptions.__dataclass_fields__
    ap.add_argument("--part-size", default=str(defaults["part_size"].default))
    ap.add_argument("--concurrency", type=int, default=int(defaults["concurrency"].default))  # type: ignore[call-overload]
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/cache.json")
    ap.add_argument(
        "--cache-parent", default="/tmp", help="file system for the cache (default /tmp)"
    )
    args = ap.parse_args()
    size, part = parse_size(args.shard_size), parse_size(args.part_size)
    work = tempfile.mkdtemp(prefix="ffcb-", dir="/tmp")
    bs = start_store(work, bucket="flashfeed")
    disk = ""
    out: dict[str, Any] = {"config": vars(args), "machine": {"cpus": os.cpu_count()}}
    try:
        opts = bs.opts
        t = time.perf_counter()
        ds = random_dataset("s3://flashfeed/bench", args.shards, size, storage_options=opts)
        secs = time.perf_counter() - t
        print(
            f"dataset: {args.shards} x {args.shard_size} uploaded in {secs:.1f}s", file=sys.stderr
        )
        raw, raw_write, lean, cold = [], [], [], []
        disk = tempfile.mkdtemp(prefix="ffcb-disk-", dir=args.cache_parent)
        root = os.path.join(disk, "cache")
        raw_parallel_get(ds, opts, args.concurrency, part, None)  # connections, server caches
        runs = {
            "raw": (raw, lambda: raw_parallel_get(ds, opts, args.concurrency, part, None)),
            "raw+write": (
                raw_write,
                lambda: raw_parallel_get(
                    ds, opts, args.concurrency, part, os.path.join(disk, "raw")
                ),
            ),
            "raw-lean": (
                lean,
                lambda: raw_parallel_get(ds, opts, args.concurrency, part, None, lean=True),
            ),
            "warm": (cold, lambda: cold_warm(ds, opts, root, args.concurrency, part)),
        }
        for r in range(args.rounds):
            names = list(runs)
            for name in names[r % 4 :] + names[: r % 4]:  # the order rotates each round
                got, measure = runs[name]
                got.append(measure())
            print(
                f"round {r}: raw GET {raw[-1]:.2f} GB/s, raw GET + write {raw_write[-1]:.2f} "
                f"GB/s, fill's reader {lean[-1]:.2f} GB/s, cold warm {cold[-1]:.2f} GB/s",
                file=sys.stderr,
            )
        out["cold"] = {
            "cache_parent": args.cache_parent,
            "raw_gbps": raw,
            "raw_write_gbps": raw_write,
            "lean_gbps": lean,
            "warm_gbps": cold,
            "raw_median": statistics.median(raw),
            "raw_write_median": statistics.median(raw_write),
            "warm_median": statistics.median(cold),
            "ratio_per_round_median": statistics.median(
                [w / r for w, r in zip(cold, raw, strict=True)]
            ),
        }
        out["hit"] = hit_path(ds, opts, root, rounds=5)
        out["single_flight"] = single_flight(ds, bs.env, work, 8)
        out["eviction"] = eviction(work, shards=40, epochs=3)
    finally:
        bs.stop()
        shutil.rmtree(work, ignore_errors=True)
        if disk:
            shutil.rmtree(disk, ignore_errors=True)
    c, h, s = out["cold"], out["hit"], out["single_flight"]
    rows = [
        (
            "cold warm-up from S3 (GB/s)",
            c["warm_median"],
            c["raw_median"],
            "raw parallel GET",
            0.90,
        ),
        (
            "cold warm-up from S3 (GB/s)",
            c["warm_median"],
            c["raw_write_median"],
            "raw GET + write",
            None,
        ),
        ("hit path: get + read (GB/s)", h["cache_gbps"], h["plain_gbps"], "plain file read", 0.95),
        (
            "first get in a process, verifies (GB/s)",
            h["first_get_in_process_gbps"],
            h["plain_gbps"],
            "plain file read",
            None,
        ),
    ]
    print(
        f"\n{'measure':44} {'flashfeed':>10} {'reference':>10}  {'ratio':>6}  target  reference is"
    )
    for name, mine, ref, what, target in rows:
        tgt = f">={target:.2f}" if target else "  -  "
        print(f"{name:44} {mine:10.2f} {ref:10.2f}  {mine / ref:6.2f}  {tgt}  {what}")
    print(
        f"{'cold warm / raw GET, median of per-round ratios':44} {'':10} {'':10}  "
        f"{c['ratio_per_round_median']:6.2f}  >=0.90"
    )
    print(
        f"{'8 processes, one shard: downloads':44} {s['downloads']:10d} {1:10d}  {'':6}  ==1"
        f"     ({s['waited_for_another']} waited, {s['ok']}/8 ok)"
    )
    head = f"{'LRU':>7} {'plan-aware':>11} {'optimum':>8} {'plan/LRU':>9}  target"
    print(f"\n{'hit rate over 3 epochs':24} {head}")
    for e in out["eviction"]:
        name = f"capacity {e['capacity']:.0%} of dataset"
        print(
            f"{name:24} {e['lru']:7.1%} {e['plan_aware']:11.1%} {e['optimum']:8.1%} "
            f"{e['ratio_vs_lru']:9.2f}  >=1.50"
        )
    write_json(args.out, out)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

"""What planning costs, and what plan-aware eviction buys, at sizes no corpus here reaches:

  plan cost       for 1,000 / 10,000 / 100,000 shards: manifest commit, ``Dataset.open``
                  (read + parse + check), ``plan_epoch`` for one epoch of a 64-rank job and
                  ``node_shard_order`` (what ``cache warm`` and eviction use) for one node
  eviction curve  hit rate of the real ``ShardCache`` over 3 epochs of the plan's order at
                  10-100% of the dataset: plan-aware (``set_future``) vs LRU vs Belady's optimum

Prints a table and writes JSON.

    python benchmarks/planbench.py --shards 1000,10000,100000 --out .bench/plan.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["eviction_curve", "plan_cost"]

_CHECKSUM = "xxh3_128:" + "0" * 32


def plan_cost(
    shards: int, *, samples_per_shard: int = 100, world_size: int = 64, ranks_per_node: int = 8
) -> dict[str, float]:
    """Seconds to commit, open and plan a dataset of ``shards`` shards (no shard bytes)."""
    from flashfeed import Dataset, Manifest, commit_manifest
    from flashfeed.manifest import ShardInfo
    from flashfeed.plan import node_shard_order, plan_epoch

    work = tempfile.mkdtemp(prefix="ffplan-", dir="/tmp")
    try:
        infos = tuple(
            ShardInfo(
                f"shards/{i:06d}.tar",
                samples_per_shard,
                64 << 20,
                _CHECKSUM,
                f"shards/{i:06d}.tar.idx",
            )
            for i in range(shards)
        )
        m = Manifest(name="plan", shard_format="webdataset", schema={"jpg": "image"}, shards=infos)
        t0 = time.perf_counter()
        commit_manifest(work, m)
        t1 = time.perf_counter()
        ds = Dataset.open(work)
        sizes = [s.samples for s in ds.shards]
        t2 = time.perf_counter()
        plan = plan_epoch(
            sizes, seed=0, epoch=0, world_size=world_size, ranks_per_node=ranks_per_node
        )
        t3 = time.perf_counter()
        order = node_shard_order(
            sizes, seed=0, epochs=[0], world_size=world_size, ranks_per_node=ranks_per_node
        )
        t4 = time.perf_counter()
        return {
            "shards": shards,
            "samples": shards * samples_per_shard,
            "world_size": world_size,
            "manifest_mb": os.path.getsize(os.path.join(work, "manifest.json")) / 1e6,
            "commit_s": t1 - t0,
            "open_s": t2 - t1,
            "plan_epoch_s": t3 - t2,
            "node_shard_order_s": t4 - t3,
            "open_plus_plan_s": t4 - t1,
            "samples_per_rank": plan.samples_per_rank,
            "node_shards": len(order),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def eviction_curve(
    *, shards: int = 40, epochs: int = 3, fractions: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9)
) -> list[dict[str, Any]]:
    """Hit rates at each capacity (fraction of the dataset) over ``epochs`` epochs."""
    from cache import eviction  # the cache benchmark's measurement, at more capacities

    work = tempfile.mkdtemp(prefix="ffevict-", dir="/tmp")
    try:
        return eviction(work, shards, epochs, fractions)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", default="1000,10000,100000")
    p.add_argument("--samples-per-shard", type=int, default=100)
    p.add_argument("--out", default=".bench/plan.json")
    args = p.parse_args(argv)
    costs = [
        plan_cost(int(n), samples_per_shard=args.samples_per_shard) for n in args.shards.split(",")
    ]
    print(
        f"{'shards':>8} {'samples':>11} {'manifest':>9} {'open':>7} {'plan_epoch':>10}"
        f" {'node order':>10} {'open+plan':>10}"
    )
    for c in costs:
        print(
            f"{c['shards']:8d} {c['samples']:11d} {c['manifest_mb']:7.1f}MB {c['open_s']:6.2f}s"
            f" {c['plan_epoch_s']:9.2f}s {c['node_shard_order_s']:9.2f}s"
            f" {c['open_plus_plan_s']:9.2f}s"
        )
    curve = eviction_curve()
    print(f"\n{'capacity':>8} {'LRU':>6} {'plan-aware':>10} {'optimum':>8}")
    for r in curve:
        print(f"{r['capacity']:8.0%} {r['lru']:6.1%} {r['plan_aware']:10.1%} {r['optimum']:8.1%}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"plan_cost": costs, "eviction": curve}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

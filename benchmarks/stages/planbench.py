"""What planning costs, and what plan-aware eviction buys, at sizes no corpus here reaches:

  plan cost       for 10,000 / 100,000 / 1,000,000 shards: manifest commit, ``Dataset.open``
                  (header + columnar shard table), one rank's epoch plan (``rank_plan``), one
                  node's warm order (``node_shard_order``), that rank's plan after an elastic
                  change at mid-epoch, and, where it fits in memory, the whole-epoch plan
                  (``plan_epoch``: every rank's sequence, which every rank computed before
                  planning became rank-local)
  --scale         the design point alone, in a fresh process: 10^6 shards x 1,000 samples
                  (10^9 samples), 8,192 ranks, 8 per node; one JSON line with ``--json``
  --mixture       the same design point as a mixture: 100 sources of 10^4 shards x 1,000
                  samples (10^9 samples, 10^6 shards), weights 1..7, 8,192 ranks, 8 per node:
                  one rank's mixture plan, one node's warm order, the elastic re-split to
                  6,144 ranks at mid-epoch; the same JSON keys as ``--scale``
  eviction curve  hit rate of the real ``ShardCache`` over 3 epochs of the plan's order at
                  10-100% of the dataset: plan-aware (``set_future``) vs LRU vs Belady's optimum

Prints a table and writes JSON.

    python -m benchmarks.stages.planbench --shards 10000,100000,1000000 --out .bench/plan.json
    python -m benchmarks.stages.planbench --scale --json
    python -m benchmarks.stages.planbench --mixture --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness.child import REPO, module_command
from benchmarks.harness.results import write_json

__all__ = ["eviction_curve", "mixture_scale", "plan_cost"]

#: the whole-epoch plan holds every rank's sample ids: past this many samples it does not fit
WHOLE_EPOCH_LIMIT = 200_000_000


def _peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM belongs to the process image; getrusage's
    maximum survives fork and exec, so a child would report its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plan_cost(
    shards: int,
    *,
    samples_per_shard: int = 1000,
    world_size: int = 8192,
    ranks_per_node: int = 8,
    new_world_size: int = 6144,
    whole_epoch: bool = True,
) -> dict[str, Any]:
    """Seconds to commit, open and plan a dataset of ``shards`` shards (no shard bytes)."""
    from flashfeed import Dataset, Manifest, commit_manifest
    from flashfeed.format.shardtable import synthetic_shard_table
    from flashfeed.plan.plan import PlanOptions, Segment, Topology, node_shard_order, plan_epoch
    from flashfeed.plan.plan import rank_plan as plan_rank

    work = tempfile.mkdtemp(prefix="ffplan-", dir="/tmp")
    options, topology = PlanOptions(seed=0), Topology(world_size, ranks_per_node)
    rank = (world_size // 2 + 3) % min(world_size, new_world_size)  # mid-job, not node 0
    try:
        table = synthetic_shard_table(shards, samples_per_shard=samples_per_shard)
        m = Manifest(name="plan", shard_format="webdataset", schema={"jpg": "image"}, shards=table)
        t0 = time.perf_counter()
        commit_manifest(work, m)
        t1 = time.perf_counter()
        ds = Dataset.open(work)
        sizes = ds.manifest.shard_samples
        t2 = time.perf_counter()
        mine = plan_rank(sizes, options=options, epoch=0, topology=topology, rank=rank)
        t3 = time.perf_counter()
        order = node_shard_order(
            sizes,
            options=options,
            epochs=[0],
            topology=topology,
            node_rank=topology.node_of(rank),
        )
        t4 = time.perf_counter()
        half = Segment(world_size, ranks_per_node, len(mine.samples) // 2)
        new = Topology(new_world_size, ranks_per_node)
        after = plan_rank(sizes, options=options, epoch=0, topology=new, rank=rank, segments=[half])
        t5 = time.perf_counter()
        out: dict[str, Any] = {
            "shards": shards,
            "samples": int(sizes.sum()),
            "world_size": world_size,
            "ranks_per_node": ranks_per_node,
            "manifest_mb": sum(os.path.getsize(os.path.join(work, f)) for f in os.listdir(work))
            / 1e6,
            "commit_s": t1 - t0,
            "open_s": t2 - t1,
            "rank_plan_s": t3 - t2,
            "node_order_s": t4 - t3,
            "resplit_s": t5 - t4,
            "samples_per_rank": len(mine.samples),
            "samples_per_rank_after_resplit": len(after.samples),
            "node_shards": len(order),
            "whole_epoch_s": None,
        }
        if whole_epoch and int(sizes.sum()) <= WHOLE_EPOCH_LIMIT:
            t6 = time.perf_counter()
            everything = plan_epoch(sizes, options=options, epoch=0, topology=topology)
            out["whole_epoch_s"] = time.perf_counter() - t6
            assert (everything.per_rank[rank] == mine.samples).all()
            del everything
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scale() -> dict[str, Any]:
    """The design point, measured in this process: its peak RSS is the whole process's."""
    cost = plan_cost(1_000_000, whole_epoch=False)
    keys = ("shards", "samples", "world_size", "ranks_per_node", "open_s", "rank_plan_s")
    out = {k: cost[k] for k in keys}
    out["node_order_s"] = cost["node_order_s"]
    out["resplit_s"] = cost["resplit_s"]
    out["peak_rss_mib"] = round(_peak_rss_mib(), 1)
    return out


def mixture_scale(
    sources: int = 100,
    shards_per_source: int = 10_000,
    *,
    world_size: int = 8192,
    ranks_per_node: int = 8,
    new_world_size: int = 6144,
) -> dict[str, Any]:
    """The design point as a mixture of ``sources`` datasets, measured in this process."""
    from flashfeed import Dataset, Manifest, commit_manifest
    from flashfeed.format.shardtable import synthetic_shard_table
    from flashfeed.plan.mixplan import MixPlanner, SourceTable
    from flashfeed.plan.mixture import Mixture, Source
    from flashfeed.plan.plan import PlanOptions, Topology

    work = tempfile.mkdtemp(prefix="ffmix-", dir="/tmp")
    topology = Topology(world_size, ranks_per_node)
    rank = (world_size // 2 + 3) % min(world_size, new_world_size)
    try:
        urls = []
        for i in range(sources):
            url = os.path.join(work, f"src{i:03d}")
            # distinct shard bytes: distinct datasets (digests), as a real mixture has
            table = synthetic_shard_table(shards_per_source, shard_bytes=(1 << 20) + i)
            schema = {"jpg": "image"}
            commit_manifest(url, Manifest(name=f"s{i}", shard_format="webdataset",
                                          schema=schema, shards=table))  # fmt: skip
            urls.append(url)
        mix = Mixture(tuple(Source(u, 1 + i % 7) for i, u in enumerate(urls)))
        t0 = time.perf_counter()
        tables = []
        for s in mix.sources:
            m = Dataset.open(s.url).manifest
            tables.append(SourceTable(s.key, m.digest, m.shard_samples))
        t1 = time.perf_counter()
        planner = MixPlanner(mix, tables, PlanOptions(seed=0))
        start = planner.start(0, topology)
        mine = planner.rank_plan(start, rank)
        t2 = time.perf_counter()
        order = planner.node_shard_order(start, topology.node_of(rank))
        t3 = time.perf_counter()
        # a restarted job on fewer ranks: a fresh planner (no memo), the saved counts
        half = replace(start, consumed=len(mine.samples) // 2)
        counts = planner.counts(half)
        again = MixPlanner(mix, tables, PlanOptions(seed=0))
        t4 = time.perf_counter()
        moved = again.settle(half, counts, Topology(new_world_size, ranks_per_node))
        after = again.rank_plan(moved, rank)
        t5 = time.perf_counter()
        return {
            "shards": int(planner.shard_offsets[-1]),
            "samples": int(planner.offsets[-1]),
            "world_size": world_size,
            "ranks_per_node": ranks_per_node,
            "open_s": t1 - t0,
            "rank_plan_s": t2 - t1,
            "node_order_s": t3 - t2,
            "resplit_s": t5 - t4,
            "peak_rss_mib": round(_peak_rss_mib(), 1),
            "sources": sources,
            "samples_per_rank": len(mine.samples),
            "samples_per_rank_after_resplit": len(after.samples),
            "node_shards": len(order),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def loader_start(shards: int = 1_000_000) -> dict[str, Any]:
    """Seconds to construct a ``Loader`` for one rank of 8,192 on a local ``shards``-shard
    manifest and ask its length (its plan); importing torch and DALI is timed apart."""
    from flashfeed import Manifest, commit_manifest
    from flashfeed.format.shardtable import synthetic_shard_table

    work = tempfile.mkdtemp(prefix="ffstart-", dir="/tmp")
    try:
        table = synthetic_shard_table(shards, samples_per_shard=1000)
        schema = {"jpg": "image/jpeg", "cls": "label"}
        commit_manifest(
            work, Manifest(name="s", shard_format="webdataset", schema=schema, shards=table)
        )
        t0 = time.perf_counter()
        import nvidia.dali  # noqa: F401

        from flashfeed.loader import Loader

        t1 = time.perf_counter()
        loader = Loader(work, batch_size=64, rank=4099, world_size=8192, ranks_per_node=8)
        batches = len(loader)
        t2 = time.perf_counter()
        loader.close()
        return {"shards": shards, "import_s": t1 - t0, "loader_start_s": t2 - t1,
                "batches": batches}  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fresh(flag: str) -> dict[str, Any]:
    cmd = module_command("benchmarks.stages.planbench", flag, "--json")
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if run.returncode:
        raise RuntimeError(f"planbench {flag} failed: {run.stderr.strip()[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def eviction_curve(
    *, shards: int = 40, epochs: int = 3, fractions: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9)
) -> list[dict[str, Any]]:
    """Hit rates at each capacity (fraction of the dataset) over ``epochs`` epochs."""
    from benchmarks.stages.cachebench import (
        eviction,  # the cache benchmark's measurement, at more capacities
    )

    work = tempfile.mkdtemp(prefix="ffevict-", dir="/tmp")
    try:
        return eviction(work, shards, epochs, fractions)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scaling_plot(costs: list[dict[str, Any]], path: Path) -> None:
    """Seconds against shards, log-log: the rank-local plan and the whole-epoch plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    shards = [c["shards"] for c in costs]
    series = (
        ("rank_plan_s", "one rank's plan"),
        ("node_order_s", "one node's warm order"),
        ("resplit_s", "re-split 8,192 -> 6,144 ranks"),
        ("open_s", "open the manifest"),
    )
    for key, label in series:
        ax.plot(shards, [c[key] for c in costs], marker="o", label=label)
    whole = [(c["shards"], c["whole_epoch_s"]) for c in costs if c.get("whole_epoch_s")]
    if whole:
        ax.plot(*zip(*whole, strict=True), marker="s", ls="--", label="whole-epoch plan")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("shards (1,000 samples each), 8,192 ranks")
    ax.set_ylabel("seconds")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", default="10000,100000,1000000", help="shard counts to plan")
    p.add_argument("--samples-per-shard", type=int, default=1000)
    p.add_argument(
        "--scale", action="store_true", help="only the 10^9-sample design point, this process"
    )
    p.add_argument(
        "--loader-start",
        action="store_true",
        help="only a Loader's construction for one rank of 8,192 on 10^6 shards",
    )
    p.add_argument(
        "--mixture",
        action="store_true",
        help="only the design point as a 100-source mixture, this process",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line, nothing else")
    p.add_argument("--out", default=".bench/plan.json", help="where to write the JSON results")
    args = p.parse_args(argv)
    if args.scale or args.loader_start or args.mixture:
        result = scale() if args.scale else mixture_scale() if args.mixture else loader_start()
        if args.json:
            print(json.dumps(result))
        else:
            for k, v in result.items():
                print(f"{k:>16} {v}")
        return 0
    costs = [
        plan_cost(int(n), samples_per_shard=args.samples_per_shard) for n in args.shards.split(",")
    ]
    print(
        f"{'shards':>9} {'samples':>13} {'open':>7} {'rank plan':>9} {'node order':>10}"
        f" {'resplit':>8} {'whole epoch':>11}"
    )
    for c in costs:
        whole = "no fit" if c["whole_epoch_s"] is None else f"{c['whole_epoch_s']:10.2f}s"
        print(
            f"{c['shards']:9d} {c['samples']:13d} {c['open_s']:6.2f}s {c['rank_plan_s']:8.2f}s"
            f" {c['node_order_s']:9.2f}s {c['resplit_s']:7.2f}s {whole:>11}"
        )
    design = _fresh("--scale")
    print(f"\ndesign point, fresh process: {json.dumps(design)}")
    mixture = _fresh("--mixture")
    print(f"design point as a 100-source mixture, fresh process: {json.dumps(mixture)}")
    start = _fresh("--loader-start")
    print(f"loader start-up, fresh process: {json.dumps(start)}")
    curve = eviction_curve()
    print(f"\n{'capacity':>8} {'LRU':>6} {'plan-aware':>10} {'optimum':>8}")
    for r in curve:
        print(f"{r['capacity']:8.0%} {r['lru']:6.1%} {r['plan_aware']:10.1%} {r['optimum']:8.1%}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    scaling_plot(costs, Path(args.out).with_suffix(".png"))
    write_json(
        args.out,
        {
            "plan_cost": costs,
            "scale": design,
            "mixture": mixture,
            "loader_start": start,
            "eviction": curve,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

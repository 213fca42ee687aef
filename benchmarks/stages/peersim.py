"""The cluster tier at scale, on paper: store bytes and cold-start time for a 1,000-node job
and a 64-run sweep, with and without the tier, from the plan's real shard orders.

No processes: each node's shards come from ``NodeShare.order`` (the plan warm and the
loaders use), the tier's transfers from ``place`` (who reads each shard from the store, who
copies it from whom). Times follow a bottleneck model at a stated bandwidth: the store's
aggregate ``--store-gbps`` shared by every node, each node's NIC ``--node-gbps`` in and out;
a cold start lasts as long as its most loaded link:

  without the tier   store bytes / store bandwidth (and a node's own bytes / its NIC)
  with the tier      max(store bytes / store bandwidth, the busiest node's bytes in or
                     out / its NIC)

Scenarios: the first epoch of a 1,000-node job (each shard read by one node); an elastic
re-split of that job to 999 nodes (the survivors' caches hold the old shares); a 64-run
sweep of 8 nodes each (512 nodes, every shard read by 64 nodes). And the announcements: the
bytes of what a node holds at 1,000 nodes and a million shards.

    python -m benchmarks.stages.peersim --out .bench/peersim.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks.harness.results import write_json
from flashfeed.cache.peer.announce import encoded_size
from flashfeed.cache.peer.placement import place
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.plan.plan import node_shard_order


def orders(shards: int, nodes: int, seed: int, tag: str) -> dict[str, list[int]]:
    share = NodeShare.build(node_rank=0, num_nodes=nodes, seed=seed)
    sizes = [1] * shards
    return {
        f"{tag}{r}": list(
            dict.fromkeys(
                node_shard_order(
                    sizes,
                    options=share.options,
                    epochs=range(1),
                    topology=share.topology,
                    node_rank=r,
                )
            )
        )
        for r in range(nodes)
    }


def model(
    needs: dict[str, list[int]],
    held: dict[str, list[int]],
    shard_bytes: float,
    store_bw: float,
    node_bw: float,
    max_serving: int,
) -> dict[str, Any]:
    """Store bytes and seconds of a cold start, without and with the tier."""
    holding = {n: set(h) for n, h in held.items()}
    alone = sum(len(set(o) - holding.get(n, set())) for n, o in needs.items()) * shard_bytes
    busiest_own = max(len(set(o) - holding.get(n, set())) for n, o in needs.items()) * shard_bytes
    t0 = time.perf_counter()
    p = place(needs, held, max_serving=max_serving)
    plan_s = time.perf_counter() - t0
    inbound: dict[str, float] = defaultdict(float)
    outbound: dict[str, float] = defaultdict(float)
    for c in p.copies:
        inbound[c.target] += shard_bytes
        outbound[c.source] += shard_bytes
    for node in p.store.values():
        inbound[node] += shard_bytes
    tier_store = len(p.store) * shard_bytes
    busiest = max([*inbound.values(), *outbound.values(), 0.0])
    today_s = max(alone / store_bw, busiest_own / node_bw)
    tier_s = max(tier_store / store_bw, busiest / node_bw)
    return {
        "nodes": len(needs),
        "store_bytes_today": alone,
        "store_bytes_tier": tier_store,
        "seconds_today": today_s,
        "seconds_tier": tier_s,
        "busiest_node_bytes": busiest,
        "copies": len(p.copies),
        "placement_seconds": plan_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--job-shards", type=int, default=100_000)
    p.add_argument("--sweep-shards", type=int, default=20_000)
    p.add_argument("--shard-mib", type=float, default=256)
    p.add_argument("--store-gbps", type=float, default=100.0, help="GB/s, all nodes together")
    p.add_argument("--node-gbps", type=float, default=12.5, help="GB/s per node (100 Gb/s)")
    p.add_argument("--max-serving", type=int, default=4)
    p.add_argument("--out", default=".bench/peersim.json")
    args = p.parse_args(argv)
    size = args.shard_mib * (1 << 20)
    store_bw, node_bw = args.store_gbps * 1e9, args.node_gbps * 1e9
    out: dict[str, Any] = {"args": vars(args)}

    job = orders(args.job_shards, 1000, 0, "n")
    out["job_first_epoch"] = model(job, {}, size, store_bw, node_bw, args.max_serving)
    resplit = orders(args.job_shards, 999, 0, "n")  # the same seed, one node fewer
    survivors = {n: o for n, o in job.items() if n != "n999"}
    out["job_resplit_999"] = model(resplit, survivors, size, store_bw, node_bw, args.max_serving)
    sweep: dict[str, list[int]] = {}
    for run in range(64):
        sweep.update(orders(args.sweep_shards, 8, run, f"r{run}n"))
    out["sweep_64x8"] = model(sweep, {}, size, store_bw, node_bw, args.max_serving)

    rng = np.random.default_rng(0)
    million = 1_000_000
    announce = {}
    for label, held in [
        ("job node, 1,000 of 1M shards", 1000),
        ("sweep node, 125,000 of 1M", 125_000),
    ]:
        announce[label] = encoded_size(rng.choice(million, held, replace=False), million)
    out["announcement_bytes"] = announce

    rows = [
        ("1,000-node job, first epoch", out["job_first_epoch"]),
        ("1,000 -> 999 nodes re-split", out["job_resplit_999"]),
        ("64-run sweep x 8 nodes", out["sweep_64x8"]),
    ]
    print(
        f"store {args.store_gbps} GB/s in all, node {args.node_gbps} GB/s, "
        f"shards of {args.shard_mib} MiB"
    )
    print("| scenario | nodes | store TB without | with | cold start s without | with | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        ratio = r["seconds_today"] / r["seconds_tier"] if r["seconds_tier"] else float("inf")
        print(
            f"| {name} | {r['nodes']} | {r['store_bytes_today'] / 1e12:.2f} | "
            f"{r['store_bytes_tier'] / 1e12:.2f} | {r['seconds_today']:.0f} | "
            f"{r['seconds_tier']:.0f} | {ratio:.1f}x |"
        )
    for label, n in announce.items():
        print(f"announcement, {label}: {n} bytes; 1,000 of them: {n * 1000 / 1e6:.1f} MB")
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

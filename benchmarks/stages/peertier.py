"""The cluster tier on simulated nodes: store bytes and warm times with and without peers.

Each node is a process on its own loopback address (127.0.0.N) with its own cache, serving
it to the others (``flashfeed.cache.peer.PeerNode``, driven by ``benchmarks/harness/peernode.py``).
Every node reaches the store through one throttling proxy (``benchmarks/harness/slowproxy.py``)
set to ``--store-mbps``: the store's bandwidth is the bottleneck, as at a few hundred nodes.
The proxy counts the shard bytes the store served. One run, three scenarios:

  sweep        4 jobs of one dataset (seeds 0-3), one node each, warm at once: store bytes
               over the dataset's, with the tier (``cache warm --sweep --local``'s
               ``warm_sweep``: one plan for all jobs, each node's warm against its node's
               cache) and without it (each node on its own, as today)
  replacement  after the sweep, a node is lost; its replacement warms its share from its
               peers, against a fresh node warming the same share from the throttled store
  cold-epoch   2 jobs x 2 nodes (every shard read by 2 nodes) start together and read
               their shares in need order: store bytes and the time of the slowest node

Prints a table and writes JSON. Not a timed test: run it by hand.

    python -m benchmarks.stages.peertier --out .bench/peertier.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.datasets import random_dataset
from benchmarks.harness.peercluster import Cluster, SimNode, assign_owners
from benchmarks.harness.results import write_json
from benchmarks.harness.slowproxy import SlowProxy
from benchmarks.harness.store import start_store
from flashfeed.cache.peer.sweep import parse_sweep
from flashfeed.cache.peer.sweepwarm import warm_sweep
from flashfeed.cache.warm.nodeshare import NodeShare

TOKEN = "flashfeed-peer-benchmark-token-0123456789"


def warm_all(nodes: list[SimNode], url: str, orders: dict[str, list[int]]) -> float:
    """Every node fetches its shards at once; seconds until the slowest is done."""
    start = time.perf_counter()
    for node in nodes:
        node.send({"fetch": url, "shards": orders[node.address]})
    for node in nodes:
        node.answer()
    return time.perf_counter() - start


def sweep_warm(root: Path, store_port: int, proxy: SlowProxy, url: str, size: int) -> dict:
    """The sweep's warm as ``cache warm --sweep FILE --local`` runs it: 4 jobs (seeds 0-3)
    of one node each, planned as one, each node's warm against its node's cache."""
    cluster = Cluster(root, store_port, proxy, "1MiB")
    nodes = [cluster.start() for _ in range(4)]
    cluster.connect(nodes)
    jobs = [{"name": f"seed{s}", "hosts": [n.address], "seed": s} for s, n in enumerate(nodes)]
    sweep = parse_sweep({"dataset": url, "jobs": jobs, "max_serving": 2})
    before = proxy.shard_bytes()
    start = time.perf_counter()
    results = warm_sweep(
        sweep,
        str(root / "{host}"),
        local=True,
        cache_kwargs={
            "part_size": "1MiB",
            "concurrency": 4,
            "storage_options": {"endpoint_url": proxy.endpoint},
        },
    )
    seconds = time.perf_counter() - start
    failed = [r for r in results if r.get("error") or r["failed"]]
    if failed:
        raise RuntimeError(f"the sweep's warm failed: {failed}")
    store_bytes = proxy.shard_bytes() - before
    served = {n.address: n.call({"stats": True})["served"] for n in nodes}
    result = {"seconds": seconds, "store_bytes": store_bytes, "store_x": store_bytes / size}
    result["nodes"] = [
        {
            "peer": r["peer"],
            "planned": r["planned"],
            "warm_bytes_from_store": r["peers"].get("bytes_from_store", 0),
            "warm_bytes_from_peers": r["peers"].get("bytes_from_peers", 0),
            "served_bytes": served[r["peer"]],
            "server_bytes_from_store": (r["server"] or {}).get("bytes_from_store", 0),
        }
        for r in results
    ]
    shares = {j["hosts"][0]: NodeShare.build(seed=j["seed"]) for j in jobs}
    return {"result": result, "cluster": cluster, "nodes": nodes, "shares": shares}


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ff-peertier-"))
    os.environ["FLASHFEED_PEER_TOKEN"] = TOKEN
    store = start_store(root / "s3", export_env=True)
    proxy = SlowProxy(("127.0.0.1", store.store.info.s3_port), rate=args.store_mbps * 1e6)
    out: dict[str, Any] = {"store_mbps": args.store_mbps}
    try:
        ds = random_dataset(
            f"{store.bucket}/peertier", args.shards, args.shard_mib << 20, per_shard=8
        )
        size = sum(s.bytes for s in ds.shards)
        out["dataset_bytes"] = size
        rate = args.store_mbps * 1e6
        print(
            f"dataset: {args.shards} shards, {size / 1e6:.0f} MB; store at {args.store_mbps} MB/s"
        )

        def scenario(name: str, peers: bool, shares: list[NodeShare], tag: str) -> dict[str, Any]:
            cluster = Cluster(root / f"{name}-{tag}", store.store.info.s3_port, proxy, "1MiB")
            nodes = [cluster.start(f"n{i}") for i in range(len(shares))]
            by_addr = {n.address: s for n, s in zip(nodes, shares, strict=True)}
            if peers:
                cluster.connect(nodes)
                assign_owners(nodes, ds, by_addr)
            orders = {a: s.order(ds) for a, s in by_addr.items()}
            before = proxy.shard_bytes()
            seconds = warm_all(nodes, ds.url, orders)
            result = {"seconds": seconds, "store_bytes": proxy.shard_bytes() - before}
            result["store_x"] = result["store_bytes"] / size
            return {"result": result, "cluster": cluster, "nodes": nodes, "shares": by_addr}

        sweep = [NodeShare.build(node_rank=0, num_nodes=1, seed=s) for s in range(4)]
        today = scenario("sweep", False, sweep, "today")
        today["cluster"].stop()
        tier = sweep_warm(root / "sweep-tier", store.store.info.s3_port, proxy, ds.url, size)
        out["sweep"] = {"today": today["result"], "tier": tier["result"]}

        # replacement: the last node is lost, a fresh one takes its place and its share
        cluster, nodes = tier["cluster"], tier["nodes"]
        lost = nodes[-1]
        share = tier["shares"][lost.address]
        lost.kill()
        fresh = cluster.start("replacement")
        cluster.connect([*nodes[:-1], fresh])
        before = proxy.shard_bytes()
        peer_s = warm_all([fresh], ds.url, {fresh.address: share.order(ds)})
        peer_store = proxy.shard_bytes() - before
        cluster.stop()
        alone = Cluster(root / "replacement-today", store.store.info.s3_port, proxy, "1MiB")
        solo = alone.start("solo")
        before = proxy.shard_bytes()
        store_s = warm_all([solo], ds.url, {solo.address: share.order(ds)})
        store_bytes = proxy.shard_bytes() - before
        alone.stop()
        out["replacement"] = {
            "from_peers": {"seconds": peer_s, "store_bytes": peer_store},
            "from_store": {"seconds": store_s, "store_bytes": store_bytes},
            "speedup": store_s / peer_s,
        }

        cold = [
            NodeShare.build(node_rank=r, num_nodes=2, seed=job) for job in (0, 1) for r in (0, 1)
        ]
        a = scenario("cold", False, cold, "today")
        a["cluster"].stop()
        b = scenario("cold", True, cold, "tier")
        b["cluster"].stop()
        out["cold_epoch"] = {"today": a["result"], "tier": b["result"]}
        out["bandwidth_bound_s"] = size / rate
    finally:
        proxy.close()
        store.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def table(out: dict[str, Any]) -> str:
    s, r, c = out["sweep"], out["replacement"], out["cold_epoch"]
    rows = [
        (
            "sweep 4 jobs x 1 node",
            "store bytes / dataset",
            s["today"]["store_x"],
            s["tier"]["store_x"],
        ),
        ("sweep 4 jobs x 1 node", "seconds", s["today"]["seconds"], s["tier"]["seconds"]),
        (
            "replacement node",
            "seconds to warm its share",
            r["from_store"]["seconds"],
            r["from_peers"]["seconds"],
        ),
        (
            "replacement node",
            "store bytes / dataset",
            r["from_store"]["store_bytes"] / out["dataset_bytes"],
            r["from_peers"]["store_bytes"] / out["dataset_bytes"],
        ),
        (
            "cold start 2 jobs x 2 nodes",
            "store bytes / dataset",
            c["today"]["store_x"],
            c["tier"]["store_x"],
        ),
        (
            "cold start 2 jobs x 2 nodes",
            "seconds (slowest node)",
            c["today"]["seconds"],
            c["tier"]["seconds"],
        ),
    ]
    lines = [
        "| scenario | measure | without the tier | with the tier | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for name, what, today, tier in rows:
        ratio = today / tier if tier else float("inf")
        lines.append(f"| {name} | {what} | {today:.2f} | {tier:.2f} | {ratio:.2f}x |")
    lines += [
        "",
        "sweep with the tier, per node (cache warm --sweep --local):",
        "| node | planned store reads | planned copies in | planned copies served | "
        "MB from store: warm + its server | warm MB from peers | MB its server served |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in s["tier"].get("nodes", []):
        p = n["planned"]
        lines.append(
            f"| {n['peer']} | {p['store_reads']} | {p['copies_in']} | {p['copies_served']} | "
            f"{n['warm_bytes_from_store'] / 1e6:.1f} + "
            f"{n.get('server_bytes_from_store', 0) / 1e6:.1f} | "
            f"{n['warm_bytes_from_peers'] / 1e6:.1f} | "
            f"{n['served_bytes'] / 1e6:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", type=int, default=24)
    p.add_argument("--shard-mib", type=int, default=2)
    p.add_argument("--store-mbps", type=float, default=16.0, help="the store's bandwidth, MB/s")
    p.add_argument("--out", default=".bench/peertier.json")
    args = p.parse_args(argv)
    out = run(args)
    print(table(out))
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

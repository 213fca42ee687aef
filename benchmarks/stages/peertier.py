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
  cold-epoch   2 jobs x 2 nodes (every shard read by 2 nodes) start together from empty
               caches, a training reader on each node reading its rank's share of epoch 0:
               store bytes, each node's epoch time, each job's delivered keys checked
               (``harness/peercold.py``)

Prints a table and writes JSON. Not a timed test: run it by hand (``--scenarios`` runs some).

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
from benchmarks.harness.peercluster import Cluster, SimNode
from benchmarks.harness.peercold import (
    check_layout,
    cold_epoch,
    cold_rows,
    dataset_samples,
    node_table,
)
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


SCENARIOS = ("sweep", "replacement", "cold-epoch")


def sweep_and_replacement(
    root: Path, store_port: int, proxy: SlowProxy, ds: Any, *, replacement: bool
) -> dict[str, Any]:
    """The sweep without the tier and with it, then (``replacement``) a lost node's
    replacement warming from its peers against a fresh node warming from the store."""
    size = sum(s.bytes for s in ds.shards)
    out: dict[str, Any] = {}
    cluster = Cluster(root / "sweep-today", store_port, proxy, "1MiB")
    nodes = [cluster.start(f"n{i}") for i in range(4)]
    orders = {n.address: NodeShare.build(seed=s).order(ds) for s, n in enumerate(nodes)}
    before = proxy.shard_bytes()
    seconds = warm_all(nodes, ds.url, orders)
    cluster.stop()
    today = {"seconds": seconds, "store_bytes": proxy.shard_bytes() - before}
    today["store_x"] = today["store_bytes"] / size
    tier = sweep_warm(root / "sweep-tier", store_port, proxy, ds.url, size)
    out["sweep"] = {"today": today, "tier": tier["result"]}
    cluster, nodes = tier["cluster"], tier["nodes"]
    if not replacement:
        cluster.stop()
        return out
    # the last node is lost, a fresh one takes its place and its share
    lost = nodes[-1]
    share = tier["shares"][lost.address]
    lost.kill()
    fresh = cluster.start("replacement")
    cluster.connect([*nodes[:-1], fresh])
    before = proxy.shard_bytes()
    peer_s = warm_all([fresh], ds.url, {fresh.address: share.order(ds)})
    peer_store = proxy.shard_bytes() - before
    cluster.stop()
    alone = Cluster(root / "replacement-today", store_port, proxy, "1MiB")
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
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    scenarios = set(args.scenarios)
    root = Path(tempfile.mkdtemp(prefix="ff-peertier-"))
    os.environ["FLASHFEED_PEER_TOKEN"] = TOKEN
    store = start_store(root / "s3", export_env=True)
    port = store.store.info.s3_port
    proxy = SlowProxy(("127.0.0.1", port), rate=args.store_mbps * 1e6)
    out: dict[str, Any] = {"store_mbps": args.store_mbps, "scenarios": args.scenarios}
    try:
        shard_bytes = int(args.shard_mib * (1 << 20))
        ds = random_dataset(
            f"{store.bucket}/peertier", args.shards, shard_bytes, per_shard=args.samples_per_shard
        )
        size = sum(s.bytes for s in ds.shards)
        out["dataset_bytes"] = size
        out["layout"] = {
            "shards": args.shards,
            "shard_mib": args.shard_mib,
            "samples_per_shard": args.samples_per_shard,
            "batch_size": args.batch_size,
        }
        out["bandwidth_bound_s"] = size / (args.store_mbps * 1e6)
        print(
            f"dataset: {args.shards} shards of {args.samples_per_shard} samples, "
            f"{size / 1e6:.1f} MB; store at {args.store_mbps} MB/s"
        )
        if scenarios & {"sweep", "replacement"}:
            out.update(
                sweep_and_replacement(root, port, proxy, ds, replacement="replacement" in scenarios)
            )
        if "cold-epoch" in scenarios:
            samples = dataset_samples(ds)  # from the store itself, not through the proxy
            cold = {}
            for tag, peers in (("today", False), ("tier", True)):
                cold[tag] = cold_epoch(
                    root / f"cold-{tag}", port, proxy, ds, peers=peers,
                    batch_size=args.batch_size, samples=samples,
                )  # fmt: skip
            out["cold_epoch"] = cold
    finally:
        proxy.close()
        store.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def table(out: dict[str, Any]) -> str:
    rows: list[tuple[str, str, float, float]] = []
    if "sweep" in out:
        s = out["sweep"]
        name = "sweep 4 jobs x 1 node"
        rows += [
            (name, "store bytes / dataset", s["today"]["store_x"], s["tier"]["store_x"]),
            (name, "seconds", s["today"]["seconds"], s["tier"]["seconds"]),
        ]
    if "replacement" in out:
        r, size = out["replacement"], out["dataset_bytes"]
        rows += [
            (
                "replacement node",
                "seconds to warm its share",
                r["from_store"]["seconds"],
                r["from_peers"]["seconds"],
            ),
            (
                "replacement node",
                "store bytes / dataset",
                r["from_store"]["store_bytes"] / size,
                r["from_peers"]["store_bytes"] / size,
            ),
        ]
    if "cold_epoch" in out:
        rows += cold_rows(out["cold_epoch"])
    lines = [
        "| scenario | measure | without the tier | with the tier | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for name, what, today, tier in rows:
        ratio = f"{today / tier:.2f}x" if tier else ""
        lines.append(f"| {name} | {what} | {today:.2f} | {tier:.2f} | {ratio} |")
    bound = out["bandwidth_bound_s"]
    lines.append(f"the store's bound: the dataset once at {out['store_mbps']} MB/s, {bound:.2f} s")
    if "sweep" in out:
        lines += ["", *sweep_nodes(out["sweep"])]
    if "cold_epoch" in out:
        lines += ["", *node_table(out["cold_epoch"])]
    return "\n".join(lines)


def sweep_nodes(s: dict[str, Any]) -> list[str]:
    """The sweep with the tier, per node: the plan's share against what happened."""
    lines = [
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
    return lines


def _scenarios(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    bad = sorted(set(names) - set(SCENARIOS))
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"scenarios must be some of {', '.join(SCENARIOS)}, got {text!r}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", type=int, default=24)
    p.add_argument("--shard-mib", type=float, default=2.0)
    p.add_argument("--samples-per-shard", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8, help="the cold epoch's readers' batch")
    p.add_argument(
        "--scenarios", type=_scenarios, default=list(SCENARIOS),
        help=f"comma-separated, of {','.join(SCENARIOS)} (default: all)",
    )  # fmt: skip
    p.add_argument("--store-mbps", type=float, default=16.0, help="the store's bandwidth, MB/s")
    p.add_argument("--out", default=".bench/peertier.json")
    args = p.parse_args(argv)
    try:
        check_layout(args.shards, args.samples_per_shard, args.batch_size)
    except ValueError as exc:
        p.error(str(exc))
    out = run(args)
    print(table(out))
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

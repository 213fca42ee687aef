"""The cold-epoch row of the peertier stage: the first epoch of 2 jobs x 2 nodes on one
dataset, through the cluster tier and without it.

Two jobs (seeds 0 and 1) of two nodes each, one rank a node, so every shard is read by two
nodes, start together from empty caches: on each node a training reader (``ShardDataset``
over the node's cache, the loader's own read-ahead) reads its rank's share of epoch 0 (the
``epoch`` command of ``benchmarks/harness/peernode.py``). The store is behind the throttling
proxy: its bandwidth is the bottleneck. With the tier the nodes know each other and the
placement's store reader of each shard; without it (today) each node reads the store alone.
Measured: the store's shard bytes over the dataset's, each node's epoch seconds from the
common start. Checked on what the readers delivered: each job's keys are the dataset's
keys (from its shards' own indexes), each exactly once, with every member byte.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness.peercluster import Cluster, assign_owners
from benchmarks.harness.slowproxy import SlowProxy
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.dataset import Dataset

__all__ = ["check_layout", "cold_epoch", "cold_rows", "dataset_samples", "node_table"]

SEEDS = (0, 1)  # one job a seed
NODES = 2  # a job's nodes, one rank each
#: seconds from sending the epoch to the nodes to their common start (each opens the
#: dataset and builds its reader meanwhile)
START_MARGIN = 1.0


def check_layout(shards: int, per_shard: int, batch_size: int) -> None:
    """Each reader's best configuration: whole shards a node, whole batches a rank (so a
    job's epoch is every sample, nothing dropped); a clear error otherwise."""
    if shards % NODES:
        raise ValueError(f"shards must be a multiple of {NODES} (a job's nodes), got {shards}")
    if (shards * per_shard) % (NODES * batch_size):
        raise ValueError(
            f"shards x samples per shard ({shards} x {per_shard}) must be a multiple of "
            f"{NODES} ranks x batch size {batch_size}: a job's epoch then drops nothing"
        )


def dataset_samples(ds: Dataset) -> dict[str, int]:
    """Every sample's ``__key__`` and member bytes, as the dataset's shard indexes name them."""
    out: dict[str, int] = {}
    for i, info in enumerate(ds.shards):
        for entry in ds.read_index(i):
            out[f"{info.path}/{entry.key}"] = sum(c.size for c in entry.components)
    return out


def _check_jobs(answers: dict[tuple[int, int], dict[str, Any]], samples: dict[str, int]) -> None:
    """Each job's delivered keys are the dataset's, each once, with all their bytes."""
    want = Counter(samples.keys())
    for seed in SEEDS:
        got = Counter(k for r in range(NODES) for k in answers[(seed, r)]["keys"])
        if got != want:
            extra, missing = got - want, want - got
            raise RuntimeError(
                f"job seed {seed} delivered {sum(got.values())} keys, not the dataset's "
                f"{len(samples)} once each: {len(extra)} extra or repeated "
                f"(e.g. {sorted(extra)[:3]}), {len(missing)} missing (e.g. {sorted(missing)[:3]})"
            )
        nbytes = sum(answers[(seed, r)]["bytes"] for r in range(NODES))
        if nbytes != sum(samples.values()):
            raise RuntimeError(
                f"job seed {seed} delivered {nbytes} member bytes, not the dataset's "
                f"{sum(samples.values())}"
            )


def cold_epoch(
    root: Path,
    store_port: int,
    proxy: SlowProxy,
    ds: Dataset,
    *,
    peers: bool,
    batch_size: int,
    samples: dict[str, int],
) -> dict[str, Any]:
    """One cold first epoch of the 2 x 2 nodes (``peers``: through the tier), checked."""
    cluster = Cluster(root, store_port, proxy, "1MiB", loader=True)
    try:
        places = [(seed, r) for seed in SEEDS for r in range(NODES)]
        nodes = {p: cluster.start(f"s{p[0]}n{p[1]}") for p in places}
        if peers:
            shares = {
                nodes[(seed, r)].address: NodeShare.build(node_rank=r, num_nodes=NODES, seed=seed)
                for seed, r in places
            }
            cluster.connect(list(nodes.values()))
            assign_owners(list(nodes.values()), ds, shares)
        before = proxy.shard_bytes()
        start_at = time.time() + START_MARGIN
        for (seed, r), node in nodes.items():
            node.send(
                {"epoch": ds.url, "rank": r, "world": NODES, "seed": seed,
                 "batch_size": batch_size, "start_at": start_at}
            )  # fmt: skip
        answers = {p: node.answer() for p, node in nodes.items()}
        wall = time.time() - start_at
        store_bytes = proxy.shard_bytes() - before
        served = {p: node.call({"stats": True})["served"] for p, node in nodes.items()}
    finally:
        cluster.stop()
    _check_jobs(answers, samples)
    size = sum(s.bytes for s in ds.shards)
    per_node = [
        {
            "node": f"seed {seed} rank {r}",
            "seconds": a["seconds"],
            "late": a["late"],
            "samples": a["samples"],
            "bytes_from_store": a["stats"].get("bytes_from_store", 0),
            "bytes_from_peers": a["stats"].get("bytes_from_peers", 0),
            "served_bytes": served[(seed, r)],
        }
        for (seed, r), a in answers.items()
    ]
    return {
        "seconds": max(n["seconds"] for n in per_node),  # the slowest node
        "wall_seconds": wall,
        "store_bytes": store_bytes,
        "store_x": store_bytes / size,
        "keys_checked": True,  # _check_jobs raised otherwise
        "nodes": per_node,
    }


def cold_rows(c: dict[str, Any]) -> list[tuple[str, str, float, float]]:
    """The summary table's rows: (scenario, measure, without the tier, with it)."""
    name = "cold first epoch 2 jobs x 2 nodes"
    today, tier = c["today"], c["tier"]
    return [
        (name, "store bytes / dataset", today["store_x"], tier["store_x"]),
        (name, "epoch seconds (slowest node)", today["seconds"], tier["seconds"]),
    ]


def node_table(c: dict[str, Any]) -> list[str]:
    """Per node: epoch seconds without and with the tier, and where its bytes came from."""
    lines = [
        "cold first epoch, per node (ShardDataset over the node's cache, epoch 0):",
        "| node | samples | seconds without | with | ratio | MB from store without | "
        "with | MB from peers with | MB it served with |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, b in zip(c["today"]["nodes"], c["tier"]["nodes"], strict=True):
        lines.append(
            f"| {a['node']} | {b['samples']} | {a['seconds']:.2f} | {b['seconds']:.2f} | "
            f"{a['seconds'] / b['seconds']:.2f}x | {a['bytes_from_store'] / 1e6:.1f} | "
            f"{b['bytes_from_store'] / 1e6:.1f} | {b['bytes_from_peers'] / 1e6:.1f} | "
            f"{b['served_bytes'] / 1e6:.1f} |"
        )
    return lines

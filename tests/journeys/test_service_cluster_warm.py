"""``flashfeed cache warm --ray-address`` with ``FLASHFEED_NODE_SOCKET`` set: on a simulated
2-node cluster (tests/support/cluster.py) with a node service on each node, one task per
node warms its share through that node's own service (the socket its Ray workers' environment
names), each shard read once through that node's S3 proxy and pinned there for the job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from benchmarks.harness.nodeservice import wait_listening
from flashfeed.cache.node import NodeClient
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.dataset import Dataset

from support.cluster import S3_NAME, Node, SimCluster, bytes_read, namespaces_available
from support.loader_helpers import make_image_dataset

pytestmark = pytest.mark.slow

_WHY_NOT = namespaces_available()


def _start_service(cluster: SimCluster, node: Node) -> str:
    """A node service on ``node`` (its namespaces: its tmpfs cache, its S3 proxy); its
    socket, once it listens."""
    sock = os.path.join(cluster.root, f"node{node.index}.sock")
    config = os.path.join(cluster.root, f"node{node.index}.json")
    with open(config, "w") as f:
        json.dump({"socket": sock, "cache_dir": os.path.join(cluster.cache_dir, "svc"),
                   "capacity": "64MiB", "default_quota": "32MiB",
                   "store": {"endpoint_url": f"http://{S3_NAME}:{cluster.s3_port}",
                             "key": cluster.store.access_key,
                             "secret": cluster.store.secret_key}}, f)  # fmt: skip
    log = os.path.join(cluster.root, f"service{node.index}.log")
    proc = cluster.popen(node, [sys.executable, "-m", "flashfeed.cli", "node", "serve", config],
                         log=log)  # fmt: skip
    wait_listening(proc, sock, log)
    return sock


@pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))
def test_a_cluster_warm_goes_through_each_nodes_service(
    cluster: SimCluster, s3_prefix: str, s3_info
) -> None:
    url = f"{s3_prefix}/svcwarm"
    make_image_dataset(url, [6] * 8, storage_options=s3_info.storage_options())
    ds = Dataset.open(url, storage_options=s3_info.storage_options())
    sizes = {"/" + ds.shard_url(i).split("://", 1)[1]: s.bytes for i, s in enumerate(ds.shards)}
    n0, n1 = cluster.add_node(), cluster.add_node()
    socks = {}
    for node in (n0, n1):
        socks[node.index] = _start_service(cluster, node)
        node.env["FLASHFEED_NODE_SOCKET"] = socks[node.index]  # where its Ray workers run
    address = cluster.start_ray()
    marks = [n.proxy.mark() for n in cluster.nodes]
    argv = ["flashfeed", "cache", "warm", url, "--ray-address", address, "--hosts",
            f"{n1.address},{n0.address}", "--json", "--no-progress"]  # fmt: skip
    done = cluster.run(n0, argv, timeout=300, env={"FLASHFEED_JOB": "tomorrow"})
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["node_rank"]: r for r in json.loads(done.stdout)}
    for node, rank in ((n1, 0), (n0, 1)):
        r = results[rank]
        assert "error" not in r and r["service"] == socks[node.index], r
        share = sorted(set(NodeShare.build(node_rank=rank, num_nodes=2).order(ds)))
        assert r["shards"] == r["pinned"] == r["fetched"] == len(share), r
        assert r["bytes_fetched"] == sum(ds.shards[i].bytes for i in share)
        # its own store reads, through its own proxy: its share, each shard once
        fetched = bytes_read(node.proxy.since(marks[node.index]), sizes)
        want = {"/" + ds.shard_url(i).split("://", 1)[1] for i in share}
        assert set(fetched) == want and all(fetched[p] == sizes[p] for p in want), fetched
        with NodeClient(socks[node.index], reconnect_timeout=5) as admin:
            rows = admin.status()["report"]["rows"]
        (row,) = [x for x in rows if x["job"] == "tomorrow"]
        assert row["tenant"] == "root" and row["pinned_bytes"] == row["resident_bytes"] > 0
        assert row["fetched_bytes"] == r["bytes_fetched"]
    # no embedded cache was made beside the services
    for node in (n0, n1):
        beside = [p for p in Path(node.path(cluster.cache_dir)).iterdir() if p.name != "svc"]
        assert beside == [], beside

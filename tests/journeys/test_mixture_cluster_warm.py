"""``flashfeed cache warm MIX.json --ray-address``: one task per node of a simulated 2-node
cluster (tests/support/cluster.py), each filling its own node's cache with its own share of
every source, read through its own S3 proxy, each shard once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.cache.warm.units import mixture_order, open_sources
from flashfeed.plan.mixture import Mixture, Source

from support.cluster import SimCluster, bytes_read, namespaces_available
from support.loader_helpers import make_token_dataset

pytestmark = pytest.mark.slow

_WHY_NOT = namespaces_available()


@pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))
def test_a_mixture_is_warmed_on_every_node_of_a_cluster_each_its_share(
    cluster: SimCluster, s3_prefix: str, s3_info, tmp_path: Path
) -> None:
    opts = s3_info.storage_options()
    sizes_of = {"web": [24] * 8, "code": [24] * 4, "books": [24] * 4}
    for name, sizes in sizes_of.items():
        make_token_dataset(f"{s3_prefix}/{name}", sizes, seq_len=8, storage_options=opts)
    mix = Mixture(tuple(Source(f"{s3_prefix}/{n}", w, n) for n, w in
                        (("web", 3.0), ("code", 1.0), ("books", 1.0))), length=96)  # fmt: skip
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(mix.to_dict()))
    datasets = open_sources(mix)
    sizes, shard_of = {}, {}  # object path (/bucket/key) -> size, and -> (source, shard)
    for s, ds in enumerate(datasets):
        for i, info in enumerate(ds.shards):
            key = "/" + ds.shard_url(i).split("://", 1)[1]
            sizes[key], shard_of[key] = info.bytes, (s, i)

    n0, n1 = cluster.add_node(), cluster.add_node()
    address = cluster.start_ray()
    marks = [n.proxy.mark() for n in cluster.nodes]
    argv = ["flashfeed", "cache", "warm", str(path), "--ray-address", address, "--hosts",
            f"{n1.address},{n0.address}", "--ranks-per-node", "2", "--epochs", "2",
            "--capacity", "64MiB", "--json", "--no-progress"]  # fmt: skip
    done = cluster.run(n0, argv, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["node_rank"]: r for r in json.loads(done.stdout)}
    # node rank = place in --hosts: n1 is node 0, n0 is node 1
    assert results[0]["address"] == n1.address and results[1]["address"] == n0.address
    for node, rank in ((n1, 0), (n0, 1)):
        share = NodeShare.build(node_rank=rank, num_nodes=2, ranks_per_node=2, epochs=2)
        want = set(mixture_order(mix, datasets, share))
        assert {s for s, _ in want} == {0, 1, 2}  # every source has shards on every node
        fetched = bytes_read(node.proxy.since(marks[node.index]), sizes)
        assert {shard_of[p] for p in fetched} == want, f"node {rank} fetched another share"
        twice = {p: n for p, n in fetched.items() if n != sizes[p]}
        assert not twice, f"node {rank} fetched shards more than once: {twice}"
        r = results[rank]
        assert r["fetched"] == len(want) and "error" not in r and r["mixture"] == str(path)
        # its own cache (the node's tmpfs) holds its share, nothing of the other node's
        cached = list(Path(node.path(cluster.cache_dir)).glob("*/data/shards/*.arrow"))
        assert len(cached) == len(want)

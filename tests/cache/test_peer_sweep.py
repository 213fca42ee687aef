"""A sweep's warm planned as one (``cache warm --sweep``), on simulated nodes: each a process
on its own 127.0.0.N with its own cache, every store request through one counting proxy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.harness.peercluster import SimNode, start_node
from benchmarks.harness.slowproxy import SlowProxy
from flashfeed import storage
from flashfeed.cache.layout import DatasetDir, dataset_key
from flashfeed.cache.peer.sweep import parse_sweep, plan_sweep

from support.cache_data import make_dataset

TOKEN = "sweep-token-of-this-test-0123456789"


def test_a_sweep_file_is_checked_before_any_io():
    good = {"dataset": "s3://b/d", "jobs": [{"hosts": ["n1", "n2"], "seed": 3}]}
    sweep = parse_sweep(good)
    nodes = sweep.nodes(port=7000)
    assert [(n.job, n.peer, n.share.node_rank, n.share.num_nodes) for n in nodes] == [
        ("job0", "n1:7000", 0, 2),
        ("job0", "n2:7000", 1, 2),
    ]
    assert nodes[0].share.options.seed == 3
    bad = [
        ({"jobs": good["jobs"]}, "'dataset' must be the dataset's URL"),
        ({**good, "jobs": []}, "'jobs' must be a non-empty list"),
        ({**good, "extra": 1}, r"unknown keys \['extra'\]"),
        ({**good, "jobs": [{"hosts": ["n1"]}, {"hosts": ["n1"]}]}, "already a node of job"),
        ({**good, "jobs": [{"hosts": ["n1"], "seed": -1}]}, r"jobs\[0\]: 'seed' must be"),
        ({**good, "jobs": [{"hosts": ["n1"], "shuffle": "no"}]}, "'shuffle' must be true"),
        ({**good, "jobs": [{"hosts": []}]}, "'hosts' must be a non-empty list"),
        ({**good, "max_serving": 0}, "'max_serving' must be an integer >= 1"),
    ]
    for data, message in bad:
        with pytest.raises(ValueError, match=message):
            parse_sweep(data)


def test_cache_warm_sweep_flags_are_checked_before_any_io(tmp_path, capsys, monkeypatch):
    from flashfeed.cli import main

    monkeypatch.setenv("FLASHFEED_PEER_TOKEN", TOKEN)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"dataset": "s3://nowhere/d", "jobs": [{"hosts": ["n1"]}]}))
    cases = [
        (["--sweep", str(path)], "--ray-address) or here (--local)"),
        (["--sweep", str(path), "--local", "--cache-dir", "/tmp/x"], "must hold {host}"),
        (["s3://b/d", "--sweep", str(path), "--local"], "drop DATASET"),
        (["--sweep", str(path), "--local", "--seed", "3"], "drop --seed"),
        (["--local"], "add --sweep FILE"),
        (["--sweep", str(tmp_path / "none.json"), "--local"], "cannot read the sweep file"),
    ]
    for flags, message in cases:
        assert main(["cache", "warm", *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags


def _store(result: dict) -> int:
    """Store bytes of one node: its warm's and its peer server's (fills peers asked for)."""
    return result["peers"].get("bytes_from_store", 0) + result["server"].get("bytes_from_store", 0)


def test_cache_warm_sweep_reads_each_shard_from_the_store_once(s3_prefix, s3_store, tmp_path):
    """Three jobs (2 + 1 + 1 nodes, seeds 0-2) of one dataset warm with one plan, here
    (``--local``): the store serves each shard once (counted at the proxy every node reads
    the store through), every node ends with its share intact, and each node's warm read from
    the store only shards the plan gave it."""
    ds = make_dataset(s3_prefix, shards=12, shard_bytes=80_000)
    size = sum(s.bytes for s in ds.shards)
    proxy = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    os.environ["FLASHFEED_PEER_TOKEN"] = TOKEN
    nodes: list[SimNode] = []
    try:
        for n in range(2, 6):
            host = f"127.0.0.{n}"
            nodes.append(
                start_node(host, host, str(tmp_path / host), s3_store.info.s3_port, proxy=proxy)
            )
        for node in nodes:
            node.call({"peers": [x.address for x in nodes]})
        hosts = [n.address for n in nodes]
        sweep = {
            "dataset": ds.url,
            "max_serving": 2,
            "jobs": [
                {"name": "a", "hosts": hosts[:2], "seed": 0},
                {"name": "b", "hosts": hosts[2:3], "seed": 1},
                {"name": "c", "hosts": hosts[3:], "seed": 2},
            ],
        }
        path = tmp_path / "sweep.json"
        path.write_text(json.dumps(sweep))
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
        argv = [sys.executable, "-m", "flashfeed.cli", "cache", "warm", "--sweep", str(path)]
        argv += ["--local", "--cache-dir", str(tmp_path / "{host}"), "--json", "--part-size"]
        argv += ["256KiB"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)
        served = [node.call({"stats": True})["served"] for node in nodes]
    finally:
        for node in nodes:
            node.stop()
        proxy.close()
        os.environ.pop("FLASHFEED_PEER_TOKEN", None)

    store_bytes = proxy.shard_bytes()
    assert size <= store_bytes <= 1.05 * size, (store_bytes, size)
    for info in ds.shards:  # every shard left the store, none twice
        got = sum(r.range[1] - r.range[0] for r in proxy.log(info.path) if r.range)
        assert got == info.bytes, info.path

    parsed = parse_sweep(sweep)
    swept = parsed.nodes()
    placement, specs = plan_sweep(ds, swept, max_serving=2)
    assert len(placement.store) == len(ds.shards)
    assert max(placement.store_reads().values()) - min(placement.store_reads().values()) <= 1
    key = dataset_key(ds.url, ds.manifest)
    assert [r["job"] for r in results] == ["a", "a", "b", "c"]
    for node, r in zip(swept, results, strict=True):
        assert "error" not in r and not r["failed"], r
        mine = {int(s) for s, owner in specs[node.peer]["owners"].items() if owner == node.peer}
        assert r["planned"]["store_reads"] == len(mine)
        # a warm reads from the store only what the plan gave its node
        assert r["peers"].get("bytes_from_store", 0) <= sum(ds.shards[s].bytes for s in mine)
        d = DatasetDir(str(tmp_path / node.hostname), key)
        for s in set(node.share.order(ds)):
            assert storage.file_checksum(d.shard_path(s)) == ds.shards[s].checksum
    assert sum(r["peers"]["bytes_from_peers"] for r in results) > 0
    assert sum(served) > 0  # the copies crossed the nodes' servers
    # per node, the warm's and its server's store reads: together what the proxy counted,
    # and each node's within the shards the plan gave it
    for node, r in zip(swept, results, strict=True):
        mine = {int(s) for s, owner in specs[node.peer]["owners"].items() if owner == node.peer}
        both = _store(r)
        assert both <= sum(ds.shards[s].bytes for s in mine)
    assert sum(_store(r) for r in results) == store_bytes
    assert sum(r["server"]["served_bytes"] for r in results) == sum(served)


def test_cache_warm_sweep_runs_one_task_per_node_on_ray(
    s3_prefix, s3_store, tmp_path, ray_session, monkeypatch, capsys
):
    """The same command on a Ray cluster: the sweep's node is matched to its Ray node by the
    host of its peer server, and its warm runs there as a pinned task."""
    import ray

    from flashfeed.cli import main

    ds = make_dataset(s3_prefix, shards=3, shard_bytes=50_000)
    address = next(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    proxy = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    monkeypatch.setenv("FLASHFEED_PEER_TOKEN", TOKEN)  # the node's server's
    node = start_node("n", address, str(tmp_path / "c"), s3_store.info.s3_port, proxy=proxy)
    monkeypatch.delenv("FLASHFEED_PEER_TOKEN")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        path = tmp_path / "sweep.json"
        path.write_text(json.dumps({"dataset": ds.url, "jobs": [{"hosts": [node.address]}]}))
        argv = ["cache", "warm", "--sweep", str(path), "--ray-address", "auto", "--json",
                "--cache-dir", str(tmp_path / "c"), "--peer-token-file", str(token)]  # fmt: skip
        assert main(argv) == 0
    finally:
        node.stop()
        proxy.close()
    results = json.loads(capsys.readouterr().out)
    assert [(r["job"], r["peer"], r["node_id"] != "") for r in results] == [
        ("job0", node.address, True)
    ]
    assert results[0]["planned"]["store_reads"] == 3 and results[0]["fetched"] == 3
    assert proxy.shard_bytes() == sum(s.bytes for s in ds.shards)

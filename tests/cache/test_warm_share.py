"""What ``cache warm`` fetches is what the run reads, on the node the launcher means.

Plan flags reach the warm order; a cluster warm ranks nodes by the launcher's host list
(matched by address or hostname); a warm leaves a record of its share in the cache, and a
loader of another share (or another version of the dataset) is told, once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from flashfeed import Dataset
from flashfeed.cache import ShardCache
from flashfeed.cache.cli.admin import status
from flashfeed.cache.warm.cluster import map_hosts, parse_hostfile, parse_hosts, warm_node
from flashfeed.cache.warm.warm import (
    NodeShare,
    check_warm_record,
    dataset_digest,
    warm_mismatch,
    warm_share,
)
from flashfeed.cli import main
from flashfeed.plan.plan import PlanOptions, Topology, node_shard_order

from support.cache_data import make_dataset


def cached(root: Path) -> set[str]:
    return {p.name for p in root.glob("*/data/shards/*.tar")}


def first_shards(ds: Dataset, order: list[int], k: int) -> set[str]:
    return {Path(ds.shards[i].path).name for i in list(dict.fromkeys(order))[:k]}


# -- plan flags reach the warm order -------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "options"),
    [
        (["--window", "2", "--no-shuffle"], PlanOptions(window=2, shuffle=False)),
        (["--window", "1", "--seed", "7"], PlanOptions(window=1, seed=7)),
        (["--no-drop-last", "--seed", "3"], PlanOptions(seed=3, drop_last=False)),
    ],
)
def test_plan_flags_reach_the_warm_order_and_the_record(
    s3_prefix: str,
    tmp_path: Path,
    flags: list[str],
    options: PlanOptions,
    capsys: pytest.CaptureFixture[str],
):
    ds = make_dataset(s3_prefix, shards=12, shard_bytes=20_000, per_shard=5)
    sizes = [s.samples for s in ds.shards]
    topology = Topology(4, 2)
    mine = node_shard_order(sizes, options=options, epochs=[0], topology=topology, node_rank=1)
    default = node_shard_order(
        sizes, options=PlanOptions(), epochs=[0], topology=topology, node_rank=1
    )
    k = 3  # the capacity holds the first k shards: which ones depends on the order
    assert first_shards(ds, mine, k) != first_shards(ds, default, k)  # the flags matter here
    capacity = sum(sorted(s.bytes for s in ds.shards)[-k:]) + 4_000  # indexes, not a 4th shard
    root = tmp_path / "c"
    argv = ["cache", "warm", s3_prefix, "--cache-dir", str(root), "--world-size", "4",
            "--ranks-per-node", "2", "--node-rank", "1", "--capacity", str(capacity),
            "--no-progress", *flags]  # fmt: skip
    assert main(argv) == 0
    assert f"{k} fetched" in capsys.readouterr().out
    assert cached(root) == first_shards(ds, mine, k)

    with ShardCache(root) as cache:
        record = cache.warm_record(s3_prefix)
    assert record is not None
    assert record["options"] == asdict(options)
    assert (record["node_rank"], record["num_nodes"], record["ranks_per_node"]) == (1, 2, 2)
    assert record["dataset_digest"] == dataset_digest(ds) and record["epochs"] == 1
    assert record["url"] == s3_prefix and record["cache_dir"] == str(root)


def test_the_share_of_the_flags_is_the_loaders_defaults_when_none_is_given():
    share = NodeShare.build()
    assert share.options == PlanOptions(seed=0, shuffle=True, window=4, drop_last=True)
    assert share.topology == Topology(1) and share.node_rank == 0 and share.epochs == 1
    assert NodeShare.build(world_size=8, ranks_per_node=4, node_rank=1).num_nodes == 2
    with pytest.raises(ValueError, match="world_size 8 is not num_nodes 3"):
        NodeShare.build(world_size=8, num_nodes=3, ranks_per_node=2)
    with pytest.raises(ValueError, match="window must be >= 1"):
        NodeShare.build(window=0)
    with pytest.raises(ValueError, match=r"node_rank must be in \[0, 2\)"):
        NodeShare.build(num_nodes=2, node_rank=2)


# -- which node is which: the host list -----------------------------------------------------


def ray_node(node_id: str, address: str, hostname: str, alive: bool = True) -> dict[str, Any]:
    """One entry of ``ray.nodes()``, with the fields the mapping reads."""
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": address,
        "NodeManagerHostname": hostname,
        "NodeName": address,
    }


CLUSTER = [
    ray_node("aa01", "10.0.0.3", "gpu-c.cluster.local"),
    ray_node("bb02", "10.0.0.1", "gpu-a.cluster.local"),
    ray_node("cc03", "10.0.0.2", "gpu-b.cluster.local"),
    ray_node("dd04", "10.0.0.9", "gpu-d.cluster.local", alive=False),
]


def test_node_rank_is_the_place_in_the_host_list_matched_by_address_or_hostname():
    ranked, extra = map_hosts(CLUSTER, ["gpu-b", "10.0.0.3", "gpu-a.cluster.local"])
    assert [n.node_id for n in ranked] == ["cc03", "aa01", "bb02"]
    assert extra == []
    # sorted node ids would have given aa01, bb02, cc03: the list, not Ray, decides
    ranked, extra = map_hosts(CLUSTER, ["10.0.0.2", "gpu-c.cluster.local"])
    assert [n.node_id for n in ranked] == ["cc03", "aa01"]
    assert [n.node_id for n in extra] == ["bb02"]  # alive, not listed: left out (warned)


def test_a_cluster_on_one_machine_is_matched_by_address():
    sim = [ray_node(f"n{i}", f"127.0.0.{i + 1}", "box") for i in range(3)]
    ranked, _ = map_hosts(sim, ["127.0.0.3", "127.0.0.1", "127.0.0.2"])
    assert [n.node_id for n in ranked] == ["n2", "n0", "n1"]
    with pytest.raises(ValueError, match="share its hostname") as err:
        map_hosts(sim, ["box"])
    assert str(err.value).endswith("127.0.0.1, 127.0.0.2, 127.0.0.3")


@pytest.mark.parametrize(
    ("hosts", "error"),
    [
        (["gpu-a", "gpu-x"], "host 'gpu-x' matches no alive Ray node"),
        (["gpu-d"], "host 'gpu-d' matches no alive Ray node"),  # dead nodes do not count
        (["10.0.0.1", "gpu-a"], "hosts '10.0.0.1' and 'gpu-a' are the same Ray node"),
        ([], "the host list is empty"),
        (["gpu-a", " gpu-b"], "empty or has spaces"),
    ],
)
def test_a_host_list_that_does_not_fit_the_cluster_is_refused_naming_the_host(
    hosts: list[str], error: str
):
    with pytest.raises(ValueError, match=error):
        map_hosts(CLUSTER, hosts)


def test_host_lists_and_hostfiles_are_read_in_order(tmp_path: Path):
    assert parse_hosts("n2,n0, n1") == ["n2", "n0", "n1"]
    with pytest.raises(ValueError, match="empty entry"):
        parse_hosts("n0,,n1")
    f = tmp_path / "hosts"
    f.write_text("# node-rank order\nn3 slots=8\n\n  n1  # second\nn2\n")
    assert parse_hostfile(str(f)) == ["n3", "n1", "n2"]
    f.write_text("# nothing\n")
    with pytest.raises(ValueError, match="lists no host"):
        parse_hostfile(str(f))
    with pytest.raises(ValueError, match="cannot read the hostfile"):
        parse_hostfile(str(tmp_path / "missing"))


def _session_node() -> dict[str, Any]:
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    assert len(alive) == 1
    return alive[0]


def test_cluster_warm_with_a_host_list_on_a_real_ray(
    s3_prefix: str, tmp_path: Path, ray_session: None, capsys: pytest.CaptureFixture[str]
):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=30_000)
    node = _session_node()
    root = tmp_path / "c"
    argv = ["cache", "warm", s3_prefix, "--cache-dir", str(root), "--ray-address", "auto",
            "--hosts", node["NodeManagerAddress"], "--window", "2", "--epochs", "2",
            "--ranks-per-node", "2", "--json"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    (result,) = json.loads(out)
    assert err == ""  # every Ray node is listed: nothing to warn about
    assert result["node_rank"] == 0 and result["node_id"] == node["NodeID"]
    assert result["address"] == node["NodeManagerAddress"] and result["fetched"] == 4
    assert cached(root) == {Path(s.path).name for s in ds.shards}
    report = status(str(root))
    warm = report["datasets"][0]["warm"]
    assert warm["options"] == asdict(PlanOptions(window=2))
    assert (warm["node_rank"], warm["num_nodes"], warm["epochs"]) == (0, 1, 2)
    assert main(["cache", "status", str(root)]) == 0
    assert "warmed for node 0 of 1 (2 ranks per node; seed 0, shuffle True, window 2" in (
        capsys.readouterr().out
    )

    # the same node by its hostname: matched, nothing left to fetch
    argv[argv.index("--hosts") + 1] = node["NodeManagerHostname"]
    assert main(argv) == 0
    (again,) = json.loads(capsys.readouterr().out)
    assert again["node_id"] == node["NodeID"] and again["already"] == 4 and again["fetched"] == 0


def test_cluster_warm_refuses_a_host_that_is_no_ray_node_in_one_line(
    s3_prefix: str, tmp_path: Path, ray_session: None, capsys: pytest.CaptureFixture[str]
):
    node = _session_node()
    hosts = f"{node['NodeManagerAddress']},no-such-node.example"
    argv = ["cache", "warm", s3_prefix, "--cache-dir", str(tmp_path / "c"),
            "--ray-address", "auto", "--hosts", hosts]  # fmt: skip
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0]
    assert "host 'no-such-node.example' matches no alive Ray node" in lines[0]
    assert not (tmp_path / "c").exists()  # refused before any node was touched
    # a run of 3 nodes with 1 listed host cannot be warmed either
    argv[argv.index("--hosts") + 1] = node["NodeManagerAddress"]
    assert main([*argv, "--num-nodes", "3"]) == 2
    assert "the run has 3 nodes but the host list names 1" in capsys.readouterr().err


def test_a_node_task_without_a_cache_dir_uses_the_nodes_default_cache_dir(
    s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """As a loader does: ``FLASHFEED_CACHE_DIR``, else ``~/.cache/flashfeed``."""
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=20_000)
    share = NodeShare.build(num_nodes=2, node_rank=1)
    kwargs = {"capacity": "1MiB", "storage_options": None}
    monkeypatch.delenv("FLASHFEED_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = warm_node(s3_prefix, None, share, kwargs)
    assert "error" not in out
    assert out["cache_dir"] == str(tmp_path / "home" / ".cache" / "flashfeed")
    monkeypatch.setenv("FLASHFEED_CACHE_DIR", str(tmp_path / "node-cache"))
    out = warm_node(s3_prefix, None, share, kwargs)
    assert "error" not in out and out["cache_dir"] == str(tmp_path / "node-cache")
    assert out["fetched"] == len(set(share.order(ds))) > 0
    assert out["host"] == socket.gethostname()


# -- the warm record and the loader's check --------------------------------------------------


def record_for(share: NodeShare, digest: str = "d1") -> dict[str, Any]:
    return {
        "url": "s3://b/ds",
        "dataset_digest": digest,
        "cache_dir": "/nvme/ff",
        "options": asdict(share.options),
        "node_rank": share.node_rank,
        "num_nodes": share.num_nodes,
        "world_size": share.topology.world_size,
        "ranks_per_node": share.ranks_per_node,
        "epochs": share.epochs,
    }


def test_warm_mismatch_names_both_sides():
    warmed = NodeShare.build(num_nodes=2, ranks_per_node=4, node_rank=1)
    record = record_for(warmed)

    def mismatch(run: NodeShare, digest: str | None = "d1") -> str | None:
        return warm_mismatch(
            record,
            dataset_digest=digest,
            options=run.options,
            topology=run.topology,
            node_rank=run.node_rank,
        )

    assert mismatch(warmed) is None
    assert mismatch(warmed, digest=None) is None  # nothing to compare the version with
    # the same job spelled with world_size: the same share
    assert mismatch(NodeShare.build(world_size=8, ranks_per_node=4, node_rank=1)) is None

    msg = mismatch(NodeShare.build(num_nodes=3, ranks_per_node=4, node_rank=0))
    assert msg is not None and "\n" not in msg
    assert msg.startswith("cache at /nvme/ff was warmed for node 1 of 2 (4 ranks per node;")
    assert "this run is node 0 of 3 (4 ranks per node;" in msg
    assert "they differ in node rank, number of nodes:" in msg

    msg = mismatch(NodeShare.build(num_nodes=2, ranks_per_node=4, node_rank=1, window=2))
    assert msg is not None and "window 4" in msg and "window 2" in msg
    assert "they differ in window:" in msg

    msg = mismatch(NodeShare.build(num_nodes=2, ranks_per_node=4, node_rank=1, shuffle=False))
    assert msg is not None and "differ in shuffle" in msg

    msg = mismatch(warmed, digest="d2")
    assert msg is not None and "warmed for another version of the dataset s3://b/ds" in msg

    broken = {k: v for k, v in record.items() if k != "options"}
    msg = warm_mismatch(
        broken, dataset_digest="d1", options=PlanOptions(), topology=Topology(), node_rank=0
    )
    assert msg is not None and "cannot be read" in msg


def test_check_warm_record_warns_once_per_process(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    ds = make_dataset(str(tmp_path / "ds"), shards=4, shard_bytes=8_000)
    share = NodeShare.build(num_nodes=2, node_rank=1, seed=4)
    with ShardCache(tmp_path / "c", capacity="1MiB") as cache:
        assert check_warm_record(cache, ds, share.options, share.topology, 1) is None
        warm_share(cache, ds, share, progress=False)
        caplog.set_level(logging.WARNING, logger="flashfeed.loader")
        assert check_warm_record(cache, ds, share.options, share.topology, 1) is None
        other = PlanOptions(seed=5)
        for _ in range(3):
            msg = check_warm_record(cache, ds, other, share.topology, 0)
            assert msg is not None and "seed 4" in msg and "seed 5" in msg
    warnings = [r for r in caplog.records if r.name == "flashfeed.loader"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].getMessage() == msg


def test_a_loader_on_a_cache_warmed_for_another_node_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    from flashfeed.loader import ShardDataset

    ds = make_dataset(str(tmp_path / "ds"), shards=4, shard_bytes=8_000)
    root = str(tmp_path / "c")
    argv = ["cache", "warm", ds.url, "--cache-dir", root, "--num-nodes", "2", "--node-rank", "0",
            "--window", "3", "--capacity", "1MiB", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    caplog.set_level(logging.WARNING, logger="flashfeed.loader")
    # rank 2 of 4, 2 per node: node 1, while the cache holds node 0's share
    ShardDataset(ds, cache_dir=root, rank=2, world_size=4, ranks_per_node=2, window=3)
    (warning,) = [r for r in caplog.records if r.name == "flashfeed.loader"]
    assert "warmed for node 0 of 2 (1 ranks per node;" in warning.getMessage()
    assert "this run is node 1 of 2 (2 ranks per node;" in warning.getMessage()
    caplog.clear()
    # the run it was warmed for: silent
    ShardDataset(ds, cache_dir=root, rank=0, world_size=2, ranks_per_node=1, window=3)
    assert not [r for r in caplog.records if r.name == "flashfeed.loader"]


# -- bad input: one line, non-zero, no traceback ---------------------------------------------


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--window", "0"], "window must be >= 1, got 0"),
        (["--node-rank", "2", "--num-nodes", "2"], "node_rank must be in [0, 2), got 2"),
        (["--world-size", "6", "--ranks-per-node", "4"], "ranks_per_node must divide"),
        (["--hosts", "n0,n1"], "--hosts and --hostfile name the nodes of a cluster"),
        (["--ray-address", "auto", "--hostfile", "/nonexistent/hosts"], "cannot read the hostfile"),
    ],
)
def test_bad_warm_options_are_one_line_without_traceback(
    tmp_path: Path, flags: list[str], error: str
):
    env = {k: v for k, v in os.environ.items() if k != "FLASHFEED_CACHE_DIR"}
    argv = ["cache", "warm", str(tmp_path / "ds"), "--cache-dir", str(tmp_path / "c"), *flags]
    p = subprocess.run(
        [sys.executable, "-m", "flashfeed.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and error in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "c").exists()


def test_without_a_cache_dir_the_default_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.delenv("FLASHFEED_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["cache", "status"]) == 1
    err = capsys.readouterr().err
    assert f"no cache directory at {tmp_path / 'home' / '.cache' / 'flashfeed'}" in err
    monkeypatch.setenv("FLASHFEED_CACHE_DIR", str(tmp_path / "c"))
    ShardCache(tmp_path / "c", capacity="1MiB").close()
    assert main(["cache", "status", "--json"]) == 0

"""``flashfeed cache warm MIXTURE.json``: exactly the shards of every source a node reads
first, in the mixture's read order; a warmed node's loader then fetches nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashfeed.cache import ShardCache
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.cache.warm.units import mixture_order, open_sources
from flashfeed.cli import main
from flashfeed.loader import TokenLoader
from flashfeed.plan.mixture import Mixture, Source

from support.loader_helpers import make_token_dataset


@pytest.fixture
def mixture_file(s3_prefix: str, s3_info, tmp_path: Path, monkeypatch) -> Path:
    for k, v in s3_info.env().items():
        monkeypatch.setenv(k, v)
    opts = s3_info.storage_options()
    urls = {}
    for name, sizes in (("prose", [30, 30, 30, 30, 30, 30]), ("code", [20, 25, 20, 25])):
        urls[name] = f"{s3_prefix}/{name}"
        make_token_dataset(urls[name], sizes, seq_len=8, storage_options=opts)
    mix = Mixture((Source(urls["prose"], 2, "prose"), Source(urls["code"], 1, "code")))
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(mix.to_dict()))
    return path


def _shards(root: Path) -> set[str]:
    return {p.name for p in root.glob("*/data/shards/*.arrow")}


def test_warm_a_mixture_then_train_without_fetching(mixture_file: Path, tmp_path: Path, capsys):
    root = tmp_path / "cache"
    argv = ["cache", "warm", str(mixture_file), "--cache-dir", str(root), "--node-rank", "1",
            "--num-nodes", "2", "--ranks-per-node", "2", "--seed", "3",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    mix = Mixture.from_file(mixture_file)
    datasets = open_sources(mix)
    order = mixture_order(mix, datasets, NodeShare.build(node_rank=1, num_nodes=2,
                                                         ranks_per_node=2, seed=3))  # fmt: skip
    assert {s for s, _ in order} == {0, 1}  # shards of both sources
    assert f"{len(order)} fetched" in out
    # node 1's ranks (2 and 3 of 4) train from the warmed cache and fetch nothing
    for rank in (2, 3):
        loader = TokenLoader(str(mixture_file), batch_size=4, rank=rank, world_size=4,
                             ranks_per_node=2, seed=3, cache_dir=str(root))  # fmt: skip
        keys = [k for b in loader for k in b["__key__"]]
        assert keys and loader.stats()["cache"]["misses"] == 0
        loader.close()
    with ShardCache(str(root)) as cache:
        record = cache.warm_record(datasets[0].url)
    assert record is not None and record["mixture_digest"] == mix.digest
    assert record["source"] == "prose" and record["node_rank"] == 1


def test_warm_a_mixture_up_to_capacity_takes_the_first_in_read_order(
    mixture_file: Path, tmp_path: Path, capsys
):
    mix = Mixture.from_file(mixture_file)
    datasets = open_sources(mix)
    order = mixture_order(mix, datasets, NodeShare.build(num_nodes=1, ranks_per_node=2))
    first = order[:3]
    capacity = sum(datasets[s].shards[i].bytes for s, i in first) + 100
    root = tmp_path / "small"
    argv = ["cache", "warm", str(mixture_file), "--cache-dir", str(root), "--ranks-per-node",
            "2", "--capacity", str(capacity), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert "3 fetched" in capsys.readouterr().out
    got = sorted(str(p.relative_to(root)).split("/data/")[1] for p in
                 root.glob("*/data/shards/*.arrow"))  # fmt: skip
    assert got == sorted(datasets[s].shards[i].path for s, i in first)
    assert {datasets[s].url for s, _ in first} <= {d.url for d in datasets}


def test_a_cluster_warm_of_a_mixture_warms_each_nodes_share_on_a_real_ray(
    mixture_file: Path, tmp_path: Path, ray_session: None, capsys
):
    import ray

    (node,) = [n for n in ray.nodes() if n.get("Alive")]
    root = tmp_path / "cache"
    argv = ["cache", "warm", str(mixture_file), "--cache-dir", str(root), "--ray-address",
            "auto", "--hosts", node["NodeManagerAddress"], "--ranks-per-node", "2",
            "--epochs", "2", "--seed", "5", "--json"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    (result,) = json.loads(out)
    assert err == ""
    mix = Mixture.from_file(mixture_file)
    datasets = open_sources(mix)
    order = mixture_order(mix, datasets, NodeShare.build(num_nodes=1, ranks_per_node=2,
                                                         epochs=2, seed=5))  # fmt: skip
    assert result["node_id"] == node["NodeID"] and result["node_rank"] == 0
    assert result["mixture"] == str(mixture_file) and "error" not in result
    assert result["fetched"] == len(order) and result["pinned"] == len(order)
    with ShardCache(str(root)) as cache:  # every source's share is on the node, pinned
        for s, d in enumerate(datasets):
            mine = {i for t, i in order if t == s}
            assert {i for i in range(len(d.shards)) if cache.contains(d, i)} == mine
        record = cache.warm_record(datasets[1].url)
    assert record is not None and record["mixture_digest"] == mix.digest
    assert (record["source"], record["node_rank"], record["epochs"]) == ("code", 0, 2)
    # the node's ranks train from the cache the cluster warm filled, fetching nothing
    for rank in (0, 1):
        loader = TokenLoader(str(mixture_file), batch_size=4, rank=rank, world_size=2,
                             ranks_per_node=2, seed=5, cache_dir=str(root))  # fmt: skip
        assert [k for b in loader for k in b["__key__"]]
        assert loader.stats()["cache"]["misses"] == 0
        loader.close()


def test_a_cluster_warm_of_a_mixture_names_a_source_that_cannot_be_opened(
    mixture_file: Path, tmp_path: Path, ray_session: None, capsys
):
    import ray

    (node,) = [n for n in ray.nodes() if n.get("Alive")]
    raw = json.loads(mixture_file.read_text())
    raw["sources"][1]["url"] += "-typo"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    argv = ["cache", "warm", str(bad), "--cache-dir", str(tmp_path / "c"), "--ray-address",
            "auto", "--hosts", node["NodeManagerAddress"], "--no-progress"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mixture source 'code'" in err[0] and "-typo" in err[0]


def test_the_warm_order_follows_a_loader_whose_epochs_are_whole_batches(tmp_path: Path, capsys):
    # 15 slots a rank (length 31 on 2 ranks) in batches of 4: each epoch delivers 12, and
    # the next epoch's deal starts there; the warm order is the loader's only if it knows
    # the batch size
    sources = []
    for name, sizes in (("a", [6] * 12), ("b", [5] * 16)):
        make_token_dataset(str(tmp_path / name), sizes, seq_len=4)
        sources.append(Source(str(tmp_path / name), 1, name))
    mix = Mixture(tuple(sources), length=31)
    datasets = open_sources(mix)
    number = {}
    for i, (s, d) in enumerate(zip(mix.sources, datasets, strict=True)):
        number.update({(s.key, sh.path): (i, j) for j, sh in enumerate(d.shards)})
    per_rank = []
    for rank in range(2):
        loader = TokenLoader(mix, batch_size=4, rank=rank, world_size=2, seed=6)
        keys = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            keys += [k for b in loader for k in b["__key__"]]
        loader.close()
        per_rank.append(keys)
    read: list[tuple[int, int]] = []
    for pair in zip(*per_rank, strict=True):  # position by position, as the node reads
        for key in pair:
            source, rest = key.split(":", 1)
            shard = number[(source, rest.rsplit("/", 1)[0])]
            if shard not in read:
                read.append(shard)
    share = NodeShare.build(num_nodes=1, ranks_per_node=2, epochs=3, seed=6)
    assert mixture_order(mix, datasets, share, batch=4) == read
    assert mixture_order(mix, datasets, share) != read  # a batch of 1 drifts in epoch 1
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(mix.to_dict()))
    root = tmp_path / "cache"
    argv = ["cache", "warm", str(path), "--cache-dir", str(root), "--ranks-per-node", "2",
            "--epochs", "3", "--seed", "6", "--no-progress", "--json"]  # fmt: skip
    assert main([*argv, "--batch-size", "0"]) == 2
    assert "--batch-size must be >= 1, got 0" in capsys.readouterr().err
    assert main([*argv, "--batch-size", "4"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["shards"] == len(read)

"""``flashfeed cache warm|status|verify|evict`` against the real S3 server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from flashfeed import Dataset, storage
from flashfeed.cache import ShardCache
from flashfeed.cache.cli.admin import status
from flashfeed.cache.stats import read_persisted
from flashfeed.cache.warm.warm import NodeShare, fitting_prefix, warm
from flashfeed.cli import main
from flashfeed.storage import RetryPolicy

from support.cache_data import make_dataset, start_own_store


def cached(root: Path) -> set[str]:
    return {p.name for p in root.glob("*/data/shards/*.tar")}


def test_help_of_every_action_has_an_example(capsys: pytest.CaptureFixture[str]):
    for action in ("warm", "status", "verify", "evict"):
        with pytest.raises(SystemExit):
            main(["cache", action, "--help"])
        out = capsys.readouterr().out
        assert "example" in out and f"flashfeed cache {action}" in out


def test_warm_fetches_the_node_share_in_read_order_until_capacity(
    s3_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    ds = make_dataset(s3_prefix, shards=8, shard_bytes=60_000)
    share = NodeShare.build(node_rank=1, num_nodes=2, ranks_per_node=2, seed=3, epochs=2)
    order = share.order(ds)
    distinct = list(dict.fromkeys(order))
    assert set(distinct) < set(range(8))  # a node reads only its part
    capacity = sum(ds.shards[i].bytes for i in distinct[:3]) + 5_000
    root = tmp_path / "c"
    argv = ["cache", "warm", s3_prefix, "--cache-dir", str(root), "--node-rank", "1",
            "--num-nodes", "2", "--ranks-per-node", "2", "--seed", "3", "--epochs", "2",
            "--capacity", str(capacity), "--concurrency", "3", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "3 fetched, 0 already cached" in out
    expected = {Path(ds.shards[i].path).name for i in distinct[:3]}
    assert cached(root) == expected

    # status agrees with the files and the counters
    report = status(str(root))
    d = report["datasets"][0]
    files = list(root.glob("*/data/shards/*"))
    assert report["used_bytes"] == sum(f.stat().st_size for f in files)
    assert (d["cached_shards"], d["share"]["shards"]) == (3, len(distinct))
    assert d["share"]["fits"] is False and d["share"]["cached"] == 3
    assert d["next"] == [ds.shards[i].path for i in distinct[3:]][: len(d["next"])] == []
    counters = report["counters"]
    assert counters["misses"] == 3
    assert counters["bytes_fetched"] == sum(ds.shards[i].bytes for i in distinct[:3])
    assert main(["cache", "status", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counters"]["misses"] == 3
    assert main(["cache", "status", str(root)]) == 0
    text = capsys.readouterr().out
    assert "does NOT fit" in text and "misses 3" in text

    # with the whole share's room: fits, and a re-run fetches only what is missing
    argv[argv.index("--capacity") + 1] = "10MiB"
    assert main(argv) == 0
    assert f"{len(distinct) - 3} fetched, 3 already cached" in capsys.readouterr().out
    report = status(str(root), url=s3_prefix, share=share)
    assert report["datasets"][0]["share"]["fits"] is True
    assert read_persisted(str(root))["misses"] == len(distinct)


def test_status_of_a_dataset_not_yet_cached_says_whether_it_fits(s3_prefix: str, tmp_path):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=50_000)
    ShardCache(tmp_path / "c", capacity=120_000).close()
    share = NodeShare.build(num_nodes=2, node_rank=0)
    report = status(str(tmp_path / "c"), url=s3_prefix, share=share)
    d = report["datasets"][0]
    need = sum(ds.shards[i].bytes for i in set(share.order(ds)))
    assert d["share"]["bytes"] == need and d["share"]["fits"] is (need <= 120_000)


WARM_SLOWLY = """
import sys, time
from flashfeed.cache.fetch import fill
real = fill.OrderedHasher.add  # every fill path hashes each part in transit
def slow(self, off, data):
    time.sleep(0.02)
    real(self, off, data)
fill.OrderedHasher.add = slow
from flashfeed.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_interrupted_warm_continues_where_it_stopped(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=6, shard_bytes=256 << 10)
    root = tmp_path / "c"
    argv = ["cache", "warm", s3_prefix, "--cache-dir", str(root), "--capacity", "16MiB",
            "--concurrency", "1", "--part-size", "16KiB", "--no-progress"]  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", WARM_SLOWLY, *argv])
    deadline = time.monotonic() + 60
    while len(cached(root)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    first = cached(root)
    assert 2 <= len(first) < 6
    assert main(argv) == 0
    assert len(cached(root)) == 6
    # nothing fetched twice: one miss per shard over both runs
    assert read_persisted(str(root))["misses"] == 6
    with ShardCache(root, capacity="16MiB", verify="always") as cache:
        for i in range(6):
            assert Path(cache.get(ds, i)).read_bytes() == ds.read_shard(i)
        assert cache.stats()["misses"] == 0


def test_verify_removes_corrupt_shards_and_evict_keeps_pinned_ones(
    s3_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=40_000)
    root = tmp_path / "c"
    with ShardCache(root, capacity="1MiB") as cache:
        paths = [cache.get(ds, i) for i in range(3)]
        cache.pin(ds, 2)
    assert main(["cache", "verify", str(root)]) == 0
    data = bytearray(Path(paths[1]).read_bytes())
    data[100] ^= 0xFF
    Path(paths[1]).write_bytes(bytes(data))
    assert main(["cache", "verify", str(root)]) == 1
    assert "1 corrupt" in capsys.readouterr().out
    assert not os.path.exists(paths[1]) and not os.path.exists(paths[1] + ".idx")
    assert main(["cache", "evict", str(root), "--dataset", s3_prefix]) == 0
    out = capsys.readouterr().out
    assert "evicted 1 shards" in out and "kept 1 pinned" in out
    assert [os.path.exists(p) for p in paths] == [False, False, True]
    with ShardCache(root, capacity="1MiB") as cache:
        cache.unpin(ds, 2)
    assert main(["cache", "evict", str(root), "--all"]) == 0
    assert not cached(root)
    assert read_persisted(str(root))["evictions"] == 2


def _kill_after_first_shard(store, root: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cached(root) and time.monotonic() < deadline:
        time.sleep(0.002)
    store.kill()


def test_the_store_stopped_mid_warm_then_restarted(tmp_path: Path):
    sdir = tempfile.mkdtemp(prefix="ffrs-", dir="/tmp")
    store = start_own_store(sdir)
    opts = store.info.storage_options()
    try:
        store.make_bucket("flashfeed")
        prefix = "s3://flashfeed/restart"
        saved = {k: os.environ.get(k) for k in store.info.env()}
        os.environ.update(store.info.env())
        try:
            ds = make_dataset(prefix, shards=10, shard_bytes=256 << 10)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        ds = Dataset.open(prefix, storage_options=opts)
        order = list(range(10))
        root = tmp_path / "c"

        # 1. down for good: warm ends, naming the shards it could not get
        quick = RetryPolicy(attempts=3, base_delay=0.05, deadline=0.5)
        with ShardCache(
            root, capacity="8MiB", storage_options=opts, part_size="32KiB", concurrency=2,
            retry=quick,
        ) as cache:  # fmt: skip
            # a crash, not a timer: the store dies (SIGKILL) once the first shard is cached
            stopper = threading.Thread(target=_kill_after_first_shard, args=(store, root))
            stopper.start()
            result = warm(cache, ds, order, progress=False, workers=2)
            stopper.join()
        assert result.failed and result.fetched < 10
        assert all(p.startswith("shards/") for p in result.failed)
        assert all("could not fetch" in e or "StorageError" in e for e in result.failed.values())
        assert not list(root.glob("*/.parts/*"))

        # 2. back up: a re-run fetches only the rest; a restart mid-run is ridden through
        store.start()
        with ShardCache(
            root, capacity="8MiB", storage_options=opts, part_size="32KiB", concurrency=2,
            # the 30 s deadline bounds the wait, not the attempts: 20 attempts of up to 1 s ran
            # out after 8 s in a loaded run while SeaweedFS still answered 500 on restart
            retry=RetryPolicy(attempts=200, base_delay=0.1, max_delay=1.0, deadline=30),
        ) as cache:  # fmt: skip
            cache.get(ds, 9)  # the first connection after the restart
            restarter = threading.Thread(target=store.restart)
            restarter.start()
            result = warm(cache, ds, order, progress=False, workers=2)
            restarter.join()
        assert result.ok, result.failed
        assert len(cached(root)) == 10
        for i in range(10):
            got = Path(next(root.glob(f"*/data/{ds.shards[i].path}"))).read_bytes()
            assert got == storage.read_bytes(ds.shard_url(i), storage_options=opts)
    finally:
        store.stop()
        shutil.rmtree(sdir, ignore_errors=True)


def test_warm_on_a_ray_cluster_runs_one_task_per_node(
    s3_prefix: str, tmp_path: Path, ray_session: None, capsys: pytest.CaptureFixture[str]
):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=40_000)
    root = tmp_path / "c"
    argv = ["cache", "warm", s3_prefix, "--cache-dir", str(root), "--capacity", "4MiB",
            "--ray-address", "auto", "--json"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    results = json.loads(out)
    assert len(results) == 1 and results[0]["node_rank"] == 0 and results[0]["node_id"]
    # no host list: ranks follow Ray's node ids, and the user is told that may be wrong
    assert "node ranks follow Ray's node ids" in err and "--hosts" in err
    assert results[0]["fetched"] == 4 and results[0]["host"]
    assert cached(root) == {Path(s.path).name for s in ds.shards}
    fits, _ = fitting_prefix(ds, NodeShare().order(ds), 4 << 20)
    assert len(fits) == 4


def test_a_cluster_warm_through_the_services_refuses_peers_before_any_io(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("FLASHFEED_NODE_SOCKET", "/nonexistent/node.sock")
    argv = ["cache", "warm", "s3://nowhere/d", "--ray-address", "127.0.0.1:1", "--hosts",
            "n1", "--peers", "n1,n2"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "through the node services, their peers section does: drop --peers" in err, err

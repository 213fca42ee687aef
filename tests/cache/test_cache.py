"""ShardCache on the real S3 server: fills, verification, single flight, crashes, eviction."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashfeed import Dataset, storage
from flashfeed.cache import CacheCapacityError, CacheFullError, ShardCache
from flashfeed.cache.fetch import fill as fill_module
from flashfeed.cache.stats import read_persisted

from support import SUPPORT
from support.cache_data import make_dataset

WORKER = str(SUPPORT / "cache_worker.py")


def worker(action: str, root: Path, ds: Dataset, shard: int, **opts: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKER, action, str(root), ds.url, str(shard), json.dumps(opts)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def parts_of(root: Path) -> list[Path]:
    return list(root.glob("*/.parts/*"))


def test_get_returns_a_verified_private_copy_with_its_index(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=300_000)
    root = tmp_path / "cache"
    with ShardCache(root, capacity="10MiB", part_size="64KiB", concurrency=4) as cache:
        path = cache.get(ds, 1)
        assert Path(path).read_bytes() == ds.read_shard(1)
        assert Path(path + ".idx").read_bytes() == storage.read_bytes(ds.index_url(1))
        assert cache.get(ds, ds.shards[1]) == path  # by ShardInfo too
        s = cache.stats()
        assert (s["misses"], s["hits"], s["bytes_fetched"]) == (1, 1, ds.shards[1].bytes)
        parts = -(-ds.shards[1].bytes // (64 << 10))
        assert s["requests"] == parts + 1  # parallel ranged GETs, and the index
        assert s["used_bytes"] == os.path.getsize(path) + os.path.getsize(path + ".idx")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path + ".idx").st_mode) == 0o600
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    # another process (here: another instance) finds it without fetching
    with ShardCache(root, capacity="10MiB") as again:
        assert again.get(ds, 1) == path
        assert again.stats()["misses"] == 0
    assert read_persisted(str(root))["misses"] == 1


def test_a_fill_persists_its_miss_before_the_shard_becomes_visible(
    s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # a process killed right after the rename must not leave a cached shard whose fetch no
    # persisted counter remembers: at the moment the shard appears, the miss is on disk
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=100_000)
    root = tmp_path / "cache"
    persisted_at_publish: list[float] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if str(dst).endswith(".tar"):  # the shard itself, not its index or a progress file
            persisted_at_publish.append(read_persisted(str(root))["misses"])
        real_replace(src, dst)

    monkeypatch.setattr(fill_module.os, "replace", replace)
    with ShardCache(root, capacity="10MiB", part_size="64KiB") as cache:
        cache.get(ds, 0)
        cache.get(ds, 1)
    assert persisted_at_publish == [1, 2]


def test_bad_options_and_a_capacity_below_the_largest_shard(s3_prefix: str, tmp_path: Path):
    with pytest.raises(ValueError, match="capacity"):
        ShardCache(tmp_path / "c", capacity="lots")
    with pytest.raises(ValueError, match="concurrency"):
        ShardCache(tmp_path / "c", capacity="1MiB", concurrency=0)
    with pytest.raises(ValueError, match="verify"):
        ShardCache(tmp_path / "c", capacity="1MiB", verify="sometimes")
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=200_000)
    with ShardCache(tmp_path / "c", capacity=150_000) as cache:
        with pytest.raises(CacheCapacityError, match=r"smaller than shard shards/00000\d\.tar"):
            cache.get(ds, 0)
        assert not list((tmp_path / "c").rglob("*.tar"))


def test_a_bit_flip_is_detected_and_the_shard_refetched(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=1, shard_bytes=200_000)
    root = tmp_path / "c"
    with ShardCache(root, capacity="1MiB") as cache:
        path = cache.get(ds, 0)
    with open(path, "r+b") as f:
        f.seek(123_456)
        byte = f.read(1)
        f.seek(123_456)
        f.write(bytes([byte[0] ^ 0x10]))
    with ShardCache(root, capacity="1MiB") as cache:  # a new process verifies on first use
        assert cache.get(ds, 0) == path
        assert Path(path).read_bytes() == ds.read_shard(0)
        s = cache.stats()
        assert (s["corrupt_refetches"], s["misses"]) == (1, 1)


def test_verify_always_catches_a_flip_in_a_running_process(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=1, shard_bytes=100_000)
    with ShardCache(tmp_path / "c", capacity="1MiB", verify="always") as cache:
        path = cache.get(ds, 0)
        data = bytearray(Path(path).read_bytes())
        data[-2000] ^= 1
        Path(path).write_bytes(bytes(data))
        cache.get(ds, 0)
        assert Path(path).read_bytes() == ds.read_shard(0)
        assert cache.stats()["corrupt_refetches"] == 1


def test_many_processes_one_download(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=1, shard_bytes=4 << 20)
    root = tmp_path / "c"
    barrier = tmp_path / "go"
    opts = {"capacity": "64MiB", "part_size": "256KiB", "concurrency": 2, "barrier": str(barrier)}
    procs = [worker("get", root, ds, 0, **opts) for _ in range(5)]
    time.sleep(1.0)  # let them all import and open the cache
    barrier.touch()
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len({o["path"] for o in outs}) == 1
    assert Path(outs[0]["path"]).read_bytes() == ds.read_shard(0)
    assert sum(o["stats"]["misses"] for o in outs) == 1
    assert sum(o["stats"]["hits"] for o in outs) == 4
    persisted = read_persisted(str(root))
    assert (persisted["misses"], persisted["bytes_fetched"]) == (1, ds.shards[0].bytes)


def test_kill_9_mid_fill_leaves_a_consistent_cache(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=2 << 20)
    root = tmp_path / "c"
    opts = {"capacity": "8MiB", "part_size": "64KiB", "concurrency": 1, "slow_write": 0.05}
    p = worker("get", root, ds, 0, **opts)
    deadline = time.monotonic() + 30
    while not parts_of(root) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # some parts written
    p.send_signal(signal.SIGKILL)
    p.wait()
    leftovers = parts_of(root)
    assert leftovers, "the fill should have been in progress"
    dead_json = root / f"stats.json.{p.pid}.0badc0de.tmp"  # a JSON write cut short too
    dead_json.write_text("{")
    assert not list(root.rglob("000000.tar"))  # the final name was never created
    with ShardCache(root, capacity="8MiB") as cache:  # opening sweeps the dead fill
        assert not parts_of(root) and not dead_json.exists()
        assert cache.stats()["used_bytes"] == 0
        assert Path(cache.get(ds, 0)).read_bytes() == ds.read_shard(0)


def test_pinned_and_in_use_shards_survive_eviction(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=100_000)
    size = max(s.bytes for s in ds.shards) + 200  # shard + index
    root = tmp_path / "c"
    with ShardCache(root, capacity=3 * size, space_timeout=0.5) as cache:
        p0 = cache.get(ds, 0)
        cache.pin(ds, 0)
        holder = worker("hold", root, ds, 1, capacity=3 * size)  # another process reads 1
        p1 = json.loads(holder.stdout.readline())["path"]
        try:
            cache.get(ds, 2)
            cache.get(ds, 3)  # must evict: only 2 may go
            assert os.path.exists(p0) and os.path.exists(p1)
            assert not cache.contains(ds, 2) and cache.contains(ds, 3)
            with cache.open(ds, 3), pytest.raises(CacheFullError, match="1 pinned"):
                cache.get(ds, 2)  # 0 pinned, 1 and 3 in use: no room, a clear error
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
        cache.get(ds, 2)  # 1 is free again
        assert os.path.exists(p0) and not os.path.exists(p1)
        cache.unpin(ds, 0)
        assert cache.stats()["evictions"] == 2


def test_belady_evicts_the_shard_read_last_lru_the_oldest(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=100_000)
    size = max(s.bytes for s in ds.shards) + 200
    with ShardCache(tmp_path / "lru", capacity=3 * size) as cache:
        for i in (0, 1, 2):
            cache.get(ds, i)
            time.sleep(0.01)
        cache.get(ds, 0)  # 1 is now the least recently used
        cache.get(ds, 3)
        assert [cache.contains(ds, i) for i in range(4)] == [True, False, True, True]
    order = [0, 1, 2, 0, 3, 2, 1, 0]
    with ShardCache(tmp_path / "lru2", capacity=3 * size) as cache:
        for i in order[:5]:
            cache.get(ds, i)
            time.sleep(0.01)
        assert [cache.contains(ds, i) for i in range(4)] == [True, False, True, True]
    with ShardCache(tmp_path / "belady", capacity=3 * size) as cache:
        cache.set_future(ds, order, active=0)
        for i in order[:5]:
            cache.get(ds, i)
        # at 3, next uses: 2 in 1 step, 1 in 2, 0 in 3 -> 0 goes, where LRU drops 1
        assert [cache.contains(ds, i) for i in range(4)] == [False, True, True, True]
        future = json.loads(next((tmp_path / "belady").glob("*/future.json")).read_text())
        assert future["order"] == order


def test_a_fetch_ahead_never_evicts_a_shard_needed_sooner(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=100_000)
    size = max(s.bytes for s in ds.shards) + 200
    with ShardCache(tmp_path / "c", capacity=2 * size) as cache:
        cache.set_future(ds, [0, 1, 0, 1, 2], active=0)
        cache.get(ds, 0)
        cache.get(ds, 1)
        cache.fetch_ahead(ds, [2])  # 0 and 1 are read before 2: no room for it ahead of time
        cache.wait_fetch_ahead(timeout=30)
        assert isinstance(next(iter(cache.fetch_ahead_errors.values())), CacheFullError)
        assert cache.contains(ds, 0) and cache.contains(ds, 1) and not cache.contains(ds, 2)
        assert cache.stats()["fetch_ahead_skipped"] == 1
        cache.get(ds, 0)
        cache.get(ds, 1)
        cache.fetch_ahead(ds, [2])  # now 0 and 1 are not needed again: 2 may take their room
        cache.wait_fetch_ahead(timeout=30)
        assert cache.contains(ds, 2) and not cache.fetch_ahead_errors


def test_fetch_ahead_returns_at_once_and_fills_in_the_background(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=100_000)
    with ShardCache(tmp_path / "c", capacity="2MiB") as cache:
        t = time.monotonic()
        cache.fetch_ahead(ds, [0, 1, 2])
        assert time.monotonic() - t < 0.5
        cache.wait_fetch_ahead(timeout=30)
        assert all(cache.contains(ds, i) for i in range(3))
        assert not cache.fetch_ahead_errors
        cache.get(ds, 2)
        assert cache.stats()["hits"] == 1


def test_disk_full_mid_fill_is_a_clear_error_and_changes_nothing(
    s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=300_000)
    root = tmp_path / "c"
    calls = []
    real = fill_module._pwrite_all

    def full_disk(fd: int, data: bytes, offset: int) -> None:
        calls.append(offset)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)

    # the s3fs path writes each part with pwrite (the direct path reads into space that
    # posix_fallocate already reserved, so it cannot meet ENOSPC mid-fill)
    monkeypatch.setattr(fill_module, "reader_for_url", lambda *a, **kw: None)
    with ShardCache(root, capacity="4MiB", part_size="64KiB", concurrency=1) as cache:
        cache.get(ds, 1)
        monkeypatch.setattr(fill_module, "_pwrite_all", full_disk)
        with pytest.raises(CacheFullError, match=r"disk full .*shards/000000\.tar"):
            cache.get(ds, 0)
        assert not parts_of(root) and not cache.contains(ds, 0)
        monkeypatch.setattr(fill_module, "_pwrite_all", real)
        assert Path(cache.get(ds, 0)).read_bytes() == ds.read_shard(0)
        assert cache.contains(ds, 1)


def test_a_real_full_filesystem(s3_prefix: str, tmp_path: Path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here (the injected ENOSPC test covers this)")
    try:
        ds = make_dataset(s3_prefix, shards=1, shard_bytes=2 << 20)
        with ShardCache(mnt / "c", capacity="1GiB") as cache:
            with pytest.raises(CacheFullError, match="disk full"):
                cache.get(ds, 0)
            assert not parts_of(mnt / "c")
    finally:
        # a fill thread may still hold the mount for a moment: detach it then (it goes once
        # unused) rather than leave a mount behind the test
        if subprocess.run(["umount", str(mnt)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False)

"""Cache fills killed or damaged: a fill SIGKILLed at random points 20 times leaves only
complete, verified shards and no part file; truncated cache files are found and refetched."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from flashfeed import Dataset, storage
from flashfeed.cache import ShardCache
from flashfeed.storage import file_checksum

from support import SUPPORT
from support.cache_data import make_dataset


def _cache_is_consistent(root: Path, ds: Dataset) -> int:
    """Every shard file present is complete and verified; no part file survives a reopen."""
    with ShardCache(root, capacity="8MiB") as cache:
        assert not list(root.glob("*/.parts/*"))
        present = 0
        for i, info in enumerate(ds.shards):
            path = root.glob(f"*/data/{info.path}")
            for p in path:
                assert p.stat().st_size == info.bytes
                assert file_checksum(str(p)) == info.checksum
                assert Path(str(p) + ".idx").read_bytes() == storage.read_bytes(ds.index_url(i))
                present += 1
        assert cache.used_bytes() == sum(
            p.stat().st_size for p in root.glob("*/data/**/*") if p.is_file()
        )
    return present


def test_cache_fill_sigkilled_at_random_points_20_times(s3_prefix: str, tmp_path: Path) -> None:
    ds = make_dataset(s3_prefix, shards=6, shard_bytes=160_000)
    root = tmp_path / "c"
    rng = random.Random(6)
    seen = []
    for _ in range(20):
        p = subprocess.Popen(
            [sys.executable, str(SUPPORT / "fill_worker.py"), str(root), ds.url],
            stdout=subprocess.PIPE,
        )
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        # aim anywhere in the warm: after a random number of whole shards, then a moment in
        for _ in range(rng.randrange(len(ds.shards))):
            assert p.stdout.readline().startswith(b"filled ")
        time.sleep(rng.uniform(0.0, 0.08))
        p.send_signal(signal.SIGKILL)
        p.wait()
        seen.append(_cache_is_consistent(root, ds))
        if seen[-1] == len(ds.shards):  # everything arrived: start over, keep killing fills
            shutil.rmtree(root)
    assert any(0 < n < len(ds.shards) for n in seen), seen  # kills landed mid-warm
    with ShardCache(root, capacity="8MiB") as cache:
        for i in range(len(ds.shards)):
            assert Path(cache.get(ds, i)).read_bytes() == ds.read_shard(i)


def test_truncated_cache_files_are_detected_and_refetched(s3_prefix: str, tmp_path: Path) -> None:
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=50_000)
    root = tmp_path / "c"
    with ShardCache(root, capacity="1MiB") as cache:
        paths = [cache.get(ds, i) for i in range(2)]
    os.truncate(paths[0], 1000)
    os.truncate(paths[1], 0)
    with ShardCache(root, capacity="1MiB", verify="never") as cache:  # size is always checked
        for i in range(2):
            assert Path(cache.get(ds, i)).read_bytes() == ds.read_shard(i)
        assert cache.stats()["corrupt_refetches"] == 2


def test_an_index_left_without_its_shard_is_swept_and_refilled(
    s3_prefix: str, tmp_path: Path
) -> None:
    """A kill between a fill's two renames (index, then shard) or an eviction's two unlinks
    (shard, then index) leaves an index alone: a reopen removes it, so the bytes the cache
    counts are the bytes on disk, and the shard is fetched again with its index."""
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=50_000)
    root = tmp_path / "c"
    with ShardCache(root, capacity="1MiB") as cache:
        paths = [cache.get(ds, i) for i in range(3)]
    os.unlink(paths[1])  # the state a kill between the two leaves
    assert Path(paths[1] + ".idx").exists()
    assert _cache_is_consistent(root, ds) == 2
    assert not Path(paths[1] + ".idx").exists()
    with ShardCache(root, capacity="1MiB") as cache:
        assert Path(cache.get(ds, 1)).read_bytes() == ds.read_shard(1)
    assert Path(paths[1] + ".idx").read_bytes() == storage.read_bytes(ds.index_url(1))
    assert Path(paths[0] + ".idx").exists() and Path(paths[2] + ".idx").exists()

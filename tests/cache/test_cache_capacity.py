"""The capacity belongs to the cache: set by whoever creates it, adopted by every opener.

The journey a user lives: ``flashfeed cache warm --capacity``, then a ``Loader`` given only
the cache directory, on a real small disk (a 200 MiB tmpfs), must neither shrink the
capacity to a share of the space the warm left nor evict what was warmed.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from flashfeed import Dataset
from flashfeed.cache import CacheHandle, ShardCache
from flashfeed.cache.space import DEFAULT_FRACTION, scan
from flashfeed.cache.stats import read_persisted
from flashfeed.format.manifest import Manifest, commit_manifest
from flashfeed.s3.retry import RetryPolicy
from flashfeed.shardio import shard_name, write_tar_shard
from flashfeed.units import format_size

from support.cache_data import make_dataset
from support.loader_helpers import make_image_dataset

MiB = 1 << 20
CLI = [sys.executable, "-c", "import sys; from flashfeed.cli import main; sys.exit(main())"]


def _recorded(root: Path) -> int:
    return int(json.loads((root / "cache.json").read_text())["capacity"])


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "flashfeed.cache"]


# -- who sets the capacity -------------------------------------------------------------------
def test_opening_without_a_capacity_adopts_the_recorded_one(s3_prefix: str, tmp_path: Path):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=200_000)
    root = tmp_path / "c"
    with ShardCache(root, capacity="3MiB") as first:
        for i in range(3):
            first.get(ds, i)
    with ShardCache(root) as second:
        assert second.capacity == 3 * MiB
        assert second.stats()["capacity"] == 3 * MiB
    assert _recorded(root) == 3 * MiB
    assert len(scan(str(root))[0]) == 3  # nothing evicted by the second opener


def test_an_explicit_different_capacity_is_honoured_and_logged(
    s3_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=300_000)
    root = tmp_path / "c"
    caplog.set_level(logging.INFO, logger="flashfeed.cache")
    with ShardCache(root, capacity="3MiB") as cache:
        for i in range(3):
            cache.get(ds, i)
    caplog.clear()
    with ShardCache(root, capacity="3MiB"):
        pass
    assert not [m for m in _messages(caplog) if "capacity" in m]  # same value: nothing to say

    with ShardCache(root, capacity="5MiB") as cache:
        assert cache.capacity == 5 * MiB
    assert _recorded(root) == 5 * MiB
    (raised,) = [r for r in caplog.records if "capacity changed" in r.getMessage()]
    assert raised.levelno == logging.INFO
    assert "3.0 MiB" in raised.getMessage() and "5.0 MiB" in raised.getMessage()

    caplog.clear()
    held = scan(str(root))[1]
    lower = held // 2
    with ShardCache(root, capacity=lower) as cache:
        assert cache.capacity == lower
        cache.get(ds, 3)  # the next fill brings the cache within the new bound
        assert cache.used_bytes() <= lower and cache.stats()["evictions"] >= 2
    (lowered,) = [r for r in caplog.records if "capacity changed" in r.getMessage()]
    assert lowered.levelno == logging.WARNING
    text = lowered.getMessage()
    assert "5.0 MiB" in text and format_size(lower) in text and "evict" in text
    with ShardCache(root) as cache:
        assert cache.capacity == lower


def test_concurrent_first_openers_agree_on_one_capacity(tmp_path: Path):
    root = tmp_path / "c"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        got = pool.map(_open_capacity, [str(root)] * 3)
    assert len(set(got)) == 1 and got[0] == _recorded(root)


def _open_capacity(root: str) -> int:
    with ShardCache(root) as cache:
        return cache.capacity


# -- every process opens it with the same options --------------------------------------------
def _odd_cache(root: Path) -> ShardCache:
    return ShardCache(
        root,
        capacity="7MiB",
        storage_options={"endpoint_url": "http://127.0.0.1:1", "secret": "s3cr3t"},
        part_size="64KiB",
        concurrency=3,
        min_concurrency=2,
        fetch_ahead_workers=2,
        verify="always",
        space_timeout=1.5,
        retry=RetryPolicy(attempts=3, deadline=5.0),
    )


def _options_of(handle: CacheHandle) -> tuple[Any, Any, Any, int]:
    with handle.open() as cache:
        return cache.root, cache.options, cache.storage_options, os.getpid()


def test_a_handle_reopens_the_cache_with_every_option_in_another_process(tmp_path: Path):
    with _odd_cache(tmp_path / "c") as cache:
        handle = cache.handle()
        assert handle == pickle.loads(pickle.dumps(handle))
        assert "s3cr3t" not in repr(handle)
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            root, options, storage_options, pid = pool.apply(_options_of, (handle,))
        assert pid != os.getpid()
        assert (root, options, storage_options) == (
            cache.root,
            cache.options,
            cache.storage_options,
        )
        assert options.part_size == 64 << 10 and options.retry == RetryPolicy(3, deadline=5.0)


def _source_cache_options(source: Any) -> tuple[Any, Any, int, int]:
    cache = source._cache()  # what a reader process does before it fetches a missing shard
    return cache.options, cache.storage_options, cache.capacity, os.getpid()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_reader_processes_open_the_cache_with_the_parents_options(
    s3_prefix: str, tmp_path: Path, method: str
):
    from flashfeed.loader.sources import CacheShardSource, open_source

    make_image_dataset(s3_prefix, [4, 4], size=8)
    ds = Dataset.open(s3_prefix)
    with _odd_cache(tmp_path / "c"):
        pass  # the cache's creator sets the options a loader then finds
    for source in (
        open_source(ds, cache_dir=str(tmp_path / "c")),
        CacheShardSource(ds, _odd_cache(tmp_path / "c")),
    ):
        parent = source.cache
        assert isinstance(source, CacheShardSource)
        with multiprocessing.get_context(method).Pool(1) as pool:
            options, storage_options, capacity, pid = pool.apply(_source_cache_options, (source,))
        assert pid != os.getpid()
        assert options == parent.options and capacity == 7 * MiB
        assert storage_options == parent.storage_options
        parent.close()


# -- the journey on a real small disk --------------------------------------------------------
@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A real 200 MiB file system of this test's own."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 200 MiB tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200m,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _padded_image_dataset(prefix: str, shards: int, shard_bytes: int) -> Dataset:
    """Image shards made big by a member the loader does not read (``.pad``)."""
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(buf, format="JPEG")
    jpg = buf.getvalue()
    per_shard = 4
    pad = b"\0" * (shard_bytes // per_shard - 4096)
    infos = []
    for i in range(shards):
        samples = [
            (f"s{i:04d}-{j:04d}", {"jpg": jpg, "cls": str(j % 3).encode(), "pad": pad})
            for j in range(per_shard)
        ]
        infos.append(write_tar_shard(prefix, shard_name(i, "tar"), samples))
    manifest = Manifest(
        name="padded-images",
        shard_format="webdataset",
        schema={"jpg": "image/jpeg", "cls": "label", "pad": "application/octet-stream"},
        shards=tuple(infos),
    )
    commit_manifest(prefix, manifest)
    return Dataset.open(prefix)


def _inodes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_ino for p in root.glob("*/data/shards/*")}


def test_warm_then_train_keeps_the_warmed_capacity_and_shards(s3_prefix: str, disk: Path):
    from flashfeed.loader import Loader

    ds = _padded_image_dataset(s3_prefix, shards=9, shard_bytes=16 * MiB)
    total = sum(s.bytes for s in ds.shards)
    assert 140 * MiB < total < 150 * MiB
    root = disk / "cache"
    env = dict(os.environ)
    warmed = subprocess.run(
        [
            *CLI,
            "cache",
            "warm",
            s3_prefix,
            "--cache-dir",
            str(root),
            "--capacity",
            "190MiB",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert warmed.returncode == 0, warmed.stderr
    assert "9 fetched, 0 already cached, 0 over capacity" in warmed.stdout
    assert _recorded(root) == 190 * MiB
    free_after_warm = shutil.disk_usage(root).free
    assert free_after_warm * DEFAULT_FRACTION < 45 * MiB  # what a loader used to shrink it to
    before = _inodes(root)
    assert len(before) == 18  # 9 shards and their indexes
    counted = read_persisted(str(root))
    assert (counted["misses"], counted["bytes_fetched"]) == (9, total)

    loader = Loader(s3_prefix, batch_size=4, image_size=8, cache_dir=str(root), shuffle=False)
    try:
        assert loader.source.capacity == 190 * MiB
        keys = [k for batch in loader for k in batch["label"].tolist()]
        assert len(keys) == 36  # every sample of the epoch
        stats = loader.stats()["cache"]
    finally:
        loader.close()
    assert stats["capacity"] == 190 * MiB and stats["misses"] == 0
    after = read_persisted(str(root))
    assert (after["misses"], after["bytes_fetched"]) == (9, total)  # nothing fetched again
    assert after["evictions"] == 0
    assert _inodes(root) == before  # the very files the warm wrote
    assert _recorded(root) == 190 * MiB

    status = subprocess.run(
        [*CLI, "cache", "status", str(root)], capture_output=True, text=True, env=env
    )
    assert status.returncode == 0, status.stderr
    assert f"{format_size(total)} used of 190.0 MiB" in status.stdout


def test_a_cache_without_a_record_counts_what_it_holds_as_room(s3_prefix: str, disk: Path):
    ds = make_dataset(s3_prefix, shards=6, shard_bytes=20 * MiB)
    root = disk / "cache"
    with ShardCache(root, capacity="190MiB") as cache:
        for i in range(6):
            cache.get(ds, i)
    (root / "cache.json").unlink()  # a cache made before capacities were recorded
    held = scan(str(root))[1]
    assert held > 110 * MiB
    free = shutil.disk_usage(root).free
    with ShardCache(root) as cache:
        expected = int((free + held) * DEFAULT_FRACTION)
        assert abs(cache.capacity - expected) <= 64 << 10
        assert cache.capacity > held  # 0.8 x free alone would be far below what it holds
        assert all(cache.contains(ds, i) for i in range(6))
    assert _recorded(root) == cache.capacity

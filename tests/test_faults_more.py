"""Faults with nothing lost, beyond test_ingest_faults / test_storage_faults / test_cache*:
a Ray worker SIGKILLed mid-task, a cache fill SIGKILLed at random points 20 times, the store
restarted under a loader, truncated cache files, a corrupt shard on the store."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from cache_data import make_dataset, start_own_store
from loader_helpers import make_image_dataset

from flashfeed import CorruptShardError, Dataset, storage
from flashfeed.cache import ShardCache
from flashfeed.cache.fill import file_checksum
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.loader import Loader
from flashfeed.storage import RetryPolicy

HERE = Path(__file__).parent


def _objects(prefix: str) -> dict[str, bytes]:
    return {url[len(prefix) :]: storage.read_bytes(url) for url in storage.list_files(prefix)}


def _running_shard_task(timeout: float = 60) -> int:
    """The pid of a Ray worker while it runs a shard task (Ray titles it ``ray::run_shard``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::run_shard"):
                        return int(pid)
            except OSError:
                pass
        time.sleep(0.005)
    raise AssertionError(f"no shard task ran within {timeout} s")


@pytest.mark.usefixtures("ray_session")
def test_ray_worker_killed_mid_task_is_retried_to_identical_bytes(
    tmp_path: Path, s3_prefix: str
) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, size=(1200, 900))
    cfg = dict(
        source=str(src),
        samples_per_shard=2,
        seed=2,
        validate=True,
        max_image_side=96,
        name="photos",
        progress="none",
    )
    outcome: dict[str, object] = {}

    def ingest() -> None:
        try:
            outcome["result"] = run(IngestConfig(dest=f"{s3_prefix}/faulted", **cfg))
        except BaseException as exc:
            outcome["error"] = exc

    driver = threading.Thread(target=ingest)
    driver.start()
    try:
        victim = _running_shard_task()
        os.kill(victim, signal.SIGKILL)  # a Ray worker, mid-task
    finally:
        driver.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    run(IngestConfig(dest=f"{s3_prefix}/clean", **cfg))
    faulted, clean = _objects(f"{s3_prefix}/faulted"), _objects(f"{s3_prefix}/clean")
    assert faulted == clean and len(clean) == 2 * 4 + 2  # shards and indexes, header, table


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
    start = time.monotonic()
    for _ in range(20):
        p = subprocess.Popen(
            [sys.executable, str(HERE / "fill_worker.py"), str(root), ds.url],
            stdout=subprocess.PIPE,
        )
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.4))
        p.send_signal(signal.SIGKILL)
        p.wait()
        seen.append(_cache_is_consistent(root, ds))
        if seen[-1] == len(ds.shards):  # everything arrived: start over, keep killing fills
            shutil.rmtree(root)
    assert time.monotonic() - start < 120
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


def test_a_corrupt_shard_on_the_store_is_named_by_the_loader(s3_prefix: str, tmp_path: Path):
    make_image_dataset(s3_prefix, [8, 8, 8], size=16)
    ds = Dataset.open(s3_prefix)
    url = ds.shard_url(1)
    data = bytearray(storage.read_bytes(url))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(url, bytes(data))
    cache = ShardCache(tmp_path / "c", capacity="16MiB")
    loader = Loader(ds, batch_size=4, image_size=16, cache=cache, shuffle=False, readahead=0)
    with pytest.raises(CorruptShardError, match=r"shards/000001\.tar of dataset s3://") as err:
        for _ in loader:
            pass
    assert s3_prefix in str(err.value)
    assert not list((tmp_path / "c").rglob("000001.tar"))
    cache.close()


def test_loader_rides_through_a_store_restart_with_identical_batches(tmp_path: Path) -> None:
    sdir = tempfile.mkdtemp(prefix="ffrl-", dir="/tmp")
    store = start_own_store(sdir)
    opts = store.info.storage_options()
    try:
        store.make_bucket("flashfeed")
        prefix = "s3://flashfeed/restart-loader"
        make_image_dataset(prefix, [6] * 12, size=16, storage_options=opts)
        ds = Dataset.open(prefix, storage_options=opts)
        patient = RetryPolicy(attempts=30, base_delay=0.1, max_delay=1.0, deadline=60)

        retries: list[int] = []

        def epoch(root: Path, disturb: bool) -> list[int]:
            cache = ShardCache(root, capacity="16MiB", storage_options=opts, retry=patient)
            loader = Loader(
                ds, batch_size=6, image_size=16, cache=cache, seed=4, readahead=0, py_workers=0
            )
            labels: list[int] = []
            restarter = threading.Thread(target=store.restart)
            for n, batch in enumerate(loader):
                labels += batch["label"].tolist()
                if disturb and n == 1:
                    restarter.start()  # killed and restarted while shards are still fetched
            if disturb:
                restarter.join()
                retries.append(cache.stats()["retries"])
            cache.close()
            return labels

        disturbed = epoch(tmp_path / "a", disturb=True)
        assert disturbed == epoch(tmp_path / "b", disturb=False)
        assert len(disturbed) == 72
        assert retries[0] > 0  # fetches did meet the store down, and were retried
        assert not list((tmp_path / "a").glob("*/.parts/*"))
        with ShardCache(tmp_path / "a", capacity="16MiB", verify="always") as cache:
            for i in range(len(ds.shards)):
                cache.get(ds, i)
            assert cache.stats()["corrupt_refetches"] == 0
    finally:
        store.stop()
        shutil.rmtree(sdir, ignore_errors=True)

"""The loader when the store misbehaves: a corrupt shard on the store is named, never
cached; a store restarted mid-epoch is ridden out by the retries, with identical batches."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from flashfeed import CorruptShardError, Dataset, storage
from flashfeed.cache import ShardCache
from flashfeed.loader import Loader
from flashfeed.storage import RetryPolicy

from support.cache_data import start_own_store
from support.loader_helpers import make_image_dataset


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
        # the 60 s deadline bounds the wait, not the attempts: with full jitter 30 attempts
        # waited about 15 s, and a loaded 2-CPU machine took longer than that to stop and
        # start the server again
        patient = RetryPolicy(attempts=400, base_delay=0.1, max_delay=1.0, deadline=60)

        retries: list[int] = []

        def epoch(root: Path, disturb: bool) -> list[int]:
            cache = ShardCache(root, capacity="16MiB", storage_options=opts, retry=patient)
            loader = Loader(
                ds, batch_size=6, image_size=16, cache=cache, seed=4, readahead=0, py_workers=0
            )
            labels: list[int] = []
            failed: list[BaseException] = []

            def restart() -> None:
                try:
                    store.restart()
                except BaseException as exc:  # told below, with the server's log
                    failed.append(exc)

            restarter = threading.Thread(target=restart)
            try:
                for n, batch in enumerate(loader):
                    labels += batch["label"].tolist()
                    if disturb and n == 1:
                        restarter.start()  # killed and restarted while shards are fetched
            finally:  # a failed epoch still waits for the server before it is removed
                if restarter.is_alive():
                    restarter.join()
                if failed:
                    raise AssertionError(f"the server did not restart: {failed[0]}")
            if disturb:
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

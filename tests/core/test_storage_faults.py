"""Faults of a real S3 server: a restart in the middle of a multi-shard read is ridden out by
the retries; a server gone for good is one clear StorageError within the retry deadline.

These tests stop their own SeaweedFS (never the session's shared one).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from flashfeed import Dataset, Manifest, StorageError, commit_manifest, storage
from flashfeed.cli.devstore import EmbeddedStore
from flashfeed.shardio import shard_name, write_tar_shard

SHARDS = 8
PER_SHARD = 16


def samples(shard: int) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (f"s{shard:02d}x{i:03d}", {"bin": bytes([shard, i]) * 4000, "cls": b"%d" % i})
        for i in range(PER_SHARD)
    ]


@pytest.fixture
def own_store() -> Iterator[EmbeddedStore]:
    root = tempfile.mkdtemp(prefix="fff-", dir="/tmp")
    store = EmbeddedStore(root)
    try:
        store.start()
        store.make_bucket("faults")
        yield store
    finally:
        store.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dataset(own_store: EmbeddedStore) -> tuple[str, dict]:
    opts = own_store.info.storage_options()
    prefix = "s3://faults/ds"
    infos = tuple(
        write_tar_shard(prefix, shard_name(i, "tar"), samples(i), storage_options=opts)
        for i in range(SHARDS)
    )
    m = Manifest(name="faults", shard_format="webdataset", schema={"bin": "x"}, shards=infos)
    commit_manifest(prefix, m, storage_options=opts)
    return prefix, opts


def test_read_survives_a_server_restart_mid_read(
    own_store: EmbeddedStore, dataset: tuple[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHFEED_RETRY_DEADLINE", "60")
    prefix, opts = dataset
    ds = Dataset.open(prefix, storage_options=opts)
    stopped = threading.Event()
    restarted = threading.Event()
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            own_store.kill()  # as a crash would: no graceful shutdown
            stopped.set()
            time.sleep(2.0)  # reads run into a dead server meanwhile
            own_store.start()
            restarted.set()
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)
            stopped.set()

    got = []
    thread = threading.Thread(target=restart, daemon=True)
    t0 = time.monotonic()
    for i, info in enumerate(ds.shards):
        got.extend(ds.iter_shard(info))
        if i == 1:
            thread.start()
            assert stopped.wait(30)
            assert not errors, errors
            assert not own_store.pid_alive()
    thread.join(60)
    assert not errors, errors
    assert restarted.is_set(), "the read finished before the server came back"
    assert got == [s for i in range(SHARDS) for s in samples(i)]
    assert time.monotonic() - t0 < 60


def test_server_gone_for_good_is_one_clear_error_in_bounded_time(
    own_store: EmbeddedStore, dataset: tuple[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHFEED_RETRY_DEADLINE", "2")
    prefix, opts = dataset
    ds = Dataset.open(prefix, storage_options=opts)
    assert list(ds.iter_shard(0)) == samples(0)
    own_store.kill()
    t0 = time.monotonic()
    with pytest.raises(StorageError) as err:
        ds.read_shard(1)
    elapsed = time.monotonic() - t0
    assert elapsed < 12, f"gave up only after {elapsed:.1f}s"
    text = str(err.value)
    assert storage.join(prefix, "shards/000001.tar") in text
    assert own_store.info.endpoint in text
    assert "start the server or fix AWS_ENDPOINT_URL" in text
    assert own_store.info.secret_key not in text

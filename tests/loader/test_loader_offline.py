"""Training from a warmed node cache while the object store is away: the store stopped
after a full warm, or refusing the credentials. The loader starts on the version the node
holds (one warning), delivers a full epoch and resumes from a checkpoint with nothing
fetched; `cache status` and `cache verify` work offline; a shard the cache cannot serve
fails with one line naming the shard and the store's error."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashfeed.cache import ShardCache
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.cache.warm.warm import warm_share
from flashfeed.cli import main as cli_main
from flashfeed.cli.devstore import EmbeddedStore
from flashfeed.loader import TokenLoader
from flashfeed.storage import RetryPolicy

from support.cache_data import start_own_store
from support.loader_helpers import make_token_dataset

SHARDS = [40] * 6
TOTAL = sum(SHARDS)
UNREACHABLE = "object store unreachable: reading version"


@pytest.fixture
def own_store() -> Iterator[EmbeddedStore]:
    """A private server: these tests stop it."""
    sdir = tempfile.mkdtemp(prefix="ffoff-", dir="/tmp")
    store = start_own_store(sdir)
    try:
        store.make_bucket("flashfeed")
        yield store
    finally:
        store.stop()
        shutil.rmtree(sdir, ignore_errors=True)


def _warm(root: Path, prefix: str, opts: dict) -> str:
    """Warm the node's whole share of one epoch; returns the version warmed."""
    with ShardCache(root, capacity="16MiB", storage_options=opts) as cache:
        ds = cache.open_dataset(prefix)
        result = warm_share(cache, ds, NodeShare(), progress=False)
    assert result.ok and result.fetched == len(SHARDS) and result.pinned == len(SHARDS)
    return ds.manifest.digest


def _keys(loader: TokenLoader, stop: int | None = None) -> list[str]:
    keys: list[str] = []
    for n, batch in enumerate(loader):
        keys += list(batch["__key__"])
        if stop is not None and n + 1 == stop:
            break
    return keys


def _train_offline(root: Path, prefix: str, opts: dict, version: str, caplog) -> None:
    """A full epoch, then an epoch cut at a checkpoint and resumed by a new loader: every
    sample once, nothing fetched, one warning naming the version."""
    kw = dict(batch_size=8, cache_dir=str(root), storage_options=opts, seed=3)
    with caplog.at_level(logging.WARNING, logger="flashfeed"):
        loader = TokenLoader(prefix, **kw)
        assert loader.dataset.manifest.digest == version
        keys = _keys(loader)
        assert len(keys) == TOTAL and len(set(keys)) == TOTAL
        assert loader.stats()["cache"]["bytes_fetched"] == 0
        loader.close()
        first = TokenLoader(prefix, **kw)
        head = _keys(first, stop=4)
        state = first.state_dict()
        first.close()
        resumed = TokenLoader(prefix, **kw)
        resumed.load_state_dict(state)
        tail = _keys(resumed)
        assert sorted(head + tail) == sorted(keys)  # exactly once across the checkpoint
        assert resumed.stats()["cache"]["bytes_fetched"] == 0
        resumed.close()
    warned = [r.getMessage() for r in caplog.records if UNREACHABLE in r.getMessage()]
    assert len(warned) == 1 and version in warned[0]


def test_a_warmed_node_trains_and_resumes_with_the_store_stopped(
    own_store: EmbeddedStore, tmp_path: Path, caplog, capsys
) -> None:
    opts = own_store.info.storage_options()
    prefix = "s3://flashfeed/offline-stopped"
    make_token_dataset(prefix, SHARDS, seq_len=8, storage_options=opts)
    root = tmp_path / "node"
    version = _warm(root, prefix, opts)
    own_store.stop()
    _train_offline(root, prefix, opts, version, caplog)
    capsys.readouterr()
    assert cli_main(["cache", "status", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"version {version}" in out and f"{len(SHARDS)}/{len(SHARDS)} shards cached" in out
    assert cli_main(["cache", "verify", str(root)]) == 0
    assert f"checked {len(SHARDS)} shards" in capsys.readouterr().out


def test_a_warmed_node_trains_when_the_store_refuses_the_credentials(
    s3_store: EmbeddedStore, s3_prefix: str, tmp_path: Path, caplog
) -> None:
    opts = s3_store.info.storage_options()
    make_token_dataset(s3_prefix, SHARDS, seq_len=8, storage_options=opts)
    root = tmp_path / "node"
    version = _warm(root, s3_prefix, opts)
    rotated = {**opts, "secret": "not-the-secret"}
    _train_offline(root, s3_prefix, rotated, version, caplog)


def test_a_shard_the_cache_cannot_serve_fails_in_one_line_naming_it_and_the_store_error(
    own_store: EmbeddedStore, tmp_path: Path
) -> None:
    opts = own_store.info.storage_options()
    prefix = "s3://flashfeed/offline-missing"
    make_token_dataset(prefix, SHARDS, seq_len=8, storage_options=opts)
    root = tmp_path / "node"
    _warm(root, prefix, opts)
    assert cli_main(["cache", "evict", str(root), "--dataset", prefix]) == 0  # pins released
    own_store.stop()
    cache = ShardCache(
        root, storage_options=opts, retry=RetryPolicy(attempts=3, base_delay=0.1, deadline=2)
    )
    loader = TokenLoader(prefix, batch_size=8, cache=cache, storage_options=opts, readahead=0)
    with pytest.raises(Exception) as failed:
        _keys(loader)
    message = str(failed.value)
    assert "\n" not in message
    assert "shards/0000" in message and prefix in message
    assert own_store.info.endpoint in message
    loader.close()
    cache.close()


def test_the_store_gone_mid_epoch_on_a_cold_cache_is_one_line_naming_the_shard(
    own_store: EmbeddedStore, tmp_path: Path
) -> None:
    opts = own_store.info.storage_options()
    prefix = "s3://flashfeed/offline-cold"
    make_token_dataset(prefix, SHARDS, seq_len=8, storage_options=opts)
    cache = ShardCache(
        tmp_path / "node",
        storage_options=opts,
        retry=RetryPolicy(attempts=50, base_delay=0.1, max_delay=0.5, deadline=3),
    )
    loader = TokenLoader(
        prefix, batch_size=8, cache=cache, storage_options=opts, readahead=0, window=1
    )
    delivered = 0
    with pytest.raises(Exception) as failed:
        for batch in loader:
            delivered += len(batch["__key__"])
            if delivered == 8:
                own_store.stop()  # gone for good, mid-epoch, most shards not fetched yet
    assert 8 <= delivered < TOTAL
    message = str(failed.value)
    assert "\n" not in message and "could not fetch shard shards/0000" in message
    assert own_store.info.endpoint in message
    assert cache.stats()["failures"] >= 1
    loader.close()
    cache.close()

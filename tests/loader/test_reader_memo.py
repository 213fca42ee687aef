"""What the batch source hands DALI for a plain image + label dataset is made once per sample
while its shard stays mapped, and given up before the shard is unmapped; a local dataset is
read in the loader's own process (no reader process), and so is a cached one unless a reader
process is asked for."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from flashfeed.dataset import Dataset
from flashfeed.loader import Loader, shardreader
from flashfeed.loader.image.fields import key_strings, parse_fields
from flashfeed.loader.passorder import PassOrder
from flashfeed.loader.reader import BatchSource, write_pass
from flashfeed.loader.shardreader import CACHED_MAX_OPEN, ShardReader
from flashfeed.loader.sources import LocalShardSource

from support.loader_helpers import image_samples, make_image_dataset

SIZES = [8, 8, 8]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("memo-img") / "ds")
    make_image_dataset(prefix, SIZES, size=16)
    return prefix


def source_for(prefix: str, pass_dir: str, order: list[tuple[int, int]], max_open: int | None):
    ds = Dataset.open(prefix)
    shards, rows = (np.array(c, np.int64) for c in zip(*order, strict=True))
    batches = -(-len(order) // 4)
    for epoch in (0, 1):
        write_pass(pass_dir, epoch, PassOrder(np.arange(len(order)), shards, rows, 4, batches))
    reader = ShardReader(LocalShardSource(ds), [s.path for s in ds.shards], max_open=max_open)
    return BatchSource(reader, batch_size=4, specs=parse_fields(None), pass_dir=pass_dir), batches


def read_pass(source: BatchSource, epoch: int, batches: int) -> list[tuple[bytes, int, str]]:
    got = []
    for i in range(batches):
        jpgs, labels, keys = source(SimpleNamespace(epoch_idx=epoch, iteration=i))
        assert labels.dtype == np.int64 and labels.shape == (len(jpgs),)
        got += zip((j.tobytes() for j in jpgs), labels.tolist(), key_strings(keys), strict=True)
    return got


def test_a_hot_pass_hands_on_the_samples_kept_from_the_first(images, tmp_path, monkeypatch):
    want = image_samples(images)
    order = [(s, r) for s in (2, 0, 1) for r in range(SIZES[s])][::-1]
    source, batches = source_for(images, str(tmp_path), order, max_open=3)
    first = read_pass(source, 0, batches)
    assert first == [want[o] for o in order]
    # every sample of each open shard is kept, and the second pass is made from them
    assert {s: len(o.memo) for s, o in source.reader._open.items()} == dict.fromkeys(range(3), 8)
    reads = []
    picked = ShardReader.picked
    monkeypatch.setattr(
        ShardReader, "picked", lambda self, *a: reads.append(a[:2]) or picked(self, *a)
    )
    assert read_pass(source, 1, batches) == first
    assert reads == []  # no index entry, label or key was read again
    source.reader.close()
    assert not source.reader._open


def test_a_shard_unmapped_between_samples_gives_up_what_was_kept(images, tmp_path):
    # one shard open at a time, the order alternating between shards: each sample maps its
    # shard again, and unmapping the last one (which the kept views point into) must work
    want = image_samples(images)
    order = [(s, r) for r in range(8) for s in range(3)]
    source, batches = source_for(images, str(tmp_path), order, max_open=1)
    for epoch in (0, 1):
        assert read_pass(source, epoch, batches) == [want[o] for o in order]
        assert len(source.reader._open) == 1
    source.reader.close()


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> str:
    """More shards than a node cache's reader keeps open."""
    prefix = str(tmp_path_factory.mktemp("memo-many") / "ds")
    make_image_dataset(prefix, [2] * (CACHED_MAX_OPEN + 4), size=16)
    return prefix


def counting_maps(monkeypatch) -> list[int]:
    """The shards ``ShardReader`` maps from now on, in order."""
    mapped: list[int] = []
    real = ShardReader._map
    monkeypatch.setattr(
        ShardReader, "_map", lambda self, shard, *a: mapped.append(shard) or real(self, shard, *a)
    )
    return mapped


def test_a_dataset_read_in_place_keeps_every_small_shard_mapped_across_passes(
    many_shards, tmp_path, monkeypatch
):
    # a pass over 20 shards of 2 samples, in a shuffled order: each shard is mapped once,
    # and the next pass maps none again and reads no sample again (the old limit of 16
    # mapped at least 4 again per pass, parsing their indexes and samples again)
    want = image_samples(many_shards)
    order = [(s, r) for s in range(CACHED_MAX_OPEN + 4) for r in range(2)]
    order = [order[i] for i in np.random.default_rng(3).permutation(len(order))]
    source, batches = source_for(many_shards, str(tmp_path), order, max_open=None)
    mapped = counting_maps(monkeypatch)
    first = read_pass(source, 0, batches)
    assert first == [want[o] for o in order]
    assert sorted(mapped) == list(range(CACHED_MAX_OPEN + 4))
    assert read_pass(source, 1, batches) == first
    assert len(mapped) == CACHED_MAX_OPEN + 4  # nothing mapped again
    assert source.reader._samples == len(order)
    source.reader.close()
    assert source.reader._samples == 0


def test_shards_beyond_the_cached_limit_are_let_go_once_their_samples_pass_the_budget(
    many_shards, tmp_path, monkeypatch
):
    # a budget of 37 samples: past 16 shards, at most 18 shards of 2 samples stay mapped,
    # the least recently read going first; what is read stays right
    monkeypatch.setattr(shardreader, "LOCAL_OPEN_SAMPLES", 2 * CACHED_MAX_OPEN + 5)
    want = image_samples(many_shards)
    order = [(s, r) for r in range(2) for s in range(CACHED_MAX_OPEN + 4)]
    source, batches = source_for(many_shards, str(tmp_path), order, max_open=None)
    mapped = counting_maps(monkeypatch)
    for epoch in (0, 1):
        assert read_pass(source, epoch, batches) == [want[o] for o in order]
        assert len(source.reader._open) == CACHED_MAX_OPEN + 2
        assert source.reader._samples == 2 * (CACHED_MAX_OPEN + 2)
    # the second round of the first pass found the last 18 shards read still open, but
    # not the first 2: every later pass maps again whatever it reads after 18 others
    assert len(mapped) > CACHED_MAX_OPEN + 4
    # an explicit limit is kept as given, whatever the budget
    few, _ = source_for(many_shards, str(tmp_path), order, max_open=3)
    read_pass(few, 0, batches)
    assert len(few.reader._open) == 3
    few.reader.close()
    source.reader.close()


def test_local_and_cached_datasets_are_read_in_the_loaders_process_unless_asked_otherwise(
    images, tmp_path
):
    local = Loader(images, batch_size=4, image_size=16)
    cached = Loader(images, batch_size=4, image_size=16, cache_dir=str(tmp_path / "cache"))
    chosen = Loader(images, batch_size=4, image_size=16, py_workers=1)
    try:
        assert local.py_workers == cached.py_workers == 0
        assert chosen.py_workers == 1
        # each delivers the whole epoch, each sample once, labels matching their keys
        want = {k: label for _, label, k in image_samples(images).values()}
        for loader in (local, cached, chosen):
            got = {}
            for batch in loader:
                got.update(zip(batch["__key__"], batch["label"].tolist(), strict=True))
            assert got == want
    finally:
        for loader in (local, cached, chosen):
            loader.close()
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match=f"must be None or an integer >= 0, got {bad!r}"):
            Loader(images, batch_size=4, py_workers=bad)

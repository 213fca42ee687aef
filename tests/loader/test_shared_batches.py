"""A loader reading its shards (local or cached) in its own process hands DALI views into
its mapped shards without a copy (``external_source(no_copy=True)``): the batch source holds
the last batches it returned, since DALI holds no reference of its own, and what comes out
of DALI is still each sample's bytes when shards are unmapped between samples."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from flashfeed.dataset import Dataset
from flashfeed.loader import Loader
from flashfeed.loader.image.convert import to_keys
from flashfeed.loader.image.fields import key_bytes, key_column, key_strings, parse_fields
from flashfeed.loader.image.pipeline import AugmentOptions, build_pipeline, shared_batches
from flashfeed.loader.passorder import PassOrder
from flashfeed.loader.reader import BatchSource, ShardReader, write_pass
from flashfeed.loader.sources import LocalShardSource

from support.loader_helpers import image_samples, make_image_dataset

SIZES = [8, 8, 8]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("shared-img") / "ds")
    make_image_dataset(prefix, SIZES, size=16)
    return prefix


def held_source(
    prefix: str, pass_dir: str, order: list[tuple[int, int]], *, keep: int, max_open: int
) -> tuple[BatchSource, int]:
    """A batch source over ``order`` (batches of 4, passes 0 and 1 alike) that holds its last
    ``keep`` batches, with at most ``max_open`` shards mapped."""
    ds = Dataset.open(prefix)
    shards, rows = (np.array(c, np.int64) for c in zip(*order, strict=True))
    batches = -(-len(order) // 4)
    for epoch in (0, 1):
        write_pass(pass_dir, epoch, PassOrder(np.arange(len(order)), shards, rows, 4, batches))
    reader = ShardReader(LocalShardSource(ds), [s.path for s in ds.shards], max_open=max_open)
    specs = parse_fields(None)
    return BatchSource(reader, batch_size=4, specs=specs, pass_dir=pass_dir, keep=keep), batches


def test_the_source_holds_exactly_its_last_keep_batches(images, tmp_path):
    order = [(s, r) for s in range(3) for r in range(SIZES[s])]
    source, batches = held_source(images, str(tmp_path), order, keep=2, max_open=3)
    labels = []  # each batch's label array is made for that batch alone
    for i in range(batches):
        labels.append(weakref.ref(source(SimpleNamespace(epoch_idx=0, iteration=i))[1]))
    gc.collect()
    assert [r() is not None for r in labels] == [False] * (batches - 2) + [True, True]
    source.reader.close()
    with pytest.raises(ValueError, match="keep must be >= 0, got -1"):
        BatchSource(source.reader, batch_size=4, specs=source.specs, pass_dir="", keep=-1)


def test_dali_reads_the_views_in_place_while_their_shards_are_unmapped(images, tmp_path):
    # one shard mapped at a time and every sample from another shard than the one before:
    # each sample unmaps the shard the previous batch's views point into, while DALI still
    # has that batch to read; two passes through a pipeline that outputs the bytes it got
    want = image_samples(images)
    order = [(s, r) for r in range(8) for s in range(3)]
    prefetch = 2
    source, batches = held_source(
        images, str(tmp_path), order, keep=shared_batches(prefetch), max_open=1
    )
    pipe, names = build_pipeline(
        source, specs=parse_fields(None), batch_size=4, num_threads=2, py_workers=0,
        augment=AugmentOptions(), user_fn=lambda nodes: {"image": nodes["image"]}, seed=1,
        prefetch=prefetch, shared=True,
    )  # fmt: skip
    assert names == ["image", "__key__"]
    for epoch in (0, 1):
        got = []
        for _ in range(batches):
            image, keys = pipe.run()
            images = [np.array(image.at(i)).tobytes() for i in range(len(image))]
            got += zip(images, to_keys(keys), strict=True)
        with pytest.raises(StopIteration):
            pipe.run()
        assert got == [(want[o][0], want[o][2]) for o in order], f"pass {epoch}"
        assert len(source.reader._open) == 1
        pipe.reset()
    del pipe
    source.reader.close()


def test_only_a_loader_reading_in_its_own_process_shares_its_batches(images, tmp_path):
    local = Loader(images, batch_size=4, image_size=16, prefetch=3)
    cached = Loader(images, batch_size=4, image_size=16, cache_dir=str(tmp_path / "cache"))
    reader = Loader(images, batch_size=4, image_size=16, py_workers=1)
    try:
        want = {k: label for _, label, k in image_samples(images).values()}
        for loader, keep in ((local, shared_batches(3)), (cached, shared_batches(2)), (reader, 0)):
            got = {}
            for batch in loader:
                got.update(zip(batch["__key__"], batch["label"].tolist(), strict=True))
            assert got == want
            assert loader._source(str(tmp_path)).keep == keep
    finally:
        for loader in (local, cached, reader):
            loader.close()


def test_keys_of_different_lengths_travel_as_one_array_and_come_back_whole():
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    names = ["a.tar/x", "shards/b.tar/longer-key", "c.tar/\udcff-not-utf8", "d.tar/k"]
    column = key_column([key_bytes(*n.split("/", 1)) for n in names])
    assert column.shape == (4, max(len(n.encode("utf-8", "surrogateescape")) for n in names))
    assert key_strings(column) == names
    pipe = Pipeline(batch_size=4, num_threads=1, device_id=None, prefetch_queue_depth=1)
    with pipe:
        keys = fn.external_source(source=lambda: column, batch=True, dtype=types.UINT8)
        pipe.set_outputs(keys)
    pipe.build()
    (out,) = pipe.run()
    assert out.is_dense_tensor() and to_keys(out) == names
    # keys of one length come back dense from a plain list too, and read the same
    same = [key_bytes("s.tar", f"k{i}") for i in range(4)]
    assert key_strings(key_column(same)) == key_strings(same) == [f"s.tar/k{i}" for i in range(4)]

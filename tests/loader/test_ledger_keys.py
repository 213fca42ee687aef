"""``__key__`` travels with its samples through every loader, and the ledger is written from it:
a batch source that reads the wrong sample is caught by the exactly-once check."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from flashfeed.loader import Loader, ShardDataset, TokenLoader
from flashfeed.loader.reader import ShardReader
from flashfeed.loader.telemetry.ledger import check_exactly_once, key_hash, read_ledger

from support.loader_helpers import (
    image_keys,
    label_of,
    make_image_dataset,
    make_token_dataset,
    token_keys,
)

SIZES = [20, 20, 20]  # 60 samples: 15 batches of 4, nothing dropped on one rank


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("keys-img") / "ds")
    make_image_dataset(prefix, SIZES, size=16)
    return prefix


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("keys-tok") / "ds")
    make_token_dataset(prefix, SIZES, seq_len=8)
    return prefix


def read_wrong_sample(monkeypatch, cls, method: str, shard: int, row: int) -> None:
    """Plant a fault: ``cls.method(self, shard, row, ...)`` reads the next row instead."""
    original = getattr(cls, method)

    def shifted(self, s, r, *args):
        return original(self, s, r + 1 if (s, r) == (shard, row) else r, *args)

    monkeypatch.setattr(cls, method, shifted)


def assert_caught(ledger_dir: str, keys: list[str], shard: int, row: int) -> None:
    check = check_exactly_once(ledger_dir, keys, epochs=[0])[0]
    assert not check.ok, check
    per_shard = len(keys) // len(SIZES)
    read_twice, never_read = keys[shard * per_shard + row + 1], keys[shard * per_shard + row]
    assert check.duplicates == {read_twice: 2} and check.missing == [never_read], check
    assert check.delivered == len(keys) and check.unknown == 0
    assert "1 repeated" in str(check) and "1 missing" in str(check)


# -- Loader (DALI) ---------------------------------------------------------------------------


@pytest.mark.parametrize("py_workers", [0, 1])
def test_image_keys_come_out_of_dali_with_their_samples(images, tmp_path, py_workers):
    ledger = str(tmp_path / "ledger")
    loader = Loader(
        images, batch_size=4, image_size=16, seed=3, py_workers=py_workers, ledger_dir=ledger
    )
    delivered = []
    for batch in loader:
        keys = batch["__key__"]
        assert isinstance(keys, list) and all(isinstance(k, str) for k in keys)
        # the label was decoded from the same sample the key names
        assert batch["label"].tolist() == [label_of(k, 10) for k in keys]
        delivered += keys
    assert read_ledger(ledger)[0] == [key_hash(k) for k in delivered]
    check = check_exactly_once(ledger, image_keys(images))
    assert list(check) == [0] and check[0].ok, check[0]
    loader.close()


@pytest.mark.parametrize("py_workers", [0, 1])
def test_a_loader_reading_the_wrong_sample_fails_the_ledger_check(
    images, tmp_path, monkeypatch, py_workers
):
    # the batch source (in the reader processes too: they are forked after the patch)
    # reads shard 1 row 4 where the plan says row 3
    read_wrong_sample(monkeypatch, ShardReader, "picked", 1, 3)
    ledger = str(tmp_path / "ledger")
    loader = Loader(
        images, batch_size=4, image_size=16, shuffle=False, py_workers=py_workers,
        ledger_dir=ledger,
    )  # fmt: skip
    assert sum(len(b["__key__"]) for b in loader) == 60
    assert_caught(ledger, image_keys(images), 1, 3)
    loader.close()


def test_a_pipeline_may_not_return_the_key(images):
    def keyed(nodes):
        return {"label": nodes["label"], "__key__": nodes["label"]}

    loader = Loader(images, batch_size=4, pipeline=keyed, py_workers=0)
    with pytest.raises(ValueError, match="must not return '__key__'"):
        next(iter(loader))
    with pytest.raises(ValueError, match="'__key__' is not a field"):
        Loader(images, batch_size=4, fields={"image": "jpg", "__key__": "cls"})


# -- TokenLoader -----------------------------------------------------------------------------


def test_token_keys_are_read_with_their_rows(tokens, tmp_path):
    ledger = str(tmp_path / "ledger")
    loader = TokenLoader(tokens, batch_size=4, seed=5, ledger_dir=ledger)
    delivered = []
    for batch in loader:
        # row n holds n*7, n*7+1, ... and is keyed t<n>
        ids = (batch["tokens"][:, 0] // 7).tolist()
        assert [int(k.rsplit("/t", 1)[1]) for k in batch["__key__"]] == ids
        delivered += batch["__key__"]
    assert read_ledger(ledger)[0] == [key_hash(k) for k in delivered]
    assert check_exactly_once(ledger, token_keys(tokens))[0].ok


def test_a_token_loader_reading_the_wrong_row_fails_the_ledger_check(tokens, tmp_path, monkeypatch):
    original = TokenLoader._gather

    def shifted(self, shards, rows):
        rows = np.where((shards == 2) & (rows == 7), rows + 1, rows)
        return original(self, shards, rows)

    monkeypatch.setattr(TokenLoader, "_gather", shifted)
    ledger = str(tmp_path / "ledger")
    loader = TokenLoader(tokens, batch_size=4, shuffle=False, ledger_dir=ledger)
    assert sum(len(b["__key__"]) for b in loader) == 60
    assert_caught(ledger, token_keys(tokens), 2, 7)


def test_token_keys_without_a_key_column_are_row_numbers(tmp_path):
    import pyarrow as pa

    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import shard_name, write_arrow_shard

    prefix = str(tmp_path / "ds")
    table = pa.table({"tokens": pa.array(np.arange(6, dtype=np.int64))})
    info = write_arrow_shard(prefix, shard_name(0, "arrow"), table)
    commit_manifest(prefix, Manifest(name="t", shard_format="arrow", schema={}, shards=(info,)))
    batches = list(TokenLoader(prefix, batch_size=3, shuffle=False))
    assert [b["__key__"] for b in batches] == [
        [f"{info.path}/{r}" for r in range(3)],
        [f"{info.path}/{r}" for r in range(3, 6)],
    ]


# -- ShardDataset ----------------------------------------------------------------------------


def to_tensor(sample):
    img = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))
    return {
        "image": torch.from_numpy(img.copy()),
        "label": sample["cls"],
        "__key__": sample["__key__"],
    }


def test_shard_dataset_samples_carry_shard_and_key(images):
    ds = ShardDataset(images, shuffle=False)
    sample = next(iter(ds))
    assert sample["__key__"] == f"{sample['__shard__']}/s0000-000000"
    assert sample["__key__"] == image_keys(images)[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_shard_data_loader_ledger_is_its_batches_keys(images, tmp_path, workers):
    ledger = str(tmp_path / "ledger")
    ds = ShardDataset(images, batch_size=4, transform=to_tensor, seed=4, ledger_dir=ledger)
    delivered = []
    for batch in ds.loader(num_workers=workers):
        assert batch["label"].tolist() == [label_of(k, 10) for k in batch["__key__"]]
        delivered += batch["__key__"]
    assert read_ledger(ledger)[0] == [key_hash(k) for k in delivered]
    assert check_exactly_once(ledger, image_keys(images))[0].ok


@pytest.mark.parametrize("workers", [None, 0, 2], ids=["in-process", "loader", "workers"])
def test_a_shard_dataset_reading_the_wrong_sample_fails_the_ledger_check(
    images, tmp_path, monkeypatch, workers
):
    read_wrong_sample(monkeypatch, ShardReader, "members", 0, 11)
    ledger = str(tmp_path / "ledger")
    ds = ShardDataset(images, batch_size=4, shuffle=False, ledger_dir=ledger)
    source = iter(ds) if workers is None else ds.loader(num_workers=workers)
    assert sum(1 if workers is None else len(b["__key__"]) for b in source) == 60
    assert_caught(ledger, image_keys(images), 0, 11)


def test_a_transform_that_drops_the_key_is_named_in_ledger_mode(images, tmp_path):
    ds = ShardDataset(
        images, batch_size=4, transform=lambda s: {"label": s["cls"]},
        ledger_dir=str(tmp_path / "ledger"),
    )  # fmt: skip
    with pytest.raises(ValueError, match="keep it in the transform's output"):
        next(iter(ds.loader()))


# -- the check itself ------------------------------------------------------------------------


def test_the_check_names_repeats_misses_strangers_and_empty_epochs():
    keys = ["a/1", "a/2", "b/1"]
    ledger = {0: [key_hash(k) for k in ["a/1", "a/1", "b/1", "zz/9"]], 1: []}
    check = check_exactly_once(ledger, keys, epochs=[0, 1, 2])
    assert check[0].duplicates == {"a/1": 2} and check[0].missing == ["a/2"]
    assert check[0].unknown == 1 and not check[0].ok
    assert check[1].missing == keys and check[2].delivered == 0 and not check[2].ok
    full = check_exactly_once({0: [key_hash(k) for k in reversed(keys)]}, keys)[0]
    assert full.ok and "each exactly once" in str(full)

"""Decoded units kept on flash (``loader/tokens/decoded.py``): what is kept reads back the
same, mapped; the folder stays within its capacity, the files read least recently going
first; a damaged file is dropped and decoded again; nothing partial is ever read."""

from __future__ import annotations

import os
import time
from collections import Counter

import numpy as np
import pytest

from flashfeed.loader.tokens.decoded import DecodedUnits, reader_digest
from flashfeed.loader.unitread import DocTokens

READER = reader_digest(column="text", tokenizer_json="{}", eos_id=0, extra=("id",))


def _docs(n: int, seed: int = 0, *, extra: bool = True) -> DocTokens:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 50, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, 50_000, int(offsets[-1])).astype(np.int64)
    more = {"id": [f"doc-{seed}-{i}" for i in range(n)]} if extra else {}
    return DocTokens(offsets, values, Counter({"null": 2, "not-json": 1}), more)


def test_a_kept_unit_reads_back_the_same_as_a_mapped_view(tmp_path):
    store = DecodedUnits(str(tmp_path), capacity=1 << 20)
    docs = _docs(40)
    assert store.get(READER, "xxh3_128:aa") is None
    store.put(READER, "xxh3_128:aa", docs)
    got = store.get(READER, "xxh3_128:aa")
    assert got is not None
    assert np.array_equal(got.offsets, docs.offsets)
    assert np.array_equal(got.values, docs.values) and got.values.dtype == np.int32
    assert not got.values.flags.owndata  # a view of the mapped file, not a copy
    assert got.skipped == docs.skipped and got.extra == docs.extra
    assert [got.doc(i).tolist() for i in range(40)] == [docs.doc(i).tolist() for i in range(40)]
    assert store.stats()["hits"] == 1 and store.stats()["misses"] == 1
    # another reader (another column, tokenizer or EOS) of the same unit is another file
    other = reader_digest(column="text", tokenizer_json="{}", eos_id=1, extra=("id",))
    assert store.get(other, "xxh3_128:aa") is None


def test_ids_beyond_int32_are_kept_as_they_are(tmp_path):
    store = DecodedUnits(str(tmp_path), capacity=1 << 20)
    docs = DocTokens(np.array([0, 2], np.int64), np.array([1, 1 << 40], np.int64), Counter())
    store.put(READER, "c", docs)
    got = store.get(READER, "c")
    assert got is not None and got.values.tolist() == [1, 1 << 40]


def test_the_folder_keeps_within_its_capacity_dropping_the_least_recently_read(tmp_path):
    probe = DecodedUnits(str(tmp_path / "probe"), capacity=1 << 30)
    probe.put(READER, "p", _docs(200))
    size = os.path.getsize(probe.path(READER, "p"))
    store = DecodedUnits(str(tmp_path / "units"), capacity=3 * size + size // 2)
    for k in range(3):
        store.put(READER, f"u{k}", _docs(200, seed=k))
        time.sleep(0.02)
    assert store.get(READER, "u0") is not None  # read now: u1 is the least recent
    store.put(READER, "u3", _docs(200, seed=3))
    kept = {k for k in ("u0", "u1", "u2", "u3") if os.path.exists(store.path(READER, k))}
    assert kept == {"u0", "u2", "u3"}
    used = sum(os.path.getsize(os.path.join(store.root, f)) for f in os.listdir(store.root))
    assert used <= store.capacity
    # a folder opened again counts what is there
    again = DecodedUnits(str(tmp_path / "units"), capacity=3 * size + size // 2)
    again.put(READER, "u4", _docs(200, seed=4))
    assert len(os.listdir(store.root)) == 3


def test_a_damaged_file_is_dropped_and_read_as_missing(tmp_path):
    store = DecodedUnits(str(tmp_path), capacity=1 << 20)
    store.put(READER, "d", _docs(30))
    path = store.path(READER, "d")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    assert store.get(READER, "d") is None
    assert not os.path.exists(path)
    store.put(READER, "d", _docs(30))
    assert store.get(READER, "d") is not None


def test_a_writer_killed_mid_write_leaves_nothing_a_reader_takes(tmp_path):
    store = DecodedUnits(str(tmp_path), capacity=1 << 20)
    dead = os.path.join(
        str(tmp_path), f"{os.path.basename(store.path(READER, 'k'))}.999999999.abcd.tmp"
    )
    with open(dead, "wb") as f:
        f.write(b"ARROW1 half")
    assert store.get(READER, "k") is None
    DecodedUnits(str(tmp_path), capacity=1 << 20)  # opening sweeps what dead writers left
    assert os.listdir(str(tmp_path)) == []


def test_the_capacity_is_checked():
    with pytest.raises(ValueError, match="capacity must be a number of bytes >= 1, got 0"):
        DecodedUnits("/tmp/never-made", capacity=0)

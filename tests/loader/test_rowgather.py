"""The compiled gather (``loader/tokens/rowgather.py``) writes exactly the rows the ``np.concatenate``
copy does, in batch order, at the stored or a wider type; a row outside its record batch
is one clear error with nothing written; rows the kernel cannot read are left to the copy."""

from __future__ import annotations

import numpy as np
import pytest

from flashfeed.loader import TokenLoader
from flashfeed.loader.tokens.rowgather import RowAddresses, copy_rows, gather_rows
from flashfeed.loader.tokens.tokenrows import RowTable

from support.loader_helpers import make_token_dataset

SEQ = 16  # int32: 64 bytes a row; 1 KiB record batches hold 16 rows
SIZES = [70, 33, 16, 1, 40]  # 1 to 5 record batches a shard


def _table(tmp_path) -> tuple[RowTable, TokenLoader]:
    path = str(tmp_path / "toks")
    make_token_dataset(path, SIZES, seq_len=SEQ, batch_bytes=1 << 10)
    loader = TokenLoader(path, batch_size=8, seed=0, max_open=len(SIZES))
    opened = loader._open_all(dict.fromkeys(range(len(SIZES))))
    return RowTable(opened, ("tokens",)), loader


def _expected(table: RowTable, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """What each row holds by its key (row n of the dataset holds 7n, 7n + 1, ...)."""
    ids = [int(k.rsplit("/t", 1)[1]) for k in table.keys(shards.tolist(), rows)]
    return np.asarray(ids)[:, None] * 7 + np.arange(SEQ)[None, :]


@pytest.mark.parametrize("wide", [None, np.int64])
def test_compiled_gather_writes_what_the_concatenate_copy_does(tmp_path, wide):
    table, loader = _table(tmp_path)
    assert table.several  # rows of many record batches, of every shard
    rng = np.random.default_rng(5)
    for batch in (1, 7, 64, 300):  # rows repeat in the larger batches
        shards = rng.integers(0, len(SIZES), batch)
        rows = np.asarray([rng.integers(0, SIZES[s]) for s in shards], np.int64)
        plan = np.empty((batch, SEQ), np.int32)
        copy_rows(table, "tokens", shards, rows, plan)
        got = np.full((batch, SEQ), -1, wide or np.int32)
        assert gather_rows(table, "tokens", shards, rows, got, wait=True)
        assert got.dtype == (wide or np.int32)
        np.testing.assert_array_equal(got, plan)
        np.testing.assert_array_equal(got, _expected(table, shards, rows))
    loader.close()


def test_a_row_outside_its_record_batch_is_one_error_and_nothing_written(tmp_path):
    table, loader = _table(tmp_path)
    shards, rows = np.array([0, 3, 1]), np.array([5, 1, 2])  # shard 3 holds one row
    out = np.full((3, SEQ), -1, np.int32)
    with pytest.raises(IndexError, match=r"row 1 of shard number 3 is not within its record "
                       r"batch of 1 rows"):  # fmt: skip
        gather_rows(table, "tokens", shards, rows, out, wait=True)
    assert (out == -1).all()
    loader.close()


def test_rows_the_kernel_cannot_read_are_left_to_the_copy(tmp_path):
    table, loader = _table(tmp_path)
    shards, rows = np.array([0, 4]), np.array([3, 39])
    for out in (np.empty((2, SEQ + 1), np.int32), np.empty((SEQ, 2), np.int32).T):
        assert not gather_rows(table, "tokens", shards, rows, out, wait=True)
    loader.close()
    one = np.zeros(1, np.int64)
    flat = RowAddresses(one, one, {0: [np.arange(8, dtype=np.int32)]})  # 1-D column
    strided = RowAddresses(one, one, {0: [np.zeros((4, 8), np.int32)[:, ::2]]})
    assert not flat.ok and not strided.ok
    whole = RowAddresses(one, one, {0: [np.zeros((4, 8), np.int32)]})
    assert whole.ok and whole.info.tolist() == [[whole.info[0, 0], 32, 4]]

"""A shard view's keys as one numpy array: the same strings a pyarrow take gives, made again
when an arriving shard's keys grow, and integer keys kept as integers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flashfeed.loader.tokens.arrowcols import ArrowShardView
from flashfeed.loader.tokens.tokenrows import row_keys


def _view(keys: pa.Array | pa.ChunkedArray | None) -> ArrowShardView:
    n = 6
    return ArrowShardView(name="s", num_rows=n, starts=np.array([0]), columns={}, keys=keys)


def test_string_keys_match_a_pyarrow_take() -> None:
    keys = pa.array([f"doc-{i}" for i in range(6)])
    rows = np.array([5, 0, 3, 3])
    expected = [str(k) for k in keys.take(pa.array(rows)).to_pylist()]
    view = _view(keys)
    assert row_keys(view, rows) == expected
    assert view.key(4) == "doc-4"


def test_arriving_keys_are_read_again_once_they_grow() -> None:
    view = _view(pa.chunked_array([pa.array(["a", "b", "c"]), pa.nulls(3, pa.string())]))
    assert row_keys(view, np.array([2, 0])) == ["c", "a"]
    view.keys = pa.chunked_array([pa.array(["a", "b", "c"]), pa.array(["d", "e", "f"])])
    assert row_keys(view, np.array([5, 3])) == ["f", "d"]


def test_integer_keys_stay_integers_beside_nulls() -> None:
    view = _view(pa.chunked_array([pa.array([10, 11, 12]), pa.nulls(3, pa.int64())]))
    assert row_keys(view, np.array([1, 2])) == ["11", "12"]


def test_keyless_shard_names_rows_by_number() -> None:
    assert row_keys(_view(None), np.array([4, 1])) == ["4", "1"]

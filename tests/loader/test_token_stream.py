"""A token dataset's cold first epoch from the real S3 server streams: rows are served from
a shard's record batches as they land in the node cache, before the shard's last byte, and
the epoch (and a resumed one) is the local epoch, row for row.

The store sits behind ``slowproxy.SlowProxy``, which delays each request; nothing is faked.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.format.arrowlayout import head_size, read_layout
from flashfeed.format.arrowshard import open_arrow, write_arrow
from flashfeed.loader import DOC_OUTPUTS, TokenLoader
from flashfeed.s3.retry import RetryPolicy

from support.loader_helpers import make_token_dataset
from support.token_cold import (
    assert_cold_resume_is_exact,
    assert_same_batches,
    cold_cache,
    rows_of,
    serve_until_it_fails,
)
from support.token_docs import byte_bpe, make_doc_token_dataset, mixed_documents

SIZES = [600, 520, 560]  # rows of 64 int32 tokens: 256 bytes a row, 64 rows a record batch
SEQ = 64
BATCH_BYTES = 16 << 10


def _both(s3_prefix: str, tmp_path) -> str:
    """The same dataset on the store and on local disk (identical bytes); the local prefix."""
    local = str(tmp_path / "local")
    for prefix in (s3_prefix, local):
        make_token_dataset(prefix, SIZES, seq_len=SEQ, batch_bytes=BATCH_BYTES)
    return local


def test_shards_are_written_in_record_batches_their_schema_locates():
    tokens = np.arange(600 * SEQ, dtype=np.int32).reshape(600, SEQ)
    import pyarrow as pa

    table = pa.table(
        {
            "__key__": [f"k{i}" for i in range(600)],
            "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), SEQ),
        }
    )
    data = write_arrow(table, batch_bytes=BATCH_BYTES)
    layout = read_layout(data[: head_size(data[:16], name="s")], name="s", size=len(data))
    assert layout is not None and layout.num_batches >= 8 and layout.num_rows == 600
    buf = pa.py_buffer(data)
    for b in range(layout.num_batches):  # each batch read from its own bytes alone
        lo, hi = int(layout.offsets[b]), int(layout.offsets[b + 1])
        got = pa.ipc.read_record_batch(buf.slice(lo, hi - lo), layout.schema)
        first = int(layout.rows[b])
        assert got.column("__key__")[0].as_py() == f"k{first}"
        assert got.column("tokens")[0].as_py() == tokens[first].tolist()
    assert open_arrow(data).equals(table)  # the footer reads the same table
    old = write_arrow(table, batch_bytes=None)  # as written before: no layout
    assert read_layout(old[: head_size(old[:16], name="s")], name="s", size=len(old)) is None


def test_first_batch_is_served_before_its_shard_has_landed(s3_prefix, proxy, tmp_path):
    local = _both(s3_prefix, tmp_path)
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    it = iter(loader)
    first = next(it)
    # observed when the first batch is in hand: shard 0's fill is under way, bytes missing
    fill = cache.progress(ds, 0)
    assert fill is not None, "shard 0 had landed whole before its first rows were served"
    assert not fill.complete() and cache.ready_path(ds, 0) is None
    fill.close()
    want = TokenLoader(local, batch_size=8, shuffle=False)
    expected = next(iter(want))
    assert first["__key__"] == expected["__key__"]
    assert np.array_equal(first["tokens"].numpy(), expected["tokens"].numpy())
    rest = list(it)
    assert loader.stats()["readahead"]["batches_served_while_arriving"] >= 1
    keys, rows = rows_of([first, *rest])
    local_keys, local_rows = rows_of(list(TokenLoader(local, batch_size=8, shuffle=False)))
    assert keys == local_keys and np.array_equal(rows, local_rows)
    assert all(cache.contains(ds, i) for i in range(len(SIZES)))  # landed, verified, kept
    loader.close()
    cache.close()


def test_cold_shuffled_epoch_equals_the_local_epoch(s3_prefix, proxy, tmp_path):
    local = _both(s3_prefix, tmp_path)
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path, delay=0.02)
    cold = list(TokenLoader(ds, batch_size=8, cache=cache, seed=5, window=2, outputs=()))
    hot = list(TokenLoader(local, batch_size=8, seed=5, window=2))
    keys, rows = rows_of(cold)
    local_keys, local_rows = rows_of(hot)
    assert keys == local_keys and len(set(keys)) == len(keys) == (sum(SIZES) // 8) * 8
    assert np.array_equal(rows, local_rows)
    cache.close()


def test_resume_mid_epoch_from_a_cold_cache_is_exact(s3_prefix, proxy, tmp_path):
    local = _both(s3_prefix, tmp_path)
    assert_cold_resume_is_exact(s3_prefix, proxy, tmp_path, local, head=23, part="16KiB")


def test_a_shard_truncated_on_the_store_fails_in_one_line_and_leaves_no_entry(
    s3_prefix, proxy, tmp_path
):
    make_token_dataset(s3_prefix, SIZES, seq_len=SEQ, batch_bytes=BATCH_BYTES)
    ds = Dataset.open(s3_prefix)
    url = ds.shard_url(0)
    data = storage.read_bytes(url)
    storage.write_bytes(url, data[: len(data) // 2])  # cut after the manifest was committed
    fast = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02, deadline=5)
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path, delay=0.02, retry=fast)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    message, got = serve_until_it_fails(loader)
    assert ds.shards[0].path in message, message
    assert got >= 1  # the rows of the half that landed were served while it arrived
    assert not cache.contains(ds, 0) and cache.progress(ds, 0) is None
    left = [f for _, _, files in os.walk(tmp_path / "cache") for f in files if "000000" in f]
    assert left == [], left  # no partial entry, no part file
    loader.close()
    cache.close()


def test_a_dataset_without_a_layout_in_one_record_batch_a_shard_loadscold_cache(
    s3_prefix, proxy, tmp_path
):
    """As flashfeed wrote Arrow shards before the layout: the walk of its messages finds the
    one record batch (test_token_walk.py streams shards of several)."""
    local = str(tmp_path / "local")
    for prefix in (s3_prefix, local):  # one record batch a shard, nothing recorded
        make_token_dataset(prefix, SIZES, seq_len=SEQ, batch_bytes=None)
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path, delay=0.02)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    keys, rows = rows_of(list(loader))
    local_keys, local_rows = rows_of(list(TokenLoader(local, batch_size=8, shuffle=False)))
    assert keys == local_keys and np.array_equal(rows, local_rows)
    assert all(cache.contains(ds, i) for i in range(len(SIZES)))
    loader.close()
    cache.close()


def test_cold_document_outputs_equal_the_local_ones(s3_prefix, proxy, tmp_path):
    docs = mixed_documents(120, seed=3)
    tok = byte_bpe(tmp_path / "tok.json", docs)
    local = str(tmp_path / "local")
    for prefix in (s3_prefix, local):  # record batches of 7 rows, a few KiB each
        make_doc_token_dataset(prefix, docs, tok, seq_len=SEQ, docs_per_shard=60, chunk_rows=7)
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path, delay=0.05, part="4KiB")
    loader = TokenLoader(ds, batch_size=4, cache=cache, shuffle=False, outputs=DOC_OUTPUTS)
    cold = list(loader)
    hot = list(TokenLoader(local, batch_size=4, shuffle=False, outputs=DOC_OUTPUTS))
    assert_same_batches(cold, hot)
    assert loader.stats()["readahead"]["batches_served_while_arriving"] >= 1
    loader.close()
    cache.close()


def _table(rows: int):
    import pyarrow as pa

    tokens = np.arange(rows * SEQ, dtype=np.int32)
    return pa.table({"tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), SEQ)})


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        (b'{"offsets": [0, 10], "rows": [0]}', "does not fit"),  # lengths differ
        (b'{"offsets": [0, 99999999], "rows": [0, 5]}', "does not fit"),  # past the end
        (b'{"offsets": [0, 0], "rows": [0, 5]}', "does not fit"),  # not increasing
        (b'{"offsets": [5, 10], "rows": [0, 5]}', "does not fit"),  # not from the schema's end
        (b"not json", "unreadable record batch layout"),
        (b'{"rows": [0, 5]}', "unreadable record batch layout"),
    ],
)
def test_a_layout_that_cannot_be_right_is_one_clear_error(doc, why):
    import pyarrow as pa

    from flashfeed.errors import CorruptShardError
    from flashfeed.format.arrowlayout import LAYOUT_KEY

    table = _table(40)
    table = table.replace_schema_metadata({LAYOUT_KEY: doc})
    data = write_arrow(table, batch_bytes=None)  # the metadata as given, nothing recorded
    with pytest.raises(CorruptShardError, match=why) as err:
        read_layout(data[: head_size(data[:16], name="bad")], name="bad", size=len(data))
    assert "shard bad" in str(err.value) and "\n" not in str(err.value)
    assert pa.ipc.open_file(pa.py_buffer(data)).read_all().num_rows == 40  # the file is fine


def test_a_layout_whose_rows_disagree_with_a_batch_fails_naming_it(s3_prefix, proxy, tmp_path):
    """A lying layout (its bytes are record batches, its row counts are not) fails the cold
    epoch naming the shard and the batch instead of serving other rows."""
    import pyarrow as pa

    from flashfeed.errors import CorruptShardError
    from flashfeed.format.arrowlayout import LAYOUT_KEY
    from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest

    table = _table(40).append_column("__key__", pa.array([f"k{i}" for i in range(40)]))
    good = write_arrow(table, batch_bytes=20 * (SEQ * 4 + 8))  # record batches of 20 rows
    layout = read_layout(good[: head_size(good[:16], name="s")], name="s", size=len(good))
    assert layout is not None and layout.rows.tolist() == [0, 20, 40]
    rel = (layout.offsets - layout.offsets[0]).tolist()
    lie = json.dumps({"offsets": rel, "rows": [0, 15, 40]}).encode()
    data = write_arrow(  # the same batches; the metadata as given
        table.replace_schema_metadata({LAYOUT_KEY: lie}), max_chunksize=20, batch_bytes=None
    )
    path = "shards/000000.arrow"
    storage.write_bytes(storage.join(s3_prefix, path), data)
    info = ShardInfo(path, 40, len(data), storage.checksum(data))
    schema = {"tokens": f"fixed_size_list<int32>[{SEQ}]", "__key__": "string"}
    manifest = Manifest(name="lie", shard_format="arrow", schema=schema, shards=(info,))
    commit_manifest(s3_prefix, manifest)
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path, delay=0.05, part="4KiB")
    loader = TokenLoader(ds, batch_size=4, cache=cache, shuffle=False)
    with pytest.raises(CorruptShardError, match="record batch 0 holds 20 rows, its layout says 15"):
        list(loader)
    loader.close()
    cache.close()

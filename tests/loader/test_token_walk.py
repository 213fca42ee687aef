"""A token dataset whose shards record no record batch layout (written by pyarrow's own
``RecordBatchFileWriter``) streams cold too: the loader walks each shard's IPC messages as
its bytes land in the node cache (``flashfeed.format.ipcwalk``) and serves a row once the walk has
found its record batch and that batch has landed, before the shard's last byte. So do shards
with dictionary columns (keys too), their dictionary batches read on the way.

The store sits behind ``slowproxy.SlowProxy``, which delays each request; nothing is faked.
"""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pyarrow as pa
import pytest

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.errors import FlashfeedError
from flashfeed.format.arrowlayout import head_size
from flashfeed.format.ipcwalk import start_walk
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest
from flashfeed.loader import DOC_OUTPUTS, TokenLoader
from flashfeed.s3.retry import RetryPolicy
from flashfeed.shardio import shard_name

from support.token_cold import (
    assert_cold_resume_is_exact,
    assert_same_batches,
    cold_cache,
    rows_of,
    serve_until_it_fails,
)
from support.token_docs import byte_bpe, make_doc_token_dataset, mixed_documents

SEQ = 64  # int32 tokens: 256 bytes a row
SHARDS = ([40, 70, 50, 90, 60, 40, 250], [64] * 9, [30, 500])  # rows per record batch


def _write(prefix: str, *, dictionary: bool = False, deltas: bool = False) -> Manifest:
    """Shards written by plain pyarrow, record batches of uneven rows, no layout recorded;
    row n holds n*7, n*7+1, ... and ``__key__`` ``t<n>``. ``dictionary``: the keys and a
    ``tag`` column dictionary-encoded, one dictionary per shard; ``deltas``: each record
    batch's keys a delta dictionary batch before it."""
    infos, n = [], 0
    for i, sizes in enumerate(SHARDS):
        count = sum(sizes)
        ids = np.arange(n, n + count)
        values = (ids[:, None] * 7 + np.arange(SEQ)[None, :]).astype(np.int32)
        cols = {
            "__key__": pa.array([f"t{j:07d}" for j in ids]),
            "tokens": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), SEQ),
        }
        if dictionary:
            cols["tag"] = pa.array(["a", "b"] * (count // 2) + ["a"] * (count % 2))
            cols["tag"] = cols["tag"].dictionary_encode()
            cols["__key__"] = cols["__key__"].dictionary_encode()
        table = pa.table(cols)
        sink = io.BytesIO()
        opts = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=deltas)
        with pa.ipc.RecordBatchFileWriter(sink, table.schema, options=opts) as writer:
            at = 0
            for size in sizes:
                part = table.slice(at, size)
                if deltas:  # the keys so far as this batch's dictionary: it grows by a delta
                    keys = pa.DictionaryArray.from_arrays(
                        pa.array(np.arange(at, at + size), pa.int32()),
                        pa.array([f"t{j:07d}" for j in ids[: at + size]]),
                    )
                    part = part.set_column(0, "__key__", pa.chunked_array([keys]))
                writer.write_table(part)
                at += size
        data = sink.getvalue()
        path = shard_name(i, "arrow")
        storage.write_bytes(storage.join(prefix, path), data)
        infos.append(ShardInfo(path, count, len(data), storage.checksum(data)))
        n += count
    schema = {"__key__": "string", "tokens": f"fixed_size_list<int32>[{SEQ}]"}
    manifest = Manifest(name="walk", shard_format="arrow", schema=schema, shards=tuple(infos))
    commit_manifest(prefix, manifest)
    return manifest


def _both(s3_prefix: str, tmp_path, **kw) -> str:
    local = str(tmp_path / "local")
    for prefix in (s3_prefix, local):
        _write(prefix, **kw)
    return local


def _cold8(prefix, proxy, tmp_path, *, name="cache", delay=0.03, retry=None):
    # one 8 KiB part at a time: a shard of 100-135 KiB takes a dozen delayed GETs to land
    return cold_cache(prefix, proxy, tmp_path, name=name, delay=delay, retry=retry, part="8KiB")


def test_the_shards_record_no_layout_and_walk_to_their_record_batches(tmp_path):
    _write(str(tmp_path / "ds"))
    data = (tmp_path / "ds" / shard_name(0, "arrow")).read_bytes()
    head = data[: head_size(data[:16], name="s")]
    assert b"flashfeed.record_batches" not in head
    walk = start_walk(head, name="s", size=len(data), rows=sum(SHARDS[0]))
    assert walk is not None
    walk.advance(lambda lo, hi: data[lo:hi], lambda lo, hi: True)
    assert walk.ended and np.diff(walk.layout().rows).tolist() == SHARDS[0]


def test_first_batch_is_served_before_its_unrecorded_shard_has_landed(s3_prefix, proxy, tmp_path):
    local = _both(s3_prefix, tmp_path)
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, delay=0.05)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    it = iter(loader)
    first = next(it)
    # observed with the first batch in hand: shard 0's fill is under way, bytes missing
    fill = cache.progress(ds, 0)
    assert fill is not None, "shard 0 had landed whole before its first rows were served"
    assert not fill.complete() and cache.ready_path(ds, 0) is None
    fill.close()
    expected = next(iter(TokenLoader(local, batch_size=8, shuffle=False)))
    assert first["__key__"] == expected["__key__"]
    assert np.array_equal(first["tokens"].numpy(), expected["tokens"].numpy())
    rest = list(it)
    assert loader.stats()["readahead"]["batches_served_while_arriving"] >= 1
    keys, rows = rows_of([first, *rest])
    local_keys, local_rows = rows_of(list(TokenLoader(local, batch_size=8, shuffle=False)))
    assert keys == local_keys and np.array_equal(rows, local_rows)
    assert all(cache.contains(ds, i) for i in range(len(SHARDS)))  # landed, verified, kept
    loader.close()
    cache.close()


def test_cold_shuffled_epoch_of_unrecorded_shards_equals_the_local_epoch(
    s3_prefix, proxy, tmp_path
):
    local = _both(s3_prefix, tmp_path)
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, delay=0.02)
    loader = TokenLoader(ds, batch_size=8, cache=cache, seed=5, window=2)
    cold = list(loader)
    streamed = loader.stats()["readahead"]["batches_served_while_arriving"]
    hot = list(TokenLoader(local, batch_size=8, seed=5, window=2))
    keys, rows = rows_of(cold)
    local_keys, local_rows = rows_of(hot)
    total = sum(map(sum, SHARDS))
    assert keys == local_keys and len(set(keys)) == len(keys) == (total // 8) * 8
    assert np.array_equal(rows, local_rows)
    assert streamed >= 1
    loader.close()
    cache.close()


def test_resume_mid_epoch_on_unrecorded_shards_from_a_cold_cache_is_exact(
    s3_prefix, proxy, tmp_path
):
    local = _both(s3_prefix, tmp_path)
    assert_cold_resume_is_exact(s3_prefix, proxy, tmp_path, local, head=37, part="8KiB")


def _no_entry(cache, ds, tmp_path, name="cache") -> None:
    assert not cache.contains(ds, 0) and cache.progress(ds, 0) is None
    left = [f for _, _, files in os.walk(tmp_path / name) for f in files if "000000" in f]
    assert left == [], left  # no partial entry, no part file


def _damage(s3_prefix: str, change) -> Dataset:
    """Shard 0 replaced on the store after the manifest was committed."""
    _write(s3_prefix)
    ds = Dataset.open(s3_prefix)
    url = ds.shard_url(0)
    storage.write_bytes(url, change(storage.read_bytes(url)))
    return ds


def test_an_unrecorded_shard_truncated_on_the_store_fails_in_one_line_and_leaves_no_entry(
    s3_prefix, proxy, tmp_path
):
    ds = _damage(s3_prefix, lambda data: data[: len(data) // 2])
    fast = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02, deadline=5)
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, retry=fast)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    message, got = serve_until_it_fails(loader)
    assert ds.shards[0].path in message, message
    assert got >= 1  # the rows of the half that landed were served while it arrived
    loader.close()
    _no_entry(cache, ds, tmp_path)
    cache.close()


def test_a_garbage_message_header_fails_in_one_line_naming_it_and_leaves_no_entry(
    s3_prefix, proxy, tmp_path
):
    sizes = SHARDS[0]

    def garble(data: bytes) -> bytes:  # the metadata length of the third record batch
        head = head_size(data[:16], name="s")
        walk = start_walk(data[:head], name="s", size=len(data), rows=sum(sizes))
        assert walk is not None
        walk.advance(lambda lo, hi: data[lo:hi], lambda lo, hi: True)
        at = int(walk.layout().offsets[2]) + 4
        return data[:at] + struct.pack("<i", -12345) + data[at + 4 :]

    ds = _damage(s3_prefix, garble)
    fast = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02, deadline=5)
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, retry=fast, delay=0.05)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    message, got = serve_until_it_fails(loader)
    assert ds.shards[0].path in message, message
    # the walk meets the header long before the fill's checksum could fail
    assert "metadata length of -12345" in message, message
    assert 1 <= got <= (sizes[0] + sizes[1]) // 8  # rows before it were served, none after
    loader.close()
    with pytest.raises(FlashfeedError):  # the fill under way fails its checksum
        cache.get(ds, 0)
    _no_entry(cache, ds, tmp_path)
    cache.close()


def test_shards_with_dictionary_columns_stream_and_equal_the_local_epoch(
    s3_prefix, proxy, tmp_path
):
    local = _both(s3_prefix, tmp_path, dictionary=True)
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, delay=0.05)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    it = iter(loader)
    first = next(it)
    fill = cache.progress(ds, 0)  # observed with the first batch in hand
    assert fill is not None, "shard 0 had landed whole before its first rows were served"
    assert not fill.complete() and cache.ready_path(ds, 0) is None
    fill.close()
    keys, rows = rows_of([first, *it])
    local_keys, local_rows = rows_of(list(TokenLoader(local, batch_size=8, shuffle=False)))
    assert keys == local_keys and np.array_equal(rows, local_rows)
    assert loader.stats()["readahead"]["batches_served_while_arriving"] >= 1
    loader.close()
    cache.close()


def test_a_cold_shuffled_epoch_over_delta_dictionaries_equals_the_local_epoch(
    s3_prefix, proxy, tmp_path
):
    local = _both(s3_prefix, tmp_path, dictionary=True, deltas=True)
    data = (tmp_path / "local" / shard_name(0, "arrow")).read_bytes()
    source = pa.BufferReader(pa.py_buffer(data))
    source.seek(8)  # the file after its magic, read as a stream: the dictionaries as they grow
    stream = pa.ipc.open_stream(source)
    grown = [len(stream.read_next_batch().column(0).dictionary) for _ in SHARDS[0][:2]]
    assert grown == [40, 110]  # a delta dictionary batch between the record batches
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, delay=0.02)
    loader = TokenLoader(ds, batch_size=8, cache=cache, seed=5, window=2)
    cold = list(loader)
    streamed = loader.stats()["readahead"]["batches_served_while_arriving"]
    keys, rows = rows_of(cold)
    local_keys, local_rows = rows_of(list(TokenLoader(local, batch_size=8, seed=5, window=2)))
    assert keys == local_keys and np.array_equal(rows, local_rows)
    assert len(set(keys)) == len(keys) == (sum(map(sum, SHARDS)) // 8) * 8
    assert streamed >= 1
    loader.close()
    cache.close()


def test_a_garbled_dictionary_batch_fails_in_one_line_and_leaves_no_entry(
    s3_prefix, proxy, tmp_path
):
    def garble(data: bytes) -> bytes:  # the metadata length of the first dictionary batch
        at = head_size(data[:16], name="s") + 4
        return data[:at] + struct.pack("<i", -12345) + data[at + 4 :]

    _write(s3_prefix, dictionary=True)
    ds = Dataset.open(s3_prefix)
    url = ds.shard_url(0)
    storage.write_bytes(url, garble(storage.read_bytes(url)))
    fast = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02, deadline=5)
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, retry=fast, delay=0.05)
    loader = TokenLoader(ds, batch_size=8, cache=cache, shuffle=False)
    message, got = serve_until_it_fails(loader)
    assert ds.shards[0].path in message and "metadata length of -12345" in message, message
    assert got == 0
    loader.close()
    with pytest.raises(FlashfeedError):
        cache.get(ds, 0)
    _no_entry(cache, ds, tmp_path)
    cache.close()


def test_cold_document_outputs_of_unrecorded_shards_equal_the_local_ones(
    s3_prefix, proxy, tmp_path
):
    docs = mixed_documents(120, seed=3)
    tok = byte_bpe(tmp_path / "tok.json", docs)
    local = str(tmp_path / "local")
    for prefix in (s3_prefix, local):  # record batches of 7 rows, no layout recorded
        make_doc_token_dataset(
            prefix, docs, tok, seq_len=SEQ, docs_per_shard=60, chunk_rows=7, layout=False
        )
    ds, cache = _cold8(s3_prefix, proxy, tmp_path, delay=0.05)
    loader = TokenLoader(ds, batch_size=4, cache=cache, shuffle=False, outputs=DOC_OUTPUTS)
    cold = list(loader)
    hot = list(TokenLoader(local, batch_size=4, shuffle=False, outputs=DOC_OUTPUTS))
    assert_same_batches(cold, hot)
    assert loader.stats()["readahead"]["batches_served_while_arriving"] >= 1
    loader.close()
    cache.close()

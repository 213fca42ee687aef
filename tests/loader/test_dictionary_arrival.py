"""A shard with dictionary columns viewed while it arrives (``loader/tokens/arrowstream.py``): its
record batches join the view in file order, each once it and every byte before it have
landed (its dictionaries, deltas included, lie there), with the very rows and keys of the
whole file; bytes that cannot be an Arrow file (with dictionaries or not) end in one
``FlashfeedError``, each record batch validated before use. Driven with the
fill's own progress file over a part file written by plain pyarrow."""

from __future__ import annotations

import io
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashfeed.cache.progress import FillProgress, FillView, live_path
from flashfeed.cache.view import arrow_partial
from flashfeed.errors import FlashfeedError
from flashfeed.format.arrowlayout import head_size
from flashfeed.format.ipcwalk import message_header
from flashfeed.loader.tokens.arrowstream import open_arriving_view

ROWS = (30, 50, 20, 40)
SEQ = 8


def _file(*, deltas: bool, plain: bool = False) -> bytes:
    """Tokens of row n: n*SEQ..; ``__key__`` ``k<n>`` dictionary-encoded (with ``deltas``,
    each record batch's dictionary grows by its own keys; ``plain``: strings, no dictionary)."""
    total = sum(ROWS)
    values = np.arange(total * SEQ, dtype=np.int32)
    keys = [f"k{n}" for n in range(total)]
    schema = pa.schema(
        [
            ("__key__", pa.string() if plain else pa.dictionary(pa.int32(), pa.string())),
            ("tokens", pa.list_(pa.int32(), SEQ)),
        ]
    )
    sink = io.BytesIO()
    opts = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=deltas)
    with pa.ipc.RecordBatchFileWriter(sink, schema, options=opts) as writer:
        at = 0
        for n in ROWS:
            vocab = keys[: at + n] if deltas else keys
            batch_keys = pa.DictionaryArray.from_arrays(
                pa.array(range(at, at + n), pa.int32()), pa.array(vocab)
            )
            if plain:
                batch_keys = pa.array(keys[at : at + n])
            tokens = pa.FixedSizeListArray.from_arrays(
                pa.array(values[at * SEQ : (at + n) * SEQ]), SEQ
            )
            writer.write_batch(pa.record_batch([batch_keys, tokens], schema=schema))
            at += n
    return sink.getvalue()


def _arrival(tmp_path, data: bytes, block: int = 8):
    part = tmp_path / "0.part"
    part.write_bytes(data)
    path = live_path(str(tmp_path), 0)
    fill = FillProgress(path, part=str(part), index_part=None, size=len(data), block=block)
    head = head_size(data[:16], name="s")
    assert head is not None
    fill.written(0, head)  # the schema message has landed
    seen = FillView.open(path)
    assert seen is not None
    partial = arrow_partial(seen, "000000.arrow", sum(ROWS))
    assert partial is not None and partial.walk is not None
    return fill, partial


def _rows(view) -> tuple[list[str], np.ndarray]:
    tokens = np.concatenate([np.empty((0, SEQ), np.int32), *view.columns["tokens"]])
    keys = [k for k in view.keys.to_pylist() if k is not None]
    return keys, tokens


@pytest.mark.parametrize("deltas", [False, True])
def test_record_batches_join_in_file_order_once_all_before_them_landed(tmp_path, deltas):
    data = _file(deltas=deltas)
    fill, partial = _arrival(tmp_path, data)
    view = open_arriving_view(partial, ("tokens",), name="000000.arrow")
    assert view.arriving is not None and view.arriving.layout.sequential
    ends = []
    for cut in range(0, len(data) + 64, 64):
        fill.written(0, min(cut, len(data)))
        view.catch_up()
        if view.arriving is None:
            break
        layout = view.arriving.layout
        landed = [b for b in range(layout.num_batches) if b not in view.arriving.pending]
        # in order, and each one only once every byte up to its end was in
        assert landed == list(range(len(landed)))
        assert all(int(layout.offsets[b + 1]) <= cut for b in landed)
        ends.append(len(landed))
        keys, tokens = _rows(view)
        rows = sum(ROWS[: len(landed)])
        assert keys == [f"k{n}" for n in range(rows)]
        assert np.array_equal(tokens.reshape(-1), np.arange(rows * SEQ, dtype=np.int32))
    assert view.arriving is None  # every record batch joined and the walk met the end
    assert view.keys.type == pa.string()  # kept decoded: a batch's take of keys is cheaper
    assert set(range(len(ROWS))) <= set(ends)  # seen with 0, 1, 2, 3 batches in
    keys, tokens = _rows(view)
    whole = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    assert keys == whole.column("__key__").to_pylist()
    assert np.array_equal(tokens.reshape(-1), np.arange(sum(ROWS) * SEQ, dtype=np.int32))
    fill.close()


def test_record_batches_whose_dictionary_has_not_landed_wait_for_it(tmp_path):
    data = _file(deltas=True)
    fill, partial = _arrival(tmp_path, data)
    view = open_arriving_view(partial, ("tokens",), name="000000.arrow")
    head = head_size(data[:16], name="s")
    assert head is not None
    (length,) = struct.unpack("<i", data[head + 4 : head + 8])
    kind, body, _ = message_header(data[head + 8 : head + 8 + length], where="s")
    assert kind == 2 and body > 0  # the first dictionary batch, its body (the first keys)
    gap = (head + 8 + length, head + 8 + length + body)
    fill.written(head, gap[0])
    fill.written(gap[1], len(data))  # everything but that body, as parts may land
    view.catch_up()
    assert view.arriving is not None
    assert view.arriving.layout.num_batches == len(ROWS)  # the walk found every batch
    assert len(view.arriving.pending) == len(ROWS)  # and none was read without its keys
    assert not any(len(a) for a in view.columns["tokens"])
    fill.written(*gap)
    view.catch_up()
    assert view.arriving is None
    assert _rows(view)[0] == [f"k{n}" for n in range(sum(ROWS))]
    fill.close()


FILES = (_file(deltas=True), _file(deltas=False, plain=True))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=6),
    which=st.sampled_from(FILES),
)
def test_mutated_arriving_shards_read_or_fail_in_one_clear_error(tmp_path_factory, edits, which):
    """Whatever the bytes after the schema (dictionaries or none), the view reads record
    batches that are valid Arrow or raises a ``FlashfeedError``: never another exception,
    never a crash on a buffer read out of bounds."""
    data = bytearray(which)
    head = head_size(which[:16], name="s")
    assert head is not None
    for pos, value in edits:
        data[head + pos % (len(data) - head)] = value
    fill, partial = _arrival(tmp_path_factory.mktemp("m"), bytes(data))
    try:
        fill.written(0, len(data))
        view = open_arriving_view(partial, ("tokens",), name="000000.arrow")
        view.catch_up()
        if view.keys is not None:
            view.keys.to_pylist()  # every key readable
    except FlashfeedError:
        return
    finally:
        fill.close()

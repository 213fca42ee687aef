"""Walking an Arrow IPC file's messages from its front (``flashfeed.format.ipcwalk``): with only a
prefix of the bytes, the walk knows every record batch whose header lies in it, agrees with
the layout flashfeed records and with pyarrow's own reader, and a message header that cannot
be right is one clear error naming the shard and the byte."""

from __future__ import annotations

import io
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashfeed.errors import CorruptShardError, FlashfeedError
from flashfeed.format.arrowlayout import head_size, read_layout
from flashfeed.format.arrowshard import write_arrow
from flashfeed.format.ipcwalk import IpcWalk, message_header, start_walk

SEQ = 16
SIZES = (10, 100, 0, 290, 7, 193)  # rows per record batch, one of them empty: 600 rows


def _table(rows: int = 600) -> pa.Table:
    tokens = np.arange(rows * SEQ, dtype=np.int32)
    return pa.table(
        {
            "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), SEQ),
            "__key__": [f"k{i}" for i in range(rows)],
        }
    )


def _pyarrow_file(table: pa.Table, sizes=SIZES, **options) -> bytes:
    """An Arrow IPC file as pyarrow's own writer makes it: no layout recorded."""
    sink = io.BytesIO()
    opts = pa.ipc.IpcWriteOptions(**options) if options else None
    with pa.ipc.RecordBatchFileWriter(sink, table.schema, options=opts) as writer:
        at = 0
        for n in sizes:
            part = table.slice(at, n)
            writer.write_batch(
                pa.record_batch([c.combine_chunks() for c in part.columns], schema=table.schema)
            )
            at += n
    return sink.getvalue()


def _walk(data: bytes, *, upto: int | None = None, rows: int = 600) -> IpcWalk:
    head = data[: head_size(data[:16], name="s")]
    walk = start_walk(head, name="s", size=len(data), rows=rows)
    assert walk is not None
    cut = len(data) if upto is None else upto
    walk.advance(lambda lo, hi: data[lo:hi], lambda lo, hi: hi <= cut)
    return walk


def test_a_walk_agrees_with_the_layout_flashfeed_records():
    data = write_arrow(_table(), batch_bytes=8 << 10)
    layout = read_layout(data[: head_size(data[:16], name="s")], name="s", size=len(data))
    assert layout is not None and layout.num_batches >= 5
    walk = _walk(data)
    assert walk.ended
    assert walk.layout().offsets.tolist() == layout.offsets.tolist()
    assert walk.layout().rows.tolist() == layout.rows.tolist()


def test_a_walk_of_a_prefix_knows_each_batch_whose_header_landed():
    data = _pyarrow_file(_table())
    whole = _walk(data).layout()
    assert whole.rows.tolist() == [0, *np.cumsum(SIZES).tolist()]
    offsets = whole.offsets.tolist()
    for cut in range(offsets[0], len(data) + 1, 97):
        walk = _walk(data, upto=cut)
        found = walk.layout()
        # batch b is known once its framing and metadata (not its body) are in the prefix
        for b in range(whole.num_batches):
            (length,) = struct.unpack("<i", data[offsets[b] + 4 : offsets[b] + 8])
            known = offsets[b] + 8 + length <= cut
            assert (b < found.num_batches) == known, (cut, b)
        assert found.offsets.tolist() == offsets[: found.num_batches + 1]
        assert found.rows.tolist() == whole.rows[: found.num_batches + 1].tolist()
        assert walk.ended == (cut >= offsets[-1] + 8)


@pytest.mark.parametrize("options", [{}, {"compression": "zstd"}], ids=["plain", "zstd"])
def test_each_walked_batch_reads_alone_as_pyarrow_reads_it(options):
    table = _table()
    data = _pyarrow_file(table, **options)
    layout = _walk(data).layout()
    reader = pa.ipc.open_file(pa.py_buffer(data))
    assert reader.num_record_batches == layout.num_batches == len(SIZES)
    buf = pa.py_buffer(data)
    for b in range(layout.num_batches):
        lo, hi = int(layout.offsets[b]), int(layout.offsets[b + 1])
        got = pa.ipc.read_record_batch(buf.slice(lo, hi - lo), layout.schema)
        assert got.equals(reader.get_batch(b))
        assert got.num_rows == layout.rows[b + 1] - layout.rows[b]


def test_message_header_reads_what_pyarrow_reads():
    data = _pyarrow_file(_table())
    layout = _walk(data).layout()
    for b in range(layout.num_batches):
        lo, hi = int(layout.offsets[b]), int(layout.offsets[b + 1])
        message = pa.ipc.read_message(pa.py_buffer(data[lo:hi]))
        meta = message.metadata.to_pybytes()
        kind, body, rows = message_header(meta, where="m")
        assert (kind, body, rows) == (3, message.body.size, SIZES[b])


def _set(data: bytes, at: int, raw: bytes) -> bytes:
    return data[:at] + raw + data[at + len(raw) :]


def _corruptions():
    data = _pyarrow_file(_table())
    offsets = _walk(data).layout().offsets.tolist()
    second = offsets[1]  # the second record batch's message
    (length,) = struct.unpack("<i", data[second + 4 : second + 8])
    schema_msg = data[8 : offsets[0]]
    return [
        ("no-marker", _set(data, second, b"\x00\x01\x02\x03"), "continuation marker"),
        ("negative-length", _set(data, second + 4, struct.pack("<i", -8)), "metadata length"),
        ("unaligned-length", _set(data, second + 4, struct.pack("<i", 13)), "metadata length"),
        ("length-past-end", _set(data, second + 4, struct.pack("<i", 1 << 30)), "does not fit"),
        ("garbage-metadata", _set(data, second + 8, b"\xff" * length), "unreadable message"),
        ("a-schema-again", _set(data, second, schema_msg), "is a schema"),
        ("cut-mid-stream", data[: second + 4], "cut off"),
    ]


@pytest.mark.parametrize(("data", "why"), [c[1:] for c in _corruptions()],
                         ids=[c[0] for c in _corruptions()])  # fmt: skip
def test_a_message_header_that_cannot_be_right_is_one_clear_error(data, why):
    with pytest.raises(CorruptShardError, match=why) as err:
        _walk(data)
    message = str(err.value)
    assert message.startswith("shard s: ") and "byte" in message and "\n" not in message


def test_a_body_past_the_end_and_rows_the_manifest_lacks_are_errors():
    data = _pyarrow_file(_table())
    last = int(_walk(data).layout().offsets[-2])
    with pytest.raises(CorruptShardError, match="does not fit"):
        _walk(data[: last + 200])  # the last header whole, its body cut off
    with pytest.raises(CorruptShardError, match="past the 500 rows the manifest"):
        _walk(data, rows=500)
    with pytest.raises(CorruptShardError, match="ends the stream after 600 rows"):
        _walk(data, rows=700)


def _dictionary_file(*, deltas: bool) -> tuple[bytes, list[list[str]]]:
    """A file of three record batches of dictionary-encoded tags; with ``deltas`` each
    batch brings new words (a delta dictionary batch before it), else one dictionary for all."""
    words = [["a", "b", "a"], ["c", "a", "d", "c"], ["e", "b"]]
    schema = pa.schema([("tag", pa.dictionary(pa.int32(), pa.string())), ("n", pa.int64())])
    sink = io.BytesIO()
    opts = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    with pa.ipc.RecordBatchFileWriter(sink, schema, options=opts) as writer:
        seen: list[str] = []
        for batch in words:
            seen += [w for w in dict.fromkeys(batch) if w not in seen]
            vocab = seen if deltas else sorted({w for b in words for w in b})
            tags = pa.DictionaryArray.from_arrays(
                pa.array([vocab.index(w) for w in batch], pa.int32()), pa.array(vocab)
            )
            writer.write_batch(pa.record_batch([tags, pa.array(range(len(batch)))], schema))
    return sink.getvalue(), words


@pytest.mark.parametrize("deltas", [False, True])
def test_a_schema_with_dictionaries_walks_in_spans_that_hold_them(deltas):
    data, words = _dictionary_file(deltas=deltas)
    layout = _walk(data, rows=9).layout()
    assert layout.sequential and layout.rows.tolist() == [0, 3, 7, 9]
    # each span ends where pyarrow's stream reader ends that record batch (the dictionary
    # batches before it read on the way), the first starting where the schema ends
    source = pa.BufferReader(pa.py_buffer(data))
    source.seek(8)
    reader = pa.ipc.open_stream(source)
    assert source.tell() == layout.offsets[0]
    for b, expected in enumerate(words):
        batch = reader.read_next_batch()
        assert source.tell() == layout.offsets[b + 1]
        assert batch.column(0).to_pylist() == expected
    # batch b needs the bytes from the first span's start: its dictionaries lie there
    assert layout.needs(2) == (int(layout.offsets[0]), int(layout.offsets[3]))


def test_dictionary_batches_are_stepped_over_until_a_record_batch_header_lands():
    data, _ = _dictionary_file(deltas=False)
    whole = _walk(data, rows=9).layout()
    first = int(whole.offsets[0])
    assert _walk(data, upto=first + 8, rows=9).num_batches == 0  # only a dictionary's framing
    assert _walk(data, upto=int(whole.offsets[1]), rows=9).num_batches >= 1


def test_a_dictionary_batch_in_a_schema_without_dictionaries_is_an_error():
    data, _ = _dictionary_file(deltas=False)
    plain = pa.schema([("tag", pa.string()), ("n", pa.int64())])
    start = head_size(data[:16], name="s")
    assert start is not None
    walk = IpcWalk(plain, start=start, size=len(data), rows=9, name="s")  # told no dictionaries
    with pytest.raises(CorruptShardError, match="is a dictionary batch, not a record batch"):
        walk.advance(lambda lo, hi: data[lo:hi], lambda lo, hi: True)


FILE = _pyarrow_file(_table(60), sizes=(10, 20, 0, 30))


def _walk_mutated(file: bytes, edits, cut, *, rows: int):
    """Walk ``file`` with ``edits`` (position, byte) after its schema and cut at ``cut``:
    (its layout, the mutated size), or None when the walk raised a ``FlashfeedError``
    (any other exception fails the test)."""
    data = bytearray(file)
    head = head_size(file[:16], name="s")
    assert head is not None
    for pos, value in edits:
        data[head + pos % (len(data) - head)] = value
    data = data[:cut] if cut is not None and cut > head else data
    walk = start_walk(file[:head], name="s", size=len(data), rows=rows)
    assert walk is not None
    try:
        walk.advance(lambda lo, hi: bytes(data[lo:hi]), lambda lo, hi: hi <= len(data))
    except FlashfeedError:
        return None
    return walk.layout(), len(data)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8),
    cut=st.none() | st.integers(0, len(FILE)),
)
def test_mutated_files_end_in_record_batches_or_one_clear_error(edits, cut):
    """Whatever the bytes after the schema, the walk ends in record batches that lie inside
    the file, in order, or a ``FlashfeedError``: never another exception."""
    got = _walk_mutated(FILE, edits, cut, rows=60)
    if got is None:
        return
    layout, size = got
    assert (np.diff(layout.offsets) > 0).all() and layout.offsets[-1] <= size
    assert (np.diff(layout.rows) >= 0).all() and layout.num_rows <= 60


DICT_FILE = _dictionary_file(deltas=True)[0]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    edits=st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(0, 255)), max_size=8),
    cut=st.none() | st.integers(0, len(DICT_FILE)),
)
def test_mutated_dictionary_files_end_in_record_batches_or_one_clear_error(edits, cut):
    """The same with dictionary batches before and between the record batches."""
    got = _walk_mutated(DICT_FILE, edits, cut, rows=9)
    if got is None:
        return
    layout, size = got
    assert layout.sequential
    assert (np.diff(layout.offsets) > 0).all() and layout.offsets[-1] <= size
    assert (np.diff(layout.rows) >= 0).all() and layout.num_rows <= 9

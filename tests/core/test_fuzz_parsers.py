"""Property tests: random and mutated bytes given to the tar reader, the ``.idx`` parser,
the manifest parser (version 1 text, version 2 header) and the version-2 shard table reader
end in a result or a ``FlashfeedError``, never another exception."""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashfeed import FlashfeedError, Manifest, commit_manifest, read_manifest, storage
from flashfeed.format.manifest import ShardTable
from flashfeed.format.tarshard import iter_samples, scan_index
from flashfeed.format.wdsindex import parse_index
from flashfeed.shardio import tar_shard_bytes

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

TAR, INDEX, _ = tar_shard_bytes(
    [(f"k{i}", {"cls": str(i).encode(), "jpg": bytes(range(40)) * i}) for i in range(1, 5)]
)
MANIFEST = Manifest(
    name="fuzz", shard_format="webdataset", schema={"jpg": "image"}, shards=()
).to_dict()
GOOD_TABLE = ShardTable.from_columns(
    path=["shards/000000.tar", "shards/000001.tar", "a/b.tar"],
    samples=[3, 0, 7],
    bytes=[10, 20, 30],
    checksum=["xxh3_128:" + "0" * 32] * 3,
    index=["shards/000000.tar.idx", None, "a/b.tar.idx"],
)
IPC = GOOD_TABLE.to_ipc().to_pybytes()

mutations = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8)


def mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None = None) -> bytes:
    b = bytearray(data)
    for pos, value in edits:
        b[pos % len(b)] = value
    return bytes(b[:cut] if cut is not None else b)


def only_flashfeed_errors(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except FlashfeedError:
        pass


@SETTINGS
@given(edits=mutations, cut=st.none() | st.integers(0, len(TAR)))
def test_tar_reader_on_mutated_shards(edits: list[tuple[int, int]], cut: int | None) -> None:
    data = mutate(TAR, edits, cut)
    only_flashfeed_errors(lambda: list(iter_samples(io.BytesIO(data), source="fuzz.tar")))
    only_flashfeed_errors(lambda: scan_index(io.BytesIO(data), source="fuzz.tar"))


@SETTINGS
@given(data=st.binary(max_size=3000))
def test_every_parser_on_random_bytes(data: bytes) -> None:
    only_flashfeed_errors(lambda: list(iter_samples(io.BytesIO(data))))
    only_flashfeed_errors(lambda: scan_index(io.BytesIO(data)))
    only_flashfeed_errors(lambda: parse_index(data))
    only_flashfeed_errors(lambda: Manifest.from_json(data))


@SETTINGS
@given(edits=mutations)
def test_index_parser_on_mutated_indexes(edits: list[tuple[int, int]]) -> None:
    only_flashfeed_errors(lambda: parse_index(mutate(INDEX.encode(), edits)))


@SETTINGS
@given(text=st.text(alphabet=st.sampled_from("v1.2 0123456789²٣\n\tjpgcls.a-"), max_size=200))
def test_index_parser_on_index_like_text(text: str) -> None:
    only_flashfeed_errors(lambda: parse_index(text))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
top_keys = st.sampled_from(
    ["name", "shard_format", "schema", "shards", "skipped", "classes", "totals", "source",
     "config", "extra", "format_version"]
)  # fmt: skip
shard_keys = st.sampled_from(["path", "samples", "bytes", "checksum", "index"])


@SETTINGS
@given(
    overrides=st.dictionaries(top_keys, json_values, max_size=4),
    shards=st.lists(
        st.dictionaries(shard_keys, json_values | st.just("xxh3_128:00") | st.just("a.tar")),
        max_size=3,
    ),
)
def test_manifest_parser_on_structured_junk(overrides: dict[str, Any], shards: list[Any]) -> None:
    d = dict(MANIFEST, shards=shards)
    d.update(overrides)
    only_flashfeed_errors(lambda: Manifest.from_json(json.dumps(d)))


@SETTINGS
@given(data=st.binary(max_size=3000))
def test_shard_table_reader_on_random_bytes(data: bytes) -> None:
    only_flashfeed_errors(lambda: ShardTable.read_ipc(pa.py_buffer(data), source="fuzz.arrow"))


@SETTINGS
@given(edits=mutations, cut=st.none() | st.integers(0, len(IPC)))
def test_shard_table_reader_on_mutated_tables(
    edits: list[tuple[int, int]], cut: int | None
) -> None:
    data = mutate(IPC, edits, cut)
    only_flashfeed_errors(lambda: ShardTable.read_ipc(pa.py_buffer(data), source="fuzz.arrow"))


arrow_columns = st.sampled_from(
    [
        pa.array([1, -1, 2**62]),
        pa.array([0, 5, 9], pa.int32()),
        pa.array([1.5, 0.0, -2.0]),
        pa.array(["a.tar", "../x", "/abs"]),
        pa.array(["b.tar", "b.tar", None]),
        pa.array(["xxh3_128:0", "md5:1", ""]),
        pa.array(["c.tar", "s3://h/x", "d\\e"], pa.large_string()),
        pa.array([None, None, None], pa.null()),
        pa.array([b"a", b"b", b"c"]),
        pa.array([True, False, True]),
        pa.array(["x.tar", "y.tar", "z.tar"]).dictionary_encode(),
    ]
)
column_names = st.sampled_from(["path", "samples", "bytes", "checksum", "index", "other"])


@SETTINGS
@given(columns=st.lists(st.tuples(column_names, arrow_columns), max_size=7))
def test_shard_table_checks_on_structured_junk(columns: list[tuple[str, pa.Array]]) -> None:
    good = GOOD_TABLE.to_arrow()
    arrays = [good.column(c) for c in good.column_names] + [a for _, a in columns]
    names = list(good.column_names) + [n for n, _ in columns]
    for drop in range(len(good.column_names) + 1):  # each base column left out once, or none
        keep = [i for i in range(len(names)) if i != drop]
        table = pa.Table.from_arrays([arrays[i] for i in keep], names=[names[i] for i in keep])
        only_flashfeed_errors(partial(ShardTable.from_arrow, table, source="fuzz.arrow"))


table_keys = st.sampled_from(["path", "format", "rows", "bytes", "checksum"])


@SETTINGS
@given(
    overrides=st.dictionaries(top_keys, json_values, max_size=3),
    table_ref=st.dictionaries(table_keys, json_values, max_size=3),
    drop_ref=st.booleans(),
)
def test_v2_header_parser_on_structured_junk(
    overrides: dict[str, Any], table_ref: dict[str, Any], drop_ref: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        m = Manifest(name="fuzz", shard_format="webdataset", schema={}, shards=GOOD_TABLE)
        commit_manifest(tmp, m)
        header = json.loads(Path(tmp, "manifest.json").read_text())
        header.update(overrides)
        if drop_ref:
            header.pop("shard_table", None)
        elif isinstance(header.get("shard_table"), dict):
            header["shard_table"].update(table_ref)
        storage.write_bytes(f"{tmp}/manifest.json", json.dumps(header).encode())
        only_flashfeed_errors(lambda: read_manifest(tmp))
        only_flashfeed_errors(lambda: Manifest.from_header(header, GOOD_TABLE))

"""Property tests: random and mutated bytes given to the tar reader, the ``.idx`` parser and
the manifest parser end in a result or a ``FlashfeedError``, never another exception."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashfeed import FlashfeedError, Manifest
from flashfeed.shardio import tar_shard_bytes
from flashfeed.tarshard import iter_samples, scan_index
from flashfeed.wdsindex import parse_index

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

TAR, INDEX, _ = tar_shard_bytes(
    [(f"k{i}", {"cls": str(i).encode(), "jpg": bytes(range(40)) * i}) for i in range(1, 5)]
)
MANIFEST = Manifest(
    name="fuzz", shard_format="webdataset", schema={"jpg": "image"}, shards=()
).to_dict()

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

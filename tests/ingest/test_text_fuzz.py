"""The JSONL and Parquet text readers under generated hostile text: lone surrogates (escaped
and raw), NULs, byte-order marks, control characters (escaped and raw) and mixed Unicode
normalisations. Every line is one document or one counted skip with the reason the input
deserves, and every document the readers pass goes through the transform, the tokenizer
and both shingle hashers without an error."""

from __future__ import annotations

import json
import os
import tempfile
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flashfeed.ingest.minhash import shingle_hashes
from flashfeed.ingest.sources import Reject, StorageContext
from flashfeed.ingest.sources.textparts import Part, plan_ranges, read_part
from flashfeed.ingest.tokenize import TokenPacker
from flashfeed.ingest.transforms import TransformOptions, transform_record

from support.token_docs import byte_bpe, mixed_documents

HOSTILE = [
    "\ud800", "\udfff", "\udc80",  # lone surrogates
    "\x00", "\ufeff", "\x01", "\x1b[31m", "\x7f", "\r", "\u2028", "\t",  # NUL, BOM, controls
    "e\u0301", "\u00e9", "\u212b", "\u00c5", "\uac00", "\u1100\u1161",  # NFD / NFC mixes
    "<|endoftext|>", " ", "word",
]  # fmt: skip
TEXTS = st.lists(
    st.lists(st.one_of(st.sampled_from(HOSTILE), st.characters()), max_size=24).map("".join),
    min_size=1,
    max_size=12,
)
MODES = st.sampled_from(["escaped", "raw", "bom", "raw_control"])
BOM = b"\xef\xbb\xbf"


def _surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _line(text: str, mode: str) -> tuple[bytes, str | None, str]:
    """One JSONL line for ``text`` written as ``mode``, the reason the reader must give
    (None: the document) and the document's text: what the line means, which for an escaped
    high surrogate followed by a low one is the character the pair encodes."""
    if mode == "raw":  # unescaped: a lone surrogate becomes bytes that are not UTF-8
        line = json.dumps({"text": text}, ensure_ascii=False).encode("utf-8", "surrogatepass")
        if _surrogate(text):
            return line, "invalid_utf8", text
    elif mode == "raw_control":  # a control character unescaped inside the string
        line = json.dumps({"text": "a\x01" + text}).replace("\\u0001", "\x01").encode()
        return line, "bad_json", text
    else:
        line = json.dumps({"text": text}).encode()
        text = json.loads(line)["text"]  # "\\ud800\\udfff" escaped is one character
        line = BOM + line if mode == "bom" else line
    if _surrogate(text):
        return line, "lone_surrogate", text
    return line, None if text.strip() else "empty_text", text


@pytest.fixture(scope="module")
def packer(tmp_path_factory: pytest.TempPathFactory) -> TokenPacker:
    root = tmp_path_factory.mktemp("tok")
    return TokenPacker(byte_bpe(root / "tok.json", mixed_documents(40)), seq_len=16)


def _downstream(packer: TokenPacker, text: str) -> None:
    """What a delivered document meets after the reader: it must not raise."""
    try:
        rec = transform_record({"txt": text}, {"txt": "text"}, TransformOptions())
    except Reject as r:  # NFC + strip may leave nothing
        assert r.reason == "empty_text" and not unicodedata.normalize("NFC", text).strip()
        return
    clean = rec["txt"]
    refused: list[int] = []
    _, stats = packer.pack([clean], [0], on_skip=lambda i, _: refused.append(i))
    assert not refused and stats["documents"] == 1
    shingle_hashes(clean, size=5, unit="word")
    assert len(shingle_hashes(clean, size=5, unit="char")) >= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=TEXTS, modes=st.lists(MODES, min_size=12, max_size=12), part_bytes=st.integers(8, 300))
@example(texts=["\ud800\udfff", "\ud800"], modes=["escaped"] * 12, part_bytes=8)  # a pair, one lone
def test_jsonl_reader_gives_each_line_a_document_or_its_reason(
    packer: TokenPacker, texts: list[str], modes: list[str], part_bytes: int
) -> None:
    made = [_line(t, m) for t, m in zip(texts, modes, strict=False)]
    lines, expect, texts = (list(c) for c in zip(*made, strict=True))
    data = b"\n".join(lines) + b"\n"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.jsonl")
        Path(path).write_bytes(data)
        docs = [
            doc
            for part in plan_ranges(path, len(data), part_bytes)
            for doc in read_part(part, StorageContext(), column="text", limit=1 << 20)
        ]
    assert len(docs) == len(texts)  # one each, whatever the byte ranges cut
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    for doc, text, reason, start in zip(docs, texts, expect, starts, strict=True):
        assert doc.source == f"{path}@{start}"
        if reason is None:
            assert doc.text == text and not doc.reason
            _downstream(packer, doc.text)
        else:
            assert doc.text is None and doc.reason == reason and doc.detail, (doc, text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=TEXTS, as_binary=st.booleans())
def test_parquet_reader_gives_each_row_a_document_or_its_reason(
    packer: TokenPacker, texts: list[str], as_binary: bool
) -> None:
    if as_binary:  # bytes columns may hold anything, lone surrogates as raw bytes included
        column = pa.array([t.encode("utf-8", "surrogatepass") for t in texts], pa.binary())
    else:  # a string column is valid UTF-8 by Arrow's rules: no surrogates get in
        texts = [t for t in texts if not _surrogate(t)] or ["x"]
        column = pa.array(texts, pa.string())
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.parquet")
        pq.write_table(pa.table({"text": column}), path, row_group_size=5)
        groups = pq.ParquetFile(path).metadata.num_row_groups
        docs = [
            doc
            for g in range(groups)
            for doc in read_part(
                Part(path, "parquet", row_group=g), StorageContext(), column="text", limit=1 << 20
            )
        ]
    assert len(docs) == len(texts)
    for n, (doc, text) in enumerate(zip(docs, texts, strict=True)):
        assert doc.source == f"{path}#rg{n // 5}:{n % 5}"
        if _surrogate(text):
            assert doc.text is None and doc.reason == "invalid_utf8"
        elif not text.strip():
            assert doc.text is None and doc.reason == "empty_text"
        else:
            assert doc.text == text
            _downstream(packer, doc.text)

"""``PackedLoader(keep_decoded=...)``: units decoded (tokenized, or a list column decoded)
once and mapped from flash after, with the very same batches; a file changed after indexing
is still refused; a mixture's sources keep theirs too."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from flashfeed.dataset import Dataset
from flashfeed.format.inplace import FileChangedError
from flashfeed.format.inplaceindex import index_in_place
from flashfeed.loader.tokens.packed import PackedLoader
from flashfeed.loader.tokens.segments import DOC_OUTPUTS

from support.parquet_corpus import corpus_texts, write_parquet_corpus
from support.token_docs import byte_bpe

TEXTS = corpus_texts(160, seed=11)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> str:
    return byte_bpe(tmp_path_factory.mktemp("tok") / "tok.json", TEXTS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("pq") / "corpus")
    rng = np.random.default_rng(4)
    ids = [rng.integers(0, 70_000, int(rng.integers(1, 80))).tolist() for _ in TEXTS]
    write_parquet_corpus(prefix, {"text": TEXTS, "input_ids": ids}, files=2, row_group_size=20,
                         types={"input_ids": pa.list_(pa.int64())})  # fmt: skip
    index_in_place(prefix)
    return prefix


def _epochs(loader: PackedLoader, n: int) -> list[list[dict[str, Any]]]:
    out = []
    for epoch in range(n):
        loader.set_epoch(epoch)
        out.append(list(loader))
    return out


def _same(a: list[list[dict[str, Any]]], b: list[list[dict[str, Any]]]) -> bool:
    return all(
        x["__key__"] == y["__key__"]
        and all(torch.equal(x[k], y[k]) for k in ("tokens", "document_ids", "document_offsets"))
        for ea, eb in zip(a, b, strict=True)
        for x, y in zip(ea, eb, strict=True)
    )


@pytest.mark.parametrize("column", ["text", "input_ids"])
def test_units_decoded_once_then_mapped_with_the_same_batches(
    corpus: str, tok: str, tmp_path: Path, column: str
) -> None:
    kw: dict[str, Any] = dict(batch_size=2, seq_len=40, column=column, outputs=DOC_OUTPUTS,
                              tokenizer=tok if column == "text" else None, seed=5,
                              max_open=2, decode_ahead=0)  # fmt: skip
    plain = _epochs(PackedLoader(corpus, **kw), 2)
    kept = PackedLoader(corpus, **kw, keep_decoded=str(tmp_path / "kept"))
    units = len(Dataset.open(corpus).shards)
    got = _epochs(kept, 2)
    assert _same(plain, got)
    stats = kept.stats()["kept"]
    # the first epoch decodes each unit once (and keeps it); the second, holding 2 units
    # decoded in memory, maps the others
    assert stats["misses"] == units and stats["hits"] >= units
    again = PackedLoader(corpus, **kw, keep_decoded=str(tmp_path / "kept"))
    assert _same(plain[:1], _epochs(again, 1))
    assert again.stats()["kept"]["misses"] == 0  # another process of the node maps them too


def test_a_file_changed_after_indexing_is_refused_though_kept(tok: str, tmp_path: Path) -> None:
    prefix = str(tmp_path / "r")
    write_parquet_corpus(prefix, {"text": TEXTS[:60]}, files=2)
    index_in_place(prefix)
    kw: dict[str, Any] = dict(batch_size=2, seq_len=32, tokenizer=tok,
                              keep_decoded=str(tmp_path / "kept"))  # fmt: skip
    list(PackedLoader(prefix, **kw))  # every unit kept
    write_parquet_corpus(prefix, {"text": TEXTS[60:120]}, files=2)
    with pytest.raises(FileChangedError, match="changed after it was indexed") as got:
        list(PackedLoader(prefix, **kw))
    assert "\n" not in str(got.value)


def test_keep_decoded_is_checked(corpus: str, tok: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_decoded must be a folder's path or None, got 3"):
        PackedLoader(corpus, batch_size=2, seq_len=32, tokenizer=tok, keep_decoded=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_decoded_bytes"):
        PackedLoader(corpus, batch_size=2, seq_len=32, tokenizer=tok,
                     keep_decoded=str(tmp_path), keep_decoded_bytes="lots")  # fmt: skip


def _unit_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("ff-unit")}


def test_kept_units_at_hand_are_read_where_needed_not_in_threads(
    corpus: str, tmp_path: Path
) -> None:
    kw: dict[str, Any] = dict(batch_size=2, seq_len=40, column="input_ids", seed=3,
                              decode_ahead=2, outputs=DOC_OUTPUTS,
                              keep_decoded=str(tmp_path / "kept"))  # fmt: skip
    first = PackedLoader(corpus, **kw)
    cold = list(first)
    assert _unit_threads(), "units decoded for the first time are read in background threads"
    first.close()
    assert not _unit_threads()
    again = PackedLoader(corpus, **kw)
    got = list(again)
    # every unit kept and its file local: checked and mapped in this thread, no pool started
    assert not _unit_threads()
    assert again.stats()["kept"]["hits"] == len(Dataset.open(corpus).shards)
    assert _same([cold], [got])
    again.close()

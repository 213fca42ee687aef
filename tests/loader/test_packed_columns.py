"""Other columns of the documents' rows carried through ``PackedLoader`` batches by name:
per row, each piece's document's value, aligned with the row's keys and document ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flashfeed.format.inplaceindex import index_in_place
from flashfeed.loader.tokens.packed import PackedLoader

from support.parquet_corpus import write_jsonl_corpus, write_parquet_corpus


def _row_docs(row: np.ndarray) -> list[int]:
    """The documents of a row of ``document_ids``, in the order their pieces lie."""
    out: list[int] = []
    for d in row.tolist():
        if d >= 0 and (not out or out[-1] != d):
            out.append(d)
    return out


def _check_aligned(batches: list[dict[str, Any]], columns: dict[str, list[Any]]) -> set[int]:
    """Every piece's passed value is its own document's; the documents seen."""
    seen: set[int] = set()
    for b in batches:
        docs = b["document_ids"].numpy()
        for r in range(docs.shape[0]):
            ids = _row_docs(docs[r])
            assert len(b["__key__"][r]) == len(ids)
            for name, values in columns.items():
                assert b[name][r] == [values[d] for d in ids], (name, r)
            seen.update(ids)
    return seen


def test_parquet_columns_pass_through(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    n = 170
    docs = [rng.integers(1, 900, int(rng.integers(1, 70))).tolist() for _ in range(n)]
    urls = [f"https://example.org/{i}" for i in range(n)]
    scores = [float(i) / 7 for i in range(n)]
    prefix = str(tmp_path / "pq")
    write_parquet_corpus(
        prefix, {"input_ids": docs, "url": urls, "score": scores}, files=2,
        row_group_size=30, types={"input_ids": pa.list_(pa.int32())},
    )  # fmt: skip
    index_in_place(prefix)
    kw: dict[str, Any] = dict(batch_size=3, seq_len=40, column="input_ids", drop_last=False)
    loader = PackedLoader(prefix, **kw, outputs=("document_ids",), columns=("url", "score"),
                          seed=6)  # fmt: skip
    batches = list(loader)
    assert _check_aligned(batches, {"url": urls, "score": scores}) == set(range(n))
    # the tokens are those of a loader asked for no columns
    plain = [b["tokens"] for b in PackedLoader(prefix, **kw, seed=6)]
    assert len(plain) == len(batches)
    for a, b in zip(plain, batches, strict=True):
        assert np.array_equal(a.numpy(), b["tokens"].numpy())


def test_jsonl_columns_pass_through_and_missing_is_none(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"text": "x " * (i % 9 + 1), "lang": ["en", "de", "fr"][i % 3]} for i in range(50)
    ]
    del rows[11]["lang"]
    rows = [{**r, "text": [ord(c) for c in r["text"]]} for r in rows]  # token ids as JSON lists
    prefix = str(tmp_path / "j")
    write_jsonl_corpus(prefix, rows, files=2)
    index_in_place(prefix, block_bytes=512)
    loader = PackedLoader(prefix, batch_size=2, seq_len=16, columns=["lang"], drop_last=False,
                          outputs=("document_ids",), shuffle=False)  # fmt: skip
    langs = [r.get("lang") for r in rows]
    assert langs[11] is None
    assert _check_aligned(list(loader), {"lang": langs}) == set(range(50))


def test_bad_column_names(tmp_path: Path) -> None:
    prefix = str(tmp_path / "pq")
    write_parquet_corpus(prefix, {"text": ["a", "b"], "url": ["u", "v"]}, files=1)
    index_in_place(prefix)
    with pytest.raises(ValueError, match="has no column 'lang'; its columns: \\['text', 'url'\\]"):
        PackedLoader(prefix, batch_size=1, seq_len=4, columns=("lang",))
    with pytest.raises(ValueError, match="'labels' is a name of the batch's own outputs"):
        PackedLoader(prefix, batch_size=1, seq_len=4, columns=("labels",))
    with pytest.raises(ValueError, match="columns must be a sequence of column names, got 'url'"):
        PackedLoader(prefix, batch_size=1, seq_len=4, columns="url")

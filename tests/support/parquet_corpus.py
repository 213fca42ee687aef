"""Hugging Face-style corpora for in-place tests: ``data/train-0000k-of-0000n.parquet``
files written by pyarrow (several row groups each), or JSONL files, on any prefix."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flashfeed import storage

__all__ = ["corpus_texts", "parquet_bytes", "write_jsonl_corpus", "write_parquet_corpus"]

_WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "quick", "lazy", "ünï", "日本"]


def corpus_texts(n: int, *, seed: int = 0) -> list[str]:
    """``n`` documents of 1 to 120 words (some non-ASCII), each unique (its number first)."""
    rng = np.random.default_rng(seed)
    return [f"doc{i} " + " ".join(rng.choice(_WORDS, int(rng.integers(1, 120)))) for i in range(n)]


def parquet_bytes(table: pa.Table, *, row_group_size: int, compression: str = "zstd") -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=row_group_size, compression=compression)
    return sink.getvalue().to_pybytes()


def write_parquet_corpus(
    prefix: str,
    columns: dict[str, Sequence[Any]],
    *,
    files: int = 3,
    row_group_size: int = 40,
    compression: str = "zstd",
    types: dict[str, pa.DataType] | None = None,
) -> list[str]:
    """The rows of ``columns`` split over ``files`` Parquet files under ``prefix/data``;
    returns their paths relative to ``prefix``."""
    n = len(next(iter(columns.values())))
    bounds = np.linspace(0, n, files + 1).astype(int)
    names = []
    for k in range(files):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        table = pa.table(
            {c: pa.array(list(v[lo:hi]), (types or {}).get(c)) for c, v in columns.items()}
        )
        name = f"data/train-{k:05d}-of-{files:05d}.parquet"
        data = parquet_bytes(table, row_group_size=row_group_size, compression=compression)
        storage.write_bytes(storage.join(prefix, name), data)
        names.append(name)
    return names


def write_jsonl_corpus(
    prefix: str, rows: Sequence[dict[str, Any]], *, files: int = 2, codec: str = ""
) -> list[str]:
    """``rows`` as JSON lines in ``files`` files (``.jsonl``, ``.jsonl.gz`` or
    ``.jsonl.zst`` by ``codec``)."""
    bounds = np.linspace(0, len(rows), files + 1).astype(int)
    names = []
    for k in range(files):
        text = "".join(json.dumps(r) + "\n" for r in rows[bounds[k] : bounds[k + 1]]).encode()
        if codec == "gzip":
            text, suffix = gzip.compress(text), ".jsonl.gz"
        elif codec == "zstd":
            import zstandard

            text, suffix = zstandard.ZstdCompressor().compress(text), ".jsonl.zst"
        else:
            suffix = ".jsonl"
        name = f"part-{k:03d}{suffix}"
        storage.write_bytes(storage.join(prefix, name), text)
        names.append(name)
    return names

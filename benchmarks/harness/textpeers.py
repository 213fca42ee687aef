"""The peers and ceilings of the in-place stage (``benchmarks/stages/inplace.py``), each
run the way its own documentation runs it: Hugging Face ``datasets`` streaming and its
tokenize-once cache, LitData's ``ParquetLoader``, and the bare work neither side can avoid
(the tokenizer's call alone, pyarrow's decode of a list column alone). Each returns the
tokens it delivered, or None when its package is not installed."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "hf_map_cached",
    "litdata_dir",
    "run_decode",
    "run_hf_cached",
    "run_hf_streaming",
    "run_litdata",
    "run_tokenizer",
]


def _hf(tok: str) -> tuple[Any, Callable[[dict[str, list[str]]], dict[str, Any]]] | None:
    """``datasets`` (None when not installed) and the batched tokenize its ``.map`` runs."""
    try:
        import datasets
    except ImportError:
        return None
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    t = Tokenizer.from_file(tok)

    def tokenize(batch: dict[str, list[str]]) -> dict[str, Any]:
        return {"input_ids": [e.ids for e in t.encode_batch_fast(batch["text"])]}

    return datasets, tokenize


def run_hf_streaming(files: list[str], tok: str, opts: dict[str, Any] | None) -> int | None:
    hf = _hf(tok)
    if hf is None:
        return None
    datasets, tokenize = hf
    ds = datasets.load_dataset(
        "parquet", data_files=files, split="train", streaming=True, storage_options=opts
    ).map(tokenize, batched=True, remove_columns=["text"])
    return sum(len(r["input_ids"]) + 1 for r in ds)  # + EOS: flashfeed's documents carry one


def hf_map_cached(files: list[str], tok: str, work: Path) -> Any:
    """``datasets``' own way to tokenize once: ``load_dataset`` (not streaming) and
    ``.map(tokenize, batched=True)``, both written to its Arrow cache, outside the rounds;
    None when ``datasets`` is not installed."""
    hf = _hf(tok)
    if hf is None:
        return None
    datasets, tokenize = hf
    ds = datasets.load_dataset("parquet", data_files=files, split="train",
                               cache_dir=str(work / "hf-cache"))  # fmt: skip
    return ds.map(tokenize, batched=True, remove_columns=["text"])


def run_hf_cached(ds: Any, args: argparse.Namespace) -> int | None:
    """An epoch over ``hf_map_cached``'s tokens in its cheapest form, packed as a
    ``group_texts`` map packs them: Arrow batches of 1,000 rows (no Python step per row),
    their tokens laid end to end and cut into (batch, seq_len) int64 tensors (no document
    outputs, no EOS: less work than flashfeed's rows)."""
    if ds is None:
        return None
    import torch

    need, n = args.batch * args.seq_len, 0
    rows, filled = np.empty(need, np.int64), 0
    for table in ds.with_format("arrow").iter(batch_size=1000):
        ids = table["input_ids"].combine_chunks().flatten().to_numpy()  # a slice: its own
        at = 0
        while at < len(ids):  # each token copied once, into its batch's own array
            k = min(need - filled, len(ids) - at)
            rows[filled : filled + k] = ids[at : at + k]
            filled, at = filled + k, at + k
            if filled == need:
                n += int(torch.from_numpy(rows.reshape(args.batch, -1)).numel())
                rows, filled = np.empty(need, np.int64), 0
    return n


def run_tokenizer(docs: list[str], tok: str) -> int:
    """The ceiling of a text column tokenized in the loader: the bare tokenizer's call over
    the same texts, batched as ``UnitReader`` batches a row group, in one process (+ EOS)."""
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(tok)
    n = 0
    for k in range(0, len(docs), 1000):
        enc = t.encode_batch_fast(docs[k : k + 1000], add_special_tokens=False)
        n += sum(len(e.ids) + 1 for e in enc)
    return n


def run_decode(prefix: str, column: str) -> int:
    """The ceiling of a token column read from Parquet: each row group's list column
    decoded by pyarrow alone (no check, no packing, no batches), in one process."""
    import pyarrow.parquet as pq

    n = 0
    for f in sorted((Path(prefix) / "data").iterdir()):
        pf = pq.ParquetFile(f)
        for g in range(pf.num_row_groups):
            n += len(pf.read_row_group(g, columns=[column]).column(column).combine_chunks().values)
    return n


def litdata_dir(files: list[str], work: Path) -> str | None:
    """The files linked into a folder of their own, indexed by LitData (its ``index.json``
    beside them, outside the timed rounds, as flashfeed's index is); None when LitData is
    not installed."""
    try:
        from litdata import index_parquet_dataset
    except ImportError:
        return None
    folder = work / "litdata"
    folder.mkdir(exist_ok=True)
    for f in files:
        os.link(f, folder / Path(f).name)
    index_parquet_dataset(str(folder))
    return str(folder)


def run_litdata(folder: str | None, tok: str, batch: int = 1000) -> int | None:
    """LitData's ``ParquetLoader`` through its ``StreamingDataLoader``, each batch of texts
    tokenized with the same call (+ EOS, as flashfeed's documents carry one)."""
    if folder is None:
        return None
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import ParquetLoader
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(tok)
    ds = StreamingDataset(input_dir=folder, item_loader=ParquetLoader())
    n = 0
    for b in StreamingDataLoader(ds, batch_size=batch, num_workers=0):
        n += sum(len(e.ids) + 1 for e in t.encode_batch_fast(b["text"], add_special_tokens=False))
    return n

"""A mixture for ``PackedLoader``: an in-place Parquet corpus and an ingested Arrow dataset
of documents, and the proofs read from what was delivered (keys, tokens, the ledger)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.ingest import IngestConfig, run
from flashfeed.loader.telemetry.ledger import key_hash, read_dropped, read_ledger

__all__ = ["all_keys", "documents_by_key", "ingest_documents", "proof", "source_texts"]


def ingest_documents(
    work: str, dest: str, texts: Sequence[str], *, per_shard: int = 40, **options: Any
) -> Dataset:
    """``texts`` as a JSONL corpus under ``work`` ingested to an Arrow dataset of documents
    (``txt``, no tokenizer) at ``dest``, on the running Ray."""
    rows = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    storage.write_bytes(storage.join(work, "corpus.jsonl"), rows)
    run(IngestConfig(source=storage.join(work, "corpus.jsonl"), dest=dest, format="arrow",
                     source_format="text", samples_per_shard=per_shard, progress="none",
                     **options))  # fmt: skip
    return Dataset.open(dest)


def all_keys(name: str, ds: Dataset) -> list[str]:
    """Every document key of source ``name`` (``<name>:<unit or shard>/<row>``), in order."""
    m = ds.manifest
    return [
        f"{name}:{m.shard_path(i)}/{r}" for i, n in enumerate(m.shard_samples) for r in range(n)
    ]


def source_texts(name: str, ds: Dataset, *, column: str) -> dict[str, str]:
    """Each document key of source ``name`` and its text, read from the stored files."""
    out: dict[str, str] = {}
    if ds.manifest.shard_format == "arrow":
        for info in ds.shards:
            data = storage.read_bytes(storage.join(ds.url, info.path))
            texts = pa.ipc.open_file(pa.py_buffer(data)).read_all().column(column).to_pylist()
            out.update((f"{name}:{info.path}/{r}", t) for r, t in enumerate(texts))
        return out
    import io

    import pyarrow.parquet as pq

    files = ds.in_place
    assert files is not None, f"{ds.url} is neither Arrow nor indexed in place"
    if ds.manifest.shard_format == "jsonl":
        return _jsonl_texts(name, ds, column=column)
    for i, info in enumerate(ds.shards):
        url, _, _ = files.location(info.path)
        group = int(info.path.rpartition("#")[2])
        parquet = pq.ParquetFile(io.BytesIO(storage.read_bytes(url)))
        rows = parquet.read_row_group(group, columns=[column]).column(column).to_pylist()
        out.update((f"{name}:{ds.manifest.shard_path(i)}/{r}", t) for r, t in enumerate(rows))
    return out


def _jsonl_texts(name: str, ds: Dataset, *, column: str) -> dict[str, str]:
    """Each key of a JSONL corpus indexed in place and its text: a unit's lines are those
    its byte range of the file holds (a compressed file: the whole file, one unit)."""
    import gzip

    import zstandard

    out: dict[str, str] = {}
    for i, info in enumerate(ds.shards):
        url, offset = ds.shard_range(info)
        data = storage.read_bytes(url)[offset : offset + info.bytes]
        if url.endswith(".gz"):
            data = gzip.decompress(data)
        elif url.endswith(".zst"):
            data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        lines = [line for line in data.split(b"\n") if line.strip()]
        assert len(lines) == info.samples, f"unit {info.path}: {len(lines)} lines"
        out.update(
            (f"{name}:{ds.manifest.shard_path(i)}/{r}", json.loads(line)[column])
            for r, line in enumerate(lines)
        )
    return out


def documents_by_key(batches: Sequence[dict[str, Any]], tok: Tokenizer) -> dict[str, str]:
    """Each delivered document's text, from its pieces' tokens (by ``document_ids`` and
    ``document_offsets``), named by its key (a row's keys follow its segments); fails on a
    gap or an overlap."""
    pieces: dict[str, list[tuple[int, list[int]]]] = {}
    for b in batches:
        toks, docs, offs = (b[k].numpy() for k in ("tokens", "document_ids", "document_offsets"))
        for r in range(toks.shape[0]):
            row = docs[r]
            real = row >= 0
            starts = np.flatnonzero(real & np.r_[True, row[1:] != row[:-1]])
            assert len(starts) == len(b["__key__"][r]), "a row's keys and segments differ"
            for s, key in zip(starts.tolist(), b["__key__"][r], strict=True):
                at = np.flatnonzero(row == row[s])
                pieces.setdefault(key, []).append((int(offs[r, s]), toks[r, at].tolist()))
    out = {}
    for key, parts in pieces.items():
        ids: list[int] = []
        for off, part in sorted(parts):
            assert off == len(ids), f"document {key}: a gap or an overlap at token {off}"
            ids += part
        out[key] = tok.decode(ids[:-1])  # its EOS last
    return out


def proof(ledger: str, keys: dict[str, list[str]]) -> dict[str, tuple[int, int, int]]:
    """Per source, from the ledger of one epoch: (documents delivered, delivered twice or
    more, named dropped); fails on a hash no source holds or a key delivered and dropped."""
    owner = {key_hash(k): name for name, ks in keys.items() for k in ks}
    order = [k for ks in keys.values() for k in ks]  # virtual ids: the sources end to end
    delivered = [h for hs in read_ledger(ledger).values() for h in hs]
    dropped = {key_hash(order[i]) for ids in read_dropped(ledger).values() for i in ids}
    assert all(h in owner for h in delivered), "a delivered key no source holds"
    assert not dropped & set(delivered), "a document both delivered and named dropped"
    out = {}
    for name in keys:
        mine = [h for h in delivered if owner[h] == name]
        twice = len(mine) - len(set(mine))
        gone = sum(1 for h in dropped if owner[h] == name)
        out[name] = (len(set(mine)), twice, gone)
    return out

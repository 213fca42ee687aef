"""The in-place journey, in one process per step: a Hugging Face-style Parquet corpus on S3
(a read-only source: the manifest goes under another prefix) indexed in place, warmed on
two nodes' caches, trained on 2 ranks, stopped after a few steps, resumed on 3 ranks from
every rank's state; then the delivered keys and tokens prove it: each document delivered
once, and each decodes back to its source text."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from flashfeed.cache import ShardCache
from flashfeed.cli.app import main as flashfeed
from flashfeed.dataset import Dataset
from flashfeed.loader import DOC_OUTPUTS, PackedLoader
from flashfeed.loader.telemetry.ledger import key_hash, read_ledger

from support.parquet_corpus import corpus_texts, write_parquet_corpus
from support.token_docs import byte_bpe

TEXTS = corpus_texts(300, seed=7)
SEQ, BATCH, STEPS = 48, 3, 4


def _documents(batches: list[dict[str, Any]], tok: Tokenizer) -> dict[int, str]:
    pieces: dict[int, list[tuple[int, list[int]]]] = {}
    for b in batches:
        toks, docs, offs = (b[k].numpy() for k in ("tokens", "document_ids", "document_offsets"))
        for r in range(toks.shape[0]):
            for d in np.unique(docs[r][docs[r] >= 0]).tolist():
                at = np.flatnonzero(docs[r] == d)
                pieces.setdefault(d, []).append((int(offs[r, at[0]]), toks[r, at].tolist()))
    out = {}
    for d, parts in pieces.items():
        ids: list[int] = []
        for off, part in sorted(parts):
            assert off == len(ids), f"document {d}: a gap or an overlap at token {off}"
            ids += part
        out[d] = tok.decode(ids[:-1])  # its EOS last
    return out


def test_parquet_on_s3_indexed_warmed_trained_resumed_elsewhere(
    s3_prefix: str, tmp_path: Path
) -> None:
    src, index = f"{s3_prefix}/hf-corpus", f"{s3_prefix}/index"
    write_parquet_corpus(src, {"text": TEXTS, "id": list(range(len(TEXTS)))}, files=3,
                         row_group_size=25)  # fmt: skip
    assert flashfeed(["index", src, "--manifest-prefix", index, "--no-progress"]) == 0
    tok_path = byte_bpe(tmp_path / "tok.json", TEXTS)
    ledger = str(tmp_path / "ledger")
    kw: dict[str, Any] = dict(batch_size=BATCH, seq_len=SEQ, tokenizer=tok_path, seed=21,
                              outputs=DOC_OUTPUTS, drop_last=False, ledger_dir=ledger)  # fmt: skip
    caches = [str(tmp_path / f"node{n}") for n in range(2)]
    for node, cache in enumerate(caches):  # one rank per node, each node warms its share
        argv = ["cache", "warm", index, "--cache-dir", cache, "--node-rank", str(node),
                "--num-nodes", "2", "--seed", "21", "--no-progress"]  # fmt: skip
        assert flashfeed(argv) == 0
    batches, states = [], []
    for rank, cache in enumerate(caches):
        with ShardCache(cache) as sc:
            loader = PackedLoader(index, rank=rank, world_size=2, ranks_per_node=1, cache=sc, **kw)
            it = iter(loader)
            batches += [next(it) for _ in range(STEPS)]
            states.append(loader.state_dict())  # the checkpoint, gathered from every rank
            assert sc.stats()["misses"] == 0  # all of it warmed before the run
            it.close()
    for rank in range(3):  # three fresh nodes, cold caches: the first epoch streams
        with ShardCache(str(tmp_path / f"new{rank}")) as sc:
            loader = PackedLoader(index, rank=rank, world_size=3, ranks_per_node=1, cache=sc, **kw)
            loader.load_state_dict(states)
            batches += list(loader)
    # exactly once, from the delivered keys; every document decodes back to its text
    delivered = [h for lines in read_ledger(ledger).values() for h in lines]
    assert len(delivered) == len(set(delivered)) == len(TEXTS)
    keys = {k for b in batches for row in b["__key__"] for k in row}
    assert {key_hash(k) for k in keys} == set(delivered)
    assert _documents(batches, Tokenizer.from_file(tok_path)) == dict(enumerate(TEXTS))
    # the caches hold row groups' byte ranges, never a whole file
    ds = Dataset.open(index)
    units = {int(b) for b in ds.manifest.shard_bytes}
    cached = [os.path.getsize(os.path.join(d, f)) for c in tmp_path.glob("n*")
              for d, _, fs in os.walk(c) for f in fs if "#" in f]  # fmt: skip
    assert cached and set(cached) <= units

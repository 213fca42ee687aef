"""A table of one text field is tokenized straight from its items' rows: the same token
rows, stats and rejects as reading each item back and transforming it; and what ingest
writes is, document by document, the tokenizer's own encoding of the source text."""

from __future__ import annotations

import json
import pickle
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from flashfeed.ingest import IngestConfig, run, runner, shardtask
from flashfeed.ingest.shardtask import ShardResult
from flashfeed.ingest.sources import StorageContext, scan_source

from support.token_docs import byte_bpe, ingested_pieces, mixed_documents

#: documents a reader or the tokenizer has an opinion on, beside plain ones
AWKWARD = [
    "\ud800 a lone surrogate",
    "",
    "   \n\t ",
    "cafe\u0301 in NFD",
    "  padded  ",
    "a literal <|endoftext|> in the text",
    "<pad>",
]


def _corpus(path: Path, docs: list[str]) -> list[object]:
    """A JSONL of ``{"text": value}`` rows: the documents, then a number and a null."""
    values: list[object] = [*docs, 12345, None]
    path.write_text("".join(json.dumps({"text": v}) + "\n" for v in values))
    return values


@pytest.fixture
def tok(tmp_path: Path) -> str:
    return byte_bpe(tmp_path / "tok.json", mixed_documents(200, seed=1))


@pytest.mark.parametrize("normalize", [True, False])
def test_rows_give_what_records_give(tmp_path: Path, tok: str, normalize: bool) -> None:
    src = tmp_path / "c.jsonl"
    _corpus(src, [*mixed_documents(40, seed=3), *AWKWARD])
    config = IngestConfig(
        source=str(src), dest=str(tmp_path / "out"), format="arrow", tokenizer=tok, seq_len=32,
        packing="best-fit", shard_size="1TB", progress="none", normalize_text=normalize,
    )  # fmt: skip
    ctx = StorageContext.resolve(None)
    scan = scan_source(config.source, config.source_format, ctx)
    assert scan.format == "jsonl" and scan.fields == {"txt": "text"}
    jobs = runner._assign_shards(config, scan, scan.items, ctx, set())
    (job,) = [pickle.loads(pickle.dumps(j)) for j in jobs.jobs]  # as a task gets it
    assert isinstance(job.items, shardtask.ItemRows)

    fast = shardtask._build(jobs.spec, job, check=False).result
    slow = ShardResult(job.number, None)
    found = list(shardtask._samples(jobs.spec, job, slow))
    table = shardtask._tokenize(jobs.spec, [(it, rec) for it, rec, _ in found], slow)
    fast_table = shardtask._build(jobs.spec, job, check=False)
    assert fast.rejects == slow.rejects and fast.stats == slow.stats
    assert fast.bytes_in == slow.bytes_in
    assert {r["reason"] for r in fast.rejects} == {"lone_surrogate", "empty_text"}
    assert fast_table.data == shardtask.write_arrow(table)
    assert fast.stats["documents_with_special_tokens"] == 2


@pytest.mark.usefixtures("ray_session")
def test_every_document_comes_back_as_its_own_encoding(
    tmp_path: Path, s3_prefix: str, tok: str
) -> None:
    """Shuffled over many shards on the rows path: each document's pieces, put back in
    order, are exactly ``encode(text) + [EOS]``; every bad one is a counted skip."""
    src = tmp_path / "c.jsonl"
    docs = [*mixed_documents(300, seed=7), *AWKWARD]
    values = _corpus(src, docs)
    result = run(
        IngestConfig(
            source=str(src), dest=s3_prefix, format="arrow", tokenizer=tok, seq_len=40,
            packing="best-fit", samples_per_shard=37, progress="none",
        )
    )  # fmt: skip
    assert len(result.manifest.shards) > 4
    encoder = Tokenizer.from_file(tok)
    encoder.encode_special_tokens = True
    eos = encoder.token_to_id("<|endoftext|>")
    want: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        text = unicodedata.normalize("NFC", str(v)).strip() if v is not None else ""
        if text and "\ud800" not in text:
            want[i] = [*encoder.encode(text, add_special_tokens=False).ids, eos]
    got = ingested_pieces(s3_prefix)
    assert {d: [t for s in sorted(p) for t in p[s]] for d, p in got.items()} == want
    skipped = result.manifest.skipped
    assert skipped == {"empty_text": 3, "lone_surrogate": 1}

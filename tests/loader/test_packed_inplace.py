"""``PackedLoader`` over Parquet and JSONL files indexed in place: documents packed on the
fly into rows, every one delivered once and decoding back to its source text."""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from tokenizers import Tokenizer

from flashfeed import storage
from flashfeed.cache import ShardCache
from flashfeed.errors import CorruptShardError
from flashfeed.format.inplace import FileChangedError
from flashfeed.format.inplaceindex import index_in_place
from flashfeed.loader.telemetry.ledger import key_hash, read_ledger
from flashfeed.loader.tokens.packed import PackedLoader
from flashfeed.loader.tokens.segments import DOC_OUTPUTS, IGNORE_INDEX

from support.parquet_corpus import corpus_texts, write_jsonl_corpus, write_parquet_corpus
from support.token_docs import byte_bpe

TEXTS = corpus_texts(240)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> str:
    return byte_bpe(tmp_path_factory.mktemp("tok") / "tok.json", TEXTS)


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("pq") / "corpus")
    write_parquet_corpus(prefix, {"text": TEXTS}, files=3, row_group_size=25)
    index_in_place(prefix)
    return prefix


def _pieces(batches: list[dict[str, Any]]) -> dict[int, list[tuple[int, list[int]]]]:
    """Per document id: its pieces (offset in the document, tokens), from the outputs."""
    out: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
    for b in batches:
        toks, docs, offs = b["tokens"].numpy(), b["document_ids"].numpy(), b["document_offsets"]
        offs = offs.numpy()
        for r in range(toks.shape[0]):
            row_docs = docs[r]
            for d in np.unique(row_docs[row_docs >= 0]).tolist():
                at = np.flatnonzero(row_docs == d)
                out[d].append((int(offs[r, at[0]]), toks[r, at].tolist()))
    return out


def _decoded(tok: str, pieces: dict[int, list[tuple[int, list[int]]]]) -> dict[int, str]:
    """Each document's pieces put together in order (each continuing where the last one
    stopped), its EOS dropped, decoded."""
    t = Tokenizer.from_file(tok)
    eos = t.token_to_id("<|endoftext|>")
    out = {}
    for d, parts in pieces.items():
        parts.sort()
        ids: list[int] = []
        for off, toks in parts:
            assert off == len(ids), f"document {d}: a piece at {off} after {len(ids)} tokens"
            ids += toks
        assert ids[-1] == eos
        out[d] = t.decode(ids[:-1])
    return out


def test_text_tokenized_packed_and_decodes_back(text_corpus: str, tok: str, tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger")
    batches = []
    for rank in range(2):
        loader = PackedLoader(
            text_corpus, batch_size=3, seq_len=64, tokenizer=tok, outputs=DOC_OUTPUTS,
            rank=rank, world_size=2, drop_last=False, ledger_dir=ledger, seed=5,
        )  # fmt: skip
        batches += list(loader)
        assert loader.stats()["skipped"] == {}
    for b in batches:
        assert b["tokens"].shape == (3, 64) and b["tokens"].dtype == torch.int64
    texts = _decoded(tok, _pieces(batches))
    # the plan ids are global row numbers: file order, row group order, row order
    assert texts == dict(enumerate(TEXTS))
    # exactly once, from the delivered keys: the ledger holds each document's key once
    hashes = [h for lines in read_ledger(ledger).values() for h in lines]
    assert len(hashes) == len(set(hashes)) == len(TEXTS)
    delivered = {k for b in batches for row in b["__key__"] for k in row}
    assert {key_hash(k) for k in delivered} == set(hashes)


def test_doc_outputs_follow_segments(text_corpus: str, tok: str) -> None:
    loader = PackedLoader(
        text_corpus, batch_size=2, seq_len=48, tokenizer=tok, outputs=DOC_OUTPUTS, seed=1
    )
    b = next(iter(loader))
    docs, pos, labels, toks = (b[k].numpy() for k in ("document_ids", "position_ids", "labels",
                                                      "tokens"))  # fmt: skip
    cu = b["cu_seqlens"].numpy()
    assert cu[0] == 0 and cu[-1] == 2 * 48 and b["max_seqlen"] == int(np.diff(cu).max())
    flat_docs, flat_pos, flat_lab = docs.reshape(-1), pos.reshape(-1), labels.reshape(-1)
    for a, z in itertools.pairwise(cu.tolist()):  # one sequence per segment
        assert len(set(flat_docs[a:z].tolist())) == 1
        assert flat_pos[a:z].tolist() == list(range(z - a))
        assert flat_lab[a] == IGNORE_INDEX
        assert (flat_lab[a + 1 : z] == toks.reshape(-1)[a + 1 : z]).all()


def test_deterministic_and_resumes_inside_a_row(text_corpus: str, tok: str) -> None:
    kw: dict[str, Any] = dict(batch_size=2, seq_len=40, tokenizer=tok, seed=3, drop_last=False)
    whole = [b["tokens"] for b in PackedLoader(text_corpus, **kw)]
    again = [b["tokens"] for b in PackedLoader(text_corpus, **kw, decode_ahead=0)]
    assert all(torch.equal(a, b) for a, b in zip(whole, again, strict=True))
    first = PackedLoader(text_corpus, **kw)
    it = iter(first)
    head = [next(it)["tokens"] for _ in range(7)]
    state = first.state_dict()
    assert state["doc_offset"] > 0  # stopped inside a document, which continues after resume
    resumed = PackedLoader(text_corpus, **kw)
    resumed.load_state_dict(state)
    rest = [b["tokens"] for b in resumed]
    assert len(head) + len(rest) == len(whole)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, whole, strict=True))
    # a one-rank job's state is every rank's: two ranks continue it, the rest once
    halves = []
    for rank in range(2):
        other = PackedLoader(text_corpus, **kw, rank=rank, world_size=2)
        other.load_state_dict(state)
        halves += [b["tokens"] for b in other]
    rest_tokens = torch.cat([t.reshape(-1) for t in rest])
    split_tokens = torch.cat([t.reshape(-1) for t in halves])
    assert sorted(rest_tokens[rest_tokens != 0].tolist()) == sorted(
        split_tokens[split_tokens != 0].tolist()
    )
    two = PackedLoader(text_corpus, **kw, rank=0, world_size=2)
    mid = iter(two)
    next(mid)
    with pytest.raises(ValueError, match="resumes on that rank and world size"):
        PackedLoader(text_corpus, **kw, rank=0, world_size=3).load_state_dict(two.state_dict())


def test_token_column_read_as_tokens(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 5000, int(rng.integers(1, 90))).tolist() for _ in range(150)]
    prefix = str(tmp_path / "ids")
    write_parquet_corpus(
        prefix, {"input_ids": docs}, files=2, row_group_size=30,
        types={"input_ids": pa.list_(pa.int32())},
    )  # fmt: skip
    index_in_place(prefix)
    loader = PackedLoader(
        prefix, batch_size=4, seq_len=32, column="input_ids", outputs=DOC_OUTPUTS,
        drop_last=False, seed=2,
    )  # fmt: skip
    pieces = _pieces(list(loader))
    got = {}
    for d, parts in pieces.items():
        parts.sort()
        got[d] = [t for _, toks in parts for t in toks]
    assert got == dict(enumerate(docs))  # no EOS added to ids given as ids


def test_text_column_needs_a_tokenizer_and_a_column(text_corpus: str) -> None:
    with pytest.raises(ValueError, match="no column 'body'; its columns: \\['text'\\]"):
        PackedLoader(text_corpus, batch_size=2, seq_len=16, column="body")
    loader = PackedLoader(text_corpus, batch_size=2, seq_len=16)
    with pytest.raises(ValueError, match="holds text: give tokenizer="):
        next(iter(loader))


def test_jsonl_bad_lines_counted_and_skipped(tmp_path: Path, tok: str) -> None:
    prefix = tmp_path / "j"
    write_jsonl_corpus(str(prefix), [{"text": t} for t in TEXTS[:60]], files=1)
    path = prefix / "part-000.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"{not json\n"
    lines[7] = b'{"text": "caf\xe9"}\n'  # Latin-1, not UTF-8
    lines[9] = b'{"body": "no text key"}\n'
    path.write_bytes(b"".join(lines))
    index_in_place(str(prefix), block_bytes=1024)
    loader = PackedLoader(str(prefix), batch_size=2, seq_len=32, tokenizer=tok,
                          outputs=DOC_OUTPUTS, drop_last=False, shuffle=False)  # fmt: skip
    texts = _decoded(tok, _pieces(list(loader)))
    assert loader.stats()["skipped"] == {"not-json": 1, "invalid-utf8": 1, "missing-column": 1}
    assert texts == {i: t for i, t in enumerate(TEXTS[:60]) if i not in (3, 7, 9)}


def test_corrupt_row_group_one_line(tmp_path: Path, tok: str) -> None:
    prefix = tmp_path / "c"
    files = write_parquet_corpus(str(prefix), {"text": TEXTS[:80]}, files=1, row_group_size=40,
                                 compression="snappy")  # fmt: skip
    index_in_place(str(prefix))
    from flashfeed.dataset import Dataset

    ds = Dataset.open(str(prefix))
    _, offset, _ = ds.in_place.location(ds.shards[1].path)
    data = bytearray((prefix / files[0]).read_bytes())
    data[offset + 10 : offset + 200] = os.urandom(190)  # the second row group's pages
    (prefix / files[0]).write_bytes(bytes(data))
    index_in_place(str(prefix), overwrite=True)  # indexed as it is: the damage is in the data
    loader = PackedLoader(str(prefix), batch_size=2, seq_len=32, tokenizer=tok, shuffle=False)
    with pytest.raises(CorruptShardError, match=r"row group 1 does not decode") as got:
        list(loader)
    assert "\n" not in str(got.value) and files[0] in str(got.value)


def test_file_replaced_after_indexing_refused(text_corpus: str, tok: str, tmp_path: Path) -> None:
    prefix = str(tmp_path / "r")
    write_parquet_corpus(prefix, {"text": TEXTS[:60]}, files=2)
    index_in_place(prefix)
    loader = PackedLoader(prefix, batch_size=2, seq_len=32, tokenizer=tok)
    write_parquet_corpus(prefix, {"text": TEXTS[60:120]}, files=2)
    with pytest.raises(FileChangedError, match="changed after it was indexed") as got:
        list(loader)
    assert "\n" not in str(got.value)


def test_s3_units_through_the_cache(s3_prefix: str, tok: str, tmp_path: Path) -> None:
    write_parquet_corpus(s3_prefix, {"text": TEXTS}, files=3, row_group_size=25)
    index_in_place(s3_prefix)
    cache = str(tmp_path / "cache")
    with ShardCache(cache) as sc:
        loader = PackedLoader(s3_prefix, batch_size=3, seq_len=64, tokenizer=tok,
                              outputs=DOC_OUTPUTS, drop_last=False, cache=sc)  # fmt: skip
        assert _decoded(tok, _pieces(list(loader))) == dict(enumerate(TEXTS))
    # the cache holds the row groups' byte ranges, not whole files
    from flashfeed.dataset import Dataset

    ds = Dataset.open(s3_prefix)
    sizes = sorted(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs
        if "#" in f
    )  # fmt: skip
    units = sorted(int(b) for b in ds.manifest.shard_bytes)
    file_sizes = {storage.size(storage.join(s3_prefix, f)) for f in ds.in_place.files}
    assert sizes == units and not set(sizes) & file_sizes
    # a file replaced on the store after indexing: refused on the next fill, in one line
    write_parquet_corpus(s3_prefix, {"text": TEXTS[::-1]}, files=3, row_group_size=25)
    with ShardCache(str(tmp_path / "cache2")) as sc:
        fresh = PackedLoader(s3_prefix, batch_size=3, seq_len=64, tokenizer=tok, cache=sc)
        with pytest.raises(FileChangedError, match="changed after it was indexed"):
            list(fresh)


def test_elastic_resume_from_every_rank_state(text_corpus: str, tok: str, tmp_path: Path) -> None:
    """Two ranks stop after 5 batches (each inside some document, having consumed different
    numbers of documents); three ranks continue from both states: every document is
    delivered once in all and decodes back to its text."""
    ledger = str(tmp_path / "ledger")
    kw: dict[str, Any] = dict(batch_size=2, seq_len=40, tokenizer=tok, outputs=DOC_OUTPUTS,
                              drop_last=False, seed=11, ledger_dir=ledger)  # fmt: skip
    batches, states = [], []
    for rank in range(2):
        loader = PackedLoader(text_corpus, rank=rank, world_size=2, **kw)
        it = iter(loader)
        batches += [next(it) for _ in range(5)]
        states.append(loader.state_dict())
    assert states[0]["consumed"] != states[1]["consumed"]
    following = []
    for rank in range(3):
        loader = PackedLoader(text_corpus, rank=rank, world_size=3, **kw)
        loader.load_state_dict(states)
        batches += list(loader)
        following += list(loader)  # the next epoch: whole, nothing left to skip from this one
    assert _decoded(tok, _pieces(batches)) == dict(enumerate(TEXTS))
    assert _decoded(tok, _pieces(following)) == dict(enumerate(TEXTS))
    by_epoch = read_ledger(ledger)
    assert sorted(by_epoch) == [0, 1]
    for hashes in by_epoch.values():
        assert len(hashes) == len(set(hashes)) == len(TEXTS)
    with pytest.raises(ValueError, match="every one of the 2 ranks"):
        PackedLoader(text_corpus, rank=0, world_size=3, **kw).load_state_dict(states[:1] * 2)


def test_warm_then_train_from_the_cache(s3_prefix: str, tok: str, tmp_path: Path) -> None:
    """``flashfeed cache warm`` fetches the units this node's ranks read (byte ranges of
    the files); the loader then reads every one of them from the cache, none from S3."""
    from flashfeed.cli.app import main

    write_parquet_corpus(s3_prefix, {"text": TEXTS}, files=3, row_group_size=25)
    index_in_place(s3_prefix)
    cache = str(tmp_path / "cache")
    argv = ["cache", "warm", s3_prefix, "--cache-dir", cache, "--world-size", "2",
            "--ranks-per-node", "2", "--seed", "4", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    batches = []
    with ShardCache(cache) as sc:
        for rank in range(2):
            loader = PackedLoader(s3_prefix, batch_size=3, seq_len=64, tokenizer=tok, seed=4,
                                  outputs=DOC_OUTPUTS, drop_last=False, cache=sc, rank=rank,
                                  world_size=2, ranks_per_node=2)  # fmt: skip
            batches += list(loader)
        assert sc.stats()["misses"] == 0 and sc.stats()["hits"] > 0
    assert _decoded(tok, _pieces(batches)) == dict(enumerate(TEXTS))

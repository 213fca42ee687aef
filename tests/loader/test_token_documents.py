"""TokenLoader's document outputs on real text: every document of an epoch comes back from
the rows and their boundaries and decodes to its exact source text; the attention mask the
``document_ids`` give equals one built from the source documents; the varlen offsets,
positions and labels agree with a plain per-token walk of the rows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from flashfeed.loader import TokenLoader
from flashfeed.loader.tokens.docrows import DocRows, row_outputs
from flashfeed.loader.tokens.segments import DOC_OUTPUTS, IGNORE_INDEX
from flashfeed.loader.tokens.tokens import docrows

from support.docref import RefShard, Segments
from support.loader_helpers import make_token_dataset
from support.token_docs import byte_bpe, make_doc_token_dataset, mixed_documents

SEQ = 64
DOCS = mixed_documents(160, seed=3)  # every 9th document longer than a row


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> str:
    return byte_bpe(tmp_path_factory.mktemp("tok") / "tok.json", DOCS)


@pytest.fixture(scope="module", params=["concat", "best-fit"])
def packed(request, tmp_path_factory, tok_path) -> tuple[str, str]:
    prefix = str(tmp_path_factory.mktemp("docs") / "ds")
    make_doc_token_dataset(
        prefix, DOCS, tok_path, seq_len=SEQ, packing=request.param, docs_per_shard=40,
        chunk_rows=7,  # several record batches per shard: rows are located across them
    )  # fmt: skip
    return prefix, request.param


def _walk(doc_row: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of one document id in a row: a plain loop."""
    runs: list[tuple[int, int]] = []
    for j, d in enumerate(doc_row.tolist()):
        if j == 0 or d != doc_row[j - 1]:
            runs.append((j, 0))
        runs[-1] = (runs[-1][0], runs[-1][1] + 1)
    return runs


@pytest.mark.parametrize("stream", [False, True], ids=["cached", "streamed"])
def test_every_document_reassembles_to_its_source_text(packed, tok_path, stream, monkeypatch):
    # streamed: batches written with stores that bypass the cache, as a big batch is
    monkeypatch.setattr(docrows, "cache_bytes", lambda: 0 if stream else 1 << 62)
    assert docrows.streams(1) is stream
    prefix, _ = packed
    tok = Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("<|endoftext|>")
    loader = TokenLoader(
        prefix, batch_size=8, seed=5, drop_last=False, outputs=DOC_OUTPUTS, device="cpu"
    )
    pieces: dict[int, dict[int, int]] = {}
    for b in loader:
        toks, docs, offs = b["tokens"].numpy(), b["document_ids"].numpy(), b["document_offsets"]
        for t, d, o in zip(toks.ravel(), docs.ravel(), offs.numpy().ravel(), strict=True):
            if d < 0:
                assert o == -1
                continue
            assert o not in pieces.setdefault(int(d), {}), "a token delivered twice"
            pieces[int(d)][int(o)] = int(t)
    assert sorted(pieces) == list(range(len(DOCS)))
    for d, got in pieces.items():
        ids = [got[k] for k in range(len(got))]  # KeyError: a gap in the document
        assert ids[-1] == eos
        assert tok.decode(ids[:-1], skip_special_tokens=False) == DOCS[d]


def test_positions_offsets_and_labels_follow_the_boundaries(packed):
    prefix, _ = packed
    loader = TokenLoader(prefix, batch_size=8, seed=1, drop_last=False, outputs=DOC_OUTPUTS)
    pads = 0
    for b in loader:
        toks, docs = b["tokens"].numpy(), b["document_ids"].numpy()
        pos, labels = b["position_ids"].numpy(), b["labels"].numpy()
        cu, expected_cu = b["cu_seqlens"].numpy(), [0]
        for r in range(len(toks)):
            for start, n in _walk(docs[r]):
                assert pos[r, start : start + n].tolist() == list(range(n))
                expected_cu.append(expected_cu[-1] + n)
                if docs[r, start] < 0:
                    pads += n
                    assert (labels[r, start : start + n] == IGNORE_INDEX).all()
                else:
                    assert labels[r, start] == IGNORE_INDEX
                    assert (
                        labels[r, start + 1 : start + n].tolist()
                        == toks[r, start + 1 : start + n].tolist()
                    )
        assert cu.dtype == np.int32 and cu.tolist() == expected_cu
        assert b["max_seqlen"] == int(np.diff(cu).max()) and cu[-1] == toks.size
    assert pads > 0  # the last row of each shard (concat) and rows best-fit could not fill


def _reference_rows(
    docs: list[str], tok: Tokenizer, eos: int, per_shard: int
) -> dict[str, np.ndarray]:
    """Row key -> the source document of each token: every shard's documents, each encoded
    alone and followed by EOS, one after the other, cut every SEQ tokens (concatenation)."""
    ref = {}
    for n, first in enumerate(range(0, len(docs), per_shard)):
        owner: list[int] = []
        for d in range(first, min(first + per_shard, len(docs))):
            owner += [d] * (len(tok.encode(docs[d], add_special_tokens=False).ids) + 1)
        owner += [-1] * (-len(owner) % SEQ)
        for r, row in enumerate(np.asarray(owner).reshape(-1, SEQ)):
            ref[f"shards/{n:06d}.arrow/{r}"] = row
    return ref


def _mask(doc: torch.Tensor) -> torch.Tensor:
    """Causal block-diagonal mask of one row from its document ids (padding attends nothing)."""
    same = (doc[:, None] == doc[None, :]) & (doc >= 0)[:, None]
    return same & torch.ones(len(doc), len(doc), dtype=torch.bool).tril()


def test_block_diagonal_mask_from_document_ids_equals_the_source_reference(tmp_path, tok_path):
    prefix = str(tmp_path / "ds")
    make_doc_token_dataset(prefix, DOCS, tok_path, seq_len=SEQ, packing="concat", docs_per_shard=40)
    tok = Tokenizer.from_file(tok_path)
    ref = _reference_rows(DOCS, tok, tok.token_to_id("<|endoftext|>"), 40)
    loader = TokenLoader(prefix, batch_size=4, seed=2, drop_last=False, outputs=("document_ids",))
    seen = 0
    for b in loader:
        for key, doc in zip(b["__key__"], b["document_ids"], strict=True):
            assert torch.equal(_mask(doc), _mask(torch.from_numpy(ref[key])))
            seen += 1
    assert seen == len(ref)


def test_outputs_resume_to_the_same_batches(packed):
    prefix, _ = packed
    full = list(TokenLoader(prefix, batch_size=4, seed=7, outputs=DOC_OUTPUTS))
    first = TokenLoader(prefix, batch_size=4, seed=7, outputs=DOC_OUTPUTS)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    again = TokenLoader(prefix, batch_size=4, seed=7, outputs=DOC_OUTPUTS)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == len(full) - 5
    for a, b in zip(full[5:], rest, strict=True):
        for name in ("tokens", "position_ids", "document_ids", "cu_seqlens", "labels"):
            assert torch.equal(a[name], b[name]), name
        assert a["max_seqlen"] == b["max_seqlen"]


def test_a_dataset_without_boundaries_reads_as_before_and_refuses_outputs(tmp_path: Path):
    prefix = str(tmp_path / "old")
    make_token_dataset(prefix, [6], seq_len=4)
    assert next(iter(TokenLoader(prefix, batch_size=2)))["tokens"].shape == (2, 4)
    with pytest.raises(ValueError, match=r"no document boundaries.*re-ingest"):
        TokenLoader(prefix, batch_size=2, outputs=("position_ids",))
    with pytest.raises(ValueError, match="outputs must be names"):
        TokenLoader(prefix, batch_size=2, outputs=("positions",))
    with pytest.raises(ValueError, match="outputs must be a sequence"):
        TokenLoader(prefix, batch_size=2, outputs="labels")


def test_the_readme_token_example_runs_as_printed(tmp_path: Path):
    from support import REPO

    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    block = next(b for b in blocks if "DOC_OUTPUTS" in b)
    script = tmp_path / "tokens_example.py"
    script.write_text(block)
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600,
        cwd=tmp_path, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs, shapes = proc.stdout.strip().splitlines()[-2:]
    assert docs.startswith("300 documents,") and docs.endswith("pad tokens")
    assert shapes == "torch.Size([4, 128]) torch.Size([4, 128]) 512"


def test_outputs_beside_tokens_in_their_stored_width(packed):
    prefix, _ = packed
    b = next(iter(TokenLoader(prefix, batch_size=4, dtype=None, outputs=("labels",))))
    assert b["tokens"].dtype == torch.uint16 and b["labels"].dtype == torch.int64
    keep = b["labels"] != IGNORE_INDEX
    assert torch.equal(b["labels"][keep], b["tokens"].to(torch.int64)[keep])
    assert set(b) == {"tokens", "labels", "__key__"}


def test_document_columns_that_do_not_fit_their_rows_are_refused_naming_the_shard(
    tmp_path: Path, tok_path
):
    import pyarrow as pa

    from flashfeed.errors import CorruptShardError
    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import write_arrow_shard

    prefix = str(tmp_path / "bad")
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.uint16)), 4)
    table = pa.table({
        "tokens": tokens,
        "doc_lens": pa.array([[3, 3], [4]], pa.list_(pa.int32())),  # row 0: 6 tokens in 4
        "doc_ids": pa.array([[0, 1], [2]], pa.list_(pa.int64())),
        "doc_starts": pa.array([[0, 0], [0]], pa.list_(pa.int64())),
    })  # fmt: skip
    info = write_arrow_shard(prefix, "shards/000000.arrow", table)
    schema = {f.name: str(f.type) for f in table.schema}
    commit_manifest(
        prefix,
        Manifest(name="bad", shard_format="arrow", schema=schema, shards=(info,),
                 requires=("token-documents",)),
    )  # fmt: skip
    loader = TokenLoader(prefix, batch_size=2, shuffle=False, outputs=("position_ids",))
    with pytest.raises(CorruptShardError, match=r"shards/000000\.arrow.*do not fit the rows"):
        next(iter(loader))


def test_document_columns_with_different_row_lengths_are_refused_naming_the_shard(
    tmp_path: Path,
):
    import pyarrow as pa

    from flashfeed.errors import CorruptShardError
    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import write_arrow_shard

    prefix = str(tmp_path / "bad")
    tokens = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.uint16)), 4)
    table = pa.table({
        "tokens": tokens,
        "doc_lens": pa.array([[2, 2], [4]], pa.list_(pa.int32())),
        "doc_ids": pa.array([[0], [1, 2]], pa.list_(pa.int64())),  # as many ids, other rows
        "doc_starts": pa.array([[0, 0], [0]], pa.list_(pa.int64())),
    })  # fmt: skip
    info = write_arrow_shard(prefix, "shards/000000.arrow", table)
    schema = {f.name: str(f.type) for f in table.schema}
    commit_manifest(
        prefix,
        Manifest(name="bad", shard_format="arrow", schema=schema, shards=(info,),
                 requires=("token-documents",)),
    )  # fmt: skip
    loader = TokenLoader(prefix, batch_size=2, shuffle=False, outputs=("document_ids",))
    with pytest.raises(CorruptShardError, match=r"shards/000000\.arrow.*'doc_ids'.*per segment"):
        next(iter(loader))


def test_outputs_are_written_into_the_callers_buffers():
    """Every (B, L) output sits in a buffer ``alloc`` gave (pooled or pinned, for a device
    copy), the tokens are widened into the one given, and the outputs are right: rows of two
    segments, one segment and padding, and padding only."""
    seg = Segments(
        counts=np.array([2, 1, 0]), lengths=np.array([3, 5, 6]), ids=np.array([10, 11, 12]),
        starts=np.array([0, 4, 2]),
    )  # fmt: skip
    tokens = np.arange(24, dtype=np.uint16).reshape(3, 8)
    given: list[np.ndarray] = []

    def alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        given.append(np.full(shape, 99, dtype))
        return given[-1]

    wide = np.full((3, 8), 99, np.int64)
    table = DocRows({0: RefShard.of(seg, tokens)})
    out = row_outputs(
        table, np.zeros(3, np.int64), np.arange(3), DOC_OUTPUTS, wide, alloc, where=str
    )
    assert all(any(out[n] is g for g in given) for n in DOC_OUTPUTS if n != "max_seqlen" and
               n != "cu_seqlens")  # fmt: skip
    assert wide.tolist() == tokens.tolist()
    assert out["position_ids"].tolist() == [
        [0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 0, 1], list(range(8))
    ]  # fmt: skip
    assert out["document_ids"].tolist() == [[10] * 3 + [11] * 5, [12] * 6 + [-1] * 2,
                                            [-1] * 8]  # fmt: skip
    assert out["document_offsets"].tolist() == [
        [0, 1, 2, 4, 5, 6, 7, 8], [2, 3, 4, 5, 6, 7, -1, -1], [-1] * 8
    ]  # fmt: skip
    I = IGNORE_INDEX  # noqa: E741
    assert out["labels"].tolist() == [
        [I, 1, 2, I, 4, 5, 6, 7], [I, 9, 10, 11, 12, 13, I, I], [I] * 8
    ]  # fmt: skip
    assert out["cu_seqlens"].tolist() == [0, 3, 8, 14, 16, 24]
    assert out["cu_seqlens"].dtype == np.int32
    assert out["max_seqlen"] == 8


@pytest.mark.parametrize("dtype", ["int64", None], ids=["int64", "stored"])
def test_a_held_output_never_changes_and_dropped_batches_reuse_their_memory(packed, dtype):
    # a CPU batch's (B, L) outputs share one pooled block: a view of one of them, held
    # alone, must keep the whole block from the pool; batches dropped give it back
    prefix, _ = packed

    def loader() -> TokenLoader:
        return TokenLoader(prefix, batch_size=4, seed=3, dtype=dtype, outputs=DOC_OUTPUTS)

    names = ("tokens", "position_ids", "document_ids", "labels", "document_offsets")
    ref = [{n: b[n].clone() for n in names} for b in loader()]
    got = loader()
    held = []
    for k, batch in enumerate(got):
        for n in names:
            assert torch.equal(batch[n], ref[k][n]), (k, n)
        if k % 3 == 0:
            held.append((k, batch["labels"][1:], batch["tokens"][:, 2:]))
        del batch
    assert len(ref) > 6 and len(held) >= 3
    for k, labels, tokens in held:
        assert torch.equal(labels, ref[k]["labels"][1:]), k
        assert torch.equal(tokens, ref[k]["tokens"][:, 2:]), k
    assert got.host_pool.reused > 0

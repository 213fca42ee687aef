"""A special token spelled in a document's text is encoded as text by default (the model
never sees a control id inside a document); ``special_tokens="special"`` keeps the control
ids; the ingest summary counts the documents that spelled one. With a tokenizer trained
here that has added special tokens (and an added ordinary token, which stays one id)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from flashfeed import Dataset, storage
from flashfeed.format.arrowshard import open_arrow
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.cli import build_config
from flashfeed.ingest.progress import summary_table
from flashfeed.ingest.tokenize import TokenPacker
from flashfeed.ingest.tokentext import SpecialTokens

from support.token_docs import byte_bpe, mixed_documents

SPELLED = [
    "the end <|endoftext|> and then more text after it",
    "chat: <|im_start|>user hello<|im_end|> done",
    "<pad> at the start, then words",
]


def _tokenizer(tmp_path: Path) -> str:
    """byte_bpe's ``<|endoftext|>`` and ``<pad>``, plus two added special tokens and one
    added ordinary token."""
    path = byte_bpe(tmp_path / "base.json", mixed_documents(60))
    tok = Tokenizer.from_file(path)
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["flashfeed"])
    out = tmp_path / "tok.json"
    tok.save(str(out))
    return str(out)


def _special_ids(tok: Tokenizer) -> set[int]:
    return {i for i, t in tok.get_added_tokens_decoder().items() if t.special}


def test_spelled_special_tokens_are_text_unless_asked(tmp_path: Path) -> None:
    path = _tokenizer(tmp_path)
    tok = Tokenizer.from_file(path)
    specials = _special_ids(tok)
    docs = [*SPELLED, "plain words about flashfeed", "no specials here"]
    as_text = TokenPacker(path, seq_len=256)
    stream, lengths = as_text.encode(docs)
    ends = np.cumsum(lengths) - 1
    assert set(stream[ends].tolist()) == {as_text.eos_id}  # EOS only where a document ends
    inside = np.delete(stream, ends)
    assert not specials & set(inside.tolist())
    pieces = np.split(stream, np.cumsum(lengths)[:-1])
    for doc, ids in zip(docs, pieces, strict=True):  # the exact text comes back
        assert tok.decode(ids[:-1].tolist(), skip_special_tokens=False) == doc
    flash = tok.token_to_id("flashfeed")  # an added ordinary token stays one id
    assert flash in inside.tolist()
    kept = TokenPacker(path, seq_len=256, special_tokens="special")
    stream2, _ = kept.encode(docs[:1])
    assert (stream2[:-1] == kept.eos_id).sum() == 1  # today's behaviour, when asked
    _, stats = as_text.pack(docs)
    assert stats["documents_with_special_tokens"] == 3
    assert kept.pack(docs)[1]["documents_with_special_tokens"] == 3
    names = SpecialTokens(tok, "text").names
    assert names == ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>")
    with pytest.raises(ValueError, match=r"special_tokens must be one of .*'control'"):
        TokenPacker(path, seq_len=8, special_tokens="control")


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("mode", ["text", "special"])
def test_ingest_counts_documents_that_spell_a_special_token(
    tmp_path: Path, s3_prefix: str, mode: str
) -> None:
    path = _tokenizer(tmp_path)
    docs = mixed_documents(40, seed=2)
    for k, d in zip((3, 17, 31), SPELLED, strict=True):
        docs[k] = d
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    result = run(
        IngestConfig(
            source=str(src), dest=s3_prefix, format="arrow", tokenizer=path, seq_len=32,
            samples_per_shard=15, special_tokens=mode, progress="none",
        )
    )  # fmt: skip
    tokens = result.manifest.extra["tokens"]
    assert tokens["documents_with_special_tokens"] == 3 and tokens["special_tokens"] == mode
    summary = result.to_dict()
    assert summary["documents_with_special_tokens"] == 3 and summary["special_tokens"] == mode
    assert "3 documents spell one" in summary_table(summary)
    assert result.manifest.config["special_tokens"] == mode
    ds = Dataset.open(s3_prefix)
    eos = tokens["eos_id"]
    found = 0
    for i, info in enumerate(ds.shards):  # every EOS in the documents' segments
        table = open_arrow(storage.read_bytes(ds.shard_url(i)), name=info.path)
        rows = table["tokens"].to_pylist()
        for row, lens in zip(rows, table["doc_lens"].to_pylist(), strict=True):
            found += sum(t == eos for t in row[: sum(lens)])
    # one closing each document, and one inside document 3 only when asked
    assert found == len(docs) + (0 if mode == "text" else 1)


def test_cli_flag_keeps_control_ids() -> None:
    from flashfeed.cli.app import build_parser

    args = build_parser().parse_args(["ingest", "src", "dst", "--special-tokens", "special"])
    assert build_config(args).special_tokens == "special"
    args = build_parser().parse_args(["ingest", "src", "dst"])
    assert build_config(args).special_tokens == "text"

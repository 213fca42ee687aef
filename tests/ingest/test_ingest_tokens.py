"""Token ingest keeps document boundaries: a JSONL corpus through Ray into S3, read back
by TokenLoader with its document outputs, gives every document's exact text; the manifest
counts documents, padding and empty documents; a tokenizer.json that cannot be loaded
stops the run with one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from flashfeed import Dataset, storage
from flashfeed.cli import main as cli_main
from flashfeed.format.arrowlayout import head_size, read_layout
from flashfeed.ingest import IngestConfig, run
from flashfeed.loader import TokenLoader

from support.token_docs import byte_bpe, mixed_documents

pytestmark = pytest.mark.usefixtures("ray_session")

SEQ = 64


def _corpus(tmp_path: Path) -> tuple[Path, list[str], str]:
    docs = mixed_documents(120, seed=8)
    lines = [json.dumps({"text": d}) for d in docs]
    lines.insert(17, json.dumps({"text": ""}))  # an empty document: a counted skip
    src = tmp_path / "corpus.jsonl"
    src.write_text("\n".join(lines) + "\n")
    return src, docs, byte_bpe(tmp_path / "tok.json", docs)


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_documents_come_back_exactly_from_s3(tmp_path: Path, s3_prefix: str, packing: str) -> None:
    src, docs, tok_path = _corpus(tmp_path)
    result = run(
        IngestConfig(
            source=str(src), dest=s3_prefix, format="arrow", tokenizer=tok_path, seq_len=SEQ,
            packing=packing, samples_per_shard=40, progress="none",
        )
    )  # fmt: skip
    m = result.manifest
    stats = m.extra["tokens"]
    assert m.format_version == 3 and stats["packing"] == packing
    assert m.skipped == {"empty_text": 1} and stats["documents"] == len(docs)
    assert stats["padding_tokens"] == SEQ * m.num_samples - stats["tokens"] > 0
    assert stats["truncated_tokens"] == 0 and stats["documents_split"] > 0
    ds = Dataset.open(s3_prefix)
    for i, info in enumerate(ds.shards):  # each shard says where its record batches lie
        data = storage.read_bytes(ds.shard_url(i))
        layout = read_layout(data[: head_size(data[:16], name=info.path)], name=info.path,
                             size=len(data))  # fmt: skip
        assert layout is not None and layout.num_rows == info.samples, info.path
    tok = Tokenizer.from_file(tok_path)
    loader = TokenLoader(
        s3_prefix, batch_size=8, seed=3, drop_last=False, device="cpu",
        outputs=("document_ids", "document_offsets", "position_ids"),
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    pieces: dict[int, dict[int, int]] = {}
    padding = 0
    for b in loader:
        for t, d, o in zip(
            b["tokens"].numpy().ravel(),
            b["document_ids"].numpy().ravel(),
            b["document_offsets"].numpy().ravel(),
            strict=True,
        ):
            if d < 0:
                padding += 1
            else:
                pieces.setdefault(int(d), {})[int(o)] = int(t)
    assert padding == stats["padding_tokens"]
    # document ids are source line numbers; line 17 was the empty one
    lines = [i for i in range(len(docs) + 1) if i != 17]
    assert sorted(pieces) == lines
    for line, text in zip(lines, docs, strict=True):
        got = pieces[line]
        ids = [got[k] for k in range(len(got))]
        assert tok.decode(ids[:-1], skip_special_tokens=False) == text


def test_a_tokenizer_that_cannot_be_loaded_is_one_clear_line(tmp_path: Path, capsys) -> None:
    src, _, _ = _corpus(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    config = IngestConfig(
        source=str(src), dest=str(tmp_path / "out"), format="arrow", tokenizer=str(bad),
        seq_len=SEQ, progress="none",
    )  # fmt: skip
    with pytest.raises(ValueError, match=rf"^cannot load tokenizer {bad}: ") as err:
        run(config)
    assert "\n" not in str(err.value)
    assert not Path(tmp_path / "out" / "manifest.json").exists()
    truncated = tmp_path / "cut.json"
    truncated.write_text(Path(_corpus(tmp_path)[2]).read_text()[:500])
    rc = cli_main(
        ["ingest", str(src), str(tmp_path / "out2"), "--format", "arrow",
         "--tokenizer", str(truncated), "--seq-len", "64"]
    )  # fmt: skip
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc != 0 and len(err_lines) == 1
    assert f"cannot load tokenizer {truncated}" in err_lines[0]
    with pytest.raises(Exception, match=r"manifest\.json"):
        Dataset.open(str(tmp_path / "out2"))

"""Text no encoder takes is a counted skip, never a crash: a JSON line with an escaped lone
surrogate (valid JSON, common in scraped text) through real Ray ingest with a tokenizer,
with near-duplicate removal and with exact dedup; and a failed Ray task reaches the user
as one line naming the stage and the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashfeed import Dataset, storage
from flashfeed.cli.app import main as cli_main
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.raysetup import ray_map
from flashfeed.ingest.sources.textparts import Part
from flashfeed.ingest.taskerrors import StageError
from flashfeed.ingest.tokenize import TokenPacker

from support.token_docs import byte_bpe, mixed_documents

pytestmark = pytest.mark.usefixtures("ray_session")

BAD = '{"text": "before \\ud800 after"}'  # the JSON text holds the escape, as scraped data does


def _corpus(tmp_path: Path, n: int = 30) -> tuple[Path, list[str]]:
    docs = mixed_documents(n, seed=4)
    lines = [json.dumps({"text": d}) for d in docs]
    lines.insert(7, BAD)
    lines.insert(20, '{"text": "\\udfff alone at the start"}')
    src = tmp_path / "src" / "corpus.jsonl"
    src.parent.mkdir(parents=True)
    src.write_text("\n".join(lines) + "\n")
    return src, docs


def _rejects(dest: str) -> list[dict]:
    body = storage.read_bytes(f"{dest}/rejects.jsonl").decode()
    return [json.loads(line) for line in body.splitlines()]


@pytest.mark.parametrize("source_format", ["text", "jsonl"])
def test_lone_surrogate_with_a_tokenizer_is_a_counted_skip(
    tmp_path: Path, s3_prefix: str, source_format: str
) -> None:
    src, docs = _corpus(tmp_path)
    tok = byte_bpe(tmp_path / "tok.json", docs)
    result = run(
        IngestConfig(
            source=str(src), dest=s3_prefix, source_format=source_format, format="arrow",
            tokenizer=tok, seq_len=32, samples_per_shard=10, progress="none",
        )
    )  # fmt: skip
    assert result.manifest.skipped == {"lone_surrogate": 2}
    assert result.manifest.extra["tokens"]["documents"] == len(docs)
    bad = [r for r in _rejects(s3_prefix) if r["reason"] == "lone_surrogate"]
    assert {r["detail"].split(": ", 1)[1] for r in bad} == {
        "U+D800 at character 7",
        "U+DFFF at character 0",
    }
    # each names its file and where in it: a byte offset (text) or a line (jsonl)
    lines = src.read_bytes().split(b"\n")
    offsets = {str(len(b"\n".join(lines[:k])) + 1) for k in (7, 20)}
    if source_format == "text":
        assert {r["source"].rsplit("@", 1)[1] for r in bad} == offsets
    else:
        assert {r["source"].rsplit(":", 1)[1] for r in bad} == {"8", "21"}
    assert all(r["source"].startswith(str(src)) for r in bad)


@pytest.mark.parametrize("source_format", ["text", "jsonl"])
def test_lone_surrogate_with_near_dup_and_dedup_is_a_counted_skip(
    tmp_path: Path, source_format: str
) -> None:
    src, docs = _corpus(tmp_path)
    dest = str(tmp_path / "ds")
    result = run(
        IngestConfig(
            source=str(src), dest=dest, source_format=source_format, format="arrow",
            near_dup_threshold=0.7, dedup=True, progress="none",
        )
    )  # fmt: skip
    skipped = result.manifest.skipped
    assert skipped["lone_surrogate"] == 2
    assert set(skipped) <= {"lone_surrogate", "duplicate", "near_duplicate"}
    delivered = [str(f["txt"]) for _, f in Dataset.open(dest)]
    assert len(delivered) + sum(skipped.values()) == len(docs) + 2
    assert not any("alone at the start" in t or "before" in t for t in delivered)


def test_dedup_alone_on_a_table_source_counts_the_skip(tmp_path: Path) -> None:
    src, docs = _corpus(tmp_path)
    dest = str(tmp_path / "ds")
    result = run(IngestConfig(source=str(src), dest=dest, dedup=True, progress="none"))
    assert result.manifest.skipped["lone_surrogate"] == 2
    assert result.manifest.num_samples + sum(result.manifest.skipped.values()) == len(docs) + 2


def test_text_the_tokenizer_refuses_is_skipped_with_its_id(tmp_path: Path) -> None:
    docs = mixed_documents(20, seed=1)
    packer = TokenPacker(byte_bpe(tmp_path / "tok.json", docs), seq_len=16)
    bad = [*docs[:5], "lone \ud800 here", *docs[5:]]  # past every reader check, on purpose
    refused: list[tuple[int, str]] = []
    ids = list(range(100, 100 + len(bad)))
    table, stats = packer.pack(bad, ids, on_skip=lambda i, w: refused.append((i, w)))
    assert [i for i, _ in refused] == [105] and "TypeError" in refused[0][1]
    clean, clean_stats = packer.pack(docs, [i for i in range(100, 121) if i != 105])
    assert table.equals(clean) and stats == clean_stats
    with pytest.raises(ValueError, match="the tokenizer refuses document 105"):
        packer.pack(bad, ids)


def test_a_failed_ray_task_is_one_line_naming_stage_and_file() -> None:
    def _boom(part: Part) -> int:  # nested: shipped to the Ray worker by value
        return len(("x" if part.url.endswith("a.jsonl") else "\ud800").encode())

    parts = [Part(f"s3://bucket/corpus/{n}.jsonl", "jsonl") for n in "ab"]
    with pytest.raises(StageError) as err:
        ray_map(_boom, parts, stage="scan")
    text = str(err.value)
    assert "\n" not in text and "\x1b" not in text and len(text) < 400
    assert text.startswith("ingest scan failed on s3://bucket/corpus/b.jsonl: ")
    assert "UnicodeEncodeError" in text and "surrogates not allowed" in text
    assert "Traceback" not in text and "ray::" not in text


def test_cli_shows_a_task_error_as_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, _ = _corpus(tmp_path)
    rc = cli_main(
        ["ingest", str(src), str(tmp_path / "ds"), "--source-format", "text", "--format",
         "arrow", "--quality-filter", "json:loads", "--progress", "none"]
    )  # fmt: skip
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("flashfeed ingest: error: ingest quality filter failed on ")
    assert str(src) in err[0] and "\x1b" not in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "ds" / "manifest.json").exists()

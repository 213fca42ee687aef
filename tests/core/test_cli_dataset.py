"""``flashfeed inspect|verify|index`` as a user runs them: output, exit codes, help."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from flashfeed import Dataset, Manifest, commit_manifest
from flashfeed.cli import main
from flashfeed.shardio import shard_name, tar_shard_bytes, write_tar_shard


def samples(n: int, start: int = 0) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (f"k{i:04d}", {"jpg": b"\xff\xd8" + bytes([i]) * 900, "cls": b"%d" % (i % 2)})
        for i in range(start, start + n)
    ]


@pytest.fixture
def dataset(any_prefix: str) -> str:
    infos = tuple(
        write_tar_shard(any_prefix, shard_name(i, "tar"), samples(3 + i, 10 * i)) for i in range(3)
    )
    m = Manifest(
        name="cats-dogs",
        shard_format="webdataset",
        schema={"jpg": "image/jpeg", "cls": "text/plain"},
        shards=infos,
        skipped={"decode_error": 2, "duplicate": 5},
        source={"url": "/data/raw"},
        classes=("cat", "dog"),
    )
    commit_manifest(any_prefix, m)
    return any_prefix


def test_inspect_prints_a_readable_summary(
    dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", dataset]) == 0
    out = capsys.readouterr().out
    m = Dataset.open(dataset).manifest
    assert "dataset   cats-dogs" in out
    assert "format    webdataset (manifest version 2)" in out
    assert "shards    3  (3 with .idx" in out
    assert "samples   12" in out
    assert f"bytes     {m.num_bytes} " in out
    assert "classes   2" in out
    assert "  jpg  image/jpeg" in out and "  cls  text/plain" in out
    assert "skipped   7" in out and "  decode_error: 2" in out and "  duplicate: 5" in out
    assert "shard list" not in out
    assert main(["inspect", dataset, "--shards"]) == 0
    listing = capsys.readouterr().out.split("shard list\n", 1)[1].splitlines()
    assert [line.split()[:3] for line in listing] == [
        [f"shards/00000{i}.tar", str(3 + i), "samples"] for i in range(3)
    ]


def test_inspect_json_matches_the_manifest(
    dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", dataset, "--json", "--shards"]) == 0
    summary = json.loads(capsys.readouterr().out)
    m = Dataset.open(dataset).manifest
    assert summary["shards"] == 3 and summary["samples"] == 12
    assert summary["bytes"] == m.num_bytes
    assert summary["schema"] == {"jpg": "image/jpeg", "cls": "text/plain"}
    assert summary["skipped"] == {"decode_error": 2, "duplicate": 5}
    assert summary["skipped_total"] == 7
    assert summary["shard_bytes"]["min"] == min(s.bytes for s in m.shards)
    assert [s["samples"] for s in summary["shard_list"]] == [3, 4, 5]
    assert [s["checksum"] for s in summary["shard_list"]] == [s.checksum for s in m.shards]


def test_verify_passes_with_a_progress_bar(
    dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", dataset, "--workers", "2"]) == 0
    out = capsys.readouterr()
    assert "ok: 3 shards" in out.out and "match the manifest" in out.out
    assert "verify: 100%" in out.err  # tqdm on stderr


def test_verify_rejects_bad_options(dataset: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", dataset, "--workers", "0", "--no-progress"]) == 2
    assert "workers must be >= 1, got 0" in capsys.readouterr().err


def test_index_refuses_a_committed_prefix_unless_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, _, _ = tar_shard_bytes(samples(4))
    (tmp_path / "a.tar").write_bytes(data)
    assert main(["index", str(tmp_path), "--name", "mine"]) == 0
    out = capsys.readouterr().out
    assert "indexed 1 shards, 4 samples" in out and "schema cls, jpg" in out
    assert (tmp_path / "a.tar.idx").read_text().startswith("v1.2 4\n")
    assert Dataset.open(str(tmp_path)).manifest.name == "mine"

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.tar").write_bytes(tar_shard_bytes(samples(2, 10))[0])
    assert main(["index", str(tmp_path)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["index", str(tmp_path), "--overwrite"]) == 0
    ds = Dataset.open(str(tmp_path))
    assert [s.path for s in ds.shards] == ["a.tar", "sub/b.tar"]
    assert ds.manifest.name == tmp_path.name
    assert list(ds) == samples(4) + samples(2, 10)


def test_index_skips_empty_tars_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    (tmp_path / "0.tar").write_bytes(empty.getvalue())
    (tmp_path / "1.tar").write_bytes(tar_shard_bytes(samples(2))[0])
    assert main(["index", str(tmp_path)]) == 0
    assert "skipped empty tar 0.tar" in capsys.readouterr().err
    m = Dataset.open(str(tmp_path)).manifest
    assert [s.path for s in m.shards] == ["1.tar"]
    assert m.extra == {"empty_tars": ["0.tar"]}


def test_index_of_a_prefix_without_tars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["index", str(tmp_path)]) == 1
    assert "no *.tar shards found under" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 1
    assert "flashfeed index PREFIX" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["inspect", "verify", "index"])
def test_every_subcommand_explains_itself_with_an_example(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out
    assert f"flashfeed {command} " in out
    assert "URL" in out


def test_top_level_help_lists_the_dataset_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("inspect", "verify", "index", "store"):
        assert f"    {command}" in out

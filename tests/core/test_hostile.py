"""The generated corpus of bad inputs (tests/hostile.py) through the real readers and ingest:
each case ends in its promised outcome, a clear error or a counted skip, never a crash."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.random import default_rng

from flashfeed import CorruptShardError, Dataset, FlashfeedError, ManifestError, storage
from flashfeed.cli import main
from flashfeed.format.manifest import Manifest, commit_manifest
from flashfeed.format.tarshard import iter_samples, scan_index
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import jpeg_bytes
from flashfeed.shardio import shard_name, write_tar_shard

from support.hostile import (
    HEADER_EDITS,
    MANIFEST_EDITS,
    MEDIA_CASES,
    TABLE_CASES,
    TAR_CASES,
    BadInput,
    TableCase,
    _info,
    manifest_with,
    tar_of,
)

#: what ingest does with each tar case: a counted skip (reason) or an error naming the shard
INGEST_SKIPS = {
    "absolute_path": "hostile_member",
    "dotdot": "hostile_member",
    "symlink": "hostile_member",
    "hardlink": "hostile_member",
    "char_device": "hostile_member",
    "fifo": "hostile_member",
    "non_utf8_name": "hostile_member",
    "duplicate_key": "duplicate_member",
    "duplicate_member": "duplicate_member",
}


@pytest.mark.parametrize("case", TAR_CASES, ids=lambda c: c.name)
def test_every_bad_tar_is_a_flashfeed_error_naming_the_shard(case: BadInput) -> None:
    for read in (
        lambda: list(iter_samples(io.BytesIO(case.data), source=f"bad/{case.name}.tar")),
        lambda: scan_index(io.BytesIO(case.data), source=f"bad/{case.name}.tar"),
    ):
        with pytest.raises(FlashfeedError) as err:
            read()
        assert isinstance(err.value, CorruptShardError)
        assert f"bad/{case.name}.tar" in str(err.value)
        assert case.expect in str(err.value)


@pytest.mark.usefixtures("ray_session")
def test_ingest_skips_and_counts_hostile_members_and_refuses_broken_tars(tmp_path: Path) -> None:
    good = tar_of([(_info("g0.txt", 4), b"good")])
    src = tmp_path / "skips"
    src.mkdir()
    (src / "000.tar").write_bytes(good)
    skipping = [c for c in TAR_CASES if c.name in INGEST_SKIPS]
    for i, case in enumerate(skipping, 1):
        (src / f"{i:03d}.tar").write_bytes(case.data)
    result = run(IngestConfig(source=str(src), dest=str(tmp_path / "out"), progress="none"))
    header = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert header["format_version"] == 2 and "shards" not in header  # ingest writes v2
    assert Dataset.open(str(tmp_path / "out")).manifest == result.manifest
    expected: dict[str, int] = {}
    for case in skipping:
        expected[INGEST_SKIPS[case.name]] = expected.get(INGEST_SKIPS[case.name], 0) + 1
    assert result.manifest.skipped == expected
    rejects = (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    assert len(rejects) == len(skipping)
    assert all(json.loads(r)["source"].startswith(str(src)) for r in rejects)
    # the rest of every shard still arrived: each case holds at least one good member
    assert result.manifest.num_samples >= 1 + sum(
        c.name in ("absolute_path", "hardlink", "duplicate_key", "duplicate_member")
        for c in skipping
    )

    for case in TAR_CASES:
        if case.name in INGEST_SKIPS:
            continue
        one = tmp_path / f"err-{case.name}"
        one.mkdir()
        (one / "000.tar").write_bytes(good)
        (one / "001.tar").write_bytes(case.data)
        with pytest.raises(Exception, match=r"001\.tar") as err:
            run(
                IngestConfig(
                    source=str(one), dest=str(tmp_path / f"o-{case.name}"), progress="none"
                )
            )
        assert "tar" in str(err.value), case.name
        assert not (tmp_path / f"o-{case.name}" / "manifest.json").exists()


@pytest.mark.usefixtures("ray_session")
def test_corrupt_images_and_bombs_are_skipped_and_counted(tmp_path: Path) -> None:
    media = tmp_path / "src" / "media"
    media.mkdir(parents=True)
    (media / "ok.jpg").write_bytes(jpeg_bytes(default_rng(0)))
    rows = [{"image": "media/ok.jpg", "text": "fine"}]
    for case in MEDIA_CASES:
        (media / case.name).write_bytes(case.data)
        rows.append({"image": f"media/{case.name}", "text": case.name})
    (tmp_path / "src" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run(
        IngestConfig(
            source=str(tmp_path / "src" / "rows.jsonl"),
            dest=str(tmp_path / "out"),
            validate=True,
            progress="none",
        )
    )
    expected: dict[str, int] = {}
    for case in MEDIA_CASES:
        expected[case.expect] = expected.get(case.expect, 0) + 1
    assert result.manifest.skipped == expected
    assert result.manifest.num_samples == 1
    rejects = [json.loads(r) for r in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    by_line = {r["source"].rsplit(":", 1)[1]: r["reason"] for r in rejects}
    # line 1 is the good image; line n + 2 is MEDIA_CASES[n], each named with its reason
    assert by_line == {str(n + 2): case.expect for n, case in enumerate(MEDIA_CASES)}


TABLES = [
    ("bad.jsonl", b'{"text": "a"}\n{"text": "b"\n{"text": "c"}\n', "bad.jsonl:2: not a JSON"),
    ("array.jsonl", b'{"text": "a"}\n[1, 2]\n', "array.jsonl:2: a JSONL row must be"),
    ("latin1.jsonl", '{"text": "caf\u00e9"}\n'.encode("latin-1"), "latin1.jsonl: not UTF-8"),
    ("short.csv", b"text,label\na,1\nb\n", "short.csv:3: fewer values"),
    ("long.csv", b"text,label\na,1,9\n", "long.csv:2: more values"),
    ("garbage.parquet", b"PAR1garbagePAR1", "garbage.parquet: not a readable Parquet"),
]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("name, data, message", TABLES, ids=[t[0] for t in TABLES])
def test_malformed_tables_are_errors_naming_file_and_line(
    tmp_path: Path, name: str, data: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("[", r"\[")):
        run(IngestConfig(source=str(tmp_path / name), dest=str(tmp_path / "o"), progress="none"))
    assert not (tmp_path / "o" / "manifest.json").exists()


@pytest.mark.usefixtures("ray_session")
def test_csv_column_missing_and_parquet_of_wrong_types(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_bytes(b"text,label\na,1\n")
    with pytest.raises(ValueError, match=r"no column 'caption'; the columns are"):
        run(
            IngestConfig(
                source=str(tmp_path / "t.csv"),
                dest=str(tmp_path / "o1"),
                fields={"txt": "caption"},
                progress="none",
            )
        )
    table = pa.table({"text": ["a", "b", "c"], "label": ["1", "seven", "3"]})
    pq.write_table(table, tmp_path / "t.parquet")
    result = run(
        IngestConfig(source=str(tmp_path / "t.parquet"), dest=str(tmp_path / "o2"), progress="none")
    )
    assert result.manifest.skipped == {"bad_value": 1}
    assert "'seven' is not a int" in (tmp_path / "o2" / "rejects.jsonl").read_text()


def _committed(prefix: str, version: int) -> None:
    infos = tuple(
        write_tar_shard(prefix, shard_name(i, "tar"), [(f"a{i}", {"bin": b"x"})]) for i in range(2)
    )
    commit_manifest(
        prefix,
        Manifest(
            name="m", shard_format="webdataset", schema={"bin": "x"}, shards=infos, classes=("c",)
        ),
        format_version=version,
    )


EDITS = [(1, *e) for e in MANIFEST_EDITS] + [(2, *e) for e in HEADER_EDITS]


@pytest.mark.parametrize(
    "version, name, edit, message", EDITS, ids=[f"v{e[0]}-{e[1]}" for e in EDITS]
)
def test_hand_edited_manifests_are_refused_naming_the_problem(
    tmp_path: Path, version: int, name: str, edit: object, message: str
) -> None:
    prefix = str(tmp_path / "ds")
    _committed(prefix, version)
    url = f"{prefix}/manifest.json"
    text = storage.read_bytes(url).decode()
    storage.write_bytes(url, manifest_with(text, edit).encode())  # type: ignore[arg-type]
    with pytest.raises(ManifestError, match=message.replace(".", r"\.")) as err:
        Dataset.open(prefix)
    assert "manifest.json" in str(err.value)


@pytest.mark.parametrize("case", TABLE_CASES, ids=lambda c: c.name)
def test_bad_shard_tables_are_refused_naming_the_file_and_the_field(
    tmp_path: Path, case: TableCase
) -> None:
    prefix = tmp_path / "ds"
    _committed(str(prefix), 2)
    header = json.loads((prefix / "manifest.json").read_text())
    ref = header["shard_table"]
    table_file = prefix / ref["path"]
    good = table_file.read_bytes()
    bad = case.edit(pa.ipc.open_file(good).read_all(), good)
    table_file.write_bytes(bad)
    if case.sync:
        ref.update(bytes=len(bad), checksum=storage.checksum(bad))
    if case.header is not None:
        case.header(ref)
    (prefix / "manifest.json").write_text(json.dumps(header))
    with pytest.raises(ManifestError) as err:
        Dataset.open(str(prefix))
    message = str(err.value)
    assert case.expect in message
    named = table_file.name if case.where == "table" else "manifest.json"
    assert f"{prefix}/{named}" in message, message
    # the CLI says the same, as one line on stderr and exit status 1
    assert main(["inspect", str(prefix)]) == 1

"""Manifest version 2: a JSON header plus a columnar shard table, read lazily; version 1
still opens, both give the same dataset identity, and the writers write version 2."""

from __future__ import annotations

import io
import json
import pickle
import re
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flashfeed import Dataset, Manifest, ManifestError, ShardInfo, commit_manifest, read_manifest
from flashfeed.cli import main
from flashfeed.format.indexer import index_dataset
from flashfeed.format.manifest import (
    MANIFEST_NAME,
    ShardTable,
    manifest_files,
    synthetic_shard_table,
)
from flashfeed.shardio import shard_name, write_tar_shard
from flashfeed.storage import checksum


def _infos(n: int) -> tuple[ShardInfo, ...]:
    return tuple(
        ShardInfo(
            path=f"shards/{i:06d}.tar",
            samples=10 + i,
            bytes=1000 * (i + 1),
            checksum=checksum(bytes([i])),
            index=f"shards/{i:06d}.tar.idx" if i % 2 == 0 else None,
        )
        for i in range(n)
    )


def _manifest(shards: tuple[ShardInfo, ...] | ShardTable, **kw: object) -> Manifest:
    args: dict = dict(
        name="photos",
        shard_format="webdataset",
        schema={"jpg": "image/jpeg", "cls": "text/plain"},
        shards=shards,
        skipped={"decode_error": 2},
        source={"url": "/data/photos"},
        config={"seed": 0},
        classes=("cat", "dog"),
        extra={"note": "x"},
    )
    args.update(kw)
    return Manifest(**args)


def _header(prefix: Path) -> dict:
    return json.loads((prefix / MANIFEST_NAME).read_text())


def test_v2_round_trip_writes_a_small_header_and_a_table(tmp_path: Path) -> None:
    m = _manifest(_infos(5))
    commit_manifest(str(tmp_path), m)
    d = _header(tmp_path)
    assert d["format_version"] == 2 and "shards" not in d
    assert d["totals"] == {"shards": 5, "samples": 60, "bytes": 15000, "skipped": 2}
    ref = d["shard_table"]
    table_file = tmp_path / ref["path"]
    assert ref["rows"] == 5 and ref["format"] == "arrow-ipc"
    assert ref["bytes"] == table_file.stat().st_size
    assert ref["checksum"] == checksum(table_file.read_bytes())
    back = read_manifest(str(tmp_path))
    assert back == m and back.format_version == 2
    assert list(back.shards) == list(m.shards) == list(_infos(5))
    assert (back.classes, back.extra, back.skipped) == (("cat", "dog"), {"note": "x"}, m.skipped)


def test_v1_still_opens_and_has_the_same_identity_as_v2(tmp_path: Path) -> None:
    m = _manifest(_infos(4))
    commit_manifest(str(tmp_path / "v1"), m, format_version=1)
    commit_manifest(str(tmp_path / "v2"), m)
    assert "shards" in _header(tmp_path / "v1") and _header(tmp_path / "v1")["format_version"] == 1
    a, b = Dataset.open(str(tmp_path / "v1")), Dataset.open(str(tmp_path / "v2"))
    assert (a.manifest.format_version, b.manifest.format_version) == (1, 2)
    assert a.manifest == b.manifest
    assert a.manifest.digest == b.manifest.digest == m.digest
    assert re.fullmatch(r"[0-9a-f]{32}", m.digest)
    assert _manifest(_infos(5)).digest != m.digest  # the digest names the content
    for ds in (a, b):
        assert ds.shard_samples.tolist() == [10, 11, 12, 13]
        assert ds.manifest.shard_bytes.tolist() == [1000, 2000, 3000, 4000]
        assert ds.shard_url(1) == f"{ds.url}/shards/000001.tar"
        assert ds.index_url(0) == f"{ds.url}/shards/000000.tar.idx" and ds.index_url(1) is None
        assert ds.shard("shards/000002.tar") == _infos(4)[2]


def test_digest_changes_with_any_field_of_any_shard() -> None:
    base = _infos(3)
    digests = {_manifest(base).digest}
    for change in (
        {"path": "shards/x.tar"},
        {"samples": 99},
        {"bytes": 1},
        {"checksum": checksum(b"other")},
        {"index": "shards/other.idx"},
        {"index": None},
    ):
        shards = (replace(base[0], **change), base[1], base[2])  # type: ignore[arg-type]
        digests.add(_manifest(shards).digest)
    assert len(digests) == 7
    # header fields are not part of the shard table's identity
    assert _manifest(base, name="other").digest == _manifest(base).digest


def test_a_large_table_opens_lazily_as_columns(tmp_path: Path) -> None:
    n = 200_000
    m = _manifest(synthetic_shard_table(n, samples_per_shard=7, shard_bytes=1 << 20), classes=None)
    commit_manifest(str(tmp_path), m)
    ds = Dataset.open(str(tmp_path))
    assert ds.shards.cached == 0  # no ShardInfo built by opening
    samples = ds.shard_samples
    assert isinstance(samples, np.ndarray) and samples.dtype == np.int64 and len(samples) == n
    assert not samples.flags.writeable
    with pytest.raises(ValueError):
        samples[0] = 1
    assert ds.manifest.shard_bytes.sum() == n << 20 and ds.manifest.num_samples == 7 * n
    assert ds.num_shards == len(ds.shards) == n
    assert ds.manifest.shard_path(123_456) == "shards/123456.tar"
    assert ds.shard_url(n - 1) == f"{ds.url}/shards/199999.tar"
    assert ds.index_url(-1) == f"{ds.url}/shards/199999.tar.idx"
    assert ds.shards.cached == 0  # urls came straight off the columns
    info = ds.shards[77]
    assert info.path == "shards/000077.tar" and info.samples == 7 and ds.shards.cached == 1
    assert ds.shard("shards/150000.tar").path == "shards/150000.tar"
    assert ds.manifest.find_shard("shards/150000.tar") == 150_000
    with pytest.raises(KeyError, match="no shard"):
        ds.shard("shards/nope.tar")
    with pytest.raises(IndexError, match="out of range"):
        ds.shard(n)
    assert ds.manifest.digest == m.digest


def test_shard_list_behaves_as_a_sequence() -> None:
    infos = _infos(6)
    shards = _manifest(infos).shards
    assert len(shards) == 6 and shards[-1] == infos[-1] and shards[0] is shards[0]
    assert shards[1:4] == infos[1:4] and shards[::2] == infos[::2]
    assert shards == infos and tuple(shards) == infos and infos[3] in shards
    assert [s.samples for s in shards] == [s.samples for s in infos]
    with pytest.raises(IndexError):
        shards[6]


def test_a_pickled_manifest_keeps_its_table_read_only(tmp_path: Path) -> None:
    commit_manifest(str(tmp_path), _manifest(_infos(3)))
    ds = pickle.loads(pickle.dumps(Dataset.open(str(tmp_path))))
    assert ds.manifest == _manifest(_infos(3)) and ds.shards[2] == _infos(3)[2]
    assert not ds.shard_samples.flags.writeable and not ds.manifest.shard_bytes.flags.writeable


def test_table_columns_are_checked_when_built_from_columns() -> None:
    ok: dict[str, Any] = dict(
        path=["a.tar", "b.tar"], samples=[1, 2], bytes=[3, 4], checksum=["xxh3_128:0"] * 2
    )
    assert len(ShardTable.from_columns(**ok)) == 2
    cases: list[tuple[dict[str, Any], str]] = [
        ({"path": ["a.tar", "../b.tar"]}, r"column 'path', row 1: '\.\./b\.tar' escapes"),
        ({"path": ["a.tar", "a.tar"]}, "two shards share one path"),
        ({"samples": [1, -2]}, "column 'samples' must be >= 0, row 1 holds -2"),
        ({"checksum": ["xxh3_128:0", "md5:1"]}, "column 'checksum', row 1"),
        ({"index": [None, "/abs.idx"]}, r"column 'index', row 1: '/abs\.idx' escapes"),
        ({"path": ["a.tar", ""]}, "row 1: '' must be a non-empty string"),
    ]
    for change, message in cases:
        with pytest.raises(ManifestError, match=message):
            ShardTable.from_columns(**{**ok, **change}, source="cols")


def test_identical_datasets_give_identical_files_and_overwrite_removes_the_old_table(
    tmp_path: Path,
) -> None:
    m = _manifest(_infos(3))
    commit_manifest(str(tmp_path / "a"), m)
    commit_manifest(str(tmp_path / "b"), m)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    commit_manifest(str(tmp_path / "a"), _manifest(_infos(2)), overwrite=True)
    after = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(after) == 2 and after != files
    assert read_manifest(str(tmp_path / "a")).num_shards == 2


def test_a_copy_of_the_manifest_files_opens_as_the_same_manifest(tmp_path: Path) -> None:
    m = _manifest(_infos(3))
    commit_manifest(str(tmp_path / "ds"), m)
    files = manifest_files(str(tmp_path / "ds"))
    assert files[0] == MANIFEST_NAME and files[1].endswith(".arrow") and len(files) == 2
    (tmp_path / "copy").mkdir()
    for name in files:
        (tmp_path / "copy" / name).write_bytes((tmp_path / "ds" / name).read_bytes())
    assert read_manifest(str(tmp_path / "copy")) == m
    commit_manifest(str(tmp_path / "v1"), m, format_version=1)
    assert manifest_files(str(tmp_path / "v1")) == [MANIFEST_NAME]


def test_a_header_without_its_table_is_no_dataset(tmp_path: Path) -> None:
    commit_manifest(str(tmp_path), _manifest(_infos(2)))
    ref = _header(tmp_path)["shard_table"]
    (tmp_path / ref["path"]).unlink()
    with pytest.raises(ManifestError, match=r"manifest\.json: its shard table .* is missing"):
        read_manifest(str(tmp_path))
    with pytest.raises(ManifestError, match="version-2 manifest keeps its shards"):
        Manifest.from_json((tmp_path / MANIFEST_NAME).read_text())


def _tars(root: Path, n: int) -> None:
    root.mkdir(parents=True)
    for i in range(n):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for k in range(3):
                data = f"{i}-{k}".encode()
                info = tarfile.TarInfo(f"s{i}k{k}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (root / f"part-{i}.tar").write_bytes(buf.getvalue())


def test_flashfeed_index_writes_v2(tmp_path: Path) -> None:
    _tars(tmp_path / "wds", 3)
    report = index_dataset(str(tmp_path / "wds"))
    d = _header(tmp_path / "wds")
    assert d["format_version"] == 2 and d["shard_table"]["rows"] == 3
    assert read_manifest(str(tmp_path / "wds")) == report.manifest


@pytest.mark.parametrize("version", [1, 2])
def test_inspect_and_verify_read_both_versions(
    tmp_path: Path, version: int, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = str(tmp_path / "ds")
    infos = tuple(
        write_tar_shard(prefix, shard_name(i, "tar"), [(f"k{i}", {"bin": bytes([i]) * 9})])
        for i in range(3)
    )
    m = Manifest(name="b", shard_format="webdataset", schema={"bin": "x"}, shards=infos)
    commit_manifest(prefix, m, format_version=version)
    assert main(["inspect", prefix, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format_version"] == version and summary["shards"] == 3
    assert summary["samples"] == 3 and summary["indexed"] == 3
    assert summary["shard_bytes"]["min"] == min(s.bytes for s in infos)
    assert main(["verify", prefix, "--no-progress"]) == 0
    assert f"match the manifest (version {version})" in capsys.readouterr().out
    (tmp_path / "ds" / infos[1].path).write_bytes(b"replaced")
    assert main(["verify", prefix, "--no-progress"]) == 1
    assert f"BAD {infos[1].path}" in capsys.readouterr().err

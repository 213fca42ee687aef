"""Manifest version 3: a version-2 header that lists in ``requires`` what a reader must
understand (token datasets with document columns). Readers of versions 1-2 refuse it with
one clear line; this reader refuses features it does not know; plain datasets stay v2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashfeed import Dataset, Manifest, ManifestError, ShardInfo, commit_manifest, read_manifest
from flashfeed.format import manifestheader
from flashfeed.storage import checksum


def _manifest(requires: tuple[str, ...] = ("token-documents",)) -> Manifest:
    shard = ShardInfo(path="shards/000000.arrow", samples=4, bytes=10, checksum=checksum(b"x"))
    return Manifest(
        name="tok", shard_format="arrow", schema={"tokens": "x"}, shards=(shard,),
        requires=requires,
    )  # fmt: skip


def _header(prefix: Path) -> dict:
    return json.loads((prefix / "manifest.json").read_text())


def test_a_manifest_that_requires_features_is_version_3_and_reads_back(tmp_path: Path):
    commit_manifest(str(tmp_path / "a"), _manifest())
    d = _header(tmp_path / "a")
    assert d["format_version"] == 3 and d["requires"] == ["token-documents"]
    back = read_manifest(str(tmp_path / "a"))
    assert back == _manifest() and back.format_version == 3
    assert back.requires == ("token-documents",)
    commit_manifest(str(tmp_path / "b"), _manifest(requires=()))
    assert _header(tmp_path / "b")["format_version"] == 2 and "requires" not in _header(
        tmp_path / "b"
    )
    assert read_manifest(str(tmp_path / "b")).requires == ()


def test_a_reader_of_versions_1_and_2_refuses_it_clearly(tmp_path: Path, monkeypatch):
    commit_manifest(str(tmp_path), _manifest())
    monkeypatch.setattr(manifestheader, "READ_VERSIONS", (1, 2))  # the reader before v3
    with pytest.raises(
        ManifestError,
        match=r"manifest.json: manifest format version 3 is not supported.*upgrade flashfeed",
    ):
        Dataset.open(str(tmp_path))


def test_an_unknown_feature_is_refused_naming_it(tmp_path: Path):
    commit_manifest(str(tmp_path), _manifest())
    d = _header(tmp_path)
    d["requires"] = ["token-documents", "sparse-rows"]
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match=r"requires \['sparse-rows'\].*upgrade flashfeed"):
        read_manifest(str(tmp_path))
    d["requires"] = []
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="version 3 needs 'requires'"):
        read_manifest(str(tmp_path))


def test_it_has_no_version_1_form(tmp_path: Path):
    with pytest.raises(ValueError, match="has no version-1 manifest"):
        commit_manifest(str(tmp_path), _manifest(), format_version=1)
    assert not (tmp_path / "manifest.json").exists()

"""The manifest: round trip, canonical JSON, validation with errors that name the file.

Version-1 text (shards inline) is what ``to_json`` writes and every reader still takes;
the version-2 header and shard table have their own tests in test_manifest_v2.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashfeed import (
    FORMAT_VERSION,
    DatasetExistsError,
    Manifest,
    ManifestError,
    ShardInfo,
    commit_manifest,
    read_manifest,
)
from flashfeed.storage import checksum


def make_manifest(n: int = 3, **kw: object) -> Manifest:
    shards = tuple(
        ShardInfo(
            path=f"shards/{i:06d}.tar",
            samples=10 + i,
            bytes=1000 * (i + 1),
            checksum=checksum(bytes([i])),
            index=f"shards/{i:06d}.tar.idx",
        )
        for i in range(n)
    )
    args: dict = {
        "name": "photos",
        "shard_format": "webdataset",
        "schema": {"jpg": "image/jpeg", "cls": "text/plain"},
        "shards": shards,
        "skipped": {"decode_error": 2, "duplicate": 1},
        "source": {"url": "/data/photos", "items": 40},
        "config": {"seed": 0, "shard_size": 1 << 20},
        "classes": ("cat", "dog"),
    }
    args.update(kw)
    return Manifest(**args)


def test_round_trip_keeps_every_field() -> None:
    m = make_manifest()
    back = Manifest.from_json(m.to_json())
    assert back == m
    d = json.loads(m.to_json())
    assert d["format_version"] == 1 and FORMAT_VERSION == 2
    assert d["totals"] == {"shards": 3, "samples": 33, "bytes": 6000, "skipped": 3}
    assert d["shards"][1] == {
        "path": "shards/000001.tar",
        "samples": 11,
        "bytes": 2000,
        "checksum": checksum(bytes([1])),
        "index": "shards/000001.tar.idx",
    }
    assert d["classes"] == ["cat", "dog"]


def test_json_is_canonical_so_equal_datasets_give_equal_manifests() -> None:
    a = make_manifest(schema={"jpg": "image/jpeg", "cls": "text/plain"})
    b = make_manifest(schema={"cls": "text/plain", "jpg": "image/jpeg"})
    assert a.to_json() == b.to_json()
    assert a.to_json().endswith("\n")


def _dump(m: Manifest, **changes: object) -> str:
    d = m.to_dict()
    d.update(changes)
    return json.dumps(d)


def test_unknown_format_version_is_refused_naming_the_file() -> None:
    text = _dump(make_manifest(), format_version=4)
    with pytest.raises(ManifestError, match=r"s3://b/ds/manifest.json.*version 4.*upgrade"):
        Manifest.from_json(text, source="s3://b/ds/manifest.json")
    with pytest.raises(ManifestError, match="no format_version"):
        Manifest.from_json(json.dumps({"name": "x"}), source="m.json")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"format_version": 1, "name": "x"}), "lacks 'shard_format'"),
    ],
)
def test_malformed_manifest_names_the_file(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message) as err:
        Manifest.from_json(text, source="/data/ds/manifest.json")
    assert "/data/ds/manifest.json" in str(err.value)


@pytest.mark.parametrize(
    "path", ["../outside.tar", "/etc/passwd", "s3://other/x.tar", "a/../../b.tar", ""]
)
def test_shard_paths_must_stay_inside_the_prefix(path: str) -> None:
    d = make_manifest().to_dict()
    d["shards"][0]["path"] = path
    with pytest.raises(ManifestError, match=r"shards\[0\]\.path"):
        Manifest.from_dict(d, source="m.json")


def test_bad_shard_entries_are_refused() -> None:
    base = make_manifest().to_dict()
    for field, value, message in [
        ("samples", -1, "samples must be an integer"),
        ("bytes", "12", "bytes must be an integer"),
        ("checksum", "md5:abc", "checksum must look like 'xxh3_128:"),
    ]:
        d = json.loads(json.dumps(base))
        d["shards"][1][field] = value
        with pytest.raises(ManifestError, match=message):
            Manifest.from_dict(d)
    d = json.loads(json.dumps(base))
    d["shards"][2]["path"] = d["shards"][0]["path"]
    with pytest.raises(ManifestError, match="two shards share one path"):
        Manifest.from_dict(d)


def test_totals_that_disagree_with_the_shards_are_refused() -> None:
    d = make_manifest().to_dict()
    d["totals"]["samples"] += 1
    with pytest.raises(ManifestError, match=r"totals\.samples is 34 but the shards add up to 33"):
        Manifest.from_dict(d)
    d = make_manifest().to_dict()
    del d["shards"][-1]  # a truncated shard list
    with pytest.raises(ManifestError, match="totals"):
        Manifest.from_dict(d)


def test_unknown_shard_format_is_refused() -> None:
    with pytest.raises(ManifestError, match="shard_format must be one of"):
        make_manifest(shard_format="orc")
    # files indexed in place: only in a manifest that requires 'in-place' (version 3)
    with pytest.raises(ManifestError, match="must require 'in-place'"):
        make_manifest(shard_format="parquet")
    with pytest.raises(ManifestError, match="shard_format"):
        Manifest.from_json(_dump(make_manifest(), shard_format="zip"))


def test_commit_refuses_to_replace_a_committed_manifest(tmp_path: Path) -> None:
    prefix = str(tmp_path / "ds")
    url = commit_manifest(prefix, make_manifest())
    assert url == prefix + "/manifest.json"
    with pytest.raises(DatasetExistsError, match="immutable"):
        commit_manifest(prefix, make_manifest(name="other"))
    assert read_manifest(prefix).name == "photos"
    commit_manifest(prefix, make_manifest(name="other", shards=()), overwrite=True)
    assert read_manifest(prefix).name == "other"
    # the replaced header's shard table went with it: one header, one table
    names = sorted(p.name for p in (tmp_path / "ds").iterdir())
    assert len(names) == 2 and names[1] == "manifest.json"
    assert names[0].startswith("manifest-") and names[0].endswith(".arrow")


def test_missing_manifest_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"no dataset at .*flashfeed index"):
        read_manifest(str(tmp_path / "nothing-here"))

"""The space check of every fill lists the cache's folders and stats only files it has not
seen: ``DatasetDir.held_bytes`` counts what a full scan counts, through renames, removals
and replacements, without a stat per cached entry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flashfeed.cache import layout
from flashfeed.cache.layout import DatasetDir
from flashfeed.cache.space import scan
from flashfeed.format.manifest import Manifest, ShardInfo


def _dataset_dir(root: Path, shards: int = 4) -> DatasetDir:
    infos = tuple(
        ShardInfo(
            path=f"shards/{i:06d}.tar", bytes=1000 + i, samples=1, checksum=f"xxh3_128:{i:032x}"
        )
        for i in range(shards)
    )
    manifest = Manifest(name="held", shard_format="webdataset", schema={}, shards=infos)
    d = DatasetDir(str(root), "held-0123456789abcdef")
    d.create("s3://bucket/held", manifest)
    return d


def _put(d: DatasetDir, rel: str, size: int) -> None:
    path = Path(d.data_dir) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp-new")
    tmp.write_bytes(b"x" * size)
    os.replace(tmp, path)  # as a fill does: a new file (new inode) renamed into place


def _full_scan_bytes(root: Path) -> int:
    return scan(str(root), sweep=False)[1]


def test_held_bytes_counts_what_a_full_scan_counts(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = _dataset_dir(root)
    parts = d.part_bytes
    assert d.held_bytes() == 0 == _full_scan_bytes(root) - parts()
    _put(d, "shards/000000.tar", 1000)
    _put(d, "shards/000000.tar.idx", 70)
    _put(d, "shards/000001.tar", 1001)
    _put(d, "shards/000002.tar.idx", 50)  # an index renamed in before its shard: not an entry
    _put(d, "notes.txt", 999)  # not a shard of this dataset
    Path(d.parts_dir, "3.data.1.ab").write_bytes(b"p" * 500)  # a fill in flight: a part
    assert d.held_bytes() == 1000 + 70 + 1001
    assert d.held_bytes() + d.part_bytes() == _full_scan_bytes(root)
    os.unlink(Path(d.data_dir) / "shards/000001.tar")  # evicted
    _put(d, "shards/000002.tar", 1002)  # its shard arrives
    _put(d, "shards/000000.tar", 10)  # replaced by another file (a refetch after damage)
    assert d.held_bytes() == 10 + 70 + 1002 + 50
    assert d.held_bytes() + d.part_bytes() == _full_scan_bytes(root)


def test_held_bytes_stats_only_files_it_has_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _dataset_dir(tmp_path / "cache", shards=64)
    for i in range(60):
        _put(d, f"shards/{i:06d}.tar", 1000 + i)
    first = d.held_bytes()
    stats: list[str] = []
    real_stat = os.stat

    def counted(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        stats.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(layout.os, "stat", counted)
    assert d.held_bytes() == first and stats == []
    _put(d, "shards/000060.tar", 1060)
    stats.clear()
    assert d.held_bytes() == first + 1060
    assert [Path(p).name for p in stats] == ["000060.tar"]

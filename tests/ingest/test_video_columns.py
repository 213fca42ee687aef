"""Per-video metadata in the shard table (``videos`` column): written by ``flashfeed index``
for tars with video members and by ingest (a folder of videos, video members of existing
tars), each entry equal to a PyAV decode of the same video; unreadable or empty videos are
counted skips at ingest, null entries when adopting; bad columns are named."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from flashfeed.cli import main
from flashfeed.dataset import Dataset
from flashfeed.errors import ManifestError
from flashfeed.format.shardtable import ShardTable
from flashfeed.format.videocolumns import VIDEO_TYPE
from flashfeed.shardio import shard_name, write_tar_shard

from support.videos import encode, reference_probe

pytest.importorskip("av")


def _recorded(prefix: str) -> dict[str, dict | None]:
    """Every sample's ``videos`` entry by ``<key>``, read back from the committed table."""
    ds = Dataset.open(prefix)
    table = ds.manifest.table
    assert table.has_videos
    out = {}
    for i, info in enumerate(ds.shards):
        rows = np.arange(info.samples)
        entries = table.videos(np.full(len(rows), i), rows)
        for e, (key, _) in zip(entries, ds.iter_shard(info), strict=True):
            out[key] = e
    return out


def _members(prefix: str, ext: str) -> dict[str, bytes]:
    ds = Dataset.open(prefix)
    return {k: m[ext] for info in ds.shards for k, m in ds.iter_shard(info) if ext in m}


def test_index_records_each_video_as_a_pyav_decode_finds_it(tmp_path):
    prefix = str(tmp_path / "ds")
    vp9 = [encode(9 + 4 * i, seed=i) for i in range(3)]
    h264 = encode(11, codec="libx264", fmt="mp4", fps=25)
    mjpeg = encode(6, codec="mjpeg", fmt="avi", fps=5)
    write_tar_shard(prefix, shard_name(0, "tar"), [
        ("a0", {"webm": vp9[0], "txt": b"walk"}),
        ("a1", {"mp4": h264, "txt": b"run"}),
        ("a2", {"txt": b"no video here"}),
        ("a3", {"webm": vp9[1][:150], "txt": b"truncated"}),
    ])  # fmt: skip
    write_tar_shard(prefix, shard_name(1, "tar"), [
        ("b0", {"avi": mjpeg}), ("b1", {"webm": vp9[2]}),
    ])  # fmt: skip
    write_tar_shard(prefix, shard_name(2, "tar"), [("c0", {"txt": b"text only"})])
    assert main(["index", prefix]) == 0
    got = _recorded(prefix)
    want = {"a0": vp9[0], "a1": h264, "b0": mjpeg, "b1": vp9[2]}
    for key, data in want.items():
        assert got[key] == reference_probe(data), key
    assert [got[k]["codec"] for k in ("a0", "a1", "b0")] == ["vp9", "h264", "mjpeg"]
    assert got["a2"] is None and got["a3"] is None  # no video; unreadable: not recorded
    table = Dataset.open(prefix).manifest.table
    assert table.videos(np.array([2]), np.array([0])) == [None]  # a shard without videos
    # the column round-trips through the IPC file and stays out of the digest
    again = ShardTable.read_ipc(table.to_ipc(), source="t")
    assert again.videos(np.array([0, 1]), np.array([1, 0])) == [got["a1"], got["b0"]]
    plain = ShardTable.from_arrow(table.to_arrow().drop_columns(["videos"]), source="old")
    assert not plain.has_videos and plain.digest == table.digest == again.digest
    assert plain.videos(np.array([0]), np.array([0])) == [None]


def test_bad_video_columns_are_named():
    table = ShardTable.from_columns(
        path=["a.tar"], samples=[2], bytes=[10], checksum=["xxh3_128:00"]
    ).to_arrow()
    entry = {"codec": "vp9", "frames": 3, "fps": 10.0, "duration": 0.3, "width": 8,
             "height": 8, "bytes": 100}  # fmt: skip
    three = pa.array([[entry, entry, entry]], VIDEO_TYPE)
    with pytest.raises(ManifestError, match=r"'videos', row 0: 3 entries for 2 samples"):
        ShardTable.from_arrow(table.append_column("videos", three), source="t")
    negative = pa.array([[entry, {**entry, "frames": -1}]], VIDEO_TYPE)
    with pytest.raises(ManifestError, match=r"'videos' holds a negative frames"):
        ShardTable.from_arrow(table.append_column("videos", negative), source="t")
    wrong = pa.array([[1, 2]], pa.list_(pa.int32()))
    with pytest.raises(ManifestError, match=r"'videos' must be of type"):
        ShardTable.from_arrow(table.append_column("videos", wrong), source="t")
    ok = ShardTable.from_arrow(
        table.append_column("videos", pa.array([[entry, None]], VIDEO_TYPE)), source="t"
    )
    assert ok.videos(np.array([0, 0]), np.array([0, 1])) == [entry, None]


def test_a_folder_of_videos_ingests_with_probes_in_the_shard_table(tmp_path, ray_session):
    from flashfeed.ingest import IngestConfig, run

    src = tmp_path / "src"
    src.mkdir()
    for i, n in enumerate([12, 15, 18]):
        (src / f"clip{i}.webm").write_bytes(encode(n, seed=i))
    (src / "h.mp4").write_bytes(encode(10, codec="libx264", fmt="mp4"))
    (src / "broken.webm").write_bytes(encode(12)[:200])
    out = str(tmp_path / "out")
    result = run(
        IngestConfig(source=str(src), dest=out, samples_per_shard=2, progress="none")
    )  # fmt: skip
    assert result.manifest.skipped == {"undecodable_video": 1}
    got = _recorded(out)
    videos = {**_members(out, "webm"), **_members(out, "mp4")}
    assert len(got) == len(videos) == 4
    for key, data in videos.items():
        assert got[key] == reference_probe(data), key


def test_video_members_of_existing_tars_ingest_and_bad_ones_are_counted(tmp_path, ray_session):
    from flashfeed.ingest import IngestConfig, run

    src = str(tmp_path / "tars")
    good = [encode(8 + 3 * i, seed=i) for i in range(4)]
    write_tar_shard(src, "part-0.tar", [
        ("k0", {"webm": good[0], "txt": b"zero"}),
        ("k1", {"webm": good[1][:120], "txt": b"truncated"}),
        ("k2", {"mp4": encode(9, codec="libx264", fmt="mp4"), "txt": b"h264"}),
    ])  # fmt: skip
    write_tar_shard(src, "part-1.tar", [
        ("k3", {"webm": good[2], "txt": b"three"}),
        ("k4", {"webm": b"", "txt": b"zero-length"}),
        ("k5", {"webm": b"not a video at all", "txt": b"garbage"}),
        ("k6", {"webm": good[3], "txt": b"six"}),
    ])  # fmt: skip
    out = str(tmp_path / "out")
    result = run(
        IngestConfig(source=src, dest=out, samples_per_shard=2, progress="none")
    )  # fmt: skip
    m = result.manifest
    assert m.source["format"] == "webdataset"
    assert m.skipped == {"undecodable_video": 3}  # truncated, zero-length, garbage
    assert m.num_samples == 4
    rejects = [json.loads(r) for r in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sorted((r["reason"], r["source"].rsplit(":", 1)[-1]) for r in rejects) == [
        ("undecodable_video", k) for k in ("k1", "k4", "k5")
    ]
    details = " ".join(r["detail"] for r in rejects)
    assert "the video is empty (0 bytes)" in details and "not a readable video" in details
    ds = Dataset.open(out)
    captions = sorted(mm["txt"] for info in ds.shards for _, mm in ds.iter_shard(info))
    assert captions == [b"h264", b"six", b"three", b"zero"]
    got = _recorded(out)
    videos = {**_members(out, "webm"), **_members(out, "mp4")}
    assert len(got) == len(videos) == 4
    for key, data in videos.items():
        assert got[key] == reference_probe(data), key

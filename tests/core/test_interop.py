"""Interop both ways: flashfeed shards read by webdataset, GNU tar and DALI (with our .idx);
shards written by webdataset, GNU tar, Ray and the webdataset test data adopted by
``flashfeed index`` and read back exactly."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from flashfeed import Dataset, TarShardReader, storage
from flashfeed.cli import main
from flashfeed.shardio import shard_name, write_tar_shard

REAL_TARS = ("compressed.tar", "mpdata.tar", "tendata.tar", "testgz.tar")


def samples(n: int, start: int = 0) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (f"s{i:05d}", {"jpg": bytes([i % 251]) * (700 + 131 * i), "cls": b"%d" % (i % 5)})
        for i in range(start, start + n)
    ]


@pytest.fixture
def flashfeed_shards(tmp_path: Path) -> list[Path]:
    prefix = str(tmp_path / "ff")
    for i in range(2):
        write_tar_shard(prefix, shard_name(i, "tar"), samples(6, start=6 * i))
    return [tmp_path / "ff" / shard_name(i, "tar") for i in range(2)]


def tar_members(path: Path) -> list[tuple[str, bytes]]:
    """Reference reading of a tar with the standard library: regular members in order."""
    with tarfile.open(path) as tar:
        return [
            (m.name, tar.extractfile(m).read())  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isreg()
        ]


def grouped(members: list[tuple[str, bytes]]) -> list[tuple[str, dict[str, bytes]]]:
    out: list[tuple[str, dict[str, bytes]]] = []
    for name, data in members:
        base = name.rsplit("/", 1)[-1]
        key = name[: len(name) - len(base)] + base.split(".", 1)[0]
        ext = base.split(".", 1)[1]
        if out and out[-1][0] == key:
            out[-1][1][ext] = data
        else:
            out.append((key, {ext: data}))
    return out


def dali_read(tars: list[Path], exts: list[str]) -> list[tuple[bytes, ...]]:
    """Every sample, in order, through DALI's webdataset reader on CPU with our .idx files."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():  # type: ignore[no-untyped-def]
        out = fn.readers.webdataset(
            paths=[str(t) for t in tars],
            index_paths=[str(t) + ".idx" for t in tars],
            ext=exts,
            missing_component_behavior="error",
            name="reader",
        )
        return tuple(out) if isinstance(out, list | tuple) else (out,)

    p = pipe()
    p.build()
    total = p.epoch_size("reader")
    rows: list[tuple[bytes, ...]] = []
    while len(rows) < total:
        outs = p.run()
        for i in range(len(outs[0])):
            rows.append(tuple(np.array(o[i]).tobytes() for o in outs))
    return rows[:total]


# --- flashfeed shards, other readers -------------------------------------------------------


def test_webdataset_library_reads_flashfeed_shards(flashfeed_shards: list[Path]) -> None:
    import webdataset as wds

    got = [
        (s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")})
        for s in wds.WebDataset([str(p) for p in flashfeed_shards], shardshuffle=False)
    ]
    assert got == samples(12)


def test_gnu_tar_lists_and_extracts_flashfeed_shards(
    flashfeed_shards: list[Path], tmp_path: Path
) -> None:
    shard = flashfeed_shards[0]
    listing = subprocess.run(
        ["tar", "--numeric-owner", "--full-time", "-tvf", str(shard)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert len(listing) == 12
    for line in listing:
        mode, owner, _size, date, _time, _name = line.split()
        assert (mode, owner, date) == ("-rw-r--r--", "0/0", "2000-01-01")
    out = tmp_path / "extracted"
    out.mkdir()
    subprocess.run(["tar", "-xf", str(shard), "-C", str(out)], check=True)
    for key, fields in samples(6):
        for ext, data in fields.items():
            assert (out / f"{key}.{ext}").read_bytes() == data


def test_dali_reads_flashfeed_shards_with_our_index(flashfeed_shards: list[Path]) -> None:
    rows = dali_read(flashfeed_shards, ["jpg", "cls"])
    assert rows == [(f["jpg"], f["cls"]) for _, f in samples(12)]


def test_our_index_equals_the_one_dali_tools_build(
    flashfeed_shards: list[Path], tmp_path: Path
) -> None:
    wds2idx = shutil.which("wds2idx") or str(Path(sys.executable).parent / "wds2idx")
    theirs = tmp_path / "theirs.idx"
    subprocess.run(
        [wds2idx, str(flashfeed_shards[1]), str(theirs)], check=True, capture_output=True
    )
    assert (flashfeed_shards[1].parent / "000001.tar.idx").read_text() == theirs.read_text()


# --- other writers, flashfeed index ---------------------------------------------------------


def index(prefix: str) -> Dataset:
    assert main(["index", prefix]) == 0
    return Dataset.open(prefix)


def assert_reads_like(ds: Dataset, expected: list[tuple[str, dict[str, bytes]]]) -> None:
    assert list(ds) == expected
    assert len(ds) == len(expected)
    for info in ds.shards:
        stored = list(ds.iter_shard(info))
        picks = sorted({0, len(stored) - 1, *range(0, len(stored), 37)})
        with TarShardReader(ds.shard_url(info), ds.read_index(info)) as r:
            assert len(r) == len(stored)
            assert [r[i] for i in picks] == [stored[i] for i in picks]


def test_index_adopts_webdataset_shardwriter_output(tmp_path: Path) -> None:
    import webdataset as wds

    out = tmp_path / "wds"
    out.mkdir()
    with wds.ShardWriter(str(out / "part-%04d.tar"), maxcount=5, verbose=0) as w:
        for key, fields in samples(12):
            w.write({"__key__": key, **fields})
    ds = index(str(out))
    assert [s.path for s in ds.shards] == ["part-0000.tar", "part-0001.tar", "part-0002.tar"]
    assert ds.manifest.schema == {"cls": "text/plain", "jpg": "image/jpeg"}
    assert_reads_like(ds, samples(12))
    rows = dali_read([out / s.path for s in ds.shards], ["jpg", "cls"])
    assert rows == [(f["jpg"], f["cls"]) for _, f in samples(12)]


def test_index_adopts_gnu_tar_output_with_folders(tmp_path: Path) -> None:
    src = tmp_path / "src"
    expected = []
    for i in range(4):
        d = src / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i}.jpg").write_bytes(b"J" * (100 + i))
        (d / f"img{i}.txt").write_bytes(b"caption %d" % i)
    for key in sorted(f"class{i % 2}/img{i}" for i in range(4)):
        i = int(key[-1])
        expected.append((key, {"jpg": b"J" * (100 + i), "txt": b"caption %d" % i}))
    out = tmp_path / "gnu"
    out.mkdir()
    subprocess.run(
        ["tar", "--sort=name", "-cf", str(out / "data.tar"), "-C", str(src), "."], check=True
    )
    ds = index(str(out))
    assert ds.manifest.schema == {"jpg": "image/jpeg", "txt": "text/plain"}
    assert_reads_like(ds, expected)


def test_index_adopts_ray_write_webdataset_output(ray_session: None, tmp_path: Path) -> None:
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = [{"__key__": k, **f} for k, f in samples(20)]
    out = tmp_path / "ray"
    ray.data.from_items(rows).write_webdataset(str(out), encoder=None, min_rows_per_file=10)
    ds = index(str(out))
    assert ds.manifest.num_samples == 20
    assert sorted(ds, key=lambda s: s[0]) == samples(20)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_realdata_tars_index_and_read_correctly(
    realdata: Path, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    src = realdata / "webdataset-testdata"
    prefix = str(tmp_path / "real") if backend == "local" else request.getfixturevalue("s3_prefix")
    for name in REAL_TARS:
        storage.put_file(str(src / name), storage.join(prefix, "shards", name))
    ds = index(prefix)
    assert [s.path for s in ds.shards] == [f"shards/{n}" for n in REAL_TARS]
    assert [s.samples for s in ds.shards] == [3, 100, 100, 1000]
    assert ds.manifest.schema == {
        "mp": "application/msgpack",
        "ten": "application/x-webdataset-tensor",
        "txt.gz": "application/gzip",
    }
    expected = [s for n in REAL_TARS for s in grouped(tar_members(src / n))]
    assert_reads_like(ds, expected)
    assert main(["verify", prefix, "--no-progress"]) == 0


def test_webdataset_library_agrees_on_realdata_after_index(realdata: Path, tmp_path: Path) -> None:
    import webdataset as wds

    src = realdata / "webdataset-testdata"
    shutil.copy(src / "mpdata.tar", tmp_path / "mpdata.tar")
    (tmp_path / "mpdata.tar").chmod(0o644)
    ds = index(str(tmp_path))
    theirs = [
        (s["__key__"], {"mp": s["mp"]})
        for s in wds.WebDataset(str(tmp_path / "mpdata.tar"), shardshuffle=False)
    ]
    assert list(ds) == theirs
    assert dali_read([tmp_path / "mpdata.tar"], ["mp"]) == [(f["mp"],) for _, f in theirs]


def test_compressed_realdata_gets_the_reshard_message(
    realdata: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(realdata / "webdataset-testdata" / "sample.tgz", tmp_path / "sample.tgz")
    assert main(["index", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "sample.tgz" in err
    assert "uncompressed tars only" in err
    assert "flashfeed ingest" in err and "--source-format webdataset" in err
    assert not (tmp_path / "manifest.json").exists()
    # the same bytes under a .tar name are caught by their gzip magic
    (tmp_path / "sample.tgz").rename(tmp_path / "renamed.tar")
    assert main(["index", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "renamed.tar is gzip-compressed" in err and "--source-format webdataset" in err
    assert not list(tmp_path.glob("*.idx"))


def test_index_handles_gnu_headers_and_empty_members(tmp_path: Path) -> None:
    """Streamed reading and indexed random access agree on a GNU-format tar holding an empty
    member (the offset of zero-size data is still valid)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in [("a.jpg", b"x" * 513), ("a.txt", b""), ("b.jpg", b"y")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "x.tar").write_bytes(buf.getvalue())
    ds = index(str(tmp_path))
    assert_reads_like(ds, [("a", {"jpg": b"x" * 513, "txt": b""}), ("b", {"jpg": b"y"})])


def test_index_adopts_pax_tars_with_long_and_unicode_names(tmp_path: Path) -> None:
    """Python's default tar format (PAX, as webdataset's TarWriter writes): extended headers
    for names over 100 bytes and non-ASCII names read and index like plain ones."""
    long_dir = "d" * 150
    expected = [
        (f"{long_dir}/k1", {"jpg": b"abc"}),
        ("ünï/k2", {"jpg": b"de"}),
        ("k3", {"txt": b"f"}),
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for key, fields in expected:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                info.pax_headers = {"comment": "written by another tool"}
                tar.addfile(info, io.BytesIO(data))
    (tmp_path / "pax.tar").write_bytes(buf.getvalue())
    ds = index(str(tmp_path))
    assert_reads_like(ds, expected)

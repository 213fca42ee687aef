"""Every source format end to end, on the real S3 server with the session's real Ray."""

from __future__ import annotations

import csv
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flashfeed import Dataset, storage
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import jpeg_bytes, make_imagefolder
from flashfeed.ingest.sources.tfrecord_format import encode_example, frame_record

pytestmark = pytest.mark.usefixtures("ray_session")


def _samples(url: str) -> dict[str, dict]:
    ds = Dataset.open(url)
    return {k: v for k, v in ds}


def _upload_tree(local: Path, url: str) -> None:
    for p in sorted(local.rglob("*")):
        if p.is_file():
            storage.put_file(str(p), storage.join(url, str(p.relative_to(local))))


@pytest.mark.parametrize("fmt", ["webdataset", "arrow"])
def test_imagefolder_from_s3_into_both_formats(tmp_path: Path, s3_prefix: str, fmt: str) -> None:
    make_imagefolder(tmp_path / "src", classes=3, per_class=5)
    _upload_tree(tmp_path / "src", f"{s3_prefix}/src")
    result = run(
        IngestConfig(
            source=f"{s3_prefix}/src",
            dest=f"{s3_prefix}/ds",
            format=fmt,
            samples_per_shard=4,
            validate=True,
            progress="none",
        )
    )
    ds = Dataset.open(f"{s3_prefix}/ds")
    assert ds.manifest.classes == ("class_00", "class_01", "class_02")
    assert ds.manifest.num_samples == 15 and len(ds.shards) == 4
    assert result.to_dict()["samples"] == 15
    originals = {p.read_bytes(): p.parent.name for p in (tmp_path / "src").rglob("*.jpg")}
    for _, fields in ds:
        label = int(fields["cls"]) if fmt == "arrow" else int(fields["cls"].decode())
        assert ds.manifest.classes[label] == originals[fields["jpg"]]
    # a class-sorted source does not give class-sorted shards
    first = [int(f["cls"]) for _, f in ds.iter_shard(0)]
    assert len(set(first)) > 1


def test_jsonl_on_s3_with_relative_media_and_url_references(tmp_path: Path, s3_prefix: str) -> None:
    rng = np.random.default_rng(3)
    imgs = [jpeg_bytes(rng) for _ in range(4)]
    for i, b in enumerate(imgs):
        storage.write_bytes(f"{s3_prefix}/src/media/{i}.jpg", b)
    rows = [{"image": f"media/{i}.jpg", "caption": f" photo {i} ", "label": i} for i in range(3)]
    rows.append({"image": f"{s3_prefix}/src/media/3.jpg", "caption": "full url", "label": 3})
    storage.write_bytes(
        f"{s3_prefix}/src/rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()
    )
    run(
        IngestConfig(
            source=f"{s3_prefix}/src/rows.jsonl",
            dest=f"{s3_prefix}/ds",
            samples_per_shard=3,
            progress="none",
        )
    )
    got = sorted(_samples(f"{s3_prefix}/ds").values(), key=lambda f: int(f["cls"]))
    assert [f["jpg"] for f in got] == imgs
    assert [f["txt"] for f in got] == [b"photo 0", b"photo 1", b"photo 2", b"full url"]


def test_csv_with_field_mapping_into_arrow(tmp_path: Path, s3_prefix: str) -> None:
    rng = np.random.default_rng(4)
    (tmp_path / "img").mkdir()
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file", "words", "klass"])
        for i in range(6):
            (tmp_path / "img" / f"{i}.jpg").write_bytes(jpeg_bytes(rng))
            w.writerow([f"img/{i}.jpg", f"caption {i}", i % 2])
    run(
        IngestConfig(
            source=str(tmp_path / "t.csv"),
            dest=s3_prefix,
            format="arrow",
            fields={"jpg": "file", "txt": "words", "cls": "klass"},
            samples_per_shard=4,
            progress="none",
        )
    )
    ds = Dataset.open(s3_prefix)
    assert ds.manifest.schema == {
        "__key__": "string",
        "cls": "int64",
        "jpg": "binary",
        "txt": "string",
    }
    rows = sorted((f for _, f in ds), key=lambda f: f["txt"])
    assert [r["cls"] for r in rows] == [0, 1, 0, 1, 0, 1]
    assert rows[2]["jpg"] == (tmp_path / "img" / "2.jpg").read_bytes()


def test_parquet_with_inline_bytes_into_webdataset(tmp_path: Path, s3_prefix: str) -> None:
    rng = np.random.default_rng(5)
    imgs = [jpeg_bytes(rng) for _ in range(5)]
    pq.write_table(
        pa.table(
            {"image": imgs, "text": [f"t{i}" for i in range(5)], "score": [i / 2 for i in range(5)]}
        ),
        tmp_path / "d.parquet",
    )
    run(IngestConfig(source=str(tmp_path / "d.parquet"), dest=s3_prefix, progress="none"))
    got = _samples(s3_prefix)
    assert sorted(f["jpg"] for f in got.values()) == sorted(imgs)
    assert sorted(float(f["score"]) for f in got.values()) == [0.0, 0.5, 1.0, 1.5, 2.0]


def _tar(samples: list[tuple[str, dict[str, bytes]]], *, gz: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_webdataset_tgz_and_tar_reshard(tmp_path: Path, s3_prefix: str) -> None:
    rng = np.random.default_rng(6)
    a = [(f"a/s{i}", {"jpg": jpeg_bytes(rng), "cls": str(i).encode()}) for i in range(5)]
    b = [(f"b/s{i}", {"jpg": jpeg_bytes(rng), "txt": f"text {i}".encode()}) for i in range(4)]
    storage.write_bytes(f"{s3_prefix}/src/000.tgz", _tar(a, gz=True))
    storage.write_bytes(f"{s3_prefix}/src/001.tar", _tar(b, gz=False))
    run(
        IngestConfig(
            source=f"{s3_prefix}/src", dest=f"{s3_prefix}/ds", samples_per_shard=4, progress="none"
        )
    )
    got = list(_samples(f"{s3_prefix}/ds").values())
    assert len(got) == 9
    assert sorted(f["jpg"] for f in got) == sorted(f["jpg"] for _, f in a + b)
    assert sorted(f["txt"] for f in got if "txt" in f) == [f"text {i}".encode() for i in range(4)]


@pytest.mark.parametrize("fmt", ["webdataset", "arrow"])
def test_tfrecord_examples(tmp_path: Path, s3_prefix: str, fmt: str) -> None:
    rng = np.random.default_rng(7)
    imgs = [jpeg_bytes(rng) for _ in range(6)]
    blob = b"".join(
        frame_record(
            encode_example(
                {"image/encoded": im, "image/class/label": i, "text": f"cap {i}".encode()}
            )
        )
        for i, im in enumerate(imgs)
    )
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train-0.tfrecord").write_bytes(blob)
    run(
        IngestConfig(
            source=str(tmp_path / "src"),
            dest=s3_prefix,
            format=fmt,
            samples_per_shard=4,
            progress="none",
        )
    )
    ds = Dataset.open(s3_prefix)
    rows = sorted((f for _, f in ds), key=lambda f: int(f["cls"]))
    assert [r["jpg"] for r in rows] == imgs
    text = [r["txt"] if fmt == "arrow" else r["txt"].decode() for r in rows]
    assert text == [f"cap {i}" for i in range(6)]


def test_lmdb_raw_values(tmp_path: Path, s3_prefix: str) -> None:
    import lmdb

    rng = np.random.default_rng(8)
    imgs = [jpeg_bytes(rng) for _ in range(5)]
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, im in enumerate(imgs):
            txn.put(f"k{i}".encode(), im)
    env.close()
    run(
        IngestConfig(
            source=str(tmp_path / "db"), dest=s3_prefix, samples_per_shard=2, progress="none"
        )
    )
    ds = Dataset.open(s3_prefix)
    assert ds.manifest.source["format"] == "lmdb" and len(ds.shards) == 3
    assert sorted(f["jpg"] for _, f in ds) == sorted(imgs)


def test_real_tgz_shard_from_others_becomes_loadable(
    tmp_path: Path, s3_prefix: str, realdata: Path
) -> None:
    tgz = realdata / "webdataset-testdata" / "sample.tgz"
    storage.put_file(str(tgz), f"{s3_prefix}/src/sample.tgz")
    with tarfile.open(tgz) as tar:
        pngs = sorted(
            tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.name.endswith(".png")
        )
    result = run(
        IngestConfig(
            source=f"{s3_prefix}/src",
            dest=f"{s3_prefix}/ds",
            validate=True,
            samples_per_shard=40,
            progress="none",
        )
    )
    assert result.manifest.skipped == {}
    ds = Dataset.open(f"{s3_prefix}/ds")
    assert ds.manifest.num_samples == len(pngs) == 90 and len(ds.shards) == 3
    assert ds.manifest.schema == {"cls": "int", "png": "image/png"}
    assert sorted(f["png"] for _, f in ds) == pngs
    assert ds.read_index(0)  # every shard has its DALI index


@pytest.mark.parametrize("kind", ["images", "videos"])
def test_detected_folder_source_is_walked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Format detection lists the source; a folder format then scans that listing (one walk
    of a bucket of a million images, not two), with the scan an explicit format gives."""
    from flashfeed.ingest.sources import StorageContext, base, scan_source

    if kind == "images":
        src, fmt = make_imagefolder(tmp_path / "src", classes=3, per_class=4), "imagefolder"
    else:
        src, fmt = tmp_path / "src", "videofolder"
        for i in range(3):
            (src / f"d{i}").mkdir(parents=True)
            (src / f"d{i}" / f"clip{i}.webm").write_bytes(b"\x1a\x45\xdf\xa3" + bytes(i + 1))
    ctx = StorageContext.resolve(None)
    walks: list[str] = []
    real = base.list_sized

    def counted(url: str, c: StorageContext) -> list[tuple[str, int]]:
        walks.append(url)
        return real(url, c)

    for module in (base, sys.modules[f"flashfeed.ingest.sources.{fmt}"]):
        monkeypatch.setattr(module, "list_sized", counted)
    monkeypatch.setattr(sys.modules["flashfeed.ingest.sources.format"], "list_sized", counted)
    detected = scan_source(str(src), "auto", ctx)
    assert walks == [str(src)] and detected.format == fmt
    explicit = scan_source(str(src), fmt, ctx)
    assert len(walks) == 2
    assert detected.items == explicit.items and detected.fields == explicit.fields
    assert len(detected.items) == (12 if kind == "images" else 3)

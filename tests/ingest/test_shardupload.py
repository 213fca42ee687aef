"""A shard uploaded while it is written: parts go out as the tar grows, the object appears
whole at commit or not at all, and an ingest that streams its shards writes the same bytes
as one that builds each shard whole."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from flashfeed import storage
from flashfeed.errors import StorageError
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.shardupload import MIN_PART_BYTES, ShardUpload, part_bytes_for
from flashfeed.ingest.transforms import TransformOptions, transform_record
from flashfeed.media import image_size
from flashfeed.shardio import tar_shard_bytes
from flashfeed.store import EmbeddedStore
from flashfeed.wdsindex import parse_index


def _pending_uploads(url: str) -> list[str]:
    fs, path = storage.filesystem(url)
    bucket, key, _ = fs.split_path(path)
    found = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)
    return [u["Key"] for u in found.get("Uploads", [])]


def _write_in_pieces(sink: ShardUpload, data: bytes, piece: int = 64 << 10) -> None:
    for i in range(0, len(data), piece):
        sink.write(data[i : i + piece])


def test_parts_appear_whole_only_at_commit(s3_prefix: str) -> None:
    data = os.urandom(2 * MIN_PART_BYTES + 12345)  # two full parts and a short last one
    url = f"{s3_prefix}/big.tar"
    sink = ShardUpload(url, part_bytes=MIN_PART_BYTES)
    _write_in_pieces(sink, data)
    assert sink.tell() == len(data)
    assert not storage.exists(url)  # parts sent, nothing visible
    assert _pending_uploads(url) == [url.split("/", 3)[3]]
    sink.commit()
    assert storage.read_bytes(url) == data
    assert sink.nbytes == len(data) and sink.checksum() == storage.checksum(data)
    assert _pending_uploads(url) == []


def test_a_shard_under_one_part_is_one_put(s3_prefix: str) -> None:
    data = os.urandom(1000)
    url = f"{s3_prefix}/small.tar"
    sink = ShardUpload(url, part_bytes=MIN_PART_BYTES)
    sink.write(data)
    assert _pending_uploads(url) == []  # nothing started before commit
    sink.commit()
    assert storage.read_bytes(url) == data and sink.checksum() == storage.checksum(data)
    with pytest.raises(ValueError, match="already committed"):
        sink.commit()


def test_abort_leaves_nothing(s3_prefix: str, tmp_path: Path) -> None:
    url = f"{s3_prefix}/dropped.tar"
    sink = ShardUpload(url, part_bytes=MIN_PART_BYTES)
    _write_in_pieces(sink, os.urandom(MIN_PART_BYTES + 10))
    sink.abort()
    sink.abort()  # twice is harmless
    assert not storage.exists(url) and _pending_uploads(url) == []
    local = str(tmp_path / "d" / "x.tar")
    sink = ShardUpload(local, part_bytes=MIN_PART_BYTES)
    _write_in_pieces(sink, os.urandom(MIN_PART_BYTES + 10))
    sink.abort()
    assert not os.path.exists(local)
    with pytest.raises(ValueError, match="after commit or abort"):
        sink.write(b"more")


def test_local_destination_is_written_whole(tmp_path: Path) -> None:
    data = os.urandom(MIN_PART_BYTES + 99)
    local = str(tmp_path / "d" / "x.tar")
    sink = ShardUpload(local, part_bytes=MIN_PART_BYTES)
    _write_in_pieces(sink, data)
    assert not os.path.exists(local)
    sink.commit()
    assert Path(local).read_bytes() == data and sink.checksum() == storage.checksum(data)


def test_a_failed_part_upload_surfaces(s3_store: EmbeddedStore) -> None:
    """The upload thread's error reaches the writer (at its next write or at commit), and
    abort after it has nothing to undo."""
    opts = {**s3_store.info.storage_options(), "endpoint_url": "http://127.0.0.1:9"}
    sink = ShardUpload("s3://flashfeed/x.tar", storage_options=opts, part_bytes=MIN_PART_BYTES)
    with pytest.raises(StorageError, match="upload"):
        _write_in_pieces(sink, os.urandom(3 * MIN_PART_BYTES))
        sink.commit()
    sink.abort()


def test_part_size_follows_the_shard_within_s3_limits() -> None:
    assert part_bytes_for(0) == MIN_PART_BYTES
    assert part_bytes_for(400 << 20) == 50 << 20
    assert part_bytes_for(10 << 30) == 64 << 20
    with pytest.raises(ValueError, match="-1"):
        part_bytes_for(-1)
    with pytest.raises(ValueError, match="part_bytes"):
        ShardUpload("s3://b/k", part_bytes=0)


def _jpeg(w: int, h: int, seed: int) -> bytes:
    img = Image.frombytes("RGB", (w, h), os.urandom(w * h * 3) if seed else bytes(w * h * 3))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=95)
    return out.getvalue()


def test_transform_reports_the_sizes_it_found() -> None:
    data = _jpeg(64, 40, 1)
    kinds = {"jpg": "image", "cls": "int"}
    sizes: dict[str, tuple[int, int]] = {}
    out = transform_record(
        {"jpg": data, "cls": 1}, kinds, TransformOptions(validate=True), sizes=sizes
    )
    assert sizes == {"jpg": image_size(out["jpg"])} == {"jpg": (64, 40)}
    sizes = {}
    opts = TransformOptions(max_image_side=32, jpeg_quality=80)
    out = transform_record({"png": data, "cls": 1}, {"png": "image"}, opts, sizes=sizes)
    assert sizes == {"jpg": image_size(out["jpg"])} == {"jpg": (32, 20)}
    sizes = {}
    transform_record({"jpg": data}, kinds, TransformOptions(), sizes=sizes)
    assert sizes == {}  # not opened: the shard task reads the header itself


@pytest.mark.usefixtures("ray_session")
def test_streamed_shards_match_shards_built_whole(tmp_path: Path, s3_prefix: str) -> None:
    """Shards over one part go out in parts; their bytes, index, sizes and checksums are
    those of the same samples written whole, and a local run writes the same."""
    src = tmp_path / "src"
    per = 200_000
    for c in range(2):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(30):  # 12 MB of incompressible "images": three parts per shard
            (src / f"c{c}" / f"{i:03d}.jpg").write_bytes(os.urandom(per))
    (src / "c0" / "real.jpg").write_bytes(_jpeg(48, 30, 1))
    common = {"source": str(src), "name": "s", "shard_size": "64MB", "progress": "none"}
    on_s3 = run(IngestConfig(dest=f"{s3_prefix}/ds", **common)).manifest  # type: ignore[arg-type]
    local = run(IngestConfig(dest=str(tmp_path / "ds"), **common)).manifest  # type: ignore[arg-type]
    assert on_s3.num_shards == 1
    shard = on_s3.table.info(0)
    assert shard.bytes > 2 * MIN_PART_BYTES
    data = storage.read_bytes(f"{s3_prefix}/ds/{shard.path}")
    assert storage.checksum(data) == shard.checksum == local.table.checksum(0)
    assert data == (tmp_path / "ds" / shard.path).read_bytes()
    # the same samples, written whole by the plain tar writer, in the shard's order
    index = storage.read_bytes(f"{s3_prefix}/ds/{shard.path}.idx").decode()
    keys = [sample.key for sample in parse_index(index)]
    files = sorted(src.glob("*/*.jpg"))
    label = {"c0": b"0", "c1": b"1"}
    by_key = {
        f"{i:09d}": {"cls": label[p.parent.name], "jpg": p.read_bytes()}
        for i, p in enumerate(files)
    }
    whole, whole_index, n = tar_shard_bytes((k, by_key[k]) for k in keys)
    assert data == whole and index == whole_index and n == len(files) == on_s3.num_samples
    # the one real JPEG's size is in the table (from its header), the rest read 0 x 0
    sizes = on_s3.table.image_sizes(np.zeros(n, np.int64), np.arange(n))
    real = keys.index(f"{files.index(src / 'c0' / 'real.jpg'):09d}")
    assert sizes[real].tolist() == [48, 30]
    assert int(sizes.sum()) == 48 + 30

"""Ingest's pure parts: config validation, shard assignment, TFRecord framing, transforms."""

from __future__ import annotations

import io
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from flashfeed.ingest import IngestConfig
from flashfeed.ingest.assign import assign_shards, item_order, size_spread
from flashfeed.ingest.samplecorpus import jpeg_bytes
from flashfeed.ingest.sources.base import Reject
from flashfeed.ingest.sources.tfrecord_format import (
    crc32c,
    encode_example,
    frame_record,
    iter_records,
    parse_example,
)
from flashfeed.ingest.transforms import (
    TransformOptions,
    content_hash,
    output_fields,
    transform_record,
)


def test_config_rejects_bad_values_by_name() -> None:
    with pytest.raises(ValueError, match="shard_size"):
        IngestConfig(source="a", dest="b", shard_size="lots")
    with pytest.raises(ValueError, match="format"):
        IngestConfig(source="a", dest="b", format="zip")
    with pytest.raises(ValueError, match="jpeg_quality"):
        IngestConfig(source="a", dest="b", jpeg_quality=0)
    with pytest.raises(ValueError, match="seq_len go together"):
        IngestConfig(source="a", dest="b", format="arrow", seq_len=8)
    with pytest.raises(ValueError, match="use format='arrow'"):
        IngestConfig(source="a", dest="b", tokenizer="t.json", seq_len=8)
    with pytest.raises(TypeError):
        IngestConfig("a", "b")  # type: ignore[misc]
    cfg = IngestConfig(source="a", dest="b", shard_size="1MiB")
    assert cfg.shard_bytes == 1 << 20
    assert "dest" not in cfg.provenance() and "ray_address" not in cfg.provenance()


def test_assignment_is_seeded_and_sized_within_ten_percent() -> None:
    rng = np.random.default_rng(1)
    sizes = rng.integers(50_000, 150_000, size=2000).tolist()
    target = 4_000_000
    a = assign_shards(sizes, target_bytes=target, seed=7)
    assert a == assign_shards(sizes, target_bytes=target, seed=7)
    assert a != assign_shards(sizes, target_bytes=target, seed=8)
    flat = sorted(p for s in a for p in s)
    assert flat == list(range(2000))
    shard_bytes = [sum(sizes[p] for p in s) for s in a]
    assert size_spread(shard_bytes, target) <= 0.10
    assert shard_bytes[-1] <= target * 1.1


def _assigned_item_by_item(sizes: list[int], target: int, order: list[int]) -> list[list[int]]:
    """The assignment rule, one item at a time: close the shard before an item that would
    take it further past the target than it stands below it, and once it reaches it."""
    shards: list[list[int]] = []
    current: list[int] = []
    total = 0
    for pos in order:
        size = max(0, sizes[pos])
        if current and total + size > target and total + size - target > target - total:
            shards.append(current)
            current, total = [], 0
        current.append(pos)
        total += size
        if total >= target:
            shards.append(current)
            current, total = [], 0
    return [*shards, current] if current else shards


@pytest.mark.parametrize("seed", range(6))
def test_assignment_follows_the_rule_item_by_item(seed: int) -> None:
    """Sizes of every spread, zeros and items larger than the target among them."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    sizes = (rng.lognormal(5, 2, size=n) * rng.integers(0, 2, size=n)).astype(int).tolist()
    sizes[: n // 10] = [0] * (n // 10)
    for target in (1, 50, 300, 10_000, 10**9):
        order = item_order(n, seed=seed, shuffle=True).tolist()
        got = assign_shards(sizes, target_bytes=target, seed=seed)
        assert got == _assigned_item_by_item(sizes, target, order)
    assert assign_shards([], target_bytes=10) == []
    assert assign_shards([5, 5, 5], target_bytes=10, shuffle=False) == [[0, 1], [2]]
    assert assign_shards([4, 9, 4], target_bytes=10, shuffle=False) == [[0, 1], [2]]
    assert assign_shards([8, 7, 1], target_bytes=10, shuffle=False) == [[0], [1, 2]]
    assert assign_shards([30, 1], target_bytes=10, shuffle=False) == [[0], [1]]


def test_assignment_shuffles_a_sorted_source_and_keeps_order_without_shuffle() -> None:
    sizes = [10] * 100
    shuffled = assign_shards(sizes, target_bytes=100, seed=0)
    assert any(s != sorted(s) for s in shuffled)
    ordered = assign_shards(sizes, target_bytes=100, shuffle=False)
    assert ordered[0] == list(range(10))
    fixed = assign_shards(sizes, target_bytes=1, samples_per_shard=30, shuffle=False)
    assert [len(s) for s in fixed] == [30, 30, 30, 10]


def test_crc32c_and_tfrecord_round_trip() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    ex = encode_example({"image/encoded": b"\xff\xd8x", "label": 3, "score": [0.5, 1.5]})
    blob = frame_record(ex) + frame_record(b"\x0a\x00")
    recs = list(iter_records(blob, source="t"))
    assert [ok for _, _, ok in recs] == [True, True]
    start, length, _ = recs[0]
    parsed = parse_example(blob[start : start + length])
    assert parsed["label"] == ("int", [3])
    assert parsed["image/encoded"] == ("bytes", [b"\xff\xd8x"])
    assert parsed["score"] == ("float", [0.5, 1.5])
    corrupt = bytearray(blob)
    corrupt[start + 2] ^= 0xFF
    assert [ok for _, _, ok in iter_records(bytes(corrupt), source="t")] == [False, True]
    with pytest.raises(ValueError, match="length CRC"):
        list(iter_records(b"\x01" + blob[1:], source="f.tfrecord"))


def _bomb_png(w: int, h: int) -> bytes:
    """A PNG header that claims w x h pixels; opening it must not decode anything."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + end
    )


def test_transforms_validate_reencode_and_text() -> None:
    kinds = {"jpg": "image", "png": "image", "txt": "text", "cls": "int"}
    opts = TransformOptions(validate=True, max_pixels=10_000_000)
    good = jpeg_bytes(np.random.default_rng(0), size=(64, 48))
    assert transform_record({"jpg": good, "cls": 1}, kinds, opts)["jpg"] == good
    with pytest.raises(Reject) as r:
        transform_record({"jpg": good[: len(good) // 2]}, kinds, opts)
    assert r.value.reason == "undecodable"
    with pytest.raises(Reject) as r:
        transform_record({"png": _bomb_png(100_000, 100_000)}, kinds, opts)
    assert r.value.reason == "too_many_pixels"
    with pytest.raises(Reject) as r:
        transform_record({"txt": "  \n "}, kinds, opts)
    assert r.value.reason == "empty_text"
    assert transform_record({"txt": " Cafe\u0301 "}, kinds, opts)["txt"] == "Caf\u00e9"
    small = TransformOptions(max_image_side=32, jpeg_quality=80, keep_original_size=True)
    png = io.BytesIO()
    Image.new("RGB", (100, 50), (200, 10, 10)).save(png, format="PNG")
    out = transform_record({"png": png.getvalue()}, kinds, small)
    assert set(out) == {"jpg", "orig_size"} and out["orig_size"] == "100x50"
    assert Image.open(io.BytesIO(out["jpg"])).size == (32, 16)
    assert output_fields(kinds, small) == {
        "cls": "int",
        "jpg": "image",
        "orig_size": "text",
        "txt": "text",
    }


def _full_decode_refuses(data: bytes) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Image.open(io.BytesIO(data)).load()  # every pixel at full size
    except Exception:
        return True
    return False


def test_decode_check_refuses_exactly_what_a_full_decode_refuses() -> None:
    """The check decodes JPEGs at 1/8 scale: on seeded truncations, byte flips and smeared
    runs of a baseline and a progressive JPEG it must agree with a full decode, case by case."""
    rng = np.random.default_rng(7)
    opts = TransformOptions(validate=True)
    base = Image.fromarray(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8))
    sources = []
    for progressive in (False, True):
        buf = io.BytesIO()
        base.save(buf, format="JPEG", quality=85, progressive=progressive)
        sources.append(buf.getvalue())
    refused = agreed = 0
    for good in sources:
        cases = [good[: int(n)] for n in rng.integers(20, len(good), 30)]
        for _ in range(60):
            bad = bytearray(good)
            at = int(rng.integers(0, len(bad) - 40))
            width = 1 if rng.random() < 0.5 else 32
            bad[at : at + width] = rng.integers(0, 256, width, dtype=np.uint8).tobytes()
            cases.append(bytes(bad))
        for data in cases:
            try:
                out = transform_record({"jpg": data}, {"jpg": "image"}, opts)
                ours = False
                assert out["jpg"] == data  # checked, kept byte for byte
            except Reject as r:
                ours = True
                assert r.reason in ("undecodable", "too_many_pixels")
            assert ours == _full_decode_refuses(data), f"disagree on {len(data)} bytes"
            refused += ours
            agreed += 1
    assert agreed == 180 and 30 <= refused < agreed  # both kinds of outcome were exercised


def test_content_hash_ignores_label_only() -> None:
    assert content_hash({"jpg": b"x", "cls": 1}) == content_hash({"jpg": b"x", "cls": 2})
    assert content_hash({"jpg": b"x"}) != content_hash({"jpg": b"y"})


def test_local_source_reads_equal_fsspec_and_fail_the_same(tmp_path) -> None:
    """A whole local file is read without fsspec: the same bytes for a path and a file://
    URL, a vanished file is a counted skip, a directory one clear error naming it."""
    from flashfeed import storage
    from flashfeed.errors import StorageError
    from flashfeed.ingest.sources.base import StorageContext, read, read_listed

    ctx = StorageContext.resolve(None)
    data = bytes(range(256)) * 400 + b"tail"
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    assert read(str(path), ctx) == data == read(f"file://{path}", ctx)
    assert read(str(path), ctx) == storage.read_bytes(str(path))
    assert read(str(path), ctx, start=3, end=9) == data[3:9]
    with pytest.raises(Reject) as gone:
        read_listed(str(tmp_path / "gone.jpg"), ctx)
    assert gone.value.reason == "missing_media"
    with pytest.raises(StorageError, match=r"could not read .*Is a directory"):
        read(str(tmp_path), ctx)

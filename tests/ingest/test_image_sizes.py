"""A shard's image size table takes the sizes the transform found when it opened each image
(decode check, re-encode) instead of parsing the image again, and they are the sizes of the
stored images."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from flashfeed import storage
from flashfeed.format.media import image_size
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.transforms import TransformOptions, transform_record


def _jpeg(w: int, h: int) -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (w, h), os.urandom(w * h * 3)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def test_transform_reports_the_sizes_it_found() -> None:
    data = _jpeg(64, 40)
    kinds = {"jpg": "image", "cls": "int"}
    sizes: dict[str, tuple[int, int]] = {}
    record = {"jpg": data, "cls": 1}
    out = transform_record(record, kinds, TransformOptions(validate=True), sizes=sizes)
    assert sizes == {"jpg": image_size(out["jpg"])} == {"jpg": (64, 40)}
    sizes = {}
    opts = TransformOptions(max_image_side=32, jpeg_quality=80)
    out = transform_record({"png": data, "cls": 1}, {"png": "image"}, opts, sizes=sizes)
    assert sizes == {"jpg": image_size(out["jpg"])} == {"jpg": (32, 20)}
    sizes = {}
    transform_record({"jpg": data}, kinds, TransformOptions(), sizes=sizes)
    assert sizes == {}  # not opened: the shard task reads the header itself


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("opts", [{"validate": True}, {"max_image_side": 24}, {}])
def test_size_table_matches_the_stored_images(
    tmp_path: Path, s3_prefix: str, opts: dict[str, object]
) -> None:
    src = tmp_path / "src"
    shapes = [(40, 30), (31, 57), (64, 16), (20, 20), (50, 45), (17, 33)]
    for i, (w, h) in enumerate(shapes):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"{i}.jpg").write_bytes(_jpeg(w, h))
    dest = f"{s3_prefix}/ds"
    config = IngestConfig(
        source=str(src),
        dest=dest,
        shard_size="16KB",
        progress="none",
        **opts,  # type: ignore[arg-type]
    )
    manifest = run(config).manifest
    table = manifest.table
    assert table.has_image_sizes and len(table) >= 2
    seen = 0
    for s in range(len(table)):
        data = storage.read_bytes(f"{dest}/{table.path(s)}")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            files = [tar.extractfile(m) for m in tar.getmembers() if m.name.endswith(".jpg")]
            images = [f.read() for f in files if f is not None]
        rows = np.arange(len(images))
        got = table.image_sizes(np.full(len(images), s), rows).tolist()
        assert got == [list(image_size(b)) for b in images]
        seen += len(images)
    assert seen == len(shapes)

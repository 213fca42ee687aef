"""Image bytes in Parquet, with a caption column beside them, through the DALI ``Loader``
like tar members: the rows of a dataset indexed in place are its samples."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from flashfeed.format.inplaceindex import index_in_place
from flashfeed.loader import Loader

from support.parquet_corpus import write_parquet_corpus

N = 45


def _jpeg(i: int) -> bytes:
    """A 24x16 image whose colour encodes its row: red = 5 * i."""
    img = Image.new("RGB", (24, 16), (5 * i, 40, 200))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=95)
    return out.getvalue()


@pytest.mark.parametrize("where,py_workers", [("local", 0), ("local", 1), ("s3", 0)])
def test_image_bytes_and_captions_from_parquet(
    tmp_path: Path, where: str, py_workers: int, request: pytest.FixtureRequest
) -> None:
    prefix = str(tmp_path / "pairs")
    cache = {}
    if where == "s3":  # through the node cache: units' byte ranges, fetched as the plan reads
        prefix = request.getfixturevalue("s3_prefix")
        cache = {"cache_dir": str(tmp_path / "cache")}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # HF's Image
    write_parquet_corpus(
        prefix,
        {"image": [{"bytes": _jpeg(i), "path": f"{i}.jpg"} for i in range(N)],
         "caption": [f"caption of image {i}" for i in range(N)], "label": list(range(N))},
        files=3, row_group_size=7, compression="snappy", types={"image": image_type},
    )  # fmt: skip
    index_in_place(prefix)
    fields = {"image": "image", "caption": "caption", "label": "cls"}
    loader = Loader(prefix, batch_size=5, image_size=8, fields=fields, seed=2,
                    py_workers=py_workers, device="cpu", **cache)  # fmt: skip
    seen = []
    for batch in loader:
        assert batch["image"].shape == (5, 3, 8, 8)
        labels = batch["label"].tolist()
        assert batch["caption"] == [f"caption of image {i}" for i in labels]
        red = batch["image"][:, 0].float().mean(dim=(1, 2)).numpy()
        want = (5 * np.array(labels) / 255 - 0.485) / 0.229  # normalised as every image is
        assert np.allclose(red, want, atol=0.05)  # each image is its own row's
        seen += labels
    assert sorted(seen) == list(range(N)) and seen != sorted(seen)

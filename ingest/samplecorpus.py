"""Tiny synthetic corpora (PIL-drawn images, short texts) for tests, demos and examples.
Seeded: the same arguments give the same files."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["jpeg_bytes", "make_imagefolder", "make_text_jsonl"]

_WORDS = (
    "data",
    "flash",
    "shard",
    "tensor",
    "cache",
    "ray",
    "arrow",
    "image",
    "token",
    "batch",
    "epoch",
    "store",
    "object",
    "loader",
    "pixel",
    "model",
)


def jpeg_bytes(
    rng: np.random.Generator, *, size: tuple[int, int] = (48, 32), quality: int = 90
) -> bytes:
    """A small JPEG with a gradient and noise, different for every draw of ``rng``."""
    w, h = size
    base = rng.integers(0, 255, size=3)
    yy, xx = np.mgrid[0:h, 0:w]
    img = (
        base[None, None, :]
        + (xx[..., None] * 3 + yy[..., None] * 2)
        + rng.normal(0, 12, size=(h, w, 3))
    )
    arr = np.clip(img, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(arr, "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def make_imagefolder(
    root: str | os.PathLike[str],
    *,
    classes: int = 3,
    per_class: int = 8,
    seed: int = 0,
    size: tuple[int, int] = (48, 32),
) -> Path:
    """``root/class_XX/img_XXXX.jpg``: ``classes * per_class`` distinct JPEGs."""
    if classes <= 0 or per_class <= 0:
        raise ValueError(f"classes and per_class must be > 0, got {classes}, {per_class}")
    rng = np.random.default_rng(seed)
    root = Path(root)
    for c in range(classes):
        d = root / f"class_{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (d / f"img_{i:04d}.jpg").write_bytes(jpeg_bytes(rng, size=size))
    return root


def make_text_jsonl(path: str | os.PathLike[str], *, rows: int = 50, seed: int = 0) -> Path:
    """A JSONL file of ``{"text": ..., "label": ...}`` rows with varied lengths."""
    if rows <= 0:
        raise ValueError(f"rows must be > 0, got {rows}")
    rng = np.random.default_rng(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(rows):
            n = int(rng.integers(4, 40))
            text = " ".join(_WORDS[j] for j in rng.integers(0, len(_WORDS), size=n))
            f.write(json.dumps({"text": text.capitalize() + ".", "label": i % 5}) + "\n")
    return path

"""A synthetic photo corpus for ``benchmarks/gpu.sh``: JPEGs made with numpy and Pillow (or
torchvision where Pillow is missing), no system packages, written as a flashfeed webdataset
dataset with flashfeed's shard writer."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

__all__ = ["build_jpeg_corpus", "read_jpegs"]


def _encoder() -> Callable[[Any], bytes]:
    try:
        import io

        from PIL import Image

        def pil(a: Any) -> bytes:
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, format="JPEG", quality=90)
            return buf.getvalue()

        return pil
    except ImportError:
        import torch
        from torchvision.io import encode_jpeg

        def tv(a: Any) -> bytes:
            return bytes(
                encode_jpeg(torch.from_numpy(a).permute(2, 0, 1).contiguous(), quality=90).numpy()
            )

        return tv


def _photo(rng: Any, h: int, w: int) -> Any:
    """A photo-like image: smooth colour fields (a coarse random grid blown up bilinearly)
    and fine noise, so JPEGs come out at photo sizes (tens of KB), not noise sizes."""
    import numpy as np

    coarse = rng.integers(0, 256, (h // 32 + 2, w // 32 + 2, 3), dtype=np.uint8)
    try:
        from PIL import Image

        smooth = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BILINEAR))
    except ImportError:
        import torch

        t = torch.from_numpy(coarse).permute(2, 0, 1)[None].float()
        t = torch.nn.functional.interpolate(t, size=(h, w), mode="bilinear", align_corners=False)
        smooth = t[0].permute(1, 2, 0).clamp(0, 255).to(torch.uint8).numpy()
    noise = rng.integers(0, 16, (h, w, 3), dtype=np.uint8)
    return np.minimum(smooth, 239) + noise


def _encode_range(args: tuple[int, int, int, int, int]) -> list[bytes]:
    """JPEGs ``lo..hi`` of the corpus: each image's randomness is seeded by its number, so
    any split over processes gives the same bytes."""
    import numpy as np

    lo, hi, h, w, seed = args
    encode = _encoder()
    out = []
    for n in range(lo, hi):
        rng = np.random.default_rng((seed, n))
        hh, ww = int(h * rng.uniform(0.75, 1.0)), int(w * rng.uniform(0.75, 1.0))
        out.append(encode(_photo(rng, hh, ww)))
    return out


def build_jpeg_corpus(
    prefix: str | Path,
    *,
    images: int,
    per_shard: int = 256,
    size: tuple[int, int] = (375, 500),
    classes: int = 1000,
    seed: int = 0,
    workers: int | None = None,
) -> dict[str, Any]:
    """A committed webdataset dataset of ``images`` synthetic JPEGs (``.jpg`` + ``.cls``) at
    ``prefix``; ``size`` is (height, width), varied by up to a quarter per image; encoded
    by ``workers`` processes (one per CPU by default), one shard each at a time. Returns
    ``{"images", "bytes", "keys"}`` (keys as ``<shard path>/<key>``, for the ledger check)."""
    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import shard_name, write_tar_shard

    h, w = size
    ranges = [(lo, min(lo + per_shard, images), h, w, seed) for lo in range(0, images, per_shard)]
    procs = max(1, min(len(ranges), workers or os.cpu_count() or 1))
    if procs > 1:
        with ProcessPoolExecutor(procs, mp_context=get_context("spawn")) as pool:
            encoded = list(pool.map(_encode_range, ranges))
    else:
        encoded = [_encode_range(r) for r in ranges]
    infos, keys, total = [], [], 0
    for s, ((lo, _, _, _, _), jpgs) in enumerate(zip(ranges, encoded, strict=True)):
        samples = []
        for n, jpg in enumerate(jpgs, start=lo):
            total += len(jpg)
            samples.append((f"img-{n:07d}", {"jpg": jpg, "cls": str(n % classes).encode()}))
        info = write_tar_shard(str(prefix), shard_name(s, "tar"), samples)
        infos.append(info)
        keys += [f"{info.path}/{k}" for k, _ in samples]
    manifest = Manifest(
        name="gpu-bench-photos",
        shard_format="webdataset",
        schema={"jpg": "image/jpeg", "cls": "label"},
        shards=tuple(infos),
    )
    commit_manifest(str(prefix), manifest, overwrite=True)
    return {"images": images, "bytes": total, "keys": keys}


def read_jpegs(prefix: str | Path) -> list[bytes]:
    """Every ``.jpg`` of the dataset's tar shards, in RAM (what the ceiling decodes)."""
    out = []
    for tar in sorted((Path(prefix) / "shards").glob("*.tar")):
        with tarfile.open(tar) as t:
            for m in t:
                if m.name.endswith(".jpg"):
                    f = t.extractfile(m)
                    if f is not None:
                        out.append(f.read())
    return out

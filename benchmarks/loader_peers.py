"""The peers of the loader benchmark, each doing the same work per image: decode,
random-resized crop to 224, flip, normalize, NCHW float32, batches of 64.

Each factory returns an iterable of batches; the benchmark times them side by side.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

__all__ = [
    "dali_decode_ceiling",
    "dali_webdataset_reader",
    "imagefolder_loader",
    "optional_peers",
    "pil_transform",
    "webdataset_loader",
]

MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255


def _crop_box(w: int, h: int, rng: random.Random) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box: area 8-100%, aspect 3/4-4/3, center crop as the fallback."""
    for _ in range(10):
        area = w * h * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            return x, y, x + cw, y + ch
    s = min(w, h)
    return (w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s


def pil_transform(data: bytes, rng: random.Random, size: int = 224) -> torch.Tensor:
    img = Image.open(io.BytesIO(data)).convert("RGB")
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=_crop_box(*img.size, rng))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    arr = (np.asarray(img, np.float32) - MEAN) / STD
    return torch.from_numpy(arr.transpose(2, 0, 1).copy())


class _Transform:
    def __init__(self) -> None:
        self.rng = random.Random()

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        return pil_transform(sample["jpg"], self.rng), int(sample["cls"])


def webdataset_loader(shards: list[str], *, batch_size: int, workers: int) -> DataLoader:
    """webdataset: shard shuffle, a 1000-sample shuffle buffer, PIL in DataLoader workers."""
    import webdataset as wds

    ds = (
        wds.WebDataset(shards, shardshuffle=len(shards), empty_check=False)
        .shuffle(1000)
        .map(_Transform())
    )
    return DataLoader(ds, batch_size=batch_size, num_workers=workers)


class _ImageFolder(Dataset):
    def __init__(self, files: list[tuple[Path, int]]) -> None:
        self.files = files
        self.transform = _Transform()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[i]
        return self.transform({"jpg": path.read_bytes(), "cls": label})


def imagefolder_loader(
    files: list[tuple[Path, int]], *, batch_size: int, workers: int
) -> DataLoader:
    """One file per image, a map-style Dataset with a full random permutation."""
    return DataLoader(_ImageFolder(files), batch_size=batch_size, num_workers=workers, shuffle=True)


def _dali_iter(pipe: Any, batches: int) -> Iterator[Any]:
    """Batches as torch tensors, copied out as flashfeed's Loader and DALI's iterator do."""
    from flashfeed.loader.convert import to_torch

    device = torch.device("cuda", 0) if torch.cuda.is_available() else None
    for _ in range(batches):
        outputs = pipe.run()
        batch = [to_torch(outputs[0], device)]
        if len(outputs) > 1:  # .cls text labels: bytes of varying length, parsed here
            labels = outputs[1]
            batch.append(
                torch.tensor([int(np.array(labels[i]).tobytes()) for i in range(len(labels))])
            )
        yield batch


def dali_webdataset_reader(
    shards: list[str], *, batch_size: int, threads: int, device: str, batches: int
) -> Iterable[Any]:
    """Plain DALI: ``fn.readers.webdataset`` with its shuffle buffer, same operators."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    from flashfeed.loader.pipeline import AugmentOptions, default_image_pipeline

    pipe = Pipeline(
        batch_size=batch_size, num_threads=threads, device_id=0 if device == "gpu" else None
    )
    with pipe:
        jpg, cls = fn.readers.webdataset(
            paths=shards,
            index_paths=[s + ".idx" for s in shards],
            ext=["jpg", "cls"],
            random_shuffle=True,
            initial_fill=1024,
            name="reader",
        )
        out = default_image_pipeline({"image": jpg}, AugmentOptions(device=device))
        pipe.set_outputs(out["image"], cls)
    pipe.build()
    return _dali_iter(pipe, batches)


def dali_decode_ceiling(
    jpegs: list[bytes], *, batch_size: int, threads: int, device: str, batches: int
) -> Iterable[Any]:
    """The same DALI operators fed from bytes already in RAM: the decode ceiling."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    from flashfeed.loader.pipeline import AugmentOptions, default_image_pipeline

    arrays = [np.frombuffer(j, np.uint8) for j in jpegs]

    def source(info: Any) -> list[np.ndarray]:
        start = (info.iteration * batch_size) % max(len(arrays) - batch_size, 1)
        return arrays[start : start + batch_size]

    pipe = Pipeline(
        batch_size=batch_size, num_threads=threads, device_id=0 if device == "gpu" else None
    )
    with pipe:
        raw = fn.external_source(source=source, batch=True, batch_info=True, dtype=types.UINT8)
        out = default_image_pipeline({"image": raw}, AugmentOptions(device=device))
        pipe.set_outputs(out["image"])
    pipe.build()
    return _dali_iter(pipe, batches)


def optional_peers() -> dict[str, str]:
    """litdata and mosaicml-streaming join only if they import here; else why not."""
    out = {}
    for name, module in (("litdata", "litdata"), ("mosaicml-streaming", "streaming")):
        try:
            __import__(module)
            out[name] = "available (not wired: convert the corpus with its writer first)"
        except Exception as exc:
            out[name] = f"skipped: {type(exc).__name__}: {str(exc)[:80]}"
    return out

"""The peers of the loader benchmark, each doing the same work per image: decode,
random-resized crop to 224, flip, normalize, NCHW float32, batches of 64.

Each factory returns an iterable of batches; the benchmark times them side by side. The PIL
peers decode with ``Image.draft`` (JPEG DCT scaling: a crop that is later shrunk to 224 px is
decoded at 1/2, 1/4 or 1/8 scale when that still leaves it at least 224 px), their best
documented setting, as DALI's crop decode reads only the crop region. ``wds+dali`` sends
webdataset's bytes through the same DALI graph as flashfeed's; the decode ceiling is the
Loader's own pipeline (``build_pipeline``: same executor, operators, threads, reader process
and prefetch) fed from bytes in RAM.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

__all__ = [
    "DaliReaderEpochs",
    "RamBatches",
    "dali_decode_ceiling",
    "dali_webdataset_reader",
    "imagefolder_loader",
    "loader_epoch_samples",
    "optional_peers",
    "pil_transform",
    "webdataset_dali",
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
    img = Image.open(io.BytesIO(data))
    w, h = img.size
    box: tuple[float, float, float, float] = _crop_box(w, h, rng)
    scale = min(box[2] - box[0], box[3] - box[1]) / size  # the crop may shrink this much
    if img.format == "JPEG" and scale >= 2:
        # DCT scaling: PIL picks the largest reduction that keeps the image >= the request
        img.draft("RGB", (math.ceil(w / scale), math.ceil(h / scale)))
        fx, fy = img.size[0] / w, img.size[1] / h
        box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
    img = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR, box=box)
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
    return DataLoader(
        ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
    )


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
    return DataLoader(
        _ImageFolder(files),
        batch_size=batch_size,
        num_workers=workers,
        shuffle=True,
        persistent_workers=workers > 0,
    )


def loader_conversion() -> Callable[[Any, torch.device | None], Any]:
    """DALI output -> torch as the Loader converts it: on the CPU, as this flashfeed's
    ``to_torch`` does (DALI's own buffer handed out in place, as DALI's PyTorch iterator
    does under its dynamic executor; an older flashfeed copied into a ``HostPool``)."""
    import inspect

    from flashfeed.loader.image.image import convert

    if "pool" not in inspect.signature(convert.to_torch).parameters:
        return lambda tl, dev: convert.to_torch(tl, dev)
    pool = convert.HostPool()
    return lambda tl, dev: convert.to_torch(tl, dev, None, pool)


def dali_iterator_conversion() -> Callable[[Any, torch.device | None], Any]:
    """DALI output -> torch as DALI's own PyTorch iterator converts it under the dynamic
    executor (DALI's default): a dense CPU output handed out in place (``from_dlpack``, no
    copy; DALI reuses the buffer once nothing refers to it); on a GPU machine, as the
    Loader's ``to_torch`` does."""
    to_gpu = loader_conversion()

    def convert(tl: Any, device: torch.device | None) -> Any:
        if device is None and type(tl).__name__ == "TensorListCPU" and tl.is_dense_tensor():
            return torch.from_dlpack(tl.as_tensor())
        return to_gpu(tl, device)

    return convert


#: the members DALI's reader peer reads by default: the image, then its ``.cls`` label
READER_EXT = ("jpg", "cls")


def _dali_iter(
    pipe: Any,
    batches: int | None,
    to_torch: Callable[[Any, Any], Any] | None = None,
    ext: Sequence[str] = READER_EXT,
) -> Iterator[Any]:
    """Batches as torch tensors, converted as DALI's iterator converts them (``to_torch``: a
    ``dali_iterator_conversion()`` by default); endless (the reader wraps around epochs)
    when ``batches`` is None. Members after the image: ``.cls`` labels parsed into a tensor,
    others decoded to ``str`` per sample (as the Loader hands text on)."""
    import itertools

    device = torch.device("cuda", 0) if torch.cuda.is_available() else None
    to_torch = to_torch or dali_iterator_conversion()
    for _ in itertools.count() if batches is None else range(batches):
        outputs = pipe.run()
        batch = [to_torch(outputs[0], device)]
        for name, out in zip(ext[1:], outputs[1:], strict=False):
            raw = [np.array(out[i]).tobytes() for i in range(len(out))]
            if name == "cls":  # text labels: bytes of varying length, parsed here
                batch.append(torch.tensor([int(b) for b in raw]))
            else:
                batch.append([b.decode("utf-8") for b in raw])
        yield batch


def _dali_reader_pipeline(
    shards: list[str],
    *,
    batch_size: int,
    threads: int,
    device: str,
    ext: Sequence[str] = READER_EXT,
) -> Any:
    """Plain DALI as its documentation sets it up: ``fn.readers.webdataset`` over the tars
    with their index files (``wds2idx`` format; the reader scans a tar without one), its
    shuffle buffer (``initial_fill`` 1024), then the Loader's operators (ROI crop decode,
    resize, flip, normalise to float CHW) on the first of ``ext``; the others are outputs
    as read."""
    from nvidia.dali import fn
    from nvidia.dali.pipeline import Pipeline

    from flashfeed.loader.image.pipeline import AugmentOptions, default_image_pipeline

    indexes = [s + ".idx" for s in shards]
    pipe = Pipeline(
        batch_size=batch_size, num_threads=threads, device_id=0 if device == "gpu" else None
    )
    with pipe:
        read = fn.readers.webdataset(
            paths=shards,
            index_paths=indexes if all(Path(i).exists() for i in indexes) else None,
            ext=list(ext),
            random_shuffle=True,
            initial_fill=1024,
            name="reader",
        )
        members = list(read) if len(ext) > 1 else [read]
        out = default_image_pipeline({"image": members[0]}, AugmentOptions(device=device))
        pipe.set_outputs(out["image"], *members[1:])
    pipe.build()
    return pipe


def dali_webdataset_reader(
    shards: list[str], *, batch_size: int, threads: int, device: str, batches: int | None = None
) -> Iterable[Any]:
    """Plain DALI: ``fn.readers.webdataset`` with its shuffle buffer, same operators."""
    pipe = _dali_reader_pipeline(shards, batch_size=batch_size, threads=threads, device=device)
    return _dali_iter(pipe, batches)


class DaliReaderEpochs:
    """Plain DALI's reader pipeline by epochs: each ``iter()`` is one epoch (the reader's
    ``epoch_size`` samples in whole batches, as its iterator's ``reader_name`` ends them),
    so a first epoch and hot epochs are timed like the Loader's. Constructing it builds the
    pipeline: a timer started before the constructor counts DALI's start-up."""

    def __init__(
        self,
        shards: list[str],
        *,
        batch_size: int,
        threads: int,
        device: str,
        ext: Sequence[str] = READER_EXT,
    ) -> None:
        self.pipe = _dali_reader_pipeline(
            shards, batch_size=batch_size, threads=threads, device=device, ext=ext
        )
        self.batches = -(-int(self.pipe.epoch_size("reader")) // batch_size)
        self.to_torch = dali_iterator_conversion()  # kept for every epoch, as DALI's iterator
        self.ext = tuple(ext)

    def __iter__(self) -> Iterator[Any]:
        return _dali_iter(self.pipe, self.batches, self.to_torch, self.ext)

    def close(self) -> None:
        self.pipe = None


class RamBatches:
    """``external_source`` callback in the Loader's layout (one list per field: JPEG bytes,
    int64 labels; then each sample's key bytes), cycling over samples held in RAM in the
    order they are listed."""

    def __init__(self, jpegs: list[bytes], labels: list[int], batch_size: int) -> None:
        from flashfeed.loader.image.fields import key_bytes

        self.images = [np.frombuffer(j, np.uint8) for j in jpegs]
        self.labels = [np.array(x, np.int64) for x in labels]
        self.keys = [key_bytes("ram", f"{i:07d}") for i in range(len(jpegs))]
        self.batch_size = batch_size

    def __call__(self, info: Any) -> tuple[list[np.ndarray], ...]:
        n = len(self.images)
        picked = [(int(info.iteration) * self.batch_size + k) % n for k in range(self.batch_size)]
        return (
            [self.images[i] for i in picked],
            [self.labels[i] for i in picked],
            [self.keys[i] for i in picked],
        )


def loader_defaults() -> dict[str, Any]:
    """The Loader's own defaults for the pipeline knobs the ceiling must share. Bytes held in
    RAM are read in place, as the Loader reads its shards (an older Loader's default
    ``py_workers=None`` picked no reader process for a local dataset)."""
    import inspect

    from flashfeed.loader import Loader

    params = inspect.signature(Loader.__init__).parameters
    out = {k: params[k].default for k in ("py_workers", "prefetch")}
    if out["py_workers"] is None:  # as for a local dataset: no reader process
        out["py_workers"] = 0
    return out


def _pipeline_batches(pipe: Any, names: list[str], device: str) -> Iterator[dict[str, Any]]:
    """Endless batches of a pipeline built by ``build_pipeline``, converted as the Loader
    converts them (``to_torch`` per output, ``to_keys`` for the keys)."""
    from flashfeed.loader.image.convert import to_keys
    from flashfeed.loader.image.fields import KEY

    dev = torch.device("cuda", 0) if device == "gpu" else None
    convert = loader_conversion()
    while True:
        out = dict(zip(names, pipe.run(), strict=True))
        keys = to_keys(out.pop(KEY))
        batch: dict[str, Any] = {n: convert(o, dev) for n, o in out.items()}
        batch[KEY] = keys
        yield batch


def _build_like_loader(
    source: Any, *, batch_size: int, threads: int, device: str, py_workers: int, shared: bool
) -> tuple[Any, list[str]]:
    """The Loader's pipeline over ``source``; ``shared``: DALI reads its arrays in place, as
    the Loader's does for a dataset read in place (the source must keep them alive)."""
    from flashfeed.loader.image.fields import parse_fields
    from flashfeed.loader.image.pipeline import AugmentOptions, build_pipeline
    from flashfeed.runtime.lifeline import tie_forked_children

    with tie_forked_children():  # the reader process dies with this one
        return build_pipeline(
            source,
            specs=parse_fields(None),
            batch_size=batch_size,
            num_threads=threads,
            py_workers=py_workers,
            augment=AugmentOptions(device=device),
            user_fn=None,
            seed=0,
            prefetch=loader_defaults()["prefetch"],
            py_start_method="fork" if device == "cpu" else "spawn",
            shared=shared and not py_workers,
        )


def dali_decode_ceiling(
    jpegs: list[bytes], labels: list[int], *, batch_size: int, threads: int, device: str
) -> Iterable[Any]:
    """The Loader's own pipeline (``build_pipeline``, exec_dynamic, its reader process and
    prefetch) fed from bytes already in RAM: the decode ceiling of the Loader."""
    pipe, names = _build_like_loader(
        RamBatches(jpegs, labels, batch_size),
        batch_size=batch_size,
        threads=threads,
        device=device,
        py_workers=loader_defaults()["py_workers"],
        shared=True,  # RamBatches holds every array it hands out
    )
    return _pipeline_batches(pipe, names, device)


def loader_epoch_samples(
    dataset: Path, *, batch_size: int, threads: int
) -> tuple[list[bytes], list[int]]:
    """The JPEG bytes and labels of one epoch of the Loader on ``dataset`` (a folder of
    webdataset tars), in the order it delivered them (its batches' keys, read off one pass):
    a decode ceiling fed in this order decodes what the Loader decodes, batch for batch."""
    from flashfeed.format.tarshard import iter_samples
    from flashfeed.loader import Loader

    loader = Loader(str(dataset), batch_size=batch_size, num_threads=threads)
    try:
        keys = [k for batch in loader for k in batch["__key__"]]
    finally:
        loader.close()
    members: dict[str, dict[str, bytes]] = {}
    for tar in sorted(dataset.glob("*.tar")):
        with open(tar, "rb") as f:
            for key, fields in iter_samples(f, source=str(tar)):
                members[f"{tar.name}/{key}"] = fields
    jpegs, labels = [], []
    for key in keys:
        sample = members[key]
        jpegs.append(sample["jpg"])
        labels.append(int(sample["cls"]) if "cls" in sample else 0)
    return jpegs, labels


class _WdsBytes:
    """webdataset's samples as ``(images, labels, keys)`` batches for ``external_source``:
    bytes read in DataLoader workers, nothing decoded there."""

    def __init__(self, shards: list[str], batch_size: int, workers: int) -> None:
        import webdataset as wds

        ds = (
            wds.WebDataset(shards, shardshuffle=len(shards), empty_check=False)
            .shuffle(1000)
            .to_tuple("__key__", "jpg", "cls")
        )
        self.loader = DataLoader(
            ds,
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=list,
            persistent_workers=workers > 0,
            drop_last=True,
        )
        self.it: Iterator[Any] = iter(())

    def __call__(self, info: Any) -> tuple[list[np.ndarray], ...]:
        from flashfeed.loader.image.fields import key_bytes

        try:
            batch = next(self.it)
        except StopIteration:  # next epoch
            self.it = iter(self.loader)
            batch = next(self.it)
        return (
            [np.frombuffer(jpg, np.uint8) for _, jpg, _ in batch],
            [np.array(int(cls), np.int64) for _, _, cls in batch],
            [key_bytes("wds", key) for key, _, _ in batch],
        )


def webdataset_dali(
    shards: list[str], *, batch_size: int, workers: int, threads: int, device: str
) -> Iterable[Any]:
    """webdataset's reader (shard shuffle, 1000-sample buffer, DataLoader workers) feeding
    the same DALI graph as flashfeed's Loader: the peers' bytes through our decode."""
    pipe, names = _build_like_loader(
        _WdsBytes(shards, batch_size, workers),
        batch_size=batch_size,
        threads=threads,
        device=device,
        py_workers=0,  # the bytes come from the DataLoader's workers, in this process
        shared=False,  # fresh arrays each batch, held by nobody: DALI copies them
    )
    return _pipeline_batches(pipe, names, device)


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

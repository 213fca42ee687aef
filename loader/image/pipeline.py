"""The DALI side: one pipeline definition, GPU (``mixed``) decode when a GPU exists, CPU
operators otherwise; samples come in plan order from a ``BatchSource``.

A user ``pipeline=`` function receives the DALI nodes of the encoded fields (labels already
int64) and returns a dict of outputs; the default is image classification. The pipeline adds
one output, ``__key__``: each sample's ``<shard>/<key>`` bytes, from the same read as its
fields.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..distributed import cuda_device_index
from ..reader import BatchSource
from .fields import KEY, FieldSpec
from .text import field_columns

__all__ = [
    "BUCKET",
    "CUDA_TORCH_HINT",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "AugmentOptions",
    "batch_device",
    "build_pipeline",
    "check_device",
    "cuda_device",
    "decode_device",
    "default_image_pipeline",
    "gpu_count",
    "shared_batches",
    "torch_cuda_usable",
]

#: the node holding each sample's bucket (height, width) and the image window that covers it
#: (relative height, width) in a bucketed pipeline
BUCKET = "__bucket__"
#: the part of the covering window's area a training crop takes (uniform in this range)
BUCKET_AREA = (0.35, 1.0)

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

PipelineFn = Callable[[dict[str, Any]], Mapping[str, Any]]


def _dali() -> tuple[Any, Any]:
    """``(nvidia.dali.fn, nvidia.dali.types)``, imported on first use."""
    return importlib.import_module("nvidia.dali.fn"), importlib.import_module("nvidia.dali.types")


def gpu_count() -> int:
    """CUDA devices DALI sees (0 on CPU-only machines, also without a driver)."""
    try:
        backend: Any = importlib.import_module("nvidia.dali.backend")
        return int(backend.GetCUDADeviceCount())
    except Exception:  # no driver, no runtime: a CPU machine
        return 0


#: what a GPU machine needs besides flashfeed, said by every "no usable CUDA" error
CUDA_TORCH_HINT = (
    "install a CUDA build of PyTorch (pip install torch --index-url "
    "https://download.pytorch.org/whl/cu130, or the cu12x index matching the driver) and the "
    "CUDA libraries DALI loads (pip install 'flashfeed[gpu]'); or pass device='cpu'"
)


def torch_cuda_usable() -> bool:
    """True when this torch build has CUDA and sees a device."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a torch without CUDA support, or a broken driver
        return False


def check_device(device: str) -> str:
    """``device`` as every loader takes it: ``"auto"``, ``"cpu"`` or ``"gpu"`` (``"cuda"`` is
    another name for it); refuses anything else."""
    if device not in ("auto", "cpu", "gpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'gpu' or 'cuda', got {device!r}")
    return "gpu" if device == "cuda" else device


def batch_device(device: str, *, torch_cuda: bool | None = None) -> Any:
    """Where a loader that copies its batches itself (``TokenLoader``; no DALI decode) puts
    them: a ``torch.device`` of this rank's GPU when ``device`` asks for one, or is
    ``"auto"`` and torch sees CUDA; None for the CPU. ``"gpu"`` without a CUDA torch raises
    here, at construction, saying what to install. ``torch_cuda`` defaults to this machine."""
    kind = check_device(device)
    cuda = torch_cuda_usable() if torch_cuda is None else torch_cuda
    if kind == "cpu" or (kind == "auto" and not cuda):
        return None
    if not cuda:
        raise ValueError(
            f"device={device!r} but this PyTorch sees no CUDA device "
            f"(torch.cuda.is_available() is False); {CUDA_TORCH_HINT}"
        )
    return cuda_device()


def cuda_device() -> Any:
    """This rank's GPU as a ``torch.device`` (see ``cuda_device_index``)."""
    import torch

    return torch.device("cuda", cuda_device_index())


def decode_device(
    device: str = "auto", *, dali_gpus: int | None = None, torch_cuda: bool | None = None
) -> str:
    """``"gpu"`` or ``"cpu"``: where decoding and augmentation run.

    GPU decode hands DALI's GPU outputs to torch, so it needs both DALI seeing a CUDA device
    and a CUDA build of torch; without the second, ``"gpu"`` and an ``"auto"`` that finds a
    GPU through DALI raise here, at construction, saying what to install. ``dali_gpus`` and
    ``torch_cuda`` default to what this machine has (tests pass them).
    """
    if check_device(device) == "cpu":
        return "cpu"
    gpus = gpu_count() if dali_gpus is None else dali_gpus
    if gpus == 0:
        if device == "auto":
            return "cpu"
        raise ValueError(f"device={device!r} but DALI sees no CUDA device")
    if not (torch_cuda_usable() if torch_cuda is None else torch_cuda):
        raise ValueError(
            f"device={device!r}: DALI sees {gpus} CUDA device(s) but this PyTorch has no "
            f"usable CUDA (torch.cuda.is_available() is False); {CUDA_TORCH_HINT}"
        )
    return "gpu"


@dataclass(frozen=True)
class AugmentOptions:
    """The default pipeline's knobs."""

    image_size: int = 224
    train: bool = True
    device: str = "cpu"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    resize_ratio: float = 0.875
    #: video clips: frames per clip and the stride between them (0: no video field)
    frames: int = 0
    stride: int = 1

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f"image_size must be >= 1, got {self.image_size}")
        if not 0 < self.resize_ratio <= 1:
            raise ValueError(f"resize_ratio must be in (0, 1], got {self.resize_ratio}")


def default_image_pipeline(nodes: dict[str, Any], opts: AugmentOptions) -> dict[str, Any]:
    """Decode; random resized crop + flip (train) or resize + center crop (eval); normalize;
    NCHW float32. Every other field passes through."""
    fn, types = _dali()
    if "image" not in nodes and opts.frames:
        return _video_clips(nodes, opts)
    if "image" not in nodes:
        raise ValueError("the default pipeline needs an 'image' field; give pipeline= otherwise")
    if BUCKET in nodes:
        return _bucketed_images(nodes, opts)
    dev = "mixed" if opts.device == "gpu" else "cpu"
    size = opts.image_size
    mirror: Any = 0
    crop: tuple[int, int] | None = None
    if opts.train:
        images = fn.decoders.image_random_crop(nodes["image"], device=dev, output_type=types.RGB)
        images = fn.resize(images, size=(size, size))
        mirror = fn.random.coin_flip(probability=0.5)
    else:
        images = fn.decoders.image(nodes["image"], device=dev, output_type=types.RGB)
        images = fn.resize(images, resize_shorter=round(size / opts.resize_ratio))
        crop = (size, size)
    images = fn.crop_mirror_normalize(
        images,
        crop=crop,
        mirror=mirror,
        mean=list(opts.mean),
        std=list(opts.std),
        dtype=types.FLOAT,
        output_layout="CHW",
    )
    return {**nodes, "image": images}


def _video_clips(nodes: dict[str, Any], opts: AugmentOptions) -> dict[str, Any]:
    """Each video field: decode the clip's frames (``frames`` from its start frame, ``stride``
    apart), resize the shorter side to ``image_size``, centre crop, normalize; FCHW float32.
    Its ``<field>_start`` (seconds) passes through."""
    fn, types = _dali()
    out = dict(nodes)
    dev = "mixed" if opts.device == "gpu" else "cpu"
    size = opts.image_size
    for name in [n for n in nodes if f"{n}_start_frame" in nodes]:
        start = out.pop(f"{name}_start_frame")
        clips = fn.decoders.video(
            nodes[name], device=dev, start_frame=start, sequence_length=opts.frames,
            stride=opts.stride,
        )  # fmt: skip
        clips = fn.resize(clips, resize_shorter=size)
        out[name] = fn.crop_mirror_normalize(
            clips, crop=(size, size), mean=list(opts.mean), std=list(opts.std),
            dtype=types.FLOAT, output_layout="FCHW",
        )  # fmt: skip
    return out


def _bucketed_images(nodes: dict[str, Any], opts: AugmentOptions) -> dict[str, Any]:
    """Decode only a window of the bucket's aspect ratio and resize it to the bucket; flip;
    normalize; CHW. ``BUCKET`` holds per sample (height, width, window height, window width),
    the window relative to the image: the largest one of the bucket's shape (a cover resize
    and crop). Eval takes it centred; training takes a random part of it (``BUCKET_AREA``
    of its area) at a random place, as a random resized crop does for square images."""
    fn, types = _dali()
    from nvidia.dali import math as dmath

    nodes = dict(nodes)
    b = nodes.pop(BUCKET)
    hw, window = b[0:2], b[2:4]
    mirror: Any = 0
    if opts.train:
        window = window * dmath.sqrt(fn.random.uniform(range=BUCKET_AREA))
        anchor = fn.random.uniform(range=(0.0, 1.0), shape=2) * (1.0 - window)
        mirror = fn.random.coin_flip(probability=0.5)
    else:
        anchor = (1.0 - window) * 0.5
    dev = "mixed" if opts.device == "gpu" else "cpu"
    images = fn.decoders.image_slice(
        nodes["image"], anchor, window, device=dev, output_type=types.RGB, axis_names="HW",
        normalized_anchor=True, normalized_shape=True,
    )  # fmt: skip
    images = fn.resize(images, size=hw)
    images = fn.crop_mirror_normalize(
        images, mirror=mirror, mean=list(opts.mean), std=list(opts.std), dtype=types.FLOAT,
        output_layout="CHW",
    )  # fmt: skip
    return {**nodes, "image": images}


def shared_batches(prefetch: int) -> int:
    """Batches a source must keep alive for ``build_pipeline(shared=True)``: DALI runs up to
    ``prefetch`` batches ahead of the one handed out, whose outputs (the keys among them)
    may still point into the source's memory until the next ``run()``; two more to spare."""
    return prefetch + 3


def build_pipeline(
    source: BatchSource | Callable[[Any], Any],
    *,
    specs: tuple[FieldSpec, ...],
    batch_size: int,
    num_threads: int,
    py_workers: int,
    augment: AugmentOptions,
    user_fn: PipelineFn | None,
    seed: int,
    prefetch: int = 2,
    py_start_method: str = "fork",
    device_id: int = 0,
    timings: dict[str, float] | None = None,
    tokenized: bool = False,
    bucketed: bool = False,
    shared: bool = False,
) -> tuple[Any, list[str]]:
    """A built DALI pipeline reading ``source`` and the names of its outputs, in order
    (``tokenized``: the source tokenizes text fields into ids and a mask; ``bucketed``: it
    gives each sample's bucket (height, width) as the node ``BUCKET``). ``timings`` (if
    given) gets ``reader_start_s``: the seconds of ``pipe.build()``, where DALI starts its
    executor and reader processes. ``shared``: the source keeps what it returns alive for
    at least ``shared_batches(prefetch)`` more batches (``BatchSource(keep=...)``), so DALI
    reads the samples where they lie instead of copying each batch first."""
    from nvidia.dali.pipeline import Pipeline

    fn, types = _dali()

    parallel = py_workers > 0
    pipe = Pipeline(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id if augment.device == "gpu" else None,
        seed=seed & 0x7FFFFFFF,
        prefetch_queue_depth=prefetch,
        py_num_workers=max(py_workers, 1),
        py_start_method=py_start_method,
        exec_dynamic=True,
    )
    names: list[str] = []
    with pipe:
        # the last output holds each sample's key bytes, read with the sample: it passes
        # through untouched and comes out beside the sample as the batch's __key__
        columns = field_columns(specs, tokenized=tokenized)
        if bucketed:
            columns.append((BUCKET, "float"))
        dtypes = {
            "int64": types.INT64, "int32": types.INT32, "uint8": types.UINT8, "float": types.FLOAT
        }  # fmt: skip
        *raw, keys = fn.external_source(
            source=source,
            num_outputs=len(columns) + 1,
            batch=True,
            batch_info=True,
            parallel=parallel,
            no_copy=parallel or shared,
            dtype=[*(dtypes[d] for _, d in columns), types.UINT8],
        )
        nodes = {name: node for (name, _), node in zip(columns, raw, strict=True)}
        outputs = user_fn(nodes) if user_fn else default_image_pipeline(nodes, augment)
        if not isinstance(outputs, Mapping) or not outputs:
            raise ValueError(
                "pipeline= must return a non-empty dict of output name -> DALI node, got "
                f"{type(outputs).__name__}"
            )
        if KEY in outputs:
            raise ValueError(f"pipeline= must not return {KEY!r}: the loader adds it")
        names = [*outputs, KEY]
        pipe.set_outputs(*outputs.values(), keys)
    t0 = time.perf_counter()
    pipe.build()
    if timings is not None:
        timings["reader_start_s"] = time.perf_counter() - t0
    return pipe, names

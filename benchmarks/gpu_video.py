"""``gpu.sh``'s ``nvdec`` stage: video clips/s decoded on the GPU (NVDEC), self-contained.

H.264 mp4 clips (made here with PyAV: 320x240, 48-72 frames) in one flashfeed shard set, read
two ways as clips of ``FRAMES`` frames ``STRIDE`` apart, resized to ``SIZE`` and normalized:

  ceiling   DALI's video decoder on device "mixed" (NVDEC) fed the same mp4 bytes from RAM
  loader    flashfeed's Loader(fields={"video": "mp4"}, frames=8, stride=2, device="gpu")

and ``vs_ceiling`` = loader / ceiling. Without a GPU (DALI sees no CUDA device) the stage is
skipped with one line saying so; ``cpu=True`` smoke-runs the same code on VP9 webm clips on
the CPU (DALI decodes VP9 there, not H.264): a check of the code, not a figure. Only the
standard library is imported at module level, like the other ``gpu_*`` modules.
"""

from __future__ import annotations

import importlib
import io
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["stage_nvdec"]

FRAMES, STRIDE, SIZE = 8, 2, 112


def _cuda_devices() -> int:
    try:
        backend: Any = importlib.import_module("nvidia.dali.backend")
        return int(backend.GetCUDADeviceCount())
    except Exception:  # no DALI, no driver: no GPU for this stage
        return 0


def _clips(count: int, *, h264: bool, small: bool = False) -> list[bytes]:
    """``count`` clips of a moving noise pattern: H.264 mp4 (NVDEC) or VP9 webm (CPU);
    ``small``: 160x120 and 20-30 frames, for a smoke run."""
    import av
    import numpy as np

    rng = np.random.default_rng(3)
    w, h, first, spread = (160, 120, 20, 11) if small else (320, 240, 48, 25)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        with av.open(buf, "w", format="mp4" if h264 else "webm") as c:
            st = c.add_stream("libx264" if h264 else "libvpx-vp9", rate=25)
            st.width, st.height, st.pix_fmt = w, h, "yuv420p"
            base = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            for f in range(first + (i * 7) % spread):
                img = np.roll(base, 3 * f, axis=1)
                for p in st.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    c.mux(p)
            for p in st.encode():
                c.mux(p)
        out.append(buf.getvalue())
    return out


def _dataset(root: Path, clips: list[bytes], ext: str) -> str:
    from flashfeed.format.indexer import index_dataset
    from flashfeed.shardio import shard_name, write_tar_shard

    prefix = root / "nvdec-clips"
    samples = [(f"clip-{i:05d}", {ext: c}) for i, c in enumerate(clips)]
    half = (len(samples) + 1) // 2
    for s, part in enumerate((samples[:half], samples[half:])):
        write_tar_shard(str(prefix), shard_name(s, "tar"), part)
    index_dataset(str(prefix), overwrite=True)
    return str(prefix)


def _timed(seconds: float, step: Any) -> tuple[int, float]:
    """Clips done by calling ``step`` (returns clips) until ``seconds`` have passed, after
    one warm-up call; the GPU synchronised at both ends."""
    import torch

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    step()
    sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += step()
    sync()
    return n, time.perf_counter() - t0


def _ceiling(clips: list[bytes], *, batch: int, cpu: bool, seconds: float) -> float:
    """Clips/s of DALI's video decoder alone (mixed: NVDEC), the same resize and normalize."""
    import numpy as np
    from nvidia.dali.pipeline import Pipeline

    fn: Any = importlib.import_module("nvidia.dali.fn")
    types: Any = importlib.import_module("nvidia.dali.types")
    data = [np.frombuffer(c, np.uint8) for c in clips]
    pos = [0]

    def source() -> list[Any]:
        i = pos[0]
        pos[0] = (i + batch) % len(data)
        return [data[(i + k) % len(data)] for k in range(batch)]

    pipe = Pipeline(
        batch_size=batch, num_threads=min(4, os.cpu_count() or 2),
        device_id=None if cpu else 0, exec_dynamic=True,
    )  # fmt: skip
    with pipe:
        enc = fn.external_source(source=source, batch=True, dtype=types.UINT8)
        video = fn.decoders.video(
            enc, device="cpu" if cpu else "mixed", sequence_length=FRAMES, stride=STRIDE
        )
        video = fn.resize(video, resize_shorter=SIZE)
        video = fn.crop_mirror_normalize(
            video, crop=(SIZE, SIZE), dtype=types.FLOAT, output_layout="FCHW",
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
            std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
        )  # fmt: skip
        pipe.set_outputs(video)
    pipe.build()

    def step() -> int:
        (out,) = pipe.run()
        return len(out)

    n, secs = _timed(seconds, step)
    return n / secs


def _loader(prefix: str, ext: str, *, batch: int, cpu: bool, seconds: float) -> dict[str, Any]:
    from flashfeed.loader import Loader

    loader = Loader(
        prefix, batch_size=batch, fields={"video": ext}, frames=FRAMES, stride=STRIDE,
        image_size=SIZE, device="cpu" if cpu else "gpu", drop_last=False,
        py_workers=1 if cpu else 4, num_threads=min(4, os.cpu_count() or 2),
    )  # fmt: skip
    shape: list[int] = []

    def epoch() -> int:
        n = 0
        for b in loader:
            shape[:] = list(b["video"].shape)
            n += int(b["video"].shape[0])
        return n

    n, secs = _timed(seconds, epoch)
    loader.close()
    return {"clips_per_s": n / secs, "clips": n, "seconds": secs, "batch_shape": shape}


def stage_nvdec(run: Any) -> dict[str, Any]:
    """The stage: ``run`` has ``work`` (a folder), ``quick``, ``cpu`` and ``seconds``."""
    gpus = _cuda_devices()
    if not run.cpu and gpus == 0:
        return {"status": "skipped", "reason": "no GPU: NVDEC clips/s needs a CUDA device"}
    try:
        import av  # noqa: F401
    except ImportError:
        return {"status": "skipped", "reason": "PyAV (av) is not installed: no clips to make"}
    count = 8 if run.cpu else 32 if run.quick else 96
    batch = 4 if run.cpu else 16
    h264 = not run.cpu
    ext = "mp4" if h264 else "webm"
    clips = _clips(count, h264=h264, small=run.cpu)
    prefix = _dataset(Path(run.work), clips, ext)
    ceiling = _ceiling(clips, batch=batch, cpu=run.cpu, seconds=run.seconds)
    got = _loader(prefix, ext, batch=batch, cpu=run.cpu, seconds=run.seconds)
    return {
        "codec": "h264" if h264 else "vp9",
        "videos": count,
        "clip": {"frames": FRAMES, "stride": STRIDE, "size": SIZE},
        "batch": batch,
        "ceiling_clips_per_s": ceiling,
        "loader_clips_per_s": got["clips_per_s"],
        "vs_ceiling": got["clips_per_s"] / ceiling,
        "loader": got,
    }

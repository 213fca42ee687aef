"""Video clips: which frames of a video member a sample reads, decided by the plan.

A clip is ``frames`` frames ``stride`` apart. Where it starts is drawn per sample from
(seed, epoch, sample id) (``clip_draws``), so a resumed epoch reads the very same clips; the
reader turns the draw into a start frame once it knows the video's frame count (probed with
PyAV from the member's container, without decoding). DALI decodes VP8, VP9 and MJPEG on the
CPU; other codecs (H.264, HEVC, AV1, MPEG-4) only with NVDEC on a GPU, so on a CPU decode
they stop the pass with ``UnsupportedCodecError`` naming the codec and what decodes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashfeed.errors import CorruptShardError, FlashfeedError
from flashfeed.video import VIDEO_EXTS, VideoProbe, probe_video, require_pyav

__all__ = [
    "CPU_CODECS",
    "VIDEO_EXTS",
    "ClipOptions",
    "UnsupportedCodecError",
    "VideoProbe",
    "clip_draws",
    "clip_start",
    "frame_name",
    "probe_at",
    "probe_video",
    "require_pyav",
    "start_name",
]

#: what DALI's video decoder decodes on the CPU (the rest need NVDEC)
CPU_CODECS = ("vp8", "vp9", "mjpeg")
_SALT_CLIP = 0x636C6970


def frame_name(field: str) -> str:
    """The pipeline node holding each clip's first frame (int32)."""
    return f"{field}_start_frame"


def start_name(field: str) -> str:
    """The output holding each clip's start time in seconds (float32)."""
    return f"{field}_start"


class UnsupportedCodecError(FlashfeedError, ValueError):
    """A video in a codec that this decode device cannot decode."""


@dataclass(frozen=True)
class ClipOptions:
    """``frames`` per clip, ``stride`` between them; ``clip``: ``"random"`` (a start drawn
    per sample and epoch) or ``"center"`` (the middle of the video)."""

    frames: int
    stride: int = 1
    clip: str = "random"

    def __post_init__(self) -> None:
        for name in ("frames", "stride"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.clip not in ("random", "center"):
            raise ValueError(f"clip must be 'random' or 'center', got {self.clip!r}")

    @property
    def span(self) -> int:
        """Frames from the clip's first to its last, inclusive."""
        return (self.frames - 1) * self.stride + 1


def probe_at(data: bytes | memoryview | np.ndarray, *, where: str) -> VideoProbe:
    """``probe_video`` of a sample's member; not a readable video is a ``CorruptShardError``
    naming ``where``."""
    try:
        return probe_video(data)
    except ValueError as exc:
        raise CorruptShardError(f"{where}: {exc}") from None


def clip_draws(seed: int, epoch: int, ids: np.ndarray) -> np.ndarray:
    """A uniform number in [0, 1) per sample id, from (seed, epoch, id) alone: where its clip
    starts this epoch, whatever rank or pass reads it."""
    ids = np.asarray(ids, np.uint64)
    x = ids * np.uint64(0x9E3779B97F4A7C15)
    x ^= np.uint64((seed * 0x100000001B3 + epoch * 0x9E3779B1 + _SALT_CLIP) & (2**64 - 1))
    for shift, mult in ((33, 0xFF51AFD7ED558CCD), (33, 0xC4CEB9FE1A85EC53)):  # splitmix-style
        x ^= x >> np.uint64(shift)
        x *= np.uint64(mult)
    x ^= x >> np.uint64(33)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def clip_start(
    probe: VideoProbe, draw: float, options: ClipOptions, *, where: str, gpu: bool
) -> int:
    """The clip's first frame: ``draw`` over the starts that fit (the middle one for
    ``"center"``). A video shorter than one clip is a ``CorruptShardError``; a codec the
    decode device cannot decode is an ``UnsupportedCodecError``."""
    if not gpu and probe.codec not in CPU_CODECS:
        raise UnsupportedCodecError(
            f"{where}: video codec {probe.codec!r} cannot be decoded on the CPU (DALI decodes "
            f"{', '.join(CPU_CODECS)} there); {probe.codec} decodes with NVDEC on a GPU "
            "(device='gpu'), or re-encode the videos as VP9"
        )
    fits = probe.frames - options.span + 1
    if fits < 1:
        raise CorruptShardError(
            f"{where}: the video has {probe.frames} frames; a clip of {options.frames} frames "
            f"at stride {options.stride} needs {options.span}"
        )
    if options.clip == "center":
        return (fits - 1) // 2
    return min(int(draw * fits), fits - 1)

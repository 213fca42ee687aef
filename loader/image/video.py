"""Video clips: which frames of a video member a sample reads, decided by the plan.

A clip is ``frames`` frames ``stride`` apart. A video gives ``clips_per_video`` clips per
epoch, each its own sample of the plan (plan id ``i`` is clip ``i % K`` of video ``i // K``),
so shuffling, ranks, resume and the ledger treat clips as samples. Where clip ``j`` starts is
drawn from (seed, epoch, video id, j) (``clip_draws``) or spaced evenly (``"uniform"``), so a
resumed epoch reads the very same clips; the reader turns that into a start frame once it
knows the video's frame count (probed with PyAV from the member's container, without
decoding). DALI decodes VP8, VP9 and MJPEG on the CPU; other codecs (H.264, HEVC, AV1,
MPEG-4) only with NVDEC on a GPU, so on a CPU decode they stop the pass with
``UnsupportedCodecError`` naming the codec and what decodes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from flashfeed.errors import CorruptShardError, FlashfeedError
from flashfeed.format.video import VIDEO_EXTS, VideoProbe, probe_video, require_pyav

__all__ = [
    "CLIP_MODES",
    "CPU_CODECS",
    "VIDEO_EXTS",
    "ClipOptions",
    "UnsupportedCodecError",
    "VideoProbe",
    "check_clip_state",
    "clip_draws",
    "clip_key",
    "clip_options",
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


CLIP_MODES = ("random", "uniform", "center")


@dataclass(frozen=True)
class ClipOptions:
    """``frames`` per clip, ``stride`` between them, ``clips_per_video`` clips of each video
    per epoch; ``clip``: ``"random"`` (each clip's start drawn per video, clip and epoch),
    ``"uniform"`` (the clips evenly spaced over the video) or ``"center"`` (the middle of the
    video; one clip per video)."""

    frames: int
    stride: int = 1
    clip: str = "random"
    clips_per_video: int = 1

    def __post_init__(self) -> None:
        for name in ("frames", "stride", "clips_per_video"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.clip not in CLIP_MODES:
            raise ValueError(f"clip must be 'random', 'uniform' or 'center', got {self.clip!r}")
        if self.clip == "center" and self.clips_per_video > 1:
            raise ValueError(
                f"clip='center' takes one clip per video, got clips_per_video="
                f"{self.clips_per_video}: use clip='uniform' for clips spread over the video"
            )

    @property
    def span(self) -> int:
        """Frames from the clip's first to its last, inclusive."""
        return (self.frames - 1) * self.stride + 1


def clip_options(
    frames: int | None,
    *,
    stride: int,
    clip: str,
    clips_per_video: int,
    fields: list[str],
    videos: list[str],
    buckets: bool,
) -> ClipOptions | None:
    """A ``Loader``'s clip options from its keywords (None without ``frames``), checked
    against its ``fields`` (``videos``: the video fields among them) and ``buckets=``."""
    if videos and frames is None:
        raise ValueError(f"video field(s) {videos} need frames= (frames per clip)")
    if frames is None:
        if clips_per_video != 1:
            raise ValueError(f"clips_per_video={clips_per_video!r} needs a video field and frames=")
        return None
    options = ClipOptions(frames, stride, clip, clips_per_video)
    if not videos:
        raise ValueError(f"frames= needs a video field (mp4/webm... members); fields= has {fields}")
    if options.clips_per_video > 1 and buckets:
        raise ValueError(
            f"clips_per_video={clips_per_video} reads video clips; buckets= shapes images: use "
            "one or the other"
        )
    return options


def check_clip_state(state: Any, clips: ClipOptions | None) -> None:
    """A saved state counts ``clips_per_video`` plan entries per video: a loader reading
    another count would continue another plan, so the state is refused naming both."""
    if not isinstance(state, dict) or state.get("kind") == "mixture":
        return
    saved = state.get("clips_per_video", 1)
    mine = clips.clips_per_video if clips is not None else 1
    if saved != mine:
        raise ValueError(
            f"the state was saved reading {saved!r} clip(s) per video, this loader reads "
            f"{mine}: make it with clips_per_video={saved!r} to continue that epoch"
        )


def probe_at(data: bytes | memoryview | np.ndarray, *, where: str) -> VideoProbe:
    """``probe_video`` of a sample's member; not a readable video is a ``CorruptShardError``
    naming ``where``."""
    try:
        return probe_video(data)
    except ValueError as exc:
        raise CorruptShardError(f"{where}: {exc}") from None


def clip_key(key: str, index: int, clips_per_video: int) -> str:
    """The key of clip ``index`` of the sample ``key``: ``<key>#<index>`` when a video gives
    several clips, the sample's own key when it gives one."""
    return f"{key}#{index}" if clips_per_video > 1 else key


def clip_draws(
    seed: int, epoch: int, ids: np.ndarray, clips: np.ndarray | None = None
) -> np.ndarray:
    """A uniform number in [0, 1) per (video id, clip index), from (seed, epoch, id, clip)
    alone: where that clip starts this epoch, whatever rank or pass reads it (clip 0 of a
    video draws what a one-clip plan draws)."""
    ids = np.asarray(ids, np.uint64)
    x = ids * np.uint64(0x9E3779B97F4A7C15)
    if clips is not None:
        x += np.asarray(clips, np.uint64) * np.uint64(0xD6E8FEB86659FD93)
    x ^= np.uint64((seed * 0x100000001B3 + epoch * 0x9E3779B1 + _SALT_CLIP) & (2**64 - 1))
    for shift, mult in ((33, 0xFF51AFD7ED558CCD), (33, 0xC4CEB9FE1A85EC53)):  # splitmix-style
        x ^= x >> np.uint64(shift)
        x *= np.uint64(mult)
    x ^= x >> np.uint64(33)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def clip_start(
    probe: VideoProbe,
    draw: float,
    options: ClipOptions,
    *,
    where: str,
    gpu: bool,
    index: int = 0,
) -> int:
    """The first frame of clip ``index``: ``draw`` over the starts that fit (``"random"``),
    the middle of the ``index``-th of ``clips_per_video`` equal stretches of those starts
    (``"uniform"``), or the middle one (``"center"``). A video shorter than one clip is a
    ``CorruptShardError``; a codec the decode device cannot decode is an
    ``UnsupportedCodecError``."""
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
    if options.clip == "uniform":
        return (2 * index + 1) * fits // (2 * options.clips_per_video)
    return min(int(draw * fits), fits - 1)

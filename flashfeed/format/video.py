"""Video members: their extensions and what a probe of their container says.

Ingest probes each video it writes (the metadata goes beside it as ``<field>.json``) and the
loader probes each video it reads (to place its clip), both with PyAV, demuxing packets to
count frames and decoding nothing.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "VIDEO_EXTS",
    "VIDEO_MEDIA_TYPES",
    "VideoProbe",
    "member_videos",
    "probe_video",
    "require_pyav",
]

#: a video member's media type by its extension
VIDEO_MEDIA_TYPES = {
    "mp4": "video/mp4",
    "m4v": "video/mp4",
    "webm": "video/webm",
    "mkv": "video/x-matroska",
    "avi": "video/x-msvideo",
    "mov": "video/quicktime",
}
#: member extensions that hold a video
VIDEO_EXTS: tuple[str, ...] = tuple(VIDEO_MEDIA_TYPES)


@dataclass(frozen=True)
class VideoProbe:
    """What a video holds: codec, frame count, frames per second, size."""

    codec: str
    frames: int
    fps: float
    width: int
    height: int

    @property
    def duration(self) -> float:
        return self.frames / self.fps if self.fps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration": round(self.duration, 6)}


def require_pyav() -> None:
    """Video fields probe with PyAV: say what to install when it is missing."""
    try:
        import av  # noqa: F401
    except ImportError:
        raise ValueError(
            "video fields need PyAV to probe each video (pip install 'flashfeed[video]')"
        ) from None


def probe_video(data: bytes | memoryview | np.ndarray) -> VideoProbe:
    """Probe a video's container: frames counted by demuxing, nothing decoded. Bytes that
    are no readable video are a ``ValueError`` saying why."""
    import av

    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    if not raw:
        raise ValueError("the video is empty (0 bytes)")
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            if not container.streams.video:
                raise ValueError("the member holds no video stream")
            stream = container.streams.video[0]
            ctx = stream.codec_context
            rate = stream.average_rate or stream.guessed_rate
            frames = 0
            for packet in container.demux(stream):
                frames += 1 if packet.size else 0
            return VideoProbe(
                str(ctx.name), frames, float(rate) if rate else 0.0, ctx.width, ctx.height
            )
    except (av.FFmpegError, OSError) as exc:
        raise ValueError(f"not a readable video ({exc})") from None


def member_videos(
    members: Sequence[Mapping[str, bytes | memoryview | str]], *, probed: bool = False
) -> list[dict[str, Any] | None]:
    """Each sample's video entry for the shard table's ``videos`` column: the probe of its
    first video member (in ``VIDEO_EXTS`` order) and its byte size; None without a video or
    when PyAV cannot read it. ``probed``: the members were written by ingest, whose
    ``<ext>.json`` beside each video holds this very probe (read instead of probing again)."""
    out: list[dict[str, Any] | None] = []
    for m in members:
        ext = next((e for e in VIDEO_EXTS if e in m), None)
        if ext is None:
            out.append(None)
            continue
        data = m[ext]
        size = len(data.encode() if isinstance(data, str) else data)
        meta = m.get(f"{ext}.json") if probed else None
        try:
            if meta is not None:
                found = json.loads(meta if isinstance(meta, str) else bytes(meta))
                probe = VideoProbe(
                    *(found[k] for k in ("codec", "frames", "fps", "width", "height"))
                )
            else:
                probe = probe_video(data if not isinstance(data, str) else data.encode())
        except (ValueError, KeyError, TypeError):
            out.append(None)
            continue
        out.append({**probe.to_dict(), "bytes": size})
    return out

"""Small videos for tests, encoded with PyAV, and an independent PyAV reference of what a
probe should find (frames counted by decoding, not by demuxing)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

FPS = 10
W, H = 64, 48


def frame_image(i: int, seed: int) -> np.ndarray:
    """Frame ``i``: a gradient whose level steps by 24 per frame, so frames tell apart."""
    y, x = np.mgrid[0:H, 0:W]
    level = (i * 24 + seed * 7) % 160
    return np.stack([x * 2 + level, y * 2 + level, np.full_like(x, 60 + level)], -1).astype(
        np.uint8
    )


def encode(
    frames: int, *, seed: int = 0, codec: str = "libvpx-vp9", fmt: str = "webm", fps: int = FPS
) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height = W, H
        s.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        for i in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(frame_image(i, seed), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def reference_probe(data: bytes) -> dict[str, Any]:
    """What the shard table should record for ``data``, found by decoding every frame."""
    import av

    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        codec = stream.codec_context.name
        fps = float(stream.average_rate)
        frames = sum(1 for _ in c.decode(video=0))
        width, height = stream.codec_context.width, stream.codec_context.height
    return {
        "codec": codec, "frames": frames, "fps": fps, "duration": round(frames / fps, 6),
        "width": width, "height": height, "bytes": len(data),
    }  # fmt: skip

"""Small videos for tests, encoded with PyAV, an independent PyAV reference of what a
probe should find (frames counted by decoding, not by demuxing), and a check of delivered
clips against a PyAV decode of the frames they should hold."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

FPS = 10
W, H = 64, 48
#: frames ``i`` and ``i + PERIOD`` of one video look alike (``frame_image``'s level cycles)
PERIOD = 20


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


def reference_frames(data: bytes) -> list[np.ndarray]:
    """Every frame of ``data`` as PyAV decodes it, RGB."""
    import av

    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def write_videos(prefix: str, members: list[bytes], ext: str = "webm") -> None:
    """One shard of samples ``v000``, ``v001``... holding ``members`` as ``ext``."""
    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import shard_name, write_tar_shard

    samples = [(f"v{i:03d}", {ext: m}) for i, m in enumerate(members)]
    info = write_tar_shard(prefix, shard_name(0, "tar"), samples)
    commit_manifest(
        prefix, Manifest(name="v", shard_format="webdataset", schema={}, shards=(info,))
    )


def denorm(clip: Any) -> np.ndarray:
    """A delivered (F, 3, H, W) clip back in pixel levels, (F, H, W, 3)."""
    import torch

    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    return (clip * std + mean).permute(0, 2, 3, 1).numpy()


def clip_errors(clip: Any, ref: list[np.ndarray], frames: int) -> list[list[float]]:
    """Per delivered frame (a centre crop of the shorter side, at its size), the mean
    absolute difference to every reference frame."""
    got = denorm(clip)
    size = got.shape[1]
    left = (W - size) // 2
    return [
        [float(np.abs(got[k] - r[:, left : left + size].astype(np.float32)).mean()) for r in ref]
        for k in range(frames)
    ]

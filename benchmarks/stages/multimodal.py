"""Multimodal samples: image-text pairs and aspect-ratio buckets, side by side.

One LAION-style shard set (jpg + txt + json per sample, written by webdataset's ShardWriter
and adopted with ``flashfeed index``) of the realistic photo corpus (``loader.py``'s
``image_corpus``), read to the same output by:

  flashfeed-text   Loader(fields={"image": "jpg", "caption": "txt"}): decode, random resized
                   crop 224, flip, normalize on DALI; captions as a list of str per batch
  wds+pil-text     webdataset + PIL in DataLoader workers doing the same crop, flip and
                   normalize, the caption as str (the peer a user would write)
  flashfeed-image  our single-image Loader on the same shards, no caption
  flashfeed-bucket Loader(buckets="auto"): resize to cover the nearest aspect-ratio bucket,
                   random crop to it, flip, normalize; one bucket per batch

and VP9 clips (``--videos`` webm files, made here with PyAV) read as clips of 8 frames at
stride 2, resized to 112 and normalized, by:

  flashfeed-video  Loader(fields={"video": "webm"}, frames=8, stride=2): DALI's CPU decoder
  pyav-video       PyAV decoding the same clips in 2 DataLoader worker processes, frames
                   resized with PIL

Rounds rotate the order; each figure is the median img/s or clips/s (construction to the
first batch after ``--min-seconds``). Ratios: text / wds+pil (target >= 1.3), text / image
(>= 0.95), bucket / image (>= 0.9); video / pyav (reported).

    python -m benchmarks.stages.multimodal --images 512 --rounds 1 --min-seconds 2 --out m.json
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.benchmath import fmt, ratio
from benchmarks.harness import timing
from benchmarks.harness.corpus import image_corpus
from benchmarks.harness.peerloaders import MEAN, STD, pil_transform
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.timing import BATCH, timed

WORDS = [
    "a",
    "photo",
    "of",
    "the",
    "sunset",
    "over",
    "an",
    "old",
    "stone",
    "bridge",
    "near",
    "quiet",
    "green",
    "hills",
    "with",
    "small",
    "boats",
    "on",
    "the",
    "river",
    "under",
    "a",
    "cloudy",
    "sky",
    "in",
    "early",
    "autumn",
    "light",
    "seen",
    "from",
    "far",
    "away",
]

#: the ratios the issue asks for, and the floor each must reach
TARGETS = {
    "text_vs_wds_pil": ("flashfeed-text", "wds+pil-text", 1.3),
    "text_vs_image": ("flashfeed-text", "flashfeed-image", 0.95),
    "bucket_vs_image": ("flashfeed-bucket", "flashfeed-image", 0.9),
    "video_vs_pyav": ("flashfeed-video", "pyav-video", None),
}
CLIP_FRAMES, CLIP_STRIDE, CLIP_SIZE = 8, 2, 112


def caption(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30)))


def write_pairs(root: Path, files: list[tuple[Path, int]], shards: int, seed: int) -> list[str]:
    """jpg + txt + json samples through webdataset's ShardWriter, then ``flashfeed index``."""
    import webdataset as wds

    from flashfeed.format.indexer import index_dataset

    out = root / "pairs"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    order = list(range(len(files)))
    rng.shuffle(order)
    per = -(-len(files) // shards)
    with wds.ShardWriter(str(out / "%06d.tar"), maxcount=per, verbose=0) as w:
        for i in order:
            path, label = files[i]
            meta = {"label": label, "similarity": round(rng.random(), 4), "url": f"x/{i}"}
            w.write({"__key__": f"img-{i:07d}", "jpg": path.read_bytes(),
                     "txt": caption(rng), "json": json.dumps(meta)})  # fmt: skip
    index_dataset(str(out), overwrite=True)
    return sorted(str(p) for p in out.glob("*.tar"))


class _PairTransform:
    def __init__(self) -> None:
        self.rng = random.Random()

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, str]:
        return pil_transform(sample["jpg"], self.rng), sample["txt"].decode("utf-8")


def wds_pil_pairs(shards: list[str], *, batch_size: int, workers: int) -> Any:
    """webdataset + PIL: shard shuffle, a 1000-sample buffer, captions as a list of str."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    ds = (
        wds.WebDataset(shards, shardshuffle=len(shards), empty_check=False)
        .shuffle(1000)
        .map(_PairTransform())
    )
    return DataLoader(
        ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
    )


def write_videos(root: Path, count: int, seed: int) -> tuple[str, list[str]]:
    """``count`` VP9 webm videos (160x120, 40-80 frames of moving noise) in one shard set
    adopted by ``flashfeed index``; returns its prefix and the tar paths."""
    import av
    import numpy as np

    from flashfeed.format.indexer import index_dataset
    from flashfeed.shardio import shard_name, write_tar_shard

    rng = np.random.default_rng(seed)
    out = root / "videos"
    samples = []
    for i in range(count):
        buf = io.BytesIO()
        with av.open(buf, "w", format="webm") as c:
            st = c.add_stream("libvpx-vp9", rate=25)
            st.width, st.height, st.pix_fmt = 160, 120, "yuv420p"
            base = rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)
            for f in range(int(rng.integers(40, 80))):
                img = np.roll(base, 3 * f, axis=1)
                for p in st.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    c.mux(p)
            for p in st.encode():
                c.mux(p)
        samples.append((f"vid-{i:05d}", {"webm": buf.getvalue()}))
    half = (len(samples) + 1) // 2
    for s, part in enumerate((samples[:half], samples[half:])):
        write_tar_shard(str(out), shard_name(s, "tar"), part)
    index_dataset(str(out), overwrite=True)
    return str(out), sorted(str(p) for p in (out / "shards").glob("*.tar"))


class _PyavClips:
    """The same clip as the Loader's: ``CLIP_FRAMES`` frames ``CLIP_STRIDE`` apart from a
    random start, each resized (PIL) and normalized like the Loader's frames."""

    def __init__(self) -> None:
        self.rng = random.Random()

    def __call__(self, sample: dict[str, Any]) -> Any:
        import av
        import numpy as np
        import torch
        from PIL import Image

        with av.open(io.BytesIO(sample["webm"])) as c:
            frames = list(c.decode(video=0))
        span = (CLIP_FRAMES - 1) * CLIP_STRIDE + 1
        start = self.rng.randint(0, len(frames) - span)
        out = []
        for f in frames[start : start + span : CLIP_STRIDE]:
            img = f.to_image()
            w, h = img.size
            scale = CLIP_SIZE / min(w, h)
            img = img.resize((round(w * scale), round(h * scale)), Image.Resampling.BILINEAR)
            left, top = (img.size[0] - CLIP_SIZE) // 2, (img.size[1] - CLIP_SIZE) // 2
            img = img.crop((left, top, left + CLIP_SIZE, top + CLIP_SIZE))
            out.append(((np.asarray(img, np.float32) - MEAN) / STD).transpose(2, 0, 1))
        return torch.from_numpy(np.stack(out)), 0  # (clip, _): batch[0] holds the clips


def pyav_clips(shards: list[str], *, batch_size: int, workers: int) -> Any:
    import webdataset as wds
    from torch.utils.data import DataLoader

    ds = wds.WebDataset(shards, shardshuffle=len(shards), empty_check=False).map(_PyavClips())
    return DataLoader(
        ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
    )


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from flashfeed.loader import Loader

    files = image_corpus(root, args.images, args.seed, args.corpus)
    shards = write_pairs(root, files, args.shards, args.seed)
    prefix = str(root / "pairs")
    thr, dev = args.threads, args.device
    batch = args.batch
    timing.BATCH = batch  # what its timer counts for a batch without keys
    common: dict[str, Any] = dict(batch_size=batch, num_threads=thr, device=dev)
    loaders: dict[str, Callable[[], Iterable[Any]]] = {
        "flashfeed-text": lambda: Loader(
            prefix, fields={"image": "jpg", "caption": "txt"}, **common
        ),
        "wds+pil-text": lambda: wds_pil_pairs(shards, batch_size=batch, workers=thr),
        "flashfeed-image": lambda: Loader(prefix, fields={"image": "jpg"}, **common),
        "flashfeed-bucket": lambda: Loader(
            prefix, fields={"image": "jpg"}, buckets="auto", **common
        ),
    }
    if args.videos:
        vprefix, vshards = write_videos(root, args.videos, args.seed)
        vb = max(1, batch // 8)
        loaders["flashfeed-video"] = lambda: Loader(
            vprefix, batch_size=vb, fields={"video": "webm"}, frames=CLIP_FRAMES,
            stride=CLIP_STRIDE, image_size=CLIP_SIZE, num_threads=thr, device=dev,
        )  # fmt: skip
        loaders["pyav-video"] = lambda: pyav_clips(vshards, batch_size=vb, workers=2)
    probe = Loader(prefix, fields={"image": "jpg"}, buckets="auto", **common)
    buckets = probe.bucket_report()
    probe.close()
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    cpu: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(args.rounds):
        for name in rotated(list(loaders), r):
            rate, ms, wall = timed(loaders[name], args.min_seconds)
            rates[name].append(rate)
            cpu[name].append(ms)
            print(f"round {r}: {name:17s} {rate:8.0f} img/s {ms:6.2f} CPU ms/img "
                  f"{wall:5.1f} s", file=sys.stderr, flush=True)  # fmt: skip
    ratios = {k: ratio(rates[a], rates[b]) for k, (a, b, _) in TARGETS.items() if a in rates}
    return {
        "images": len(files),
        "shards": len(shards),
        "img_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "cpu_ms_per_img": {k: statistics.median(v) for k, v in cpu.items()},
        "rounds": {"img_per_s": rates, "cpu_ms_per_img": cpu},
        "ratios": ratios,
        "targets": {k: t for k, (a, _, t) in TARGETS.items() if a in rates},
        "units": {k: "clips/s" if "video" in k else "img/s" for k in rates},
        "buckets": buckets,
        "timer": f"construction to the first batch after {args.min_seconds} s, rotated order",
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| loader | per s | CPU ms per item |", "|---|---:|---:|"]
    for k, v in result["img_per_s"].items():
        unit = result["units"][k]
        lines.append(f"| {k} | {fmt(v)} {unit} | {fmt(result['cpu_ms_per_img'][k])} |")
    lines += ["", "| ratio | of medians (per round) | target |", "|---|---:|---:|"]
    for k, v in result["ratios"].items():
        lines.append(
            f"| {k} | {fmt(v['ratio'])} ({fmt(v['min'])}-{fmt(v['max'])}) "
            f"| {'>= ' + str(result['targets'][k]) if result['targets'][k] else '-'} |"
        )
    lines += ["", "| bucket (h, w) | samples | batches | crop lost |", "|---|---:|---:|---:|"]
    for b in result["buckets"]["buckets"]:
        lines.append(
            f"| {tuple(b['shape'])} | {b['samples']} | {b['batches']} | {b['crop_lost']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--videos", type=int, default=64, help="VP9 videos (0: no video rows)")
    ap.add_argument("--device", choices=["cpu", "gpu", "auto"], default="cpu")
    ap.add_argument("--corpus", help="an existing ImageFolder corpus (class_*/*.jpg)")
    ap.add_argument("--work", help="folder for the shards (default: a temporary one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ffmm-") as tmp:
        result = run(args, Path(args.work or tmp))
    print(table(result))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

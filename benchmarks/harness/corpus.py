"""Benchmark corpora: ImageNet-like JPEGs cut from real photographs (synthetic JPEGs where no
photos are installed), and a small text corpus; ``datasets`` writes shards of them.

Photos come from Debian's wallpaper packages (real photographs, freely licensed):

    sudo apt-get install -y mate-backgrounds plasma-workspace-wallpapers

Every image is a seeded random crop (area 8-100%, aspect 0.62-1.6) of one photo, resized
to a short side of 300-500 px, with luma grain (sigma 9-16: the wallpapers are smoother than
real camera images) and saved at JPEG quality 85-95, in an ImageFolder layout of N classes.
The same arguments give the same files.

    python -m benchmarks.harness.corpus images .bench/corpus --size 2GB --classes 50
    python -m benchmarks.harness.corpus text .bench/text.jsonl --rows 20000
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from flashfeed.units import format_size, parse_size

__all__ = [
    "build_image_corpus",
    "build_text_corpus",
    "find_photos",
    "image_corpus",
    "pick_images",
    "synthetic_images",
]

PHOTO_DIRS = ("/usr/share/backgrounds/mate/nature", "/usr/share/wallpapers")
INSTALL_HINT = (
    "the benchmark corpus is cut from real photographs in Debian's wallpaper packages; "
    "install them with:\n    sudo apt-get install -y mate-backgrounds plasma-workspace-wallpapers"
)
_MAX_SOURCE_SIDE = 2400
_BATCH = 64


def find_photos() -> list[Path]:
    """MATE's nature photos plus the largest JPEG of each Plasma wallpaper, sorted."""
    photos = sorted(Path(PHOTO_DIRS[0]).glob("*.jpg")) if Path(PHOTO_DIRS[0]).is_dir() else []
    plasma = Path(PHOTO_DIRS[1])
    if plasma.is_dir():
        for wallpaper in sorted(p for p in plasma.iterdir() if p.is_dir()):
            jpgs = list(wallpaper.rglob("*.jpg"))
            if jpgs:
                photos.append(max(jpgs, key=lambda p: (p.stat().st_size, str(p))))
    return photos


def _load(path: Path) -> np.ndarray:
    img = Image.open(path).convert("RGB")
    if max(img.size) > _MAX_SOURCE_SIDE:
        img.thumbnail((_MAX_SOURCE_SIDE, _MAX_SOURCE_SIDE), Image.Resampling.LANCZOS)
    return np.asarray(img)


_PHOTOS: list[np.ndarray] = []


def _init(paths: list[str]) -> None:
    _PHOTOS[:] = [_load(Path(p)) for p in paths]


def _one(seed: int, i: int) -> bytes:
    rng = np.random.default_rng([seed, i])
    photo = _PHOTOS[int(rng.integers(len(_PHOTOS)))]
    h, w = photo.shape[:2]
    for _ in range(10):
        area = rng.uniform(0.08, 1.0) * w * h
        aspect = float(np.exp(rng.uniform(np.log(0.62), np.log(1.6))))
        cw, ch = round((area * aspect) ** 0.5), round((area / aspect) ** 0.5)
        if cw <= w and ch <= h:
            break
    else:
        cw, ch = min(w, h), min(w, h)
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    crop = Image.fromarray(photo[y : y + ch, x : x + cw])
    short = int(rng.integers(300, 501))
    scale = short / min(cw, ch)
    img = crop.resize(
        (max(1, round(cw * scale)), max(1, round(ch * scale))), Image.Resampling.BILINEAR
    )
    arr = np.asarray(img).astype(np.float32)
    grain = rng.normal(0.0, rng.uniform(9, 16), size=arr.shape[:2]).astype(np.float32)
    arr = np.clip(arr + grain[..., None], 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format="JPEG", quality=int(rng.integers(85, 96)))
    return out.getvalue()


def _batch(args: tuple[int, int, int]) -> list[bytes]:
    seed, start, n = args
    return [_one(seed, i) for i in range(start, start + n)]


def build_image_corpus(
    out: str | os.PathLike[str],
    *,
    size: int | str,
    classes: int = 50,
    seed: int = 0,
    workers: int = 2,
) -> dict[str, float]:
    """Write ``out/class_XXX/img_XXXXXXX.jpg`` until ``size`` bytes; return its statistics."""
    target = parse_size(size, name="size")
    if classes <= 0:
        raise ValueError(f"classes must be > 0, got {classes}")
    photos = find_photos()
    if len(photos) < 8:
        raise SystemExit(f"found {len(photos)} photos in {', '.join(PHOTO_DIRS)}: {INSTALL_HINT}")
    root = Path(out)
    total, n, sizes = 0, 0, []

    def path(i: int) -> Path:
        return root / f"class_{i % classes:03d}" / f"img_{i:07d}.jpg"

    def keep(i: int, data: bytes | None) -> None:
        nonlocal total
        p = path(i)
        if data is not None:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        sizes.append(p.stat().st_size)
        total += sizes[-1]

    with ProcessPoolExecutor(
        max(1, workers), initializer=_init, initargs=([str(p) for p in photos],)
    ) as pool:
        while total < target:
            starts = [n + k * _BATCH for k in range(max(1, workers) * 2)]
            # images already on disk (an earlier, smaller build) are kept, not redrawn
            todo = [s for s in starts if not all(path(i).is_file() for i in range(s, s + _BATCH))]
            made = dict(zip(todo, pool.map(_batch, [(seed, s, _BATCH) for s in todo]), strict=True))
            for s in starts:
                for k in range(_BATCH):
                    if total >= target:
                        break
                    keep(s + k, made[s][k] if s in made else None)
                    n = s + k + 1
    s = np.asarray(sizes)
    return {
        "images": len(sizes),
        "bytes": total,
        "classes": classes,
        "photos": len(photos),
        "median_kb": float(np.median(s) / 1e3),
        "p10_kb": float(np.percentile(s, 10) / 1e3),
        "p90_kb": float(np.percentile(s, 90) / 1e3),
    }


def build_text_corpus(path: str | os.PathLike[str], *, rows: int = 20_000, seed: int = 0) -> Path:
    """JSONL documents of varied length, from the words of the photo-free synthetic corpus."""
    from flashfeed.ingest.samplecorpus import make_text_jsonl

    return make_text_jsonl(path, rows=rows, seed=seed)


def image_corpus(
    root: Path, images: int, seed: int, existing: str | None = None
) -> list[tuple[Path, int]]:
    """``(file, label)`` of ``images`` photos: ``existing`` (an ImageFolder) when given, else
    the photo corpus built under ``root``, else synthetic JPEGs where no photos are installed."""
    folder = Path(existing) if existing else root / "corpus"
    if existing:
        kind = f"existing ImageFolder {existing}"
    elif len(find_photos()) >= 8:
        build_image_corpus(
            folder, size=int(images * 120e3), classes=50, seed=seed,
            workers=min(8, os.cpu_count() or 2),
        )  # fmt: skip
        kind = "photos (benchmarks/harness/corpus.py)"
    else:
        print("no photos installed; synthetic PIL JPEGs instead", file=sys.stderr)
        synthetic_images(folder, images, seed)
        kind = "synthetic PIL JPEGs"
    files = sorted(folder.glob("class_*/*.jpg"))[:images]
    if len(files) < images:
        raise SystemExit(f"the corpus has {len(files)} images, {images} asked")
    print(f"corpus: {len(files)} images, {kind}", file=sys.stderr)
    return [(f, int(f.parent.name.split("_")[1])) for f in files]


def pick_images(corpus: str | os.PathLike[str], nbytes: int) -> list[tuple[Path, int]]:
    """``(file, label)`` of an ImageFolder corpus's first images (sorted) up to ``nbytes``."""
    files, total = [], 0
    for f in sorted(Path(corpus).glob("class_*/*.jpg")):
        files.append((f, int(f.parent.name.split("_")[1])))
        total += f.stat().st_size
        if total >= nbytes:
            break
    return files


def synthetic_images(folder: Path, images: int, seed: int) -> None:
    """``images`` blocky, grainy 300-500 px JPEGs in 50 classes (photo-free fallback)."""
    rng = np.random.default_rng(seed)
    for i in range(images):
        path = folder / f"class_{i % 50:03d}" / f"img_{i:07d}.jpg"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        h, w = (int(x) for x in rng.integers(300, 500, 2))
        base = rng.integers(0, 255, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        img = np.kron(base, np.ones((16, 16, 1), np.uint8))[:h, :w]
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=90)
        path.write_bytes(buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="what", required=True)
    img = sub.add_parser("images", help="ImageFolder JPEG corpus from real photographs")
    img.add_argument("out")
    img.add_argument("--size", default="2GB")
    img.add_argument("--classes", type=int, default=50)
    img.add_argument("--seed", type=int, default=0)
    img.add_argument("--workers", type=int, default=2)
    txt = sub.add_parser("text", help="JSONL text corpus")
    txt.add_argument("out")
    txt.add_argument("--rows", type=int, default=20_000)
    txt.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.what == "images":
        stats = build_image_corpus(
            args.out, size=args.size, classes=args.classes, seed=args.seed, workers=args.workers
        )
        print(json.dumps(stats, indent=2))
        print(
            f"{stats['images']} images, {format_size(stats['bytes'])} in {args.out}",
            file=sys.stderr,
        )
    else:
        print(build_text_corpus(args.out, rows=args.rows, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

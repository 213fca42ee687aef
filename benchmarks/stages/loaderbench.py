"""Loader benchmark: flashfeed's DALI Loader against its peers and the decode ceiling.

Every image loader does the same work: decode, random-resized crop to 224, flip, normalize,
NCHW float32, batch 64, 2 workers/threads, median images/s over rounds whose order rotates
each round:

  flashfeed          Loader (plan order, DALI decode: CPU here, "mixed" with --device gpu)
  dali-reader        plain DALI fn.readers.webdataset pipeline, same operators
  wds+pil            webdataset + torch DataLoader workers decoding with PIL (Image.draft)
  wds+dali           webdataset's bytes (DataLoader workers) through flashfeed's DALI graph
  imagefolder+pil    one JPEG file per image, map-style Dataset, DataLoader workers
  decode-ceiling     the Loader's own pipeline (build_pipeline) fed from bytes in RAM

Every row has the same timer: it starts before the loader is constructed and stops at the
first batch after ``--min-seconds`` (epochs repeat until then), so construction, start-up
and epoch turns count the same for all. Each round also times one first epoch (from
construction to its last batch) of flashfeed and of the DALI reader.

plus the token loader's GB/s against a plain memory copy and a random-row gather of the same
bytes, and shuffle quality (label entropy per batch / ideal) on a class-sorted layout.
Prints a table and writes JSON. Not a timed test: run it by hand.

    python -m benchmarks.stages.loaderbench --images 5000 --out .bench/loader.json
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stages.loader_peers import (
    DaliReaderEpochs,
    dali_decode_ceiling,
    dali_webdataset_reader,
    imagefolder_loader,
    optional_peers,
    webdataset_dali,
    webdataset_loader,
)
from flashfeed.manifest import Manifest, commit_manifest
from flashfeed.shardio import shard_name, write_arrow_shard, write_tar_shard

BATCH = 64


def image_corpus(
    root: Path, images: int, seed: int, existing: str | None = None
) -> list[tuple[Path, int]]:
    """``(file, label)`` of the realistic corpus (benchmarks/harness/corpus.py), else synthetic."""
    folder = Path(existing) if existing else root / "corpus"
    try:
        if existing:
            raise ImportError(f"using the existing corpus {existing}")
        from benchmarks.harness.corpus import build_image_corpus, find_photos

        if len(find_photos()) < 8:
            raise ImportError("no photos installed")
        build_image_corpus(
            folder, size=int(images * 120e3), classes=50, seed=seed,
            workers=min(8, os.cpu_count() or 2),
        )  # fmt: skip
        kind = "photos (benchmarks/harness/corpus.py)"
    except (ImportError, SystemExit) as exc:
        kind = f"existing ImageFolder {existing}"
        if not existing:
            print(f"corpus.py unusable ({exc}); synthetic PIL JPEGs instead", file=sys.stderr)
            _synthetic(folder, images, seed)
            kind = "synthetic PIL JPEGs"
    files = sorted(folder.glob("class_*/*.jpg"))[:images]
    if len(files) < images:
        raise SystemExit(f"the corpus has {len(files)} images, {images} asked")
    print(f"corpus: {len(files)} images, {kind}", file=sys.stderr)
    return [(f, int(f.parent.name.split("_")[1])) for f in files]


def _synthetic(folder: Path, images: int, seed: int) -> None:
    from PIL import Image

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


def write_dataset(prefix: Path, files: list[tuple[Path, int]], shards: int, seed: int) -> list[str]:
    """A flashfeed webdataset dataset of the corpus, samples scattered as ingest does."""
    order = np.random.default_rng(seed).permutation(len(files))
    per = -(-len(files) // shards)
    infos = []
    for s in range(shards):
        picked = order[s * per : (s + 1) * per]
        samples = [
            (f"img-{i:07d}", {"jpg": files[i][0].read_bytes(), "cls": str(files[i][1]).encode()})
            for i in picked.tolist()
        ]
        infos.append(write_tar_shard(str(prefix), shard_name(s, "tar"), samples))
    m = Manifest(
        name="bench", shard_format="webdataset", schema={"jpg": "image", "cls": "label"},
        shards=tuple(infos),
    )  # fmt: skip
    commit_manifest(str(prefix), m, overwrite=True)
    return [str(prefix / i.path) for i in infos]


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and every live descendant, from /proc:
    a measure of work that the other tenants of a shared machine do not inflate as much as
    wall-clock throughput."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {os.getpid()}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(cpu.get(p, 0.0) for p in tree)


def batch_len(batch: Any) -> int:
    """Samples in a batch: a flashfeed/DALI dict (its keys) or a DataLoader's (images, ...)."""
    if isinstance(batch, dict):
        return len(batch["__key__"]) if "__key__" in batch else BATCH
    return len(batch[0])


def timed(make: Callable[[], Iterable[Any]], min_seconds: float) -> tuple[float, float, float]:
    """(images/s, CPU ms per image, seconds): the timer starts before ``make()`` constructs
    the loader and stops at the first batch after ``min_seconds``; epochs repeat until then.
    The same boundaries for every loader, construction included."""
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    loader = make()
    n = 0
    while True:
        got = 0
        for batch in loader:
            got += batch_len(batch)
            if time.perf_counter() - t0 >= min_seconds:
                break
        n += got
        if not got:
            raise RuntimeError("the loader gave no batch")
        if time.perf_counter() - t0 >= min_seconds:
            break
    wall, cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    del loader
    # tear down now, outside every timer: a pipeline or DataLoader left to a later garbage
    # collection joins its worker processes inside the next row's window (seen: ~10 s)
    gc.collect()
    return n / wall, 1000 * cpu / n, wall


def first_epoch(make: Callable[[], Iterable[Any]]) -> tuple[float, float]:
    """(images/s, CPU ms per image) of one epoch, the timer starting before ``make()``."""
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    loader = make()
    n = sum(batch_len(b) for b in loader)
    wall, cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    del loader
    gc.collect()
    return n / wall, 1000 * cpu / n


def rotated(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order: each round starts one name later, so no loader always runs first
    (after a conversion, beside a warm page cache) or last."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def image_rows(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from flashfeed.loader import Loader

    files = image_corpus(root, args.images, args.seed, args.corpus)
    prefix = root / "wds"
    shards = write_dataset(prefix, files, args.shards, args.seed)
    ram = files[: 40 * BATCH]
    jpegs, labels = [f.read_bytes() for f, _ in ram], [c for _, c in ram]
    dev, thr = args.device, args.threads

    def flashfeed() -> Iterable[Any]:
        return Loader(str(prefix), batch_size=BATCH, num_threads=thr, device=dev)

    loaders: dict[str, Callable[[], Iterable[Any]]] = {
        "flashfeed": flashfeed,
        "dali-reader": lambda: dali_webdataset_reader(
            shards, batch_size=BATCH, threads=thr, device=dev
        ),
        "wds+pil": lambda: webdataset_loader(shards, batch_size=BATCH, workers=thr),
        "wds+dali": lambda: webdataset_dali(
            shards, batch_size=BATCH, workers=thr, threads=thr, device=dev
        ),
        "imagefolder+pil": lambda: imagefolder_loader(files, batch_size=BATCH, workers=thr),
        "decode-ceiling": lambda: dali_decode_ceiling(
            jpegs, labels, batch_size=BATCH, threads=thr, device=dev
        ),
    }
    firsts: dict[str, Callable[[], Iterable[Any]]] = {
        "flashfeed": flashfeed,
        "dali-reader": lambda: DaliReaderEpochs(shards, batch_size=BATCH, threads=thr, device=dev),
    }
    first: dict[str, list[float]] = {k: [] for k in firsts}
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    cpu: dict[str, list[float]] = {k: [] for k in loaders}
    secs: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(args.rounds):
        for name in rotated(list(firsts), r):
            rate, ms = first_epoch(firsts[name])
            first[name].append(rate)
            print(f"round {r}: {name:16s} first epoch {rate:8.0f} img/s {ms:6.2f} CPU ms/img",
                  file=sys.stderr, flush=True)  # fmt: skip
        for name in rotated(list(loaders), r):
            rate, ms, wall = timed(loaders[name], args.min_seconds)
            rates[name].append(rate)
            cpu[name].append(ms)
            secs[name].append(wall)
            print(
                f"round {r}: {name:16s} {rate:8.0f} img/s {ms:6.2f} CPU ms/img {wall:5.1f} s",
                file=sys.stderr,
                flush=True,
            )
    return {
        "img_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "cpu_ms_per_img": {k: statistics.median(v) for k, v in cpu.items()},
        "first_epoch_img_per_s": {k: statistics.median(v) for k, v in first.items()},
        "rounds": {
            "img_per_s": rates,
            "cpu_ms_per_img": cpu,
            "seconds": secs,
            "first_epoch": first,
        },
        "timer": f"construction to the first batch after {args.min_seconds} s, rotated order",
    }


def token_rows(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """TokenLoader GB/s (stored int32, and widened to int64) vs memcpy and a row gather."""
    import pyarrow as pa

    from flashfeed.loader import TokenLoader

    prefix, seq, rows = root / "tokens", 2048, args.token_rows
    per = rows // 8
    if not (prefix / "manifest.json").exists():
        infos = []
        for s in range(8):
            vals = np.random.default_rng(s).integers(0, 50000, per * seq, dtype=np.int32)
            table = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(pa.array(vals), seq)})
            infos.append(write_arrow_shard(str(prefix), shard_name(s, "arrow"), table))
        m = Manifest(
            name="tok", shard_format="arrow", schema={"tokens": "int32"}, shards=tuple(infos)
        )
        commit_manifest(str(prefix), m, overwrite=True)
    out: dict[str, float] = {}
    for name, dtype in (("tokens-int32", None), ("tokens-int64", "int64")):
        loader = TokenLoader(str(prefix), batch_size=BATCH, dtype=dtype)
        passes = []
        for _ in range(args.rounds + 1):  # one pass per epoch; the first also maps pages in
            t0 = time.perf_counter()
            nbytes = sum(b["tokens"].numel() * 4 for b in loader)  # source bytes read
            passes.append(nbytes / (time.perf_counter() - t0) / 1e9)
        out[name] = statistics.median(passes[1:])
        out[name + " (first pass)"] = passes[0]
    src = np.random.default_rng(0).integers(0, 50000, (per * 8, seq), dtype=np.int32)
    dst = np.empty_like(src)
    copies = []
    for _ in range(3):  # the first copy also faults the destination pages in
        t0 = time.perf_counter()
        np.copyto(dst, src)
        copies.append(src.nbytes / (time.perf_counter() - t0) / 1e9)
    out["memcpy"] = max(copies)
    idx = np.random.default_rng(1).permutation(len(src))
    t0 = time.perf_counter()
    for i in range(0, len(idx), BATCH):
        np.take(src, idx[i : i + BATCH], axis=0)
    out["row-gather"] = src.nbytes / (time.perf_counter() - t0) / 1e9
    return out


def shuffle_rows() -> dict[str, dict[str, float]]:
    """Quality on a class-sorted ImageNet-sized layout (1000 classes in order over 1024
    shards of 1250): each loader's read order simulated from its shuffle algorithm."""
    from flashfeed.loader.shuffle_quality import (
        buffer_shuffle_order,
        plan_shuffle_quality,
        shuffle_quality,
    )

    sizes = [1250] * 1024
    labels = np.arange(sum(sizes)) * 1000 // sum(sizes)
    orders = {
        "flashfeed plan (window 4)": plan_shuffle_quality(sizes, labels, batch_size=BATCH),
        "flashfeed plan (window 16)": plan_shuffle_quality(
            sizes, labels, batch_size=BATCH, window=16
        ),
        "dali-reader (initial_fill 1024)": shuffle_quality(
            labels[buffer_shuffle_order(sizes, buffer_size=1024, shuffle_shards=False)],
            batch_size=BATCH,
        ),
        "wds (shardshuffle + shuffle(1000))": shuffle_quality(
            labels[buffer_shuffle_order(sizes, buffer_size=1000)], batch_size=BATCH
        ),
        "imagefolder (full permutation)": shuffle_quality(
            np.random.default_rng(0).permutation(labels), batch_size=BATCH
        ),
    }
    return {
        k: {"quality": q.quality, "classes_per_batch": q.classes_per_batch}
        for k, q in orders.items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--shards", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=5.0, help="timed window of each run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--token-rows", type=int, default=16384)
    p.add_argument("--corpus", help="an existing ImageFolder corpus (class_XXX/*.jpg) to use")
    p.add_argument("--work", default=".bench/loader")
    p.add_argument("--out", default=".bench/loader.json")
    args = p.parse_args(argv)
    root = Path(args.work)
    root.mkdir(parents=True, exist_ok=True)
    images = image_rows(args, root)
    tokens = token_rows(args, root)
    shuffle = shuffle_rows()
    peers = optional_peers()
    rate, cpu = images["img_per_s"], images["cpu_ms_per_img"]
    print(
        f"\nimage loaders, {args.images} images, batch {BATCH}, {args.threads} workers/threads,"
        f" device {args.device} (median of {args.rounds} interleaved rounds)"
    )
    print(
        f"{'loader':18s} {'img/s':>7s} {'vs dali-reader':>15s} {'vs wds+pil':>11s}"
        f" {'of ceiling':>11s} {'CPU ms/img':>11s}"
    )
    for name in rate:
        v = rate[name]
        print(
            f"{name:18s} {v:7.0f} {v / rate['dali-reader']:14.2f}x {v / rate['wds+pil']:10.2f}x"
            f" {100 * v / rate['decode-ceiling']:10.0f}% {cpu[name]:11.2f}"
        )
    firsts = images["first_epoch_img_per_s"]
    ratio = firsts["flashfeed"] / firsts["dali-reader"]
    rows = ", ".join(f"{k} {v:.0f}" for k, v in firsts.items())
    print(f"\nfirst epoch, construction timed (img/s): {rows}; flashfeed / dali-reader {ratio:.2f}")
    for name, why in peers.items():
        print(f"{name:18s} {why}")
    print(f"\ntoken loader, {args.token_rows} x 2048 int32 (GB/s of source bytes)")
    for k, v in tokens.items():
        print(f"{k:18s} {v:8.2f} GB/s  ({100 * v / tokens['memcpy']:.0f}% of memcpy)")
    print("\nshuffle quality, class-sorted ImageNet-sized layout (label entropy per batch / ideal)")
    for k, v in shuffle.items():
        print(f"{k:40s} {v['quality']:5.2f}  ({v['classes_per_batch']:.1f} classes per batch)")
    result = {"config": vars(args), "images": images, "tokens_gbps": tokens,
              "shuffle": shuffle, "optional_peers": peers}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

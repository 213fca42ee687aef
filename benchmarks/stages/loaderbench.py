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
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.corpus import image_corpus
from benchmarks.harness.datasets import image_dataset, token_dataset
from benchmarks.harness.peerloaders import (
    DaliReaderEpochs,
    dali_decode_ceiling,
    dali_webdataset_reader,
    imagefolder_loader,
    optional_peers,
    webdataset_dali,
    webdataset_loader,
)
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.timing import BATCH, first_epoch, timed


def image_rows(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from flashfeed.loader import Loader

    files = image_corpus(root, args.images, args.seed, args.corpus)
    prefix = root / "wds"
    shards = image_dataset(prefix, files, args.shards, seed=args.seed, overwrite=True)
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

    from flashfeed.loader import TokenLoader

    prefix, seq, per = root / "tokens", 2048, args.token_rows // 8
    token_dataset(prefix, rows=args.token_rows, seq_len=seq)
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
    from benchmarks.harness.shuffle_quality import (
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
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

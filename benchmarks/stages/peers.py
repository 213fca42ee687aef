"""Loader peers that need their own format: litdata and mosaicml-streaming, side by side with
flashfeed's Loader and webdataset + PIL on the same images, rounds interleaved in one process.

Each peer first converts the corpus with its own writer (``litdata.optimize``, mosaic's
``MDSWriter``; the seconds are reported), then every loader does the same work per image as
in loaderbench.py: decode, random-resized crop to 224, flip, normalize, NCHW float32,
batch 64, 2 DataLoader workers / DALI threads. A peer that does not import here is reported
as ``unavailable: <reason>``; the others still run.

The peers live in .bench-venv (``make bench-venv``), not in the product's environment.

    .bench-venv/bin/python -m benchmarks.stages.peers --corpus .bench/corpus --images 2000
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.corpus import image_corpus
from benchmarks.harness.datasets import image_dataset
from benchmarks.harness.peerloaders import pil_transform, webdataset_loader
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.timing import BATCH, timed

__all__ = ["litdata_loader", "mosaic_loader", "peer_loaders"]

Files = list[tuple[Path, int]]


def _sample(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": label}


def convert_litdata(files: Files, out: Path, workers: int) -> float:
    """Seconds of ``litdata.optimize`` writing the corpus as 64 MB chunks at ``out``."""
    from litdata import optimize

    shutil.rmtree(out, ignore_errors=True)
    method = multiprocessing.get_start_method()
    t0 = time.perf_counter()
    optimize(
        fn=_sample,
        inputs=[(str(p), c) for p, c in files],
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=workers,
    )
    secs = time.perf_counter() - t0
    # optimize switches the whole process to "spawn"; the other loaders run under the default
    multiprocessing.set_start_method(method, force=True)
    return secs


def convert_mosaic(files: Files, out: Path) -> float:
    """Seconds of mosaic's ``MDSWriter`` writing the corpus as 64 MB shards at ``out``."""
    from streaming import MDSWriter

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    with MDSWriter(
        out=str(out), columns={"jpg": "bytes", "cls": "int"}, size_limit=64 << 20
    ) as writer:
        for p, c in files:
            writer.write({"jpg": p.read_bytes(), "cls": c})
    return time.perf_counter() - t0


class DecodeBatch:
    """collate_fn: decode + augment each sample with PIL in the DataLoader worker."""

    def __init__(self) -> None:
        self.rng = random.Random()

    def __call__(self, samples: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = [pil_transform(s["jpg"], self.rng) for s in samples]
        return torch.stack(images), torch.tensor([int(s["cls"]) for s in samples])


def litdata_loader(root: Path, *, batch_size: int, workers: int) -> Iterable[Any]:
    """litdata's StreamingDataset (shuffled) + StreamingDataLoader, PIL in its workers."""
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(str(root), shuffle=True)
    return StreamingDataLoader(
        ds, batch_size=batch_size, num_workers=workers, collate_fn=DecodeBatch()
    )


def mosaic_loader(root: Path, *, batch_size: int, workers: int) -> Iterable[Any]:
    """mosaic's StreamingDataset (local, shuffled) + torch DataLoader, PIL in its workers."""
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    ds = StreamingDataset(local=str(root), shuffle=True, batch_size=batch_size)
    return DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=DecodeBatch())


def peer_loaders(
    files: Files, work: Path, *, batch_size: int, workers: int
) -> tuple[dict[str, Callable[[], Iterable[Any]]], dict[str, float], dict[str, str]]:
    """(name -> loader factory, name -> conversion seconds, name -> why unavailable)."""
    makers: dict[str, Callable[[], Iterable[Any]]] = {}
    convert: dict[str, float] = {}
    missing: dict[str, str] = {}
    lit, mds = work / "litdata", work / "mds"
    for name, conv, make in (
        (
            "litdata",
            lambda: convert_litdata(files, lit, workers),
            lambda: litdata_loader(lit, batch_size=batch_size, workers=workers),
        ),
        (
            "mosaicml-streaming",
            lambda: convert_mosaic(files, mds),
            lambda: mosaic_loader(mds, batch_size=batch_size, workers=workers),
        ),
    ):
        try:
            convert[name] = conv()  # imports the peer: one that cannot run says why here
            makers[name] = make
        except Exception as exc:
            missing[name] = f"unavailable: {type(exc).__name__}: {str(exc)[:160]}"
    return makers, convert, missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", default=".bench/corpus")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--shards", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=5.0, help="timed window of each run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default=".bench/peers")
    p.add_argument("--out", default=".bench/peers.json")
    args = p.parse_args(argv)
    from flashfeed.loader import Loader

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    files = image_corpus(work, args.images, 0, args.corpus)
    shards = image_dataset(work / "wds", files, args.shards, seed=0, overwrite=True)
    makers, convert, missing = peer_loaders(files, work, batch_size=BATCH, workers=args.threads)
    loaders: dict[str, Callable[[], Iterable[Any]]] = {
        "flashfeed": lambda: Loader(
            str(work / "wds"), batch_size=BATCH, num_threads=args.threads, device="cpu"
        ),
        "wds+pil": lambda: webdataset_loader(shards, batch_size=BATCH, workers=args.threads),
        **makers,
    }
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    cpu: dict[str, list[float]] = {k: [] for k in loaders}
    for r in range(args.rounds):
        for name in rotated(list(loaders), r):
            try:
                rate, ms, _ = timed(loaders[name], args.min_seconds)
            except Exception as exc:
                missing[name] = f"unavailable: {type(exc).__name__}: {str(exc)[:160]}"
                del loaders[name], rates[name], cpu[name]
                continue
            rates[name].append(rate)
            cpu[name].append(ms)
            print(f"round {r}: {name:20s} {rate:8.0f} img/s {ms:6.2f} CPU ms/img", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{'loader':20s} {'img/s':>7s} {'vs flashfeed':>13s} {'convert s':>10s}")
    for name, v in med.items():
        conv = f"{convert[name]:10.1f}" if name in convert else f"{'':10s}"
        print(f"{name:20s} {v:7.0f} {v / med['flashfeed']:12.2f}x {conv}")
    for name, why in missing.items():
        print(f"{name:20s} {why}")
    out = {
        "config": vars(args),
        "img_per_s": med,
        "rounds": {"img_per_s": rates, "cpu_ms_per_img": cpu},
        "convert_s": convert,
        "unavailable": missing,
    }
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What feeding DALI through ``external_source`` costs against DALI's native webdataset
reader, with no flashfeed code in the feed: the bound on any loader that hands DALI samples
in an order of its own (a seeded plan, exact resume), the Loader among them.

Every way runs the Loader's operators (ROI crop decode, resize, flip, normalise to float
CHW; ``default_image_pipeline``) on the same tars, with the same threads, prefetch and
dynamic executor, and converts each image batch as DALI's PyTorch iterator does. Epochs of
all ways alternate in one process, the order reversed every other round, and each way is
compared with the reader epoch by epoch (every pipeline keeps running across its epochs, as
the reader does, so none starts an epoch with more batches in flight than another):

  reader             fn.readers.webdataset over the tars and their index files, its shuffle
                     buffer (initial_fill 1024): what a user writes with DALI alone
  ram, shuffled      fn.external_source(no_copy=True) fed each image's bytes from RAM,
                     the whole set shuffled once, batch after batch
  ram, tar order     the same, the images in the order the tars hold them (as the reader
                     reads them before its shuffle buffer)
  ram, + label, key  ram, shuffled with an int64 label array and each sample's key bytes as
                     two more outputs, the layout the Loader feeds

Prints img/s and CPU ms per image (this process) per way and each way's ratio to the reader
(median of the per-epoch ratios, with their min-max); ``--out PATH`` writes them as JSON.

    python -m benchmarks.stages.extsource --tars .bench/targets/wds-100MiB --rounds 6
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.peerloaders import dali_iterator_conversion
from benchmarks.harness.results import write_json
from benchmarks.harness.timing import BATCH

__all__ = ["WAYS", "main"]

#: way -> (images in tar order, label and key outputs)
WAYS = {
    "ram, shuffled": (False, False),
    "ram, tar order": (True, False),
    "ram, + label, key": (False, True),
}


def _read_images(tars: list[str]) -> list[np.ndarray]:
    """Every sample's ``.jpg`` in ``tars``, in the order the tars hold them."""
    from flashfeed.format.tarshard import iter_samples

    images = []
    for path in tars:
        with open(path, "rb") as f:
            for _, fields in iter_samples(f, source=path):
                if "jpg" in fields:
                    images.append(np.frombuffer(fields["jpg"], np.uint8))
    return images


class _RamFeed:
    """``external_source`` callback: batch ``i`` of ``images`` (cycling), with an int64 label
    array and key bytes when ``extra``."""

    def __init__(self, images: list[np.ndarray], extra: bool) -> None:
        self.images = images
        self.extra = extra
        self.labels = np.zeros(BATCH, np.int64)
        self.keys = [np.frombuffer(f"{i:09d}".encode(), np.uint8) for i in range(len(images))]

    def __call__(self, info: Any) -> tuple[Any, ...]:
        lo = int(info.iteration) % (len(self.images) // BATCH) * BATCH  # whole epochs
        batch = self.images[lo : lo + BATCH]
        if not self.extra:
            return (batch,)
        return batch, self.labels, self.keys[lo : lo + BATCH]


def _pipeline(
    tars: list[str], images: list[np.ndarray] | None, extra: bool, threads: int, prefetch: int
) -> Any:
    """The reader's pipeline (``images`` None) or one fed from RAM, the Loader's operators."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    from flashfeed.loader.image.pipeline import AugmentOptions, default_image_pipeline

    pipe = Pipeline(
        batch_size=BATCH, num_threads=threads, device_id=None, prefetch_queue_depth=prefetch,
        exec_dynamic=True,
    )  # fmt: skip
    with pipe:
        if images is None:
            jpg, cls = fn.readers.webdataset(
                paths=tars, index_paths=[t + ".idx" for t in tars], ext=["jpg", "cls"],
                random_shuffle=True, initial_fill=1024,
            )  # fmt: skip
            rest = [cls]
        else:
            got = fn.external_source(
                source=_RamFeed(images, extra), num_outputs=3 if extra else 1, batch=True,
                batch_info=True, no_copy=True,
                dtype=[types.UINT8, types.INT64, types.UINT8] if extra else [types.UINT8],
            )  # fmt: skip
            jpg, rest = got[0], list(got[1:])
        out = default_image_pipeline({"image": jpg}, AugmentOptions(device="cpu"))
        pipe.set_outputs(out["image"], *rest)
    pipe.build()
    return pipe


def _epoch(pipe: Any, batches: int, convert: Callable[[Any, Any], Any]) -> tuple[float, float]:
    """(img/s, CPU ms per image) of ``batches`` batches, each image batch converted."""
    c0, t0 = sum(os.times()[:2]), time.perf_counter()
    for _ in range(batches):
        convert(pipe.run()[0], None)
    secs, cpu = time.perf_counter() - t0, sum(os.times()[:2]) - c0
    return batches * BATCH / secs, 1e3 * cpu / (batches * BATCH)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tars", required=True, help="a folder of webdataset tars with .idx files")
    ap.add_argument("--rounds", type=int, default=6, help="epochs per way (default: 6)")
    ap.add_argument("--threads", type=int, default=2, help="DALI threads (default: 2)")
    ap.add_argument("--prefetch", type=int, default=2, help="prefetch queue depth (default: 2)")
    ap.add_argument("--out", default=None, help="write the epochs and ratios as JSON here")
    args = ap.parse_args(argv)
    for name in ("rounds", "threads", "prefetch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    tars = sorted(str(t) for t in Path(args.tars).glob("*.tar"))
    if not tars or not all(Path(t + ".idx").exists() for t in tars):
        ap.error(f"--tars {args.tars}: needs .tar files, each with its .idx (wds2idx format)")
    in_order = _read_images(tars)
    shuffled = list(in_order)
    random.Random(0).shuffle(shuffled)
    batches = len(in_order) // BATCH
    pipes = {"reader": _pipeline(tars, None, False, args.threads, args.prefetch)}
    for way, (tar_order, extra) in WAYS.items():
        feed = in_order if tar_order else shuffled
        pipes[way] = _pipeline(tars, feed, extra, args.threads, args.prefetch)
    convert = dali_iterator_conversion()
    for pipe in pipes.values():  # start-up and the first touch of every buffer, untimed
        _epoch(pipe, batches, convert)
    epochs: dict[str, list[tuple[float, float]]] = {way: [] for way in pipes}
    for r in range(args.rounds):
        for way in list(pipes) if r % 2 == 0 else list(pipes)[::-1]:
            epochs[way].append(_epoch(pipes[way], batches, convert))
            print(f"round {r}: {way}: {epochs[way][-1][0]:.0f} img/s", file=sys.stderr)
    result: dict[str, Any] = {"images": len(in_order), "tars": len(tars), "ways": {}}
    print(f"{len(in_order)} images in {len(tars)} tars, batch {BATCH}, {args.threads} threads, "
          f"prefetch {args.prefetch}, {args.rounds} epochs per way")  # fmt: skip
    print(f"{'way':<20} {'img/s':>7} {'CPU ms':>7}   speed vs reader     CPU vs reader")
    for way, got in epochs.items():
        speed = [a[0] / b[0] for a, b in zip(got, epochs["reader"], strict=True)]
        cpu = [a[1] / b[1] for a, b in zip(got, epochs["reader"], strict=True)]
        row = {
            "img_s": statistics.median(g[0] for g in got),
            "cpu_ms": statistics.median(g[1] for g in got),
            "speed_vs_reader": [statistics.median(speed), min(speed), max(speed)],
            "cpu_vs_reader": [statistics.median(cpu), min(cpu), max(cpu)],
            "epochs": got,
        }
        result["ways"][way] = row
        s, c = row["speed_vs_reader"], row["cpu_vs_reader"]
        print(f"{way:<20} {row['img_s']:7.0f} {row['cpu_ms']:7.3f}   {s[0]:.3f} ({s[1]:.3f}-"
              f"{s[2]:.3f})   {c[0]:.3f} ({c[1]:.3f}-{c[2]:.3f})")  # fmt: skip
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What handing a batch to DALI costs the loader's process: the Loader's external source fed
batches as its ``BatchSource`` makes them for a dataset read in place (per sample a view into
a memory-mapped file, one int64 label array per batch, each sample's key), through a
pipeline that decodes nothing (the images' shapes, the labels and the keys come out), the
keys read back as the Loader reads them. Four ways, in one process, the order rotating
every round:

  copy, key list        DALI copies each batch; the keys a list of per-sample arrays
  copy, key column      DALI copies each batch; the keys one NUL-padded array (key_column)
  in place, key list    external_source(no_copy=True), the source holding its last batches
  in place, key column  the Loader's way for a dataset read in place

Prints CPU microseconds per image (the whole process: DALI's threads and this one) and
each way's ratio to ``copy, key list``; ``--out PATH`` also writes the rounds as JSON.

    python -m benchmarks.stages.feedcost --batches 400 --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import gc
import mmap
import os
import resource
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness.results import write_json
from flashfeed.loader.image.convert import to_keys
from flashfeed.loader.image.fields import key_bytes, key_column
from flashfeed.loader.image.pipeline import shared_batches

__all__ = ["WAYS", "main", "measure"]

#: (name, DALI reads in place, keys as one column)
WAYS = (
    ("copy, key list", False, False),
    ("copy, key column", False, True),
    ("in place, key list", True, False),
    ("in place, key column", True, True),
)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _source(
    views: list[np.ndarray], keys: list[np.ndarray], *, batch: int, column: bool, keep: int
) -> Callable[[Any], tuple[Any, ...]]:
    """Batches of random samples as ``BatchSource`` hands them on; the last ``keep`` held."""
    rng = np.random.default_rng(0)
    held: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=max(keep, 1))

    def source(info: Any) -> tuple[Any, ...]:
        pick = rng.integers(0, len(views), batch).tolist()
        picked = [keys[i] for i in pick]
        out = (
            [views[i] for i in pick],
            np.array([i % 1000 for i in pick], np.int64),
            key_column(picked) if column else picked,
        )
        held.append(out)
        return out

    return source


def measure(
    views: list[np.ndarray], keys: list[np.ndarray], *, shared: bool, column: bool, batches: int
) -> float:
    """CPU microseconds per image of ``batches`` batches of 64 (after 10 untimed)."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    prefetch = 2
    pipe = Pipeline(
        batch_size=64, num_threads=2, device_id=None, prefetch_queue_depth=prefetch,
        exec_dynamic=True,
    )  # fmt: skip
    source = _source(
        views, keys, batch=64, column=column, keep=shared_batches(prefetch) if shared else 0
    )
    with pipe:
        images, labels, names = fn.external_source(
            source=source, num_outputs=3, batch=True, batch_info=True, no_copy=shared,
            dtype=[types.UINT8, types.INT64, types.UINT8],
        )  # fmt: skip
        pipe.set_outputs(images.shape(), labels, names)
    pipe.build()
    for _ in range(10):
        to_keys(pipe.run()[2])
    c0 = _cpu()
    for _ in range(batches):
        to_keys(pipe.run()[2])
    return 1e6 * (_cpu() - c0) / (64 * batches)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batches", type=int, default=400, help="timed batches of 64 per way")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=1000, help="samples in the mapped file")
    ap.add_argument("--sample-kib", type=int, default=90, help="bytes of each sample, KiB")
    ap.add_argument("--out", default=None, help="write the rounds as JSON here")
    args = ap.parse_args(argv)
    for name in ("batches", "rounds", "samples", "sample_kib"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    size = args.sample_kib << 10
    rounds: dict[str, list[float]] = {name: [] for name, _, _ in WAYS}
    with tempfile.TemporaryDirectory(prefix="feedcost-") as tmp:
        path = os.path.join(tmp, "shard.bin")
        with open(path, "wb") as f:
            f.write(np.random.default_rng(1).bytes(size * args.samples))
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            whole = np.frombuffer(m, np.uint8)
            views = [whole[i * size : (i + 1) * size] for i in range(args.samples)]
            keys = [key_bytes("shards/000000.tar", f"sample{i:07d}") for i in range(args.samples)]
            for r in range(args.rounds):
                for name, shared, column in WAYS[r % 4 :] + WAYS[: r % 4]:
                    rounds[name].append(
                        measure(views, keys, shared=shared, column=column, batches=args.batches)
                    )
            del views, whole
            gc.collect()  # the pipelines, and the views their sources held: then unmap
    median = {name: statistics.median(v) for name, v in rounds.items()}
    base = median[WAYS[0][0]]
    print(f"CPU us per image, {args.rounds} rounds of {args.batches} batches of 64 "
          f"({args.sample_kib} KiB samples)")  # fmt: skip
    for name, value in median.items():
        print(f"{name:<22} {value:8.2f}   x{value / base:.2f} of {WAYS[0][0]}")
    if args.out:
        write_json(args.out, {"rounds": rounds, "median_us_per_image": median,
                              "ratio_vs_copy_list": {n: v / base for n, v in median.items()},
                              "batches": args.batches, "sample_kib": args.sample_kib})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

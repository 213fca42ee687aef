"""A cold restart with a start-up of its own: does ``start_fetching()`` hide the first download?

A restarted job builds its loader, then spends a while on its own start-up (the model, the
checkpoint, the process group) before its first batch. The same photos as the targets stage
(webdataset ``ShardWriter`` shards of ``--shard-mib``, adopted with ``flashfeed index``) sit
on a private SeaweedFS; each round restarts it and empties the cache, then runs, in an order
that rotates every round:

  at-iter   ``Loader(...)``, the job's start-up, then the epoch: the fetches start at ``iter()``
  early     ``Loader(...)``, ``start_fetching()``, the job's start-up, then the epoch

The job's start-up is ``--startup`` seconds of either a sleep (``--busy 0``: waiting on the
network or another process) or work on this process's CPU (``--busy 1``: a model built on
the CPU, here torch filling tensors with random numbers), so the download competes with it.
Printed per row: seconds from the start-up's end to the first batch, the epoch's storage
wait, and the seconds from ``Loader(...)`` to the last batch; medians over the rounds.

    python -m benchmarks.stages.earlyfetch --corpus .bench/corpus --mb 256 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.corpus import pick_images
from benchmarks.harness.datasets import shardwriter_dataset
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.store import start_store, upload_tree
from benchmarks.harness.timing import BATCH

ROWS = ("at-iter", "early")


def job_startup(seconds: float, busy: bool) -> None:
    """The job's own start-up: a sleep, or ``seconds`` of CPU work (building a model)."""
    if not busy:
        time.sleep(seconds)
        return
    import torch

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.nn.init.kaiming_uniform_(torch.empty(1024, 1024))


def one(url: str, cache: Path, *, early: bool, startup: float, busy: bool, thr: int) -> dict:
    from flashfeed.loader import Loader

    t0 = time.perf_counter()
    loader = Loader(url, batch_size=BATCH, num_threads=thr, cache_dir=str(cache))
    if early:
        loader.start_fetching()
    job_startup(startup, busy)
    ready = time.perf_counter()
    first = None
    for _ in loader:
        if first is None:
            first = time.perf_counter() - ready
    stats = loader.stats()
    loader.close()
    return {
        "first_batch_after_startup_s": first,
        "storage_wait_s": stats["wait_s"]["storage"],
        "loader_to_last_batch_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", required=True, help="folder of class_*/ photos (corpus.py)")
    p.add_argument("--mb", type=int, default=256, help="MiB of photos to use")
    p.add_argument("--shard-mib", type=int, default=64, help="shard size, MiB")
    p.add_argument("--startup", type=float, default=1.0, help="the job's start-up, seconds")
    p.add_argument("--busy", type=int, choices=(0, 1), default=1, help="start-up on the CPU")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default=".bench/earlyfetch")
    p.add_argument("--json", metavar="PATH", help="also write the rounds here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.startup < 0:
        p.error("--rounds must be >= 1 and --startup >= 0")
    import nvidia.dali.fn  # noqa: F401  (imported before any timer, as a job imports it)

    work = Path(args.work)
    layout = work / f"wds-{args.shard_mib}MiB"
    work.mkdir(parents=True, exist_ok=True)
    shardwriter_dataset(pick_images(Path(args.corpus), args.mb << 20), layout, args.shard_mib)
    scratch = Path(tempfile.mkdtemp(prefix="ffearly-", dir="/tmp"))
    bs = start_store(scratch, bucket="flashfeed", export_env=True)
    rounds: dict[str, list[dict[str, Any]]] = {r: [] for r in ROWS}
    try:
        bucket = bs.bucket
        url = f"{bucket}/wds"
        upload_tree(layout, url)
        for r in range(args.rounds):
            for row in rotated(list(ROWS), r):
                bs.restart()
                time.sleep(2.0)  # let the restarted server settle before the timer
                cache = scratch / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                got = one(url, cache, early=row == "early", startup=args.startup,
                          busy=bool(args.busy), thr=args.threads)  # fmt: skip
                rounds[row].append(got)
                print(f"round {r}: {row} {json.dumps(got)}", file=sys.stderr, flush=True)
    finally:
        bs.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    kind = "CPU work" if args.busy else "a sleep"
    print(f"{args.mb} MiB in {args.shard_mib} MiB shards; job start-up: {args.startup:g} s of "
          f"{kind}; medians of {args.rounds} rounds")  # fmt: skip
    print(f"{'row':<10}{'first batch after start-up':>28}{'storage wait':>14}{'to last batch':>15}")
    for row in ROWS:
        med = {k: statistics.median(g[k] for g in rounds[row]) for k in rounds[row][0]}
        first, wait = med["first_batch_after_startup_s"], med["storage_wait_s"]
        total = med["loader_to_last_batch_s"]
        print(f"{row:<10}{first:>26.3f} s{wait:>12.3f} s{total:>13.3f} s")
    if args.json:
        write_json(args.json, {"config": vars(args), "rounds": rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stalls over time: flashfeed's Loader reading a photo dataset from a private SeaweedFS
server through an empty node cache for two epochs, logging every batch (``stats_log=``).

The first epoch fetches shards as it goes (storage waits), the second reads the cache
(decode-bound on CPU). Prints the summary per epoch and writes JSON plus the raw log.

    python -m benchmarks.stages.stalls --corpus .bench/corpus --images 2000 --out .bench/stalls.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.datasets import image_dataset
from benchmarks.harness.results import write_json
from benchmarks.harness.store import start_store

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", default=".bench/corpus")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--log", default=".bench/stalls.jsonl")
    p.add_argument("--out", default=".bench/stalls.json")
    args = p.parse_args(argv)

    from flashfeed.loader import Loader
    from flashfeed.monitor.report import read_stats_log, summarize

    files = sorted(Path(args.corpus).glob("class_*/*.jpg"))[: args.images]
    if len(files) < args.images:
        raise SystemExit(f"{args.corpus} has {len(files)} images, {args.images} asked")
    work = tempfile.mkdtemp(prefix="ffstall-", dir="/tmp")
    bs = start_store(work, bucket="stalls")
    Path(args.log).unlink(missing_ok=True)
    try:
        opts = bs.opts
        labelled = [(f, int(f.parent.name.split("_")[1])) for f in files]
        image_dataset("s3://stalls/ds", labelled, args.shards, name="stalls", storage_options=opts)
        loader = Loader(
            "s3://stalls/ds",
            batch_size=64,
            storage_options=opts,
            cache_dir=os.path.join(work, "cache"),
            num_threads=args.threads,
            py_workers=1,
            stats_log=args.log,
            seed=0,
        )
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        loader.close()
    finally:
        bs.stop()
        shutil.rmtree(work, ignore_errors=True)
    records = read_stats_log(args.log)
    per_epoch = {}
    for epoch in sorted({int(r.get("epoch", 0)) for r in records}):
        per_epoch[str(epoch)] = summarize([r for r in records if int(r.get("epoch", 0)) == epoch])
    print(f"{'epoch':>5} {'img/s':>8} {'storage':>8} {'decode':>8} {'h2d':>6}  (wait fractions)")
    for e, s in per_epoch.items():
        print(
            f"{e:>5} {s['samples_per_s']:8.0f} {s['storage_fraction']:8.1%}"
            f" {s['decode_fraction']:8.1%} {s['h2d_fraction']:6.1%}"
        )
    out = {
        "images": args.images,
        "shards": args.shards,
        "log": args.log,
        "epochs": per_epoch,
        "records": records,
    }
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

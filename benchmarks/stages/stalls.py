"""Stalls over time: flashfeed's Loader reading a photo dataset from a private SeaweedFS
server through an empty node cache for two epochs, logging every batch (``stats_log=``).

The first epoch fetches shards as it goes (storage waits), the second reads the cache
(decode-bound on CPU). Prints the summary per epoch and writes JSON plus the raw log.

    python -m benchmarks.stages.stalls --corpus .bench/corpus --images 2000 --out .bench/stalls.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main"]


def upload_dataset(prefix: str, files: list[Path], shards: int, opts: dict[str, Any]) -> None:
    """``files`` (class_XXX/*.jpg) as ``shards`` scattered tar shards committed at ``prefix``."""
    from flashfeed import Manifest, commit_manifest
    from flashfeed.shardio import shard_name, write_tar_shard

    order = np.random.default_rng(0).permutation(len(files))
    per = -(-len(files) // shards)
    infos = []
    for s in range(shards):
        samples = [
            (
                f"img-{i:07d}",
                {
                    "jpg": files[i].read_bytes(),
                    "cls": files[i].parent.name.split("_")[1].lstrip("0").encode() or b"0",
                },
            )
            for i in order[s * per : (s + 1) * per].tolist()
        ]
        infos.append(write_tar_shard(prefix, shard_name(s, "tar"), samples, storage_options=opts))
    m = Manifest(
        name="stalls",
        shard_format="webdataset",
        schema={"jpg": "image", "cls": "label"},
        shards=tuple(infos),
    )
    commit_manifest(prefix, m, storage_options=opts)


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
    from flashfeed.loader.report import read_stats_log, summarize
    from flashfeed.store import EmbeddedStore

    files = sorted(Path(args.corpus).glob("class_*/*.jpg"))[: args.images]
    if len(files) < args.images:
        raise SystemExit(f"{args.corpus} has {len(files)} images, {args.images} asked")
    work = tempfile.mkdtemp(prefix="ffstall-", dir="/tmp")
    store = EmbeddedStore(os.path.join(work, "store"), port=0)
    Path(args.log).unlink(missing_ok=True)
    try:
        store.start()
        store.make_bucket("stalls")
        opts = store.info.storage_options()
        upload_dataset("s3://stalls/ds", files, args.shards, opts)
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
        store.stop()
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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

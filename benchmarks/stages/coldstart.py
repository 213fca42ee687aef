"""Cold-start benchmark: the first epoch from S3 against local disk and the peers.

Same corpus and work as loaderbench.py (photo JPEGs, decode + random-resized crop to
224 + flip + normalize, batch 64, 2 threads/workers). Each round restarts the embedded
SeaweedFS server and empties the cache, then runs, interleaved:

  ff-s3-first       flashfeed Loader, first epoch from S3 (empty node cache)
  ff-s3-second      the same loader's second epoch (cache hot)
  ff-local          flashfeed Loader on the dataset on local disk
  dali-s3           DALI fn.readers.webdataset reading s3:// directly (AWS_* env vars)
  wds-http          webdataset over presigned HTTP URLs + PIL in DataLoader workers
  ff-s3-2x-capacity flashfeed from S3 with a cache half the dataset's size, 2 epochs
                    (every epoch streams; reported against ff-local). The same images in
                    --shards-2x shards (40): with 10 shards the cache would hold 5, and the
                    plan's window of 4 shards read at once would leave room for 1 ahead

Throughput is a whole epoch: images / seconds from creating the loader to its last batch,
for every row (flashfeed's timers include ``Loader(...)`` too; a second epoch is timed from
the end of the first). The order of the runs rotates each round.
Prints a table and writes JSON. Not a timed test: run it by hand.

    python -m benchmarks.stages.coldstart --out .bench/coldstart.json
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.harness.corpus import image_corpus
from benchmarks.harness.datasets import image_dataset
from benchmarks.harness.peerloaders import dali_webdataset_reader, optional_peers, webdataset_loader
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.store import start_store, upload_tree
from benchmarks.harness.timing import BATCH
from flashfeed import storage


def epoch_rate(make: Callable[[], Iterable[Any]], images: int) -> float:
    t0 = time.perf_counter()
    n = 0
    for _ in make():
        n += BATCH
        if n >= images:
            break
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--shards", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shards-2x", type=int, default=40, help="shards of the 2x-capacity run")
    p.add_argument("--corpus", default=".bench/corpus", help="an ImageFolder corpus to use")
    p.add_argument("--work", default=".bench/loader")
    p.add_argument("--out", default=".bench/coldstart.json")
    args = p.parse_args(argv)
    from flashfeed.loader import Loader

    root = Path(args.work)
    local = root / "wds"
    if not (local / "manifest.json").exists():
        files = image_corpus(root, args.images, args.seed, args.corpus)
        image_dataset(local, files, args.shards, seed=args.seed, overwrite=True)
    local2x = root / f"wds{args.shards_2x}"  # the same images in more, smaller shards
    if not (local2x / "manifest.json").exists():
        files = image_corpus(root, args.images, args.seed, args.corpus)
        image_dataset(local2x, files, args.shards_2x, seed=args.seed, overwrite=True)
    from flashfeed import Dataset

    m = Dataset.open(str(local)).manifest
    shard_rel = [s.path for s in m.shards]
    images, total = int(m.num_samples), int(m.num_bytes)
    batches = images // BATCH
    scratch = Path(tempfile.mkdtemp(prefix="ffcold-", dir="/tmp"))
    bs = start_store(scratch, bucket="flashfeed", export_env=True)
    rates: dict[str, list[float]] = {}
    extra: dict[str, list[Any]] = {"first_epoch_storage_waits": [], "2x_capacity_epochs": []}
    thr = args.threads
    try:
        bucket = bs.bucket
        url = f"{bucket}/coldstart"
        upload_tree(local, url)
        upload_tree(local2x, url + "-2x")
        fs, path = storage.filesystem(url)
        shard_paths = [f"{url}/{rel}" for rel in shard_rel]
        from flashfeed.cache import ShardCache

        def ff_s3() -> dict[str, float]:
            cache_dir = scratch / "cache"
            shutil.rmtree(cache_dir, ignore_errors=True)
            out: dict[str, float] = {}
            t0 = time.perf_counter()  # construction inside the timer, as for every row
            ff = Loader(url, batch_size=BATCH, num_threads=thr, cache_dir=str(cache_dir))
            n = sum(BATCH for _ in ff)
            out["ff-s3-first"] = n / (time.perf_counter() - t0)
            first = ff.stats()
            extra["first_epoch_storage_waits"].append(
                {"batches": first["batches_waited_on_storage"], "of": first["batches"],
                 "seconds": first["wait_s"]["storage"]}
            )  # fmt: skip
            t0 = time.perf_counter()
            n = sum(BATCH for _ in ff)
            out["ff-s3-second"] = n / (time.perf_counter() - t0)
            ff.close()
            return out

        def ff_local() -> dict[str, float]:
            return {
                "ff-local": epoch_rate(
                    lambda: Loader(str(local), batch_size=BATCH, num_threads=thr), images
                )
            }

        def dali_s3() -> dict[str, float]:
            return {
                "dali-s3": epoch_rate(
                    lambda: dali_webdataset_reader(
                        shard_paths, batch_size=BATCH, threads=thr, device="cpu", batches=batches
                    ),
                    images,
                )
            }

        def wds_http() -> dict[str, float]:
            urls = [fs.url(f"{path}/{rel}", expires=3600) for rel in shard_rel]
            return {
                "wds-http": epoch_rate(
                    lambda: webdataset_loader(urls, batch_size=BATCH, workers=thr), images
                )
            }

        def ff_2x() -> dict[str, float]:
            small = scratch / "cache-2x"
            shutil.rmtree(small, ignore_errors=True)
            epochs = []
            t0 = time.perf_counter()
            cache = ShardCache(str(small), capacity=total // 2)
            two = Loader(url + "-2x", batch_size=BATCH, num_threads=thr, cache=cache)
            for _ in range(2):
                n = sum(BATCH for _ in two)
                epochs.append(n / (time.perf_counter() - t0))
                t0 = time.perf_counter()
            stats = cache.stats()
            two.close()
            cache.close()
            extra["2x_capacity_epochs"].append(
                {"img_per_s": epochs, "bytes_fetched": stats["bytes_fetched"],
                 "evictions": stats["evictions"]}
            )  # fmt: skip
            return {"ff-s3-2x-capacity": statistics.median(epochs)}

        runs: dict[str, Callable[[], dict[str, float]]] = {
            "ff-s3": ff_s3, "ff-local": ff_local, "dali-s3": dali_s3, "wds-http": wds_http,
            "ff-2x": ff_2x,
        }  # fmt: skip
        for r in range(args.rounds):
            bs.restart()
            time.sleep(2.0)  # let the restarted server settle before the first run is timed
            row: dict[str, float] = {}
            for name in rotated(list(runs), r):  # the order rotates each round
                row.update(runs[name]())
            for k2, v in row.items():
                rates.setdefault(k2, []).append(v)
            print(f"round {r}: " + ", ".join(f"{k2} {v:.0f}" for k2, v in row.items()),
                  file=sys.stderr, flush=True)  # fmt: skip
    finally:
        bs.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    local_rate, peers = med["ff-local"], max(med["dali-s3"], med["wds-http"])
    print(
        f"\ncold start, {images} images ({total / 1e6:.0f} MB in {len(shard_paths)} shards), "
        f"batch {BATCH}, {thr} threads, whole epochs, median of {args.rounds} rounds"
    )
    print(f"{'loader':20s} {'img/s':>7s} {'of ff-local':>12s} {'vs best peer cold':>18s}")
    for k, v in med.items():
        print(f"{k:20s} {v:7.0f} {v / local_rate:11.2f}x {v / peers:17.2f}x")
    for name, why in optional_peers().items():
        print(f"{name:20s} {why}")
    result = {"config": vars(args), "img_per_s": med, "rounds": rates, **extra,
              "optional_peers": optional_peers()}  # fmt: skip
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

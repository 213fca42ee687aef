"""``make demo`` (``python examples/demo.py``): the whole path on one machine, from nothing,
with embedded defaults. It uses flashfeed as a user would, from outside the package; it
is not part of the installed package.

1. start the embedded S3 server (SeaweedFS on 127.0.0.1) in ``.demo/store``;
2. build a small labelled JPEG corpus (ImageFolder layout) in ``.demo/corpus``;
3. ingest it on a local Ray into ``s3://flashfeed/demo/images`` (WebDataset tar + .idx);
4. inspect and verify the committed dataset;
5. warm the node-local cache with exactly the shards this node will read;
6. train-loop two epochs through the DALI loader from an empty cache: the first epoch
   streams from the store (cold), the second reads the node cache (hot); samples/s of each,
   batches that waited on storage and stall fractions.

The store is stopped on exit, also on SIGTERM or an error; Ctrl-C at any step prints one
line, stops every process the demo started (store, Ray, DALI readers) and exits 130.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from flashfeed.cli.devstore import EmbeddedStore
from flashfeed.runtime.interrupt import exit_on_interrupt


def _say(step: str, text: str = "") -> None:
    print(f"\n== {step}" + (f": {text}" if text else ""), flush=True)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python examples/demo.py",
        description="Run ingest -> verify -> cache warm -> DALI loader end to end on a local "
        "S3 server and a local Ray, with a generated sample corpus.",
    )
    p.add_argument("--workdir", default=".demo", help="scratch dir, emptied first (%(default)s)")
    p.add_argument("--classes", type=int, default=10, help="classes in the corpus (%(default)s)")
    p.add_argument("--per-class", type=int, default=64, help="images per class (%(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="loader epochs (%(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="loader batch size (%(default)s)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    signal.signal(signal.SIGTERM, _on_sigterm)
    if argv is None:  # the real command line, not a caller's process
        exit_on_interrupt("flashfeed demo")
    work = Path(args.workdir).absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store = EmbeddedStore(work / "store")
    try:
        _say("object store", "starting SeaweedFS on 127.0.0.1")
        info = store.start()
        bucket = store.make_bucket("flashfeed")
        os.environ.update(info.env())
        print(f"S3 endpoint {info.endpoint}, bucket {bucket}")
        _run(args, work, f"{bucket}/demo/images")
    finally:
        _say("object store", "stopping")
        store.stop()
    return 0


def _run(args: argparse.Namespace, work: Path, dataset_url: str) -> None:
    # imported here: each pulls in a large framework (Ray, DALI, torch)
    from flashfeed import Dataset
    from flashfeed.cache import ShardCache
    from flashfeed.cache.warm.warm import NodeShare, warm_share
    from flashfeed.ingest import IngestConfig, run
    from flashfeed.ingest.progress import summary_table
    from flashfeed.ingest.samplecorpus import make_imagefolder
    from flashfeed.loader import Loader
    from flashfeed.summary import format_summary, summarize
    from flashfeed.verify import verify_dataset

    _say("corpus", f"{args.classes} classes x {args.per_class} JPEGs")
    corpus = make_imagefolder(
        work / "corpus", classes=args.classes, per_class=args.per_class, size=(160, 120)
    )
    print(f"written to {corpus}")

    _say("ingest", f"{corpus} -> {dataset_url} on a local Ray")
    result = run(
        IngestConfig(
            source=str(corpus),
            dest=dataset_url,
            format="webdataset",
            samples_per_shard=max(1, args.classes * args.per_class // 8),
            validate=True,
            dedup=True,
            num_cpus=2,
            progress="lines",
        )
    )
    print(summary_table(result.to_dict()))

    _say("inspect")
    ds = Dataset.open(dataset_url)
    print(format_summary(summarize(ds.manifest, url=dataset_url)))

    _say("verify", "every shard's checksum and index")
    report = verify_dataset(ds)
    if report.problems:
        raise SystemExit(f"verify found bad shards: {report.problems}")
    print(f"all {report.shards} shards match their checksums ({report.bytes / 1e6:.1f} MB)")

    cache_dir = work / "cache"
    _say("cache warm", f"this node's shards into {cache_dir}")
    cache = ShardCache(str(cache_dir), capacity="2GiB")
    share = NodeShare.build(epochs=args.epochs, seed=0)  # the loader's plan options below
    warmed = warm_share(cache, ds, share, progress=False)
    print(
        f"{warmed.fetched} shards fetched ({warmed.bytes_fetched / 1e6:.1f} MB) in "
        f"{warmed.seconds:.2f}s, {warmed.already} already cached, failed: {warmed.failed or 0}"
    )

    cold_dir = work / "cache-cold"
    _say(
        "loader",
        f"{args.epochs} epochs, batch {args.batch_size}, DALI decode + augment, starting from "
        f"an empty cache ({cold_dir}): epoch 0 streams from the store, later epochs are hot",
    )
    loader = Loader(ds, batch_size=args.batch_size, cache_dir=str(cold_dir), image_size=96, seed=0)
    waited_before = 0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        start = time.perf_counter()
        n = 0
        for batch in loader:
            n += int(batch["image"].shape[0])
        secs = time.perf_counter() - start
        shape = tuple(batch["image"].shape)
        waited = loader.stats()["batches_waited_on_storage"]
        kind = "cold, from the S3 store" if epoch == 0 else "hot, from the node cache"
        print(
            f"epoch {epoch} ({kind}): {n} samples in {secs:.2f}s = {n / secs:.0f} samples/s, "
            f"{waited - waited_before} of {-(-n // args.batch_size)} batches waited on storage; "
            f"batches of {shape} {batch['image'].dtype}, labels {batch['label'].dtype}"
        )
        waited_before = waited
    stats = loader.stats()
    fractions = ", ".join(f"{k} {v:.1%}" for k, v in stats["wait_fraction"].items())
    print(f"stall fractions (time the training loop waited): {fractions}")
    loader.close()


if __name__ == "__main__":
    sys.exit(main())

"""The loader's targets (issues #18 and #28) on photos in ShardWriter shards, one run.

The same photos are written by webdataset's ``ShardWriter`` (by default 100 MiB shards, as a
new user would) and adopted with ``flashfeed index``; litdata (``optimize``) and
mosaicml-streaming (``MDSWriter``) convert them with their own writers where they are
installed. Everything is uploaded to one private SeaweedFS server. Each round restarts the
server and runs, in an order that rotates every round (batch 64, ``--threads`` DALI threads
and peer workers, image size 224):

  ff-s3-<S>        flashfeed Loader from S3 with an empty cache: the first epoch (timer from
                   ``Loader(...)`` to the last batch) and the next ones (hot: from the cache;
                   whole epochs, at least --min-seconds)
  ff-local-<S>     flashfeed Loader on the same shards on local disk: the first epoch, timer
                   from ``Loader(...)`` to the last batch, then hot epochs (whole ones, at
                   least --min-seconds) with their CPU ms per image (the whole process tree)
  dali-reader-<S>  what a user writes with DALI alone: ``fn.readers.webdataset`` on the same
                   local tars with their index files, same operators (ROI crop decode,
                   resize, flip, normalise to float CHW); first epoch from the pipeline's
                   construction, then hot epochs with CPU ms per image, as ff-local-<S>;
                   both local first epochs start from a warm page cache (every file of the
                   layout read once, untimed, just before)
  ceiling-cold-<S> the cold epoch's ceiling: ff-local-<S> while a plain download of the same
                   shards from the same server (limits.download: the fill's reader in the
                   cache's shape, landed in files, nothing else) runs beside it from the
                   start; timer from ``Loader(...)`` to whichever ends last. Any cold loader
                   with a disk cache pays at least that download on the same CPUs
  startup-<S>      ``Loader(...)`` to the first batch in a fresh process, local disk, warm
                   page cache (median of --startup-repeats), and a second loader in the same
                   process (``startup-again-<S>``)
  startup-s3-<S>   ``Loader(...)`` to the first batch in a fresh process from S3 with an empty
                   cache (default ``arrival_slices``)
  wds-http-<S>     webdataset + PIL over presigned HTTP URLs of the same shards (cold)
  litdata-s3       litdata's StreamingDataset from S3 (its boto3 client), empty cache dir
  mosaic-s3        mosaic's StreamingDataset from S3 (its boto3 client), empty local dir, in
                   a process of its own (as a training job runs it)
  ceiling-<S>      the hot epoch's ceiling: the Loader's own DALI pipeline (its executor,
                   operators, threads and prefetch, fed through ``external_source`` as the
                   Loader feeds it) fed from RAM with the images of one of the Loader's
                   epochs on the same shards, in the order it delivered them (read once
                   before the rounds, untimed); whole epochs after warm-up, at least
                   --min-seconds, with CPU ms per image: the same pipeline with nothing
                   before it, so it bounds any loader that feeds DALI an order of its own (a
                   plan, exact resume); its ratio to the DALI reader is what feeding through
                   ``external_source`` costs against DALI's native reader

Every peer's timer starts before its dataset/loader is constructed. Targets (printed at the
end, each with its ratio; benchmarks/targets_report.py): hot epoch >= 1.0x the DALI reader
and CPU per image <= its own; local first epoch >= 0.95 of the DALI reader's; start-up
<= 0.5 s (fresh process and second loader), <= 1.0 s from S3 with an empty cache; cold first
epoch >= 0.95 of the same loader's hot epoch and of the local first epoch, >= 1.3x the best
cold peer. Runs in .bench-venv where the peers live (webdataset alone also works in .venv).
The corpus is built (benchmarks/harness/corpus.py) where it holds less than --mb.

    .bench-venv/bin/python -m benchmarks.stages.targets            # the issue's layout
    .bench-venv/bin/python -m benchmarks.stages.targets --mb 128 --rounds 1   # a quick look
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.harness.coldpeers import convert_peers, litdata_s3, mosaic_s3_child
from benchmarks.harness.corpus import pick_images
from benchmarks.harness.datasets import shardwriter_dataset
from benchmarks.harness.peerloaders import (
    DaliReaderEpochs,
    dali_decode_ceiling,
    loader_epoch_samples,
    webdataset_loader,
)
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.store import start_store, upload_tree
from benchmarks.harness.timing import (
    BATCH,
    batch_len,
    epoch,
    first_then_hot,
    tree_cpu_seconds,
    whole_epochs,
)
from benchmarks.machine import cpu_steal
from benchmarks.stagerun import ensure_corpus
from benchmarks.stages.limits import download
from benchmarks.stages.startup import run_child
from benchmarks.targets_report import TARGETS, targets_markdown

#: the issue's layout: 100 MiB ShardWriter shards of about 5,000 photos
DEFAULT_MB = 450
DEFAULT_SHARD_MIB = "100"


def warm_page_cache(folder: Path) -> int:
    """Read every file of ``folder`` once (untimed), so both local first epochs (the Loader's
    and the DALI reader's) start from the same page cache: a rotated round order otherwise
    lets whichever runs first after a cold spell pay the disk for both. Returns the bytes."""
    total = 0
    for f in sorted(folder.iterdir()):
        if f.is_file():
            with open(f, "rb") as fh:
                while chunk := fh.read(16 << 20):
                    total += len(chunk)
    return total


def compile_product() -> int:
    """Compile flashfeed's modules to bytecode, as ``pip install`` does for an installed
    package: an editable checkout run with ``PYTHONDONTWRITEBYTECODE`` would otherwise
    compile every module from source in each fresh start-up process (0.4 s and more of
    imports on 2 busy cores, inside ``Loader(...)`` for its lazy imports). Returns the
    package folders compiled."""
    import compileall
    import importlib

    names = ("flashfeed", "flashfeed.loader", "flashfeed.cache", "flashfeed.ingest")
    dirs = {d for n in names for d in importlib.import_module(n).__path__}
    for d in sorted(dirs):
        compileall.compile_dir(d, quiet=1)
    return len(dirs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--corpus", default=".bench/corpus",
        help="ImageFolder of photos (benchmarks/harness/corpus.py); built or extended there "
        "when it holds less than --mb (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--mb", type=int, default=DEFAULT_MB,
        help="dataset size in MiB: the corpus's first photos up to this size "
        "(default: %(default)s, about 5,000 photos)",
    )  # fmt: skip
    p.add_argument(
        "--shard-mib", default=DEFAULT_SHARD_MIB,
        help="ShardWriter shard sizes in MiB, comma-separated; each is a layout of its own "
        "(default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--rounds", type=int, default=3,
        help="interleaved rounds, the order rotated each round (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--startup-repeats", type=int, default=2,
        help="fresh processes per start-up row per round; the round's figure is their "
        "median (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--min-seconds", type=float, default=5.0,
        help="least seconds of hot epochs (whole epochs) and of the decode ceiling's window "
        "(default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=2,
        help="DALI threads of flashfeed and the DALI reader, DataLoader workers of the peers "
        "(default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--work", default=".bench/targets",
        help="where the shards and peer conversions are written and kept between runs "
        "(default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--out", default=".bench/targets.json", help="the result JSON (default: %(default)s)"
    )
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.shard_mib.split(",") if s.strip()]
    for name, v in (
        ("--mb", args.mb),
        ("--rounds", args.rounds),
        ("--startup-repeats", args.startup_repeats),
        ("--threads", args.threads),
    ):
        if v < 1:
            p.error(f"{name} must be >= 1, got {v}")
    if not sizes or min(sizes) < 1:
        p.error(f"--shard-mib must list sizes >= 1, got {args.shard_mib!r}")
    from flashfeed.loader import Loader

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ensure_corpus(Path(args.corpus), args.mb << 20, sys.executable)
    compile_product()
    files = pick_images(Path(args.corpus), args.mb << 20)
    layouts = {s: work / f"wds-{s}MiB" for s in sizes}
    shard_counts = {s: shardwriter_dataset(files, layouts[s], s) for s in sizes}
    peer_dirs, missing = convert_peers(files, work / "peers", args.threads)
    images = len(files)
    thr = args.threads
    # each ceiling decodes the very images a Loader epoch decodes, in its order: a ceiling
    # in another order (the files' own) measured below the hot epoch it bounds
    epoch_samples = {
        s: loader_epoch_samples(layouts[s], batch_size=BATCH, threads=thr) for s in sizes
    }
    scratch = Path(tempfile.mkdtemp(prefix="fftarget-", dir="/tmp"))
    bs = start_store(scratch, bucket="flashfeed", export_env=True)
    rounds: dict[str, list[float]] = {}
    waits: dict[str, list[dict[str, Any]]] = {}
    steal: dict[str, list[float]] = {}  # share of CPU time the host took, per run
    loads: list[float] = []  # the 1-minute load average as each round starts
    try:
        bucket = bs.bucket
        env = bs.env
        os.environ["S3_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL"]  # mosaic's variable
        for s in sizes:
            upload_tree(layouts[s], f"{bucket}/wds-{s}")
        for name, d in peer_dirs.items():
            upload_tree(d, f"{bucket}/{name}")
        from flashfeed import storage

        boto = {
            "endpoint_url": env["AWS_ENDPOINT_URL"],
            "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        }

        def fresh(name: str) -> Path:
            d = scratch / "cache" / name
            shutil.rmtree(d, ignore_errors=True)
            return d

        def ff_s3(s: int) -> dict[str, float]:
            url = f"{bucket}/wds-{s}"
            t0 = time.perf_counter()
            ff = Loader(url, batch_size=BATCH, num_threads=thr, cache_dir=str(fresh("ff")))
            n = sum(BATCH for _ in ff)
            first = n / (time.perf_counter() - t0)
            st = ff.stats()
            waits.setdefault(f"ff-s3-{s}", []).append(
                {"storage_s": st["wait_s"]["storage"], "batches_waited":
                 st["batches_waited_on_storage"], "of": st["batches"]}
            )  # fmt: skip
            n, secs = whole_epochs(ff, args.min_seconds)  # hot: from the cache
            ff.close()
            hot = n / secs
            return {f"ff-s3-first-{s}": first, f"ff-hot-{s}": hot}

        def named_first_then_hot(name: str, make: Callable[[], Any]) -> dict[str, float]:
            # the first epoch from construction, then whole hot epochs of the same loader
            got = first_then_hot(make, min_seconds=args.min_seconds)
            return {f"{name}-first": got["first"], f"{name}-hot": got["hot"],
                    f"{name}-hot-cpu-ms": got["cpu_ms"]}  # fmt: skip

        def ff_local(s: int) -> dict[str, float]:
            warm_page_cache(layouts[s])
            got = named_first_then_hot(
                f"ff-local-{s}", lambda: Loader(str(layouts[s]), batch_size=BATCH, num_threads=thr)
            )
            got[f"ff-local-first-{s}"] = got.pop(f"ff-local-{s}-first")
            return got

        def dali_reader(s: int) -> dict[str, float]:
            tars = [str(t) for t in sorted(layouts[s].glob("*.tar"))]
            warm_page_cache(layouts[s])
            return named_first_then_hot(
                f"dali-reader-{s}",
                lambda: DaliReaderEpochs(tars, batch_size=BATCH, threads=thr, device="cpu"),
            )

        def ceiling_cold(s: int) -> dict[str, float]:
            # the local epoch, paying for one plain download of the shards beside it
            dest = fresh("download")
            with ThreadPoolExecutor(1, thread_name_prefix="download") as bg:
                t0 = time.perf_counter()
                landed = bg.submit(download, f"{bucket}/wds-{s}", dest)
                local = Loader(str(layouts[s]), batch_size=BATCH, num_threads=thr)
                n = sum(batch_len(b) for b in local)
                landed.result()
                secs = time.perf_counter() - t0
            local.close()
            return {f"ceiling-cold-{s}": n / secs}

        def startup(s: int) -> dict[str, float]:
            # a restart is a new process: each start-up runs in a fresh one (startup.py),
            # DALI imported before the timer, the pass iterator kept so leaving it is untimed
            got = [run_child("flashfeed", layouts[s]) for _ in range(args.startup_repeats)]
            return {
                f"startup-{s}": statistics.median(g["first_batch"] for g in got),
                f"startup-again-{s}": statistics.median(g["again"] for g in got),
            }

        def startup_s3(s: int) -> dict[str, float]:
            # the same from S3 into an empty node cache: construction (the manifest and
            # shard table through the cache) and the first batch's bytes are both timed
            got = [
                run_child("flashfeed", f"{bucket}/wds-{s}", cache_dir=fresh("startup"))
                for _ in range(args.startup_repeats)
            ]
            return {
                f"startup-s3-{s}": statistics.median(g["first_batch"] for g in got),
                f"startup-s3-construct-{s}": statistics.median(g["construct"] for g in got),
            }

        def wds_http(s: int) -> dict[str, float]:
            fs, path = storage.filesystem(f"{bucket}/wds-{s}")
            urls = [fs.url(str(u), expires=3600) for u in sorted(fs.glob(f"{path}/*.tar"))]
            rate, _ = epoch(lambda: webdataset_loader(urls, batch_size=BATCH, workers=thr))
            return {f"wds-http-{s}": rate}

        def ceiling(s: int) -> dict[str, float]:
            jpegs, labels = epoch_samples[s]
            it = iter(dali_decode_ceiling(jpegs, labels, batch_size=BATCH, threads=thr,
                                          device="cpu"))  # fmt: skip
            for _ in range(5):  # construction, start-up, the prefetch
                next(it)
            per_epoch = len(jpegs) // BATCH  # whole epochs, at least min_seconds
            c0, t0, n = tree_cpu_seconds(), time.perf_counter(), 0
            while not n or n % per_epoch or time.perf_counter() - t0 < args.min_seconds:
                next(it)
                n += 1
            secs, cpu, images_read = time.perf_counter() - t0, tree_cpu_seconds() - c0, n * BATCH
            return {
                f"ceiling-{s}": images_read / secs,
                f"ceiling-{s}-cpu-ms": 1e3 * cpu / images_read,
            }

        runs: dict[str, Callable[[], dict[str, float]]] = {}
        for s in sizes:
            runs[f"ceiling-{s}"] = lambda s=s: ceiling(s)  # type: ignore[misc]
            runs[f"ff-s3-{s}"] = lambda s=s: ff_s3(s)  # type: ignore[misc]
            runs[f"ff-local-{s}"] = lambda s=s: ff_local(s)  # type: ignore[misc]
            runs[f"dali-reader-{s}"] = lambda s=s: dali_reader(s)  # type: ignore[misc]
            runs[f"ceiling-cold-{s}"] = lambda s=s: ceiling_cold(s)  # type: ignore[misc]
            runs[f"startup-{s}"] = lambda s=s: startup(s)  # type: ignore[misc]
            runs[f"startup-s3-{s}"] = lambda s=s: startup_s3(s)  # type: ignore[misc]
            runs[f"wds-http-{s}"] = lambda s=s: wds_http(s)  # type: ignore[misc]
        if "litdata" in peer_dirs:
            runs["litdata-s3"] = lambda: {
                "litdata-s3": epoch(
                    lambda: litdata_s3(f"{bucket}/litdata", fresh("lit"), boto, thr)
                )[0]
            }
        if "mosaicml-streaming" in peer_dirs:
            runs["mosaic-s3"] = lambda: {
                "mosaic-s3": mosaic_s3_child(f"{bucket}/mosaicml-streaming", fresh("mds"), thr)
            }
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            bs.restart()
            time.sleep(2.0)  # let the restarted server settle before the first run is timed
            for name in rotated(list(runs), r):
                # untimed: the last run's writes (a cache fill, a download: hundreds of MB)
                # leave the disk, so their writeback does not land in this run's timer (the
                # rotation keeps neighbours: ff-local always follows ff-s3's fills)
                os.sync()
                before = cpu_steal()
                try:
                    got = runs[name]()
                except Exception as exc:  # a peer that fails says why; the rest still run
                    missing[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
                    print(f"round {r}: {name} {missing[name]}", file=sys.stderr, flush=True)
                    continue
                after = cpu_steal()
                share = (after[0] - before[0]) / max(after[1] - before[1], 1e-9)
                steal.setdefault(name, []).append(share)
                for k, v in got.items():
                    rounds.setdefault(k, []).append(v)
                    print(f"round {r}: {k} {v:.2f} (steal {share:.0%})", file=sys.stderr,
                          flush=True)  # fmt: skip
    finally:
        bs.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "config": vars(args),
        "images": images,
        "bytes": sum(f.stat().st_size for f, _ in files),
        "shards": {str(s): shard_counts[s] for s in sizes},
        "rounds": rounds,
        "median": {k: statistics.median(v) for k, v in rounds.items()},
        "first_epoch_waits": waits,
        "cpu_steal": steal,
        "load_average": {"rounds": loads, "end": os.getloadavg()[0]},
        "targets": TARGETS,
        "unavailable": missing,
    }
    for k, v in result["median"].items():
        print(f"{k:28s} {v:9.2f}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(targets_markdown({"stages": {"targets": {"data": result}}}))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

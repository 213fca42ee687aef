"""Ingest benchmark: one ImageFolder corpus, one Ray, one object store, three writers,
interleaved rounds:

  flashfeed   ``flashfeed.ingest.run`` (one Ray task per shard, tar + .idx, manifest)
  ray-data    ``read_binary_files(override_num_blocks=shards)`` + ``map_batches`` (one call
              per block, doing ingest's per-image work: ``transform_record``, the decode
              check and re-encoding as asked) + ``write_webdataset(encoder=None,
              min_rows_per_file=N, try_create_dir=False)`` on the same Ray, whose object
              store (1 GiB) holds the whole corpus several times over
  shardwriter webdataset's ``ShardWriter`` in one process, each shard uploaded when closed,
              doing ingest's per-image work (``transform_record`` with the same options:
              the decode check, re-encoding where ``--jpeg-quality`` asks)

Per CPU: flashfeed's MB/s over its Ray CPUs against ShardWriter's one process, and against
the PUT limit of the same run. Ray's fixed cost (``ray.init``; none when a running Ray is
reused: ``--ray-address``, or a Ray this process already runs; then its workers' start and
imports, one task per CPU) is timed apart and not in any writer's seconds; ShardWriter's
imports are done before its first round too.

Prints MB/s (corpus bytes / wall seconds) and ratios, where flashfeed's time goes (read,
transform, write+upload, summed over tasks), and raw ceilings (local read; the PUT limit in
ingest's own shape: shard-sized objects, one PUT each, as many in flight as Ray CPUs, several
rounds; the work ceiling: the per-image work alone, read + ``transform_record``, no Ray, no
tar, no upload, in as many processes as Ray CPUs, timed in every round beside the writers;
the work+PUT ceiling: that work and the PUTs of the shards it makes, each process uploading
one shard while it works on the next, on the same cores as the S3 server:
``harness/ingestceilings.py``). Ingest is reported as a fraction of min(PUT limit, work ceiling,
work+PUT ceiling), the ceiling that binds, and of the PUT limit alone; writes everything as
JSON. Not a timed test: run it by hand.

    python -m benchmarks.harness.corpus images .bench/corpus --size 2GB
    python -m benchmarks.stages.ingestbench .bench/corpus --rounds 1 --out .bench/ingest.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.ingestceilings import WorkCeiling, ceilings
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.store import start_store
from flashfeed import storage
from flashfeed.units import format_size, parse_size

METHODS = ("flashfeed", "ray-data", "shardwriter")


def _files(corpus: Path) -> list[tuple[Path, int]]:
    classes = sorted(p.name for p in corpus.iterdir() if p.is_dir())
    label = {c: i for i, c in enumerate(classes)}
    return [(p, label[p.parent.name]) for p in sorted(corpus.glob("*/*.jpg"))]


def transform_options(validate: bool, jpeg_quality: int | None) -> Any:
    from flashfeed.ingest.transforms import TransformOptions

    return TransformOptions(validate=validate, jpeg_quality=jpeg_quality)


def run_flashfeed(
    corpus: Path, dest: str, shard_size: int, opts: dict[str, Any], work: Any = None
) -> dict:
    from flashfeed.ingest import IngestConfig, run

    t0 = time.perf_counter()
    result = run(
        IngestConfig(
            source=str(corpus),
            dest=dest,
            shard_size=shard_size,
            storage_options=opts,
            progress="none",
            validate=bool(work and work.validate),
            jpeg_quality=work.jpeg_quality if work else None,
        )
    )
    secs = time.perf_counter() - t0
    d = result.to_dict()
    return {
        "seconds": secs,
        "shards": d["shards"],
        "samples": d["samples"],
        "bytes_out": d["bytes_out"],
        "task_seconds": d["timings"],
        "phases": d["phases"],
    }


def run_ray_data(
    corpus: Path,
    dest: str,
    rows_per_file: int,
    blocks: int,
    opts: dict[str, Any],
    work: Any = None,
) -> dict:
    import pyarrow.fs as pafs
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    endpoint = opts["endpoint_url"]
    fs = pafs.S3FileSystem(
        access_key=opts["key"],
        secret_key=opts["secret"],
        endpoint_override=endpoint.split("://", 1)[1],
        scheme=endpoint.split("://", 1)[0],
        region="us-east-1",
    )
    classes = sorted(p.name for p in corpus.iterdir() if p.is_dir())
    label = {c: i for i, c in enumerate(classes)}

    busy = work is not None and (work.validate or work.reencode)

    def to_samples(batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from flashfeed.ingest.transforms import transform_record

        keys, classes, images = [], [], []
        for path, data in zip(batch["path"], batch["bytes"], strict=True):
            cls = path.rsplit("/", 2)[-2]
            keys.append(cls + "_" + path.rsplit("/", 1)[-1].split(".")[0])
            classes.append(str(label[cls]).encode())
            if busy:  # ingest's own per-image work, as the other writers do it
                data = transform_record({"jpg": bytes(data)}, {"jpg": "image"}, work)["jpg"]
            images.append(data)
        return {
            "__key__": np.array(keys, dtype=object),
            "jpg": np.array(images, dtype=object),
            "cls": np.array(classes, dtype=object),
        }

    t0 = time.perf_counter()
    ds = ray.data.read_binary_files(
        str(corpus), include_paths=True, override_num_blocks=blocks
    ).map_batches(to_samples, batch_size=None, batch_format="numpy")
    ds.write_webdataset(
        dest.split("://", 1)[1],
        filesystem=fs,
        encoder=None,
        min_rows_per_file=rows_per_file,
        try_create_dir=False,
    )
    secs = time.perf_counter() - t0
    written = storage.list_files(dest, storage_options=opts)
    return {
        "seconds": secs,
        "shards": len(written),
        "bytes_out": sum(storage.size(u, storage_options=opts) for u in written),
    }


def _warm_worker() -> int:
    """A Ray worker with ingest's modules imported (Ray's fixed cost, timed apart)."""
    import flashfeed.ingest.shardtask  # noqa: F401

    return os.getpid()


def run_shardwriter(
    corpus: Path, dest: str, shard_size: int, opts: dict[str, Any], work: Any = None
) -> dict:
    import webdataset as wds

    from flashfeed.ingest.transforms import transform_record
    from flashfeed.s3.putobject import put_object

    kinds = {"jpg": "image", "cls": "text"}
    busy = work is not None and (work.validate or work.reencode)

    tmp = tempfile.mkdtemp(prefix="ffbw-", dir="/tmp")
    uploaded: list[int] = []

    def upload(path: str) -> None:  # the PUT ingest makes (put_object), of the closed shard
        data = Path(path).read_bytes()
        put_object(storage.join(dest, os.path.basename(path)), data, storage_options=opts)
        uploaded.append(len(data))
        os.unlink(path)

    t0 = time.perf_counter()
    try:
        with wds.ShardWriter(
            os.path.join(tmp, "%06d.tar"), maxsize=shard_size, post=upload, verbose=0
        ) as sink:
            for path, label in _files(corpus):
                sample: dict[str, Any] = {"jpg": path.read_bytes(), "cls": str(label)}
                if busy:  # ingest's own per-image work, in this one process
                    sample = transform_record(sample, kinds, work)
                sample["__key__"] = f"{path.parent.name}_{path.stem}"
                sink.write(sample)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "seconds": time.perf_counter() - t0,
        "shards": len(uploaded),
        "bytes_out": sum(uploaded),
    }


def _phases(runs: list[dict]) -> str:
    """Each driver phase's median over rounds, in ms, and the driver's time before the
    first task starts (the run's seconds less its shard tasks and commit)."""
    names = list(runs[0]["phases"])
    before = [r["seconds"] - r["phases"]["shards"] - r["phases"]["commit"] for r in runs]
    parts = [f"{k} {1e3 * statistics.median(r['phases'][k] for r in runs):.0f}" for k in names]
    return ", ".join([*parts, f"before tasks {1e3 * statistics.median(before):.0f}"]) + " ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("corpus", help="ImageFolder corpus (benchmarks/harness/corpus.py images)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shard-size", default="64MiB")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument(
        "--no-validate", dest="validate", action="store_false", help="skip the decode check"
    )
    p.add_argument("--jpeg-quality", type=int, help="re-encode every image at this quality")
    p.add_argument("--ray-address", help="reuse a running Ray cluster (no start-up cost)")
    p.add_argument("--out", default=".bench/ingest.json")
    args = p.parse_args(argv)

    import ray

    from flashfeed.ingest.raysetup import ray_session

    work = transform_options(args.validate, args.jpeg_quality)
    corpus = Path(args.corpus)
    files = _files(corpus)
    if not files:
        raise SystemExit(f"no corpus at {corpus}: build one with benchmarks.harness.corpus images")
    corpus_bytes = sum(p.stat().st_size for p, _ in files)
    shard_size = parse_size(args.shard_size)
    rows_per_file = max(1, round(shard_size / (corpus_bytes / len(files))))
    # one block per output shard, at least one per Ray CPU
    blocks = max(args.num_cpus, -(-len(files) // rows_per_file))
    print(
        f"corpus: {len(files)} images, {format_size(corpus_bytes)}; shards ~"
        f"{format_size(shard_size)} ({rows_per_file} images); {args.num_cpus} Ray CPUs",
        file=sys.stderr,
    )
    root = tempfile.mkdtemp(prefix="ffbs-", dir="/tmp")
    bs = start_store(root, bucket="bench")
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    work_rounds: list[float] = []
    work_put_rounds: list[float] = []
    ceiling = WorkCeiling(files, work, args.num_cpus, shard_size)
    try:
        opts = bs.opts
        limits = ceilings(
            files,
            opts,
            "bench",
            shard_size=shard_size,
            in_flight=args.num_cpus,
            total=corpus_bytes,
        )
        reused = bool(args.ray_address) or ray.is_initialized()
        t0 = time.perf_counter()
        with ray_session(address=args.ray_address, num_cpus=args.num_cpus):
            ray_start = time.perf_counter() - t0
            t0 = time.perf_counter()
            warm = ray.remote(_warm_worker)
            workers = len(set(ray.get([warm.remote() for _ in range(args.num_cpus)])))
            import webdataset  # noqa: F401  (ShardWriter's imports, as the workers' above)

            warmup = time.perf_counter() - t0
            print(
                f"Ray {'joined' if reused else 'started'} in {ray_start:.2f} s, "
                f"{workers} workers warm in {warmup:.2f} s",
                file=sys.stderr,
            )
            for r in range(args.rounds):
                order = rotated(METHODS, r)
                for method in order:
                    dest = f"s3://bench/{method}-{r}"
                    if method == "flashfeed":
                        out = run_flashfeed(corpus, dest, shard_size, opts, work)
                    elif method == "ray-data":
                        out = run_ray_data(corpus, dest, rows_per_file, blocks, opts, work)
                    else:
                        out = run_shardwriter(corpus, dest, shard_size, opts, work)
                    out["mb_s"] = corpus_bytes / out["seconds"] / 1e6
                    runs[method].append(out)
                    print(
                        f"round {r} {method:<12} {out['seconds']:7.1f} s {out['mb_s']:7.1f} MB/s",
                        file=sys.stderr,
                    )
                work_rounds.append(ceiling.measure())
                work_put_rounds.append(ceiling.measure_with_puts(f"s3://bench/workput-{r}", opts))
                print(
                    f"round {r} {'work ceiling':<12} {work_rounds[-1]:17.1f} MB/s, with its "
                    f"PUTs {work_put_rounds[-1]:.1f} MB/s",
                    file=sys.stderr,
                )
    finally:
        ceiling.close()
        bs.stop()
        shutil.rmtree(root, ignore_errors=True)
    med = {m: statistics.median(x["mb_s"] for x in runs[m]) for m in METHODS}
    lines = [f"{'writer':<12} {'MB/s':>8} {'seconds':>8} {'shards':>7} {'vs flashfeed':>13}"]
    for m in METHODS:
        secs = statistics.median(x["seconds"] for x in runs[m])
        lines.append(
            f"{m:<12} {med[m]:8.1f} {secs:8.1f} {runs[m][0]['shards']:7d} "
            f"{med['flashfeed'] / med[m]:12.2f}x"
        )
    ff = runs["flashfeed"][-1]["task_seconds"]
    busy = sum(ff.values()) or 1.0
    where = ", ".join(f"{k} {v:.1f} s ({100 * v / busy:.0f}%)" for k, v in ff.items())
    print("\n".join(lines))
    print(f"flashfeed driver phases (median of rounds): {_phases(runs['flashfeed'])}")
    print(f"flashfeed task time (summed over tasks): {where}")
    limits["work_mb_s"] = round(statistics.median(work_rounds), 1)
    limits["work_rounds_mb_s"] = work_rounds
    limits["work_processes"] = args.num_cpus
    limits["work_put_mb_s"] = round(statistics.median(work_put_rounds), 1)
    limits["work_put_rounds_mb_s"] = work_put_rounds
    binding = min(limits["s3_put_mb_s"], limits["work_mb_s"], limits["work_put_mb_s"]) or None
    print(
        f"ceilings: local read {limits['local_read_mb_s']} MB/s, "
        f"S3 PUT in ingest's shape {limits['s3_put_mb_s']} MB/s, per-image work alone in "
        f"{args.num_cpus} processes {limits['work_mb_s']} MB/s, the same work with its "
        f"shards' PUTs on the same cores {limits['work_put_mb_s']} MB/s"
    )
    per_cpu = med["flashfeed"] / args.num_cpus
    of_put = med["flashfeed"] / limits["s3_put_mb_s"] if limits["s3_put_mb_s"] else None
    of_ceiling = med["flashfeed"] / binding if binding else None
    print(
        f"per CPU: flashfeed {per_cpu:.1f} MB/s per Ray CPU, ShardWriter {med['shardwriter']:.1f}"
        f" MB/s in one process: {per_cpu / med['shardwriter']:.2f}x; flashfeed at "
        f"{args.num_cpus} Ray CPUs: {of_ceiling or 0:.2f} of min(PUT limit, work ceiling, "
        "work+PUT ceiling), "
        f"{of_put or 0:.2f} of the PUT limit; Ray "
        f"{'joined' if reused else 'start-up'} {ray_start:.2f} s + workers' warm-up {warmup:.2f} s "
        "(not in the writers' seconds)"
    )
    report = {
        "corpus": {"images": len(files), "bytes": corpus_bytes, "path": str(corpus)},
        "shard_size": shard_size,
        "num_cpus": args.num_cpus,
        "rounds": args.rounds,
        "median_mb_s": med,
        "runs": runs,
        "ceilings": limits,
        "work": {"validate": args.validate, "jpeg_quality": args.jpeg_quality},
        "ray_start_s": ray_start,
        "worker_warmup_s": warmup,
        "ray_reused": reused,
        "ratios": {
            "per_cpu_vs_shardwriter": per_cpu / med["shardwriter"],
            "of_put_limit": of_put,
            "of_binding_ceiling": of_ceiling,
            "shardwriter_of_work": med["shardwriter"] / limits["work_mb_s"]
            if limits["work_mb_s"]
            else None,
            "vs_ray_data": med["flashfeed"] / med["ray-data"],
            "vs_shardwriter": med["flashfeed"] / med["shardwriter"],
        },
    }
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Client CPU of a cache fill against plain parallel ranged GETs of the same bytes.

Starts a private SeaweedFS, writes ``--shards`` tar shards of ``--shard-size`` random bytes,
then, in interleaved rounds, measures the CPU seconds of *this process* (user + system of
all its threads; the server is another process and is not counted) per GB moved by:

  fill         a ``ShardCache`` fetching every shard into an empty cache directory: ranged
               GETs, writes into the part file, the in-transit checksum, progress marks,
               the rename (what a cold epoch pays per byte)
  fill-s3fs    the same fill with the parts fetched through s3fs and written with pwrite
               (the fill before the direct path; still used for storage options the
               direct reader does not understand)
  raw-botocore the same ranges with a plain botocore client (what boto3 wraps), same part
               size and concurrency, bytes dropped on arrival
  raw-signed   the same ranges read by the fill's own signed-GET client (``signedget.py``)
               into a reused buffer, same threads, dropped: the client alone
  raw-obstore  the same ranges with obstore's ``get_range`` (Rust object_store: one ranged
               GET read into a Rust buffer), same threads, dropped (when obstore is installed)
  raw-pyarrow  the same ranges with ``pyarrow.fs.S3FileSystem`` (Arrow's C++ S3 client):
               one input file a shard, ``read_at`` from the same threads (its Python
               binding returns bytes: one copy more than the C++ client makes), dropped
  raw-s3fs     the same ranges through s3fs ``cat_file`` (flashfeed's storage layer), dropped
  raw-to-file  the same ranges read chunk by chunk into a reused buffer and written to
               preallocated files (the cheapest way measured here to land bytes in the page
               cache: no checksum, no bookkeeping), files removed like the cache's

Prints a table (``--json PATH`` also writes the rounds). The target: fill <= 1.3x raw.

    python -m benchmarks.stages.fillcpu --shards 4 --shard-size 64MiB --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.harness.datasets import random_dataset
from benchmarks.harness.results import write_json
from benchmarks.harness.store import start_store
from flashfeed import Dataset, storage
from flashfeed.cache import ShardCache
from flashfeed.cache.fetch.fill import CHUNK
from flashfeed.cache.fetch.ranged import split_ranges
from flashfeed.s3.directget import SignedObject, reader_for
from flashfeed.units import format_size, parse_size

METHODS = (
    "fill",
    "fill-s3fs",
    "raw-botocore",
    "raw-signed",
    "raw-obstore",
    "raw-pyarrow",
    "raw-s3fs",
    "raw-to-file",
)


def measured(fn: Callable[[], int]) -> dict[str, float]:
    """Run ``fn`` (returns bytes moved); wall and process CPU seconds, per GB too."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    moved = fn()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    gb = moved / 1e9
    return {"bytes": moved, "wall_s": wall, "cpu_s": cpu, "cpu_s_per_gb": cpu / gb,
            "gbps": gb / wall}  # fmt: skip


def primed(fn: Callable[[], int]) -> dict[str, float]:
    """``measured(fn)`` right after an untimed run of ``fn``: each method then starts from
    the memory state it leaves itself. On this VM the CPU cost of landing bytes in the page
    cache doubles when the run before freed memory another way (memory handed back to the
    host and faulted in again), so without this a method's figure depends on its
    neighbour in the order."""
    fn()
    return measured(fn)


def fill(ds: Dataset, opts: dict[str, Any], root: str, concurrency: int, part: int) -> int:
    shutil.rmtree(root, ignore_errors=True)
    with ShardCache(
        root, capacity=2 * ds.manifest.num_bytes, storage_options=opts,
        concurrency=concurrency, part_size=part,
    ) as cache, ThreadPoolExecutor(len(ds.shards)) as pool:  # fmt: skip
        list(pool.map(lambda i: cache.fetch(ds, i), range(len(ds.shards))))
        assert cache.stats()["bytes_fetched"] == ds.manifest.num_bytes
    shutil.rmtree(root, ignore_errors=True)
    return int(ds.manifest.num_bytes)


def fill_s3fs(ds: Dataset, opts: dict[str, Any], root: str, concurrency: int, part: int) -> int:
    from flashfeed.cache.fetch import fill as fill_module

    direct = fill_module.reader_for_url
    fill_module.reader_for_url = lambda *a, **kw: None  # type: ignore[assignment]
    try:
        return fill(ds, opts, root, concurrency, part)
    finally:
        fill_module.reader_for_url = direct


def _jobs(ds: Dataset, part: int) -> list[tuple[str, int, int]]:
    return [(info.path, lo, hi) for info in ds.shards for lo, hi in split_ranges(info.bytes, part)]


def raw_botocore(ds: Dataset, client: Any, bucket: str, key_prefix: str, concurrency: int,
                 part: int) -> int:  # fmt: skip
    def one(job: tuple[str, int, int]) -> int:
        path, lo, hi = job
        body = client.get_object(
            Bucket=bucket, Key=f"{key_prefix}/{path}", Range=f"bytes={lo}-{hi - 1}"
        )["Body"]
        n = len(body.read())
        assert n == hi - lo
        return n

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, _jobs(ds, part)))


def raw_signed(ds: Dataset, opts: dict[str, Any], concurrency: int, part: int) -> int:
    readers = {}
    for i, info in enumerate(ds.shards):
        fs, key = storage.filesystem(ds.shard_url(i), opts)
        readers[info.path] = reader_for(fs, key, connections=concurrency)
        assert isinstance(readers[info.path], SignedObject), "not the signed-GET client"
    buffers = threading.local()

    def one(job: tuple[str, int, int]) -> int:
        path, lo, hi = job
        if not hasattr(buffers, "view"):
            buffers.view = memoryview(bytearray(min(CHUNK, part)))
        return sum(len(chunk) for chunk in readers[path].chunks(lo, hi, buffers.view))

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, _jobs(ds, part)))


def obstore_store(info: Any, bucket: str) -> Any:
    """An obstore ``S3Store`` on the benchmark's server, or None without obstore."""
    try:
        from obstore.store import S3Store
    except ImportError:
        return None
    return S3Store(
        bucket, endpoint=info.endpoint, access_key_id=info.access_key,
        secret_access_key=info.secret_key, region="us-east-1",
        client_options={"allow_http": True},
    )  # fmt: skip


def raw_obstore(ds: Dataset, store: Any, key_prefix: str, concurrency: int, part: int) -> int:
    import obstore

    def one(job: tuple[str, int, int]) -> int:
        path, lo, hi = job
        n = len(memoryview(obstore.get_range(store, f"{key_prefix}/{path}", start=lo, end=hi)))
        assert n == hi - lo
        return n

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, _jobs(ds, part)))


def pyarrow_fs(info: Any) -> Any:
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(
        access_key=info.access_key, secret_key=info.secret_key, region="us-east-1",
        endpoint_override=info.endpoint.split("://", 1)[1], scheme="http",
    )  # fmt: skip


def raw_pyarrow(ds: Dataset, fs: Any, bucket: str, key_prefix: str, concurrency: int,
                part: int) -> int:  # fmt: skip
    files = {info.path: fs.open_input_file(f"{bucket}/{key_prefix}/{info.path}")
             for info in ds.shards}  # fmt: skip

    def one(job: tuple[str, int, int]) -> int:
        path, lo, hi = job
        n = len(files[path].read_at(hi - lo, lo))  # Python bytes: one copy more
        assert n == hi - lo
        return int(n)

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            return sum(pool.map(one, _jobs(ds, part)))
    finally:
        for f in files.values():
            f.close()


def raw_s3fs(ds: Dataset, opts: dict[str, Any], concurrency: int, part: int) -> int:
    fs, _ = storage.filesystem(ds.url, opts)

    def one(job: tuple[str, int, int]) -> int:
        path, lo, hi = job
        _, key = storage.filesystem(ds.shard_url(path), opts)
        return len(fs.cat_file(key, start=lo, end=hi))

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, _jobs(ds, part)))


def raw_to_file(ds: Dataset, opts: dict[str, Any], folder: str, concurrency: int,
                part: int) -> int:  # fmt: skip
    os.makedirs(folder, exist_ok=True)
    files: dict[str, tuple[int, Any]] = {}
    for i, info in enumerate(ds.shards):
        fs, key = storage.filesystem(ds.shard_url(i), opts)
        direct = reader_for(fs, key, connections=concurrency)
        assert direct is not None, "the direct reader refused these storage options"
        fd = os.open(os.path.join(folder, str(i)), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.posix_fallocate(fd, 0, info.bytes)
        files[info.path] = (fd, direct)
    buffers = threading.local()

    def one(job: tuple[str, int, int]) -> int:
        path, lo, hi = job
        fd, direct = files[path]
        if not hasattr(buffers, "view"):
            buffers.view = memoryview(bytearray(min(CHUNK, part)))
        at = lo
        for chunk in direct.chunks(lo, hi, buffers.view):
            os.pwrite(fd, chunk, at)
            at += len(chunk)
        return hi - lo

    with ThreadPoolExecutor(concurrency) as pool:
        moved = sum(pool.map(one, _jobs(ds, part)))
    for fd, _ in files.values():
        os.close(fd)
    shutil.rmtree(folder, ignore_errors=True)
    return moved


def botocore_client(info: Any, concurrency: int) -> Any:
    import botocore.config
    import botocore.session

    return botocore.session.get_session().create_client(
        "s3", endpoint_url=info.endpoint, aws_access_key_id=info.access_key,
        aws_secret_access_key=info.secret_key, region_name="us-east-1",
        config=botocore.config.Config(max_pool_connections=concurrency,
                                      retries={"max_attempts": 1}),
    )  # fmt: skip


def table(rounds: list[dict[str, dict[str, float]]]) -> list[str]:
    methods = [m for m in METHODS if m in rounds[0]]
    med = {m: statistics.median(r[m]["cpu_s_per_gb"] for r in rounds) for m in methods}
    gbps = {m: statistics.median(r[m]["gbps"] for r in rounds) for m in methods}
    lines = [f"{'method':<14}{'CPU s/GB (median)':>19}{'per round':>28}{'GB/s':>8}{'vs raw':>8}"]
    for m in methods:
        each = " ".join(f"{r[m]['cpu_s_per_gb']:.3f}" for r in rounds)
        ratio = med[m] / med["raw-botocore"]
        lines.append(f"{m:<14}{med[m]:>19.3f}  {each:>26}{gbps[m]:>8.3f}{ratio:>7.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shards", type=int, default=4, help="shards in the dataset (default 4)")
    ap.add_argument("--shard-size", default="64MiB", help="bytes per shard (default 64MiB)")
    ap.add_argument("--part-size", default="16MiB", help="bytes per ranged GET (default 16MiB)")
    ap.add_argument("--concurrency", type=int, default=8, help="GETs in flight (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--only", metavar="ROWS", help="comma-separated rows to run (default all)")
    ap.add_argument("--json", metavar="PATH", help="also write the rounds as JSON here")
    args = ap.parse_args(argv)
    if args.shards < 1 or args.rounds < 1 or args.concurrency < 1:
        ap.error("--shards, --rounds and --concurrency must be >= 1")
    size = parse_size(args.shard_size, name="--shard-size")
    part = parse_size(args.part_size, name="--part-size")
    work = tempfile.mkdtemp(prefix="ff-fillcpu-")
    bs = start_store(work, bucket="fillcpu")
    try:
        opts = bs.opts
        bucket, key_prefix = "fillcpu", "ds"
        ds = random_dataset(f"s3://{bucket}/{key_prefix}", args.shards, size, storage_options=opts)
        client = botocore_client(bs.store.info, args.concurrency)
        ob, arrow = obstore_store(bs.store.info, bucket), pyarrow_fs(bs.store.info)
        runs: dict[str, Callable[[], int]] = {
            "fill": lambda: fill(ds, opts, os.path.join(work, "cache"), args.concurrency, part),
            "fill-s3fs": lambda: fill_s3fs(
                ds, opts, os.path.join(work, "cache"), args.concurrency, part
            ),
            "raw-botocore": lambda: raw_botocore(
                ds, client, bucket, key_prefix, args.concurrency, part
            ),
            "raw-pyarrow": lambda: raw_pyarrow(
                ds, arrow, bucket, key_prefix, args.concurrency, part
            ),
            "raw-signed": lambda: raw_signed(ds, opts, args.concurrency, part),
            "raw-s3fs": lambda: raw_s3fs(ds, opts, args.concurrency, part),
            "raw-to-file": lambda: raw_to_file(
                ds, opts, os.path.join(work, "files"), args.concurrency, part
            ),
        }
        if ob is not None:
            runs["raw-obstore"] = lambda: raw_obstore(ds, ob, key_prefix, args.concurrency, part)
        else:
            print("raw-obstore: obstore is not installed (pip install obstore): row left out")
        only = set(args.only.split(",")) | {"raw-botocore"} if args.only else set(METHODS)
        if only - set(METHODS):
            ap.error(f"--only: unknown rows {sorted(only - set(METHODS))}, known: {METHODS}")
        methods = tuple(m for m in METHODS if m in runs and m in only)
        for m in methods:  # warm-up: connections, imports, the server's own caches
            runs[m]()
        rounds = []
        for r in range(args.rounds):
            order = methods if r % 2 == 0 else tuple(reversed(methods))
            rounds.append({m: primed(runs[m]) for m in order})
        print(
            f"{args.shards} shards x {format_size(size)}, part {format_size(part)}, "
            f"concurrency {args.concurrency}, {args.rounds} rounds interleaved; CPU of this "
            f"process only (server excluded), {os.cpu_count()} CPUs"
        )
        for line in table(rounds):
            print(line)
        if args.json:
            write_json(args.json, {"args": vars(args), "rounds": rounds})
    finally:
        bs.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

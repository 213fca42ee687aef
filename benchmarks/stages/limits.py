"""Physical limits of this machine, measured in the same run as the benchmarks they bound:

  memcpy          GB/s of one large numpy copy (the best of 3)
  read hot        GB/s reading the corpus files (and one large file, as shards are) again
                  while they sit in the page cache; each file in one read into a buffer
                  of its size, as the cache's hit path reads a whole shard
  read cold       GB/s reading them from the device: page cache dropped
                  (``/proc/sys/vm/drop_caches`` when permitted, else per-file
                  ``posix_fadvise(DONTNEED)``, else O_DIRECT); the JSON names the method
  S3 GET          GB/s of parallel ranged GETs from a private SeaweedFS server through the
                  reader a cache fill uses, bytes dropped on arrival (no disk, no
                  checksum), in the cache's own shape: its default part size and GETs in
                  flight (``CacheOptions``), several rounds

The decode ceiling (the Loader's DALI pipeline fed from RAM) comes from loaderbench.py
in the same run; the PUT limit of ingest from ingestbench.py (same server as the run).
Prints a table and writes JSON.

    python -m benchmarks.stages.limits --files .bench/corpus --read-mb 256 --out .bench/limits.json
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.results import write_json
from benchmarks.harness.store import start_store

__all__ = [
    "download",
    "drop_page_cache",
    "memcpy_gbps",
    "ranged_get",
    "read_gbps",
    "s3_get_gbps",
]

_CHUNK = 4 << 20


def memcpy_gbps(nbytes: int = 256 << 20, repeats: int = 3) -> float:
    """The best of ``repeats`` copies of ``nbytes`` (the first also faults pages in)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def pick_files(root: Path, limit: int) -> list[Path]:
    """Files under ``root`` in sorted order until ``limit`` bytes."""
    out, total = [], 0
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out.append(p)
            total += p.stat().st_size
            if total >= limit:
                break
    return out


def drop_page_cache(files: list[Path]) -> str:
    """Evict ``files`` from the page cache; returns the method that worked, or ``"none"``."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        pass
    if hasattr(os, "posix_fadvise"):
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"
    return "none"


def _read_buffered(path: Path, buf: memoryview) -> int:
    with open(path, "rb", buffering=0) as f:
        total = 0
        while n := f.readinto(buf):
            total += n
        return total


def _read_direct(path: Path, buf: memoryview) -> int:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        total = 0
        while n := os.readv(fd, [buf]):
            total += n
            if n < len(buf):
                break
        return total
    finally:
        os.close(fd)


def cache_fetch_shape() -> tuple[int, int]:
    """(part size, GETs in flight) of the node cache's fills: its defaults."""
    from flashfeed.cache.options import CacheOptions

    fields = CacheOptions.__dataclass_fields__
    return int(fields["part_size"].default), int(fields["concurrency"].default)  # type: ignore[call-overload]


def read_gbps(files: list[Path], *, direct: bool = False) -> float:
    """GB/s reading ``files`` one after another, each in one read into a buffer as large as
    the largest file (the hit path reads a shard whole)."""
    size = max(p.stat().st_size for p in files)
    buf = mmap.mmap(-1, max(_CHUNK, -(-size // 4096) * 4096))  # page-aligned, as O_DIRECT needs
    view = memoryview(buf)
    read = _read_direct if direct else _read_buffered
    t0 = time.perf_counter()
    total = sum(read(p, view) for p in files)
    secs = time.perf_counter() - t0
    view.release()
    buf.close()
    return total / secs / 1e9


def _fill_reads(concurrency: int) -> Callable[[Any, str, int, int], Iterable[Any]]:
    """``read(fs, path, lo, hi)``: the chunks of those bytes as a cache fill reads them (the
    product's own reader: signed GETs or botocore, in chunks into this thread's reused
    buffer), or through s3fs in one piece where that reader does not apply."""
    import threading

    from flashfeed.cache.fetch.fill import CHUNK
    from flashfeed.s3.directget import reader_for

    buffers = threading.local()

    def read(fs: Any, path: str, lo: int, hi: int) -> Iterable[Any]:
        reader = reader_for(fs, path, connections=concurrency)
        if reader is None:
            return [fs.cat_file(path, start=lo, end=hi)]
        if not hasattr(buffers, "view"):
            buffers.view = memoryview(bytearray(CHUNK))
        return reader.chunks(lo, hi, buffers.view)

    return read


def ranged_get(concurrency: int) -> Callable[[tuple[Any, str, int, int]], int]:
    """``one((fs, path, lo, hi))``: GET those bytes the way a cache fill does
    (``_fill_reads``) and drop them. The bytes received."""
    read = _fill_reads(concurrency)

    def one(job: tuple[Any, str, int, int]) -> int:
        return sum(len(c) for c in read(*job))

    return one


def download(url: str, dest: Path) -> int:
    """Every object under ``url`` into files under ``dest`` the plainest way a cache could:
    ranged GETs in the cache's own shape (part size, GETs in flight) read as a fill reads
    them (``_fill_reads``), each chunk written where it belongs; no checksum, no progress
    marks, no index, no need order. The bytes landed. What any cold loader must at least
    pay for its bytes: the cold-start ceiling runs it beside a local epoch (targets.py)."""
    from flashfeed import storage
    from flashfeed.cache.fetch.ranged import split_ranges

    part, concurrency = cache_fetch_shape()
    read = _fill_reads(concurrency)
    fs, root = storage.filesystem(url)
    dest.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, int, int, int]] = []
    fds = []
    for info in fs.find(root, detail=True).values():
        name = info["name"]
        fd = os.open(dest / name.replace("/", "_"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        fds.append(fd)
        jobs += [(name, fd, lo, hi) for lo, hi in split_ranges(int(info["size"]), part)]

    def one(job: tuple[str, int, int, int]) -> int:
        name, fd, lo, hi = job
        at = lo
        for chunk in read(fs, name, lo, hi):
            view = memoryview(chunk)
            while view:
                n = os.pwrite(fd, view, at)
                view, at = view[n:], at + n
        return at - lo

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            return sum(pool.map(one, jobs))
    finally:
        for fd in fds:
            os.close(fd)


def s3_get_gbps(
    *, objects: int, object_size: int, part_size: int, concurrency: int, rounds: int
) -> list[float]:
    """Per round: GB/s of every object's ranged GETs, ``concurrency`` at a time, through
    the reader a cache fill uses (``ranged_get``), bytes dropped on arrival."""
    from flashfeed import storage
    from flashfeed.cache.fetch.ranged import split_ranges

    work = tempfile.mkdtemp(prefix="fflim-", dir="/tmp")
    bs = start_store(work, bucket="limits")
    try:
        opts = bs.opts
        blob = os.urandom(object_size)
        urls = [f"s3://limits/obj-{i:04d}" for i in range(objects)]
        for u in urls:
            storage.write_bytes(u, blob, storage_options=opts)
        jobs = []
        for u in urls:
            fs, path = storage.filesystem(u, opts)
            jobs += [(fs, path, lo, hi) for lo, hi in split_ranges(object_size, part_size)]

        one = ranged_get(concurrency)

        out = []
        with ThreadPoolExecutor(concurrency) as pool:
            sum(pool.map(one, jobs[:concurrency]))  # connections
            for _ in range(rounds):
                t0 = time.perf_counter()
                got = sum(pool.map(one, jobs))
                out.append(got / (time.perf_counter() - t0) / 1e9)
        return out
    finally:
        bs.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--files", default=".bench/corpus", help="a folder of files to read")
    p.add_argument("--read-mb", type=int, default=256)
    p.add_argument("--s3-objects", type=int, default=8)
    part, conc = cache_fetch_shape()
    p.add_argument("--s3-object-mb", type=int, default=64, help="object (shard) size")
    p.add_argument("--part-mb", type=int, default=part >> 20, help="the cache's part size")
    p.add_argument("--concurrency", type=int, default=conc, help="the cache's GETs in flight")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--big-file-dir", default="/tmp", help="where the one large file is read")
    p.add_argument("--out", default=".bench/limits.json")
    args = p.parse_args(argv)
    files = pick_files(Path(args.files), args.read_mb << 20)
    if not files:
        raise SystemExit(f"no files under {args.files}")
    out: dict[str, Any] = {"read_bytes": sum(f.stat().st_size for f in files)}
    out["memcpy_gbps"] = memcpy_gbps()
    read_gbps(files)
    hot = [read_gbps(files) for _ in range(args.rounds)]
    cold, methods = [], set()
    for _ in range(args.rounds):
        method = drop_page_cache(files)
        direct = method == "none"
        methods.add("O_DIRECT" if direct else method)
        cold.append(read_gbps(files, direct=direct))
    out["read_hot_gbps"] = hot
    out["read_cold_gbps"] = cold
    big = Path(tempfile.mkdtemp(prefix="fflim-read-", dir=args.big_file_dir)) / "big.bin"
    try:
        with open(big, "wb") as f:
            for _ in range(max(1, args.read_mb // 4)):
                f.write(os.urandom(_CHUNK))
        read_gbps([big])
        out["big_file_mb"] = big.stat().st_size / 1e6
        out["big_hot_gbps"] = [read_gbps([big]) for _ in range(args.rounds)]
        out["big_cold_gbps"] = []
        for _ in range(args.rounds):
            method = drop_page_cache([big])
            methods.add("O_DIRECT" if method == "none" else method)
            out["big_cold_gbps"].append(read_gbps([big], direct=method == "none"))
    finally:
        shutil.rmtree(big.parent, ignore_errors=True)
    out["cold_method"] = ",".join(sorted(methods))
    out["s3_get_gbps"] = s3_get_gbps(
        objects=args.s3_objects,
        object_size=args.s3_object_mb << 20,
        part_size=args.part_mb << 20,
        concurrency=args.concurrency,
        rounds=args.rounds,
    )
    out["s3_get"] = {
        "objects": args.s3_objects,
        "object_mb": args.s3_object_mb,
        "part_mb": args.part_mb,
        "concurrency": args.concurrency,
    }
    print(f"{'limit':<36}{'median':>8}{'min':>8}{'max':>8}  unit")
    print(f"{'memcpy':<36}{out['memcpy_gbps']:8.2f}{'':>16}  GB/s")
    for key, label in (
        ("read_hot_gbps", "read corpus files hot"),
        ("read_cold_gbps", f"read corpus files cold ({out['cold_method']})"),
        ("big_hot_gbps", "read one large file hot"),
        ("big_cold_gbps", "read one large file cold"),
        ("s3_get_gbps", "S3 parallel GET"),
    ):
        v = out[key]
        print(f"{label:<36}{statistics.median(v):8.2f}{min(v):8.2f}{max(v):8.2f}  GB/s")
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

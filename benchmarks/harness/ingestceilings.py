"""Ceilings for ``ingestbench``: speeds no ingest of the corpus on these cores can beat,
measured in the same run as the writers.

  work       the per-image work alone (read, decode check, re-encode where asked) in N
             processes, no Ray, no tar, no upload
  work+PUT   the same work and the PUTs of the shards it makes, in N processes on the same
             cores as the S3 server: each process uploads a shard on a thread while it
             works on the next (the least a pipeline can spend), no Ray, no tar, no index,
             no manifest. Where the server shares the cores, this is the one that binds.
  PUT        shard-sized objects through ingest's ``put_object``, N at once
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import Any

__all__ = ["WorkCeiling", "ceilings", "shard_runs"]


def _work_chunk(args: tuple[list[str], Any]) -> int:
    """Read and transform one chunk of files in a pool process; the bytes read."""
    from flashfeed.ingest.transforms import transform_record

    paths, work = args
    kinds = {"jpg": "image", "cls": "int"}
    n = 0
    for path in paths:
        data = Path(path).read_bytes()
        transform_record({"jpg": data, "cls": 0}, kinds, work)
        n += len(data)
    return n


def _work_put_run(args: tuple[list[list[str]], Any, str, dict[str, Any]]) -> int:
    """Read and transform a run of shards in a pool process, each shard's images joined
    into one object and PUT on a thread while the next is worked on; the bytes read."""
    from flashfeed.s3.putobject import put_object

    shards, work, prefix, opts = args
    n = 0
    with ThreadPoolExecutor(1) as uploads:
        pending: Future[None] | None = None
        for i, paths in enumerate(shards):
            body = b"".join(_work_files(paths, work))
            n += sum(os.path.getsize(p) for p in paths)
            if pending is not None:
                pending.result()
            url = f"{prefix}/{os.getpid()}-{i:05d}"
            pending = uploads.submit(put_object, url, body, storage_options=opts)
        if pending is not None:
            pending.result()
    return n


def _work_files(paths: list[str], work: Any) -> list[bytes]:
    from flashfeed.ingest.transforms import transform_record

    kinds = {"jpg": "image", "cls": "int"}
    return [
        transform_record({"jpg": Path(p).read_bytes(), "cls": 0}, kinds, work)["jpg"] for p in paths
    ]


def shard_runs(files: list[tuple[Path, int]], shard_size: int, procs: int) -> list[list[list[str]]]:
    """The corpus cut into shards of about ``shard_size`` bytes, in file order, and the
    shards into ``procs`` runs of consecutive shards (as ingest's tasks take them)."""
    shards: list[list[str]] = [[]]
    size = 0
    for path, _ in files:
        if size >= shard_size:
            shards.append([])
            size = 0
        shards[-1].append(str(path))
        size += path.stat().st_size
    runs = min(procs, len(shards))
    bounds = [len(shards) * r // runs for r in range(runs + 1)]
    return [shards[a:b] for a, b in pairwise(bounds)]


class WorkCeiling:
    """The per-image work alone (read, decode check, re-encode where asked) in ``procs``
    processes, chunks handed out as processes free up: MB/s of corpus that no ingest of this
    corpus on ``procs`` CPUs can beat; and the same work with its shards' PUTs
    (``measure_with_puts``). The pool starts (and imports) before it is timed."""

    def __init__(
        self, files: list[tuple[Path, int]], work: Any, procs: int, shard_size: int
    ) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        step = max(1, len(files) // (8 * procs))
        paths = [str(p) for p, _ in files]
        self._work = work
        self._chunks = [(paths[i : i + step], work) for i in range(0, len(paths), step)]
        self._runs = shard_runs(files, shard_size, procs)
        self._total = sum(p.stat().st_size for p, _ in files)
        # forked before Ray starts: the workers hold none of Ray's threads
        self._pool = ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("fork"))
        list(self._pool.map(time.sleep, [0.2] * procs))  # every process up before timing
        self.measure()  # imports and page cache warm, as for the writers' later rounds

    def measure(self) -> float:
        t0 = time.perf_counter()
        n = sum(self._pool.map(_work_chunk, self._chunks))
        return n / (time.perf_counter() - t0) / 1e6

    def measure_with_puts(self, prefix: str, opts: dict[str, Any]) -> float:
        """MB/s of corpus worked on and PUT as shards under ``prefix``."""
        t0 = time.perf_counter()
        n = sum(self._pool.map(_work_put_run, [(r, self._work, prefix, opts) for r in self._runs]))
        return n / (time.perf_counter() - t0) / 1e6

    def close(self) -> None:
        self._pool.shutdown()


def ceilings(
    files: list[tuple[Path, int]],
    opts: dict[str, Any],
    bucket: str,
    *,
    shard_size: int,
    in_flight: int,
    total: int,
    rounds: int = 3,
) -> dict[str, Any]:
    """Raw speeds the writers cannot beat here: reading the corpus (``files``), and PUTs in
    ingest's own shape (shard-sized objects through ingest's ``put_object``, ``in_flight``
    at once as Ray runs one shard task per CPU) of ``total`` bytes, median of ``rounds``."""
    from flashfeed.s3.putobject import put_object

    t0 = time.perf_counter()
    n = sum(len(p.read_bytes()) for p, _ in files)
    read = n / (time.perf_counter() - t0) / 1e6
    size = min(shard_size, max(total, 1 << 20))
    blob = os.urandom(size)
    count = max(in_flight, -(-total // size))

    def put(i: int) -> int:
        put_object(f"s3://{bucket}/ceiling/{i:05d}", blob, storage_options=opts)
        return size

    puts = []
    with ThreadPoolExecutor(in_flight) as pool:
        for _ in range(rounds):
            t0 = time.perf_counter()
            moved = sum(pool.map(put, range(count)))
            puts.append(moved / (time.perf_counter() - t0) / 1e6)
    return {
        "local_read_mb_s": round(read, 1),
        "s3_put_mb_s": round(statistics.median(puts), 1),
        "s3_put_rounds_mb_s": puts,
        "s3_put_shape": {"object_bytes": size, "objects": count, "in_flight": in_flight},
    }

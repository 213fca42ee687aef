"""Token rates of the token stages (``inplace``, ``packedcost``): a timed side's tokens per
second and per CPU second, the Parquet corpus they read, and the table that sets each side
beside the best peer reading from where it reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.benchmath import fmt, ratio
from benchmarks.harness.rounds import best_median

__all__ = ["Measure", "progress", "rates_table", "timed", "write_corpus"]

Measure = dict[str, float]


def timed(fn: Callable[[], int]) -> Measure:
    """tokens/s and tokens per CPU second (this process: every thread it ran) of ``fn``."""
    c0, t0 = time.process_time(), time.perf_counter()
    tokens = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"tokens": tokens, "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu}


def write_corpus(prefix: str, columns: dict[str, Any], files: int, rows: int, codec: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flashfeed import storage

    n = len(next(iter(columns.values())))
    bounds = np.linspace(0, n, files + 1).astype(int)
    for k in range(files):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        table = pa.table({c: v[lo:hi] for c, v in columns.items()})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=rows, compression=codec)
        name = f"data/train-{k:05d}-of-{files:05d}.parquet"
        storage.write_bytes(storage.join(prefix, name), sink.getvalue().to_pybytes())


def progress(r: int, name: str, m: Measure | None) -> None:
    if m is not None:
        print(f"  round {r} {name}: {fmt(m['tokens_per_s'])} tokens/s", flush=True)


def rates_table(
    title: str, got: dict[str, list[Measure | None]], ours: tuple[str, ...]
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    print(f"\n{title}")
    print(f"{'side':44} {'tokens/s':>12} {'tokens/CPU s':>13} {'x best peer':>12}")
    peers = [n for n in got if n not in ours and all(m is not None for m in got[n])]
    for name, ms in got.items():
        if any(m is None for m in ms):
            rows[name] = "not installed"
            print(f"{name:44} {'not installed':>12}")
            continue
        rate = [m["tokens_per_s"] for m in ms]  # type: ignore[index]
        cpu = [m["tokens_per_cpu_s"] for m in ms]  # type: ignore[index]
        row: dict[str, Any] = {
            "tokens_per_s": best_median(rate),
            "tokens_per_cpu_s": best_median(cpu),
        }
        rel = ""
        # a side is compared with the best peer reading from where it reads (local, S3)
        # ... and in the same epochs (a later epoch's tokens kept, or every epoch's work)
        alike = [p for p in peers if ("epoch 2+" in p) == ("epoch 2+" in name)] or peers
        near = [p for p in alike if p.split()[-1] == name.split()[-1]] or alike
        if name in ours and near:
            best = max(near, key=lambda p: np.median([m["tokens_per_s"] for m in got[p]]))
            row["vs"] = best
            row["ratio"] = ratio(rate, [m["tokens_per_s"] for m in got[best]])  # type: ignore[index]
            row["cpu_ratio"] = ratio(cpu, [m["tokens_per_cpu_s"] for m in got[best]])  # type: ignore[index]
            rel = f"{row['ratio']['ratio']:.2f}x / {row['cpu_ratio']['ratio']:.2f}x cpu"
        rows[name] = row
        print(f"{name:44} {fmt(row['tokens_per_s']['median']):>12} "
              f"{fmt(row['tokens_per_cpu_s']['median']):>13} {rel:>12}")  # fmt: skip
    return rows

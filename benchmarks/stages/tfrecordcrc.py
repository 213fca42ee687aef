"""TFRecord CRC check speed: ingest's ``iter_records`` over one in-memory file, per CRC-32C
backend (``flashfeed.ingest.sources.tfrecord_format.CRC32C_BACKENDS``):

  google-crc32c  Google's C library (hardware CRC where the CPU has it), Apache-2.0
  crc32c         ICRAR's C extension (hardware CRC where the CPU has it), LGPL-2.1
  python         the pure-Python table loop, the fallback when neither is installed

Each round checks every record of the file (both CRCs of each record, as ingest does) once
per installed backend, in an order that rotates every round; the pure-Python loop checks only
the first ``--python-mb`` of the file (it is about a thousand times slower). Prints MB/s,
each backend's ratio to the pure-Python loop, and which backend ingest uses here;
``--out PATH`` also writes the rounds as JSON.

    python -m benchmarks.stages.tfrecordcrc --size 64MiB --record-size 100KiB --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from flashfeed.ingest.sources.tfrecord_format import (
    CRC32C_BACKENDS,
    crc32c_backend,
    frame_record,
    iter_records,
)
from flashfeed.units import format_size, parse_size

__all__ = ["main", "make_file", "measure"]


def make_file(size: int, record_size: int, *, seed: int = 0) -> bytes:
    """A TFRecord file of about ``size`` bytes of ``record_size``-byte random records."""
    if size <= 0 or record_size <= 0:
        raise ValueError(f"size and record_size must be > 0, got {size} and {record_size}")
    rng = np.random.default_rng(seed)
    n = max(1, size // record_size)
    return b"".join(
        frame_record(rng.integers(0, 256, record_size, dtype=np.uint8).tobytes()) for _ in range(n)
    )


def _check(blob: bytes, crc: Callable[[bytes], int]) -> tuple[float, int]:
    """Seconds to check every record of ``blob``; the number of records (all must pass)."""
    t0 = time.perf_counter()
    results = [ok for _, _, ok in iter_records(blob, source="bench", crc=crc)]
    seconds = time.perf_counter() - t0
    if not all(results):
        raise RuntimeError("a record failed its CRC check: the backend is wrong")
    return seconds, len(results)


def _prefix(blob: bytes, limit: int) -> bytes:
    """Whole records of ``blob`` up to about ``limit`` bytes (at least one)."""
    end = 0
    while end < len(blob):
        (length,) = struct.unpack_from("<Q", blob, end)
        if end and end + length + 16 > limit:
            break
        end += length + 16
    return blob[:end]


def measure(
    blob: bytes, *, rounds: int, python_bytes: int, backends: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """MB/s of each installed backend's check over ``blob`` in rotated rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    loaded: dict[str, Callable[[bytes], int]] = {}
    missing: list[str] = []
    for name in backends or tuple(CRC32C_BACKENDS):
        try:
            loaded[name] = crc32c_backend(name)[1]
        except ImportError:
            missing.append(name)
    small = _prefix(blob, python_bytes)

    def mb_s(name: str) -> Callable[[], float]:
        data = small if name == "python" else blob
        return lambda: len(data) / _check(data, loaded[name])[0] / 1e6

    runs = run_rounds({name: mb_s(name) for name in loaded}, rounds)
    median = {name: statistics.median(v) for name, v in runs.items()}
    base = median.get("python")
    return {
        "bytes": len(blob),
        "python_bytes": len(small),
        "mb_s": runs,
        "median_mb_s": median,
        "ratio_vs_python": {k: v / base for k, v in median.items()} if base else {},
        "missing": missing,
        "ingest_uses": crc32c_backend()[0],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="64MiB", help="TFRecord file size (default 64MiB)")
    ap.add_argument("--record-size", default="100KiB", help="bytes a record (default 100KiB)")
    ap.add_argument("--python-mb", type=float, default=2.0, help="MB the Python loop checks")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the result here (JSON)")
    args = ap.parse_args(argv)
    size, record = parse_size(args.size), parse_size(args.record_size)
    blob = make_file(size, record)
    out = measure(blob, rounds=args.rounds, python_bytes=int(args.python_mb * 1e6))
    out.update(record_size=record, rounds=args.rounds)
    print(
        f"TFRecord CRC check: {format_size(len(blob))} of {format_size(record)} records, "
        f"{args.rounds} rounds; ingest uses {out['ingest_uses']}"
    )
    print(f"{'backend':<14} {'MB/s':>10} {'x python':>10}")
    for name, mbs in out["median_mb_s"].items():
        ratio = out["ratio_vs_python"].get(name)
        print(f"{name:<14} {mbs:>10.1f} {ratio:>10.1f}" if ratio else f"{name:<14} {mbs:>10.1f}")
    for name in out["missing"]:
        print(f"{name:<14} {'not installed':>10}")
    if args.out:
        write_json(args.out, out)
    return out


if __name__ == "__main__":
    main()

"""TokenLoader's document outputs: the batch kernel the loader calls beside the numpy passes
it replaced, and what compiling it costs.

  step     GB/s of what a batch delivers with the document outputs (tokens widened to int64,
           position_ids, document_ids, labels, cu_seqlens, max_seqlen) from rows of uint16
           tokens with their segments, at each ``--batch-sizes``, into ``--sets`` buffer
           sets used in turn (a big batch's outputs go to memory, as a loader's do), in
           rotated rounds: numpy (each output its own pass over the batch's rows and
           segments, gathered beforehand: the path before the kernels), the batch kernel
           (``loader/tokens/docrows.py``: ``DocRows`` over flashfeed Arrow shards written and
           opened as ``TokenLoader`` opens them, one ``row_outputs`` per batch of shuffled
           (shard, row) pairs that locates and reads each row and its segments where they
           lie: what ``TokenLoader`` calls), and a memcpy of the same bytes
  compile  in new processes: seconds of the first batch kernel call (numba's import,
           compiling into an empty cache, then loading from that cache), and TokenLoader
           start-up (construction to first batch) tokens only, with the outputs and an
           empty numba cache, with the outputs and a filled one

Prints tables and writes JSON. Not a timed test.

    python -m benchmarks.stages.docfill --rounds 5 --out .bench/docfill.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated

OUTPUTS = ("position_ids", "document_ids", "cu_seqlens", "max_seqlen", "labels")


@dataclass(frozen=True)
class Segments:
    """A batch's segments, row after row: ``counts[r]`` segments in row ``r``, their
    ``lengths``, documents ``ids`` and where in their document they start."""

    counts: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray
    starts: np.ndarray


def packed_rows(rows: int, seq: int, seed: int = 0) -> tuple[Segments, np.ndarray]:
    """``rows`` rows of ``seq`` uint16 tokens filled with documents of a log-normal length
    mix (median 600 tokens), a row closed with padding where the next one does not fit."""
    rng = np.random.default_rng(seed)
    counts, lengths = [], []
    for _ in range(rows):
        left, c = seq, 0
        while left > 0:
            n = int(rng.lognormal(np.log(600), 1.0)) + 1
            if n > left and c:  # does not fit: padding ends the row
                break
            lengths.append(min(n, left))
            left -= lengths[-1]
            c += 1
        counts.append(c)
    s = len(lengths)
    seg = Segments(np.array(counts), np.array(lengths), np.arange(s), np.zeros(s, np.int64))
    return seg, rng.integers(0, 16000, (rows, seq)).astype(np.uint16)


def numpy_outputs(
    seg: Any, tokens: np.ndarray, alloc: Callable[[], np.ndarray]
) -> dict[str, np.ndarray | int]:
    """The numpy path the kernel replaced: tokens widened, then each output its own pass
    (positions joined from slices of one ramp, document ids repeated, labels copied and
    patched), into ``alloc()``'s (B, L) int64 buffers."""
    B, L = tokens.shape
    wide = alloc()
    np.copyto(wide, tokens, casting="unsafe")
    total = np.zeros(len(seg.lengths) + 1, dtype=np.int64)
    np.cumsum(seg.lengths, out=total[1:])
    row_end = np.cumsum(seg.counts)
    pad = L - (total[row_end] - total[row_end - seg.counts])
    has_pad = pad > 0
    ends = np.cumsum(seg.counts + has_pad)
    is_pad = np.zeros(int(ends[-1]), dtype=bool)
    is_pad[(ends - 1)[has_pad]] = True
    lengths = np.empty(len(is_pad), dtype=np.int64)
    lengths[~is_pad] = seg.lengths
    lengths[is_pad] = pad[has_pad]
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    ramp = np.arange(L, dtype=np.int64)
    pos = alloc()
    np.concatenate([ramp[:n] for n in lengths.tolist()], out=pos.reshape(-1))
    ids = np.full(len(lengths), -1, dtype=np.int64)
    ids[~is_pad] = seg.ids
    doc = alloc()
    np.copyto(doc, np.repeat(ids, lengths).reshape(B, L))
    labels = alloc()
    np.copyto(labels, tokens, casting="unsafe")
    labels.reshape(-1)[cu[:-1][~is_pad]] = -100
    for r in np.flatnonzero(pad).tolist():
        labels[r, L - int(pad[r]) :] = -100
    return {
        "tokens": wide, "position_ids": pos, "document_ids": doc, "labels": labels,
        "cu_seqlens": cu.astype(np.int32), "max_seqlen": int(lengths.max()),
    }  # fmt: skip


class Batches:
    """The batch kernel's inputs as ``TokenLoader`` builds them: ``packed_rows`` written as
    ``shards`` flashfeed Arrow shards (tokens and the document columns, record batches as
    ingest writes them), each opened as the loader opens it (mapped, ``OpenShard``), one
    ``DocRows`` over them; and ``sets`` batches of ``batch`` rows drawn without repeats in
    a shuffled order as (shard, row) pairs, with the same rows gathered first (tokens and
    ``Segments``) for the numpy passes."""

    def __init__(self, work: Path, batch: int, seq: int, sets: int, shards: int = 2) -> None:
        import pyarrow as pa

        from flashfeed.ingest.tokenize import DOCUMENT_COLUMNS
        from flashfeed.loader.openshard import OpenShard
        from flashfeed.loader.tokens.arrowcols import open_arrow_view
        from flashfeed.shardio import shard_name, write_arrow_shard

        total = batch * sets
        per = -(-total // shards)
        seg, tokens = packed_rows(total, seq)
        ends = np.cumsum(seg.counts)
        first = ends - seg.counts
        opened = {}
        for s in range(shards):
            lo, hi = s * per, min(total, (s + 1) * per)
            offsets = pa.array(np.concatenate([[0], ends[lo:hi] - first[lo]]).astype(np.int32))
            a, b = int(first[lo]), int(ends[hi - 1])
            values = {"doc_lens": seg.lengths[a:b], "doc_ids": seg.ids[a:b],
                      "doc_starts": seg.starts[a:b]}  # fmt: skip
            table = pa.table({
                "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens[lo:hi].ravel()), seq),
                **{n: pa.ListArray.from_arrays(offsets, pa.array(values[n], type=t))
                   for n, t in DOCUMENT_COLUMNS.items()},
            })  # fmt: skip
            write_arrow_shard(str(work), shard_name(s, "arrow"), table)
            view = open_arrow_view(
                str(work / shard_name(s, "arrow")), ("tokens",), name=shard_name(s, "arrow"),
                lists=("doc_lens", "doc_ids"),
            )  # fmt: skip
            opened[s] = OpenShard(s, view)
        self.opened = opened  # the views the table's addresses point into
        self.table: Any = None  # the DocRows, made on the first batch (numba imported then)
        order = np.random.default_rng(1).permutation(total)
        self.pairs: list[tuple[np.ndarray, np.ndarray]] = []
        self.gathered: list[tuple[Any, np.ndarray]] = []
        for k in range(sets):
            rows = order[k * batch : (k + 1) * batch]
            self.pairs.append((rows // per, rows % per))
            counts = seg.counts[rows]
            at = np.concatenate([np.arange(first[r], ends[r]) for r in rows.tolist()])
            at = at.astype(np.int64)
            self.gathered.append((
                Segments(counts, seg.lengths[at], seg.ids[at], seg.starts[at]), tokens[rows]
            ))  # fmt: skip


def kernel_outputs(
    batches: Batches, k: int, alloc: Callable[[], np.ndarray]
) -> dict[str, np.ndarray | int]:
    """Batch ``k``'s outputs as ``TokenLoader._gather`` makes them: ``row_outputs`` locates
    its (shard, row) pairs in the ``DocRows`` table and writes the widened tokens and every
    output in one compiled pass (``loader/tokens/docrows.py``)."""
    from flashfeed.loader.tokens.docrows import DocRows, row_outputs

    if batches.table is None:  # as the loader makes it when the open shards change
        batches.table = DocRows(batches.opened)
    shards, rows = batches.pairs[k]
    wide = alloc()
    out = row_outputs(batches.table, shards, rows, OUTPUTS, wide, lambda s, d: alloc(),
                      where=lambda: "a benchmark batch")  # fmt: skip
    return {"tokens": wide, **out}


def bench_step(batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """GB/s of the delivered bytes per way, rotated rounds of ``--batches`` batches each,
    the ``--sets`` batches (their rows, their output buffers) taken in turn."""
    with tempfile.TemporaryDirectory(prefix="ffdocstep-") as work:
        return _step(Batches(Path(work), batch, args.seq_len, args.sets), args)


def _step(batches: Batches, args: argparse.Namespace) -> dict[str, Any]:
    shape = batches.gathered[0][1].shape
    sets = [np.ones(shape, np.int64) for _ in range(4 * args.sets)]
    turn = iter(range(1 << 62))
    which = iter(range(1 << 62))

    def alloc() -> np.ndarray:
        return sets[next(turn) % len(sets)]

    nbytes = 0
    for k in range(args.sets):  # same outputs, or the timing means nothing
        ref, got = numpy_outputs(*batches.gathered[k], alloc), kernel_outputs(batches, k, alloc)
        for name, want in ref.items():
            same = want == got[name] if isinstance(want, int) else np.array_equal(want, got[name])
            if not same:
                raise SystemExit(f"batch kernel and numpy differ in {name} at batch {shape[0]}")
        nbytes = max(nbytes, sum(v.nbytes for v in got.values() if isinstance(v, np.ndarray)))
    src = np.ones(nbytes * args.sets // 8, np.int64)
    dst = np.ones_like(src)
    per = nbytes // 8

    def memcpy() -> None:
        k = next(turn) % args.sets
        np.copyto(dst[k * per : (k + 1) * per], src[k * per : (k + 1) * per])

    def numpy_way() -> None:
        numpy_outputs(*batches.gathered[next(which) % args.sets], alloc)

    def kernel_way() -> None:
        kernel_outputs(batches, next(which) % args.sets, alloc)

    ways: dict[str, Callable[[], Any]] = {
        "numpy passes": numpy_way,
        "batch kernel": kernel_way,
        "memcpy (same bytes)": memcpy,
    }
    rates: dict[str, list[float]] = {n: [] for n in ways}
    for r in range(args.rounds):
        for name in rotated(list(ways), r):
            t0 = time.perf_counter()
            for _ in range(args.batches):
                ways[name]()
            rates[name].append(nbytes * args.batches / (time.perf_counter() - t0) / 1e9)
    med = {n: statistics.median(v) for n, v in rates.items()}
    return {
        "bytes_per_batch": nbytes,
        "gb_per_s": med,
        "rounds": rates,
        "batch_kernel_vs_numpy": med["batch kernel"] / med["numpy passes"],
        "batch_kernel_of_memcpy": med["batch kernel"] / med["memcpy (same bytes)"],
    }


def _child(what: str, prefix: str) -> None:
    """In a new process: seconds of the first kernel call, or of TokenLoader start-up."""
    if what == "kernel":  # numba's import, DocRows and the first batch (its compile)
        with tempfile.TemporaryDirectory(prefix="ffdocstep-") as work:
            batches = Batches(Path(work), 4, 256, 1)
            t0 = time.perf_counter()
            kernel_outputs(batches, 0, lambda: np.empty((4, 256), np.int64))
            print(json.dumps({"seconds": time.perf_counter() - t0}))
        return
    else:
        from flashfeed.loader import TokenLoader

        outputs = OUTPUTS if what == "loader-outputs" else ()
        t0 = time.perf_counter()
        next(iter(TokenLoader(prefix, batch_size=8, outputs=outputs, device="cpu")))
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def _in_child(what: str, prefix: str, cache: Path) -> float:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.docfill", "--child", what, prefix],
        capture_output=True, text=True, timeout=600, env=env, check=True,
    )  # fmt: skip
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def bench_compile(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Medians over ``--compile-rounds`` of each first call / start-up, each in a new process."""
    from benchmarks.stages.tokenize_bench import (
        machine_documents,
        make_token_dataset,
        train_tokenizer,
    )

    tok = work / "tokenizer.json"
    train_tokenizer(machine_documents(200_000), tok, 600)
    prefix = work / "tokens"
    make_token_dataset(prefix, tok, argparse.Namespace(token_rows=256, seq_len=args.seq_len))
    rows: dict[str, list[float]] = {}
    for r in range(args.compile_rounds):
        cache = work / f"numba-{r}"  # each "empty cache" row starts a new one, the next reads it
        for name, what in (
            ("kernel first call, empty cache", "kernel"),
            ("kernel first call, from the cache", "kernel"),
            ("TokenLoader start-up, tokens only", "loader-tokens"),
            ("TokenLoader start-up, outputs, empty cache", "loader-outputs"),
            ("TokenLoader start-up, outputs, from the cache", "loader-outputs"),
        ):
            if "empty" in name:
                cache = work / f"numba-{r}-{what}"
            rows.setdefault(name, []).append(_in_child(what, str(prefix), cache))
    return {"seconds": {n: statistics.median(v) for n, v in rows.items()}, "rounds": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--sets", type=int, default=4, help="buffer sets used in turn")
    p.add_argument("--batches", type=int, default=20, help="batches per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--compile-rounds", type=int, default=2)
    p.add_argument("--child", nargs=2, metavar=("WHAT", "PREFIX"), help=argparse.SUPPRESS)
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    result: dict[str, Any] = {"config": vars(args)}
    result["step"] = {str(b): bench_step(b, args) for b in args.batch_sizes}
    with tempfile.TemporaryDirectory(prefix="ffdocfill-") as work:
        result["compile"] = bench_compile(Path(work), args)
    print_tables(result)
    if args.out:
        write_json(args.out, result)
    return 0


def print_tables(result: dict[str, Any]) -> None:
    print("\ndocument outputs of a batch, CPU (GB/s of delivered bytes, median)")
    for b, step in result["step"].items():
        rates = step["gb_per_s"]
        cells = ", ".join(f"{n} {v:6.2f}" for n, v in rates.items())
        print(
            f"  batch {b:>4s}: {cells}; batch kernel / numpy "
            f"{step['batch_kernel_vs_numpy']:5.2f}, batch kernel / memcpy "
            f"{step['batch_kernel_of_memcpy']:5.2f}"
        )
    print("\ncompiling the kernel (seconds, median, each in a new process)")
    for name, v in result["compile"]["seconds"].items():
        print(f"  {name:48s} {v:7.3f}")


if __name__ == "__main__":
    sys.exit(main())

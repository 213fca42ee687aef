"""Token cold start: a token dataset's first epoch from S3 (empty node cache) against the
same epoch from local disk, TokenLoader, CPU.

The dataset: ``--shards`` Arrow shards of ``--shard-mib`` MiB of random ``--dtype`` tokens, rows
of ``--seq-len``, in record batches of ``--batch-mib``, written three times, the very same
record batches: by flashfeed with the layout the schema records (rows stream as their record
batch lands); by pyarrow's own ``RecordBatchFileWriter``, no layout (rows stream once the
walk of the messages has found their record batch); and so with the keys dictionary-encoded
(the walk steps over the dictionary batch and the shard is read in file order, a record
batch once it and all before it have landed). Each round empties the cache and runs,
interleaved, the order rotating each round:

  cold-stream    first epoch from S3, record batch layout (streams)
  cold-walk      first epoch from S3, no layout: pyarrow's writer (streams by the walk)
  cold-dict      first epoch from S3, no layout, dictionary keys (streams in file order)
  local          first epoch from local disk (the layout dataset, read in place)
  ceiling        the local epoch while a plain download of the same shards from the same
                 server runs beside it (limits.download: the cache's GET shape, no checksum,
                 no progress marks): what any cold loader with a disk cache pays at least on
                 the same CPUs
  bound          (derived) the ceiling's seconds + the local epoch's last window's: the plan
                 shuffles the rows of a window of shards together, so the first batch of the
                 last window waits for nearly all of it, and no loader reads that window
                 while it downloads; a window read in arrival slices (every window of the
                 first epoch, ``--arrival-windows all``, the default; or only the first),
                 only its last slice; what a cold epoch can reach in this round

A run is a whole epoch: bytes of token rows delivered / seconds from creating the loader to
its last batch; ``--step-ms`` adds a training step per batch (sleep: the CPU is free meanwhile,
as while a GPU computes), which is what a training job overlaps the download with. A cold
run's ``tail``: the seconds from its last byte landing (the cached shards' last write) to its
last batch. Prints a table of medians and writes JSON. Not a timed test: run it by hand.

    python -m benchmarks.stages.tokcold --out .bench/tokcold.json
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.store import start_store, upload_tree
from benchmarks.stages.limits import download
from flashfeed import storage
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest
from flashfeed.shardio import shard_name, write_arrow_shard

ROWS = ("cold-stream", "cold-walk", "cold-dict", "local", "ceiling")
KINDS = {"cold-stream": "layout", "cold-walk": "walk", "cold-dict": "dict"}


def write_dataset(
    prefix: str, args: argparse.Namespace, *, batch_bytes: int, kind: str = "layout"
) -> int:
    """The token dataset at ``prefix``, record batches of about ``batch_bytes``, the same
    rows and batches whatever the ``kind``: ``layout`` (flashfeed's writer), ``walk``
    (pyarrow's ``RecordBatchFileWriter``), ``dict`` (so, keys dictionary-encoded); its bytes."""
    rng = np.random.default_rng(args.seed)
    dtype = np.dtype(args.dtype)
    rows = max(1, (args.shard_mib << 20) // (args.seq_len * dtype.itemsize))
    infos, n = [], 0
    for i in range(args.shards):
        tokens = rng.integers(0, 50_000, rows * args.seq_len, dtype=dtype)
        table = pa.table(
            {
                "__key__": [f"r{n + j:09d}" for j in range(rows)],
                "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), args.seq_len),
            }
        )
        path = shard_name(i, "arrow")
        if kind == "layout":
            infos.append(write_arrow_shard(prefix, path, table, batch_bytes=batch_bytes))
        else:
            per_batch = max(1, batch_bytes // max(1, table.nbytes // table.num_rows))
            if kind == "dict":
                keys = table.column("__key__").combine_chunks().dictionary_encode()
                table = table.set_column(0, "__key__", keys)
            sink = io.BytesIO()
            with pa.ipc.RecordBatchFileWriter(sink, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=min(per_batch, 8192)):
                    writer.write_batch(batch)
            data = sink.getvalue()
            storage.write_bytes(storage.join(prefix, path), data)
            infos.append(ShardInfo(path, table.num_rows, len(data), storage.checksum(data)))
        n += rows
    schema = {"__key__": "string", "tokens": f"fixed_size_list<{dtype}>[{args.seq_len}]"}
    manifest = Manifest(name="tokcold", shard_format="arrow", schema=schema, shards=tuple(infos))
    commit_manifest(prefix, manifest)
    return sum(s.bytes for s in infos)


def epoch(
    url: str, args: argparse.Namespace, cache_dir: str | None, beside: Path | None = None
) -> dict[str, float]:
    """One whole epoch: GB/s of token rows, seconds to the first batch, batches served
    while their shard arrived, and this process's CPU seconds (all its threads: the fills'
    too, not the server's), which a busy machine moves far less than the wall time.
    ``beside``: (the url's dataset is local) download the store's copy of the streaming
    dataset into that folder meanwhile; the epoch ends when both have. A cold epoch also
    says when its last byte landed (``landed_s``) and the seconds after it (``tail_s``); a
    local one how long what the plan shuffles together last took (``last_window_s``): no
    loader reads those rows before all of their bytes have landed (``last_window_batch``)."""
    from flashfeed.loader import TokenLoader

    t0, c0, wall0 = time.perf_counter(), time.process_time(), time.time()
    landed = None
    if beside is not None:
        bg = ThreadPoolExecutor(1, thread_name_prefix="download")
        landed = bg.submit(download, args.stream_url, beside)
    loader = TokenLoader(
        url, batch_size=args.batch, dtype=None, device="cpu", cache_dir=cache_dir,
        seed=args.seed, arrival_windows=args.arrival_windows,
    )  # fmt: skip
    times = []
    for _ in loader:
        times.append(time.perf_counter() - t0)
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
    if landed is not None:
        landed.result()
        bg.shutdown()
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
    stats = loader.stats()
    options = loader.parts.options
    loader.close()
    ahead = stats.get("readahead", {})
    out = {
        "gbps": loader.bytes_delivered / seconds / 1e9,
        "first_batch_s": times[0] if times else 0.0,
        "streamed_batches": float(ahead.get("batches_served_while_arriving", 0)),
        "batches": float(stats["batches"]),
        "cpu_s": cpu,
        "seconds": seconds,
    }
    if cache_dir is not None:
        out["landed_s"] = last_landed(cache_dir) - wall0
        out["tail_s"] = seconds - out["landed_s"]
    elif beside is None and times:
        out["last_window_s"] = seconds - times[last_window_batch(args, options, len(times))]
    return out


def last_landed(cache_dir: str) -> float:
    """When the last byte of any shard in the cache landed (a fill writes its part file with
    ``pwrite``, then renames it into place: its mtime is its last write)."""
    return max((p.stat().st_mtime for p in Path(cache_dir).rglob("*.arrow")), default=0.0)


def last_window_batch(args: argparse.Namespace, options: Any, batches: int) -> int:
    """The first batch of what the plan shuffles together last: its last window (the
    shards are of equal rows, a window holds ``options.window`` of them, the last one what
    is left), or, when the first epoch reads that window front to back in arrival slices
    (every window: ``arrival_windows="all"``; else only the first), that window's last
    slice (``flashfeed/plan/streams.py``)."""
    share = (args.shards - options.window * ((args.shards - 1) // options.window)) / args.shards
    sliced = args.shards <= options.window or options.arrival_windows == "all"
    if sliced and options.arrival_slices > 1:
        doubling = options.arrival_spacing == "doubling"
        share *= 0.5 if doubling else 1 / options.arrival_slices
    return min(batches - 1, round(batches * (1 - share)))


def bound(ceiling: dict[str, float], local: dict[str, float]) -> dict[str, float]:
    """What a cold epoch reaches at best in one round: the download beside a local epoch
    (the ceiling), then the local epoch's last window, which no loader reads before all of
    its shards have landed (its rows are shuffled together)."""
    seconds = ceiling["seconds"] + local["last_window_s"]
    return {"gbps": local["gbps"] * local["seconds"] / seconds, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--shard-mib", type=int, default=32)
    p.add_argument("--batch-mib", type=float, default=4.0, help="record batch size")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--dtype", choices=("uint16", "uint32"), default="uint16", help="token type")
    p.add_argument("--batch", type=int, default=16, help="rows per loader batch")
    p.add_argument("--step-ms", type=float, default=0.0, help="a training step per batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--arrival-windows",
        choices=("all", "first"),
        default="first",
        help="the first epoch's windows read in arrival slices (the loaders' arrival_windows=; "
        "default: theirs)",
    )
    p.add_argument("--out", default=".bench/tokcold.json")
    args = p.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="fftokcold-", dir="/tmp"))
    runs: dict[str, list[dict[str, float]]] = {r: [] for r in ROWS}
    store = start_store(scratch, export_env=True)
    bucket = store.bucket
    try:
        stream = scratch / "layout"
        size = int(args.batch_mib * (1 << 20))
        urls, written = {}, {}
        for name, kind in KINDS.items():
            written[kind] = write_dataset(str(scratch / kind), args, batch_bytes=size, kind=kind)
            urls[name] = f"{bucket}/tok-{kind}"
            upload_tree(scratch / kind, urls[name])
        total = written["layout"]
        args.stream_url = urls["cold-stream"]
        for r in range(args.rounds):
            for name in rotated(ROWS, r):
                cache = scratch / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                if name == "local":
                    got = epoch(str(stream), args, None)
                elif name == "ceiling":
                    shutil.rmtree(scratch / "download", ignore_errors=True)
                    got = epoch(str(stream), args, None, beside=scratch / "download")
                else:
                    got = epoch(urls[name], args, str(cache))
                runs[name].append(got)
            print(f"round {r}: " + ", ".join(f"{n} {runs[n][-1]['gbps']:.3f}" for n in ROWS),
                  file=sys.stderr, flush=True)  # fmt: skip
    finally:
        store.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    bounds = [bound(c, lo) for c, lo in zip(runs["ceiling"], runs["local"], strict=True)]
    med = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in runs.items()}
    med["bound"] = {k: statistics.median(b[k] for b in bounds) for k in bounds[0]}
    local, ceiling, limit = (med[n]["gbps"] for n in ("local", "ceiling", "bound"))
    print(
        f"\ntoken cold start, {args.shards} shards x {args.shard_mib} MiB ({total / 1e6:.0f} MB), "
        f"record batches {args.batch_mib:g} MiB, batch {args.batch} x {args.seq_len} "
        f"{args.dtype}, step {args.step_ms:g} ms, arrival windows {args.arrival_windows}, "
        f"whole epochs, median of {args.rounds} rounds"
    )
    print(f"{'run':<12} {'GB/s':>8} {'of local':>9} {'of ceiling':>11} {'of bound':>9} "
          f"{'first batch s':>14} {'streamed':>11} {'tail s':>7} {'CPU s':>6}")  # fmt: skip
    for n in (*ROWS, "bound"):
        m = med[n]
        ratios = (
            f"{m['gbps'] / local:>8.2f}x {m['gbps'] / ceiling:>10.2f}x {m['gbps'] / limit:>8.2f}x"
        )
        if n == "bound":
            print(f"{n:<12} {m['gbps']:>8.3f} {ratios}")
            continue
        streamed = f"{m['streamed_batches']:>5.0f}/{m['batches']:<5.0f}"
        tail = f"{m['tail_s']:>7.3f}" if "tail_s" in m else f"{'':>7}"
        print(f"{n:<12} {m['gbps']:>8.3f} {ratios} {m['first_batch_s']:>14.3f} {streamed} "
              f"{tail} {m['cpu_s']:>6.2f}")  # fmt: skip
    print(
        "bound: the ceiling's seconds + the local epoch's last window's (that window's rows "
        "are shuffled together: read once all of it has landed; in arrival slices, its last "
        "slice's); tail: seconds after the last byte landed"
    )
    out: dict[str, Any] = {
        "config": vars(args),
        "bytes": total,
        "median": med,
        "of_local": {n: med[n]["gbps"] / local for n in med},
        "of_ceiling": {n: med[n]["gbps"] / ceiling for n in med},
        "of_bound": {n: med[n]["gbps"] / limit for n in med},
        "rounds": runs,
        "bound_rounds": bounds,
    }
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``flashfeed report`` (a stats log or a run's directory of them) and ``flashfeed top``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from flashfeed.telemetry import WAIT_KINDS

from .report import Records, plot_stalls, source_totals, summarize
from .runlog import read_records

__all__ = ["register"]

EPILOG = """\
examples:
  flashfeed report stats.jsonl                      # summary only
  flashfeed report stats.jsonl --out stalls.png     # plus stall fractions over time
  flashfeed report runs/42/ --html run42.html       # every rank's log in runs/42/*.jsonl
  flashfeed report runs/42/ --html run42.html --gpu-hour-price 2.50
"""

TOP_EPILOG = """\
examples:
  flashfeed top --cache-dir /nvme/ff-cache          # refreshed in place every second
  flashfeed top --interval 5 --iterations 3 | tee   # three frames as plain lines

Loaders reading through the node cache keep one small status file per rank in
CACHE_DIR/.status/ (at most every 0.5 s); the cache keeps its counters in CACHE_DIR.
Loaders reading a local dataset in place keep theirs in RUNTIME_DIR/.status/, where
RUNTIME_DIR is $FLASHFEED_RUNTIME_DIR, else $XDG_RUNTIME_DIR/flashfeed, else
/tmp/flashfeed-UID; top shows both.
--cache-dir defaults to $FLASHFEED_CACHE_DIR, else ~/.cache/flashfeed, as the loaders do.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="summarize a loader stats log or a run's logs; plot stalls; an HTML run report",
        description="Read the JSON-lines stats logs loaders wrote (stats_log=) and print "
        "samples/s and the fraction of time spent waiting on storage, decode and "
        "host-to-device copies. LOG is one log, or a run directory holding one log per "
        "rank (*.jsonl). --out draws the stalls over time (needs matplotlib); --html writes "
        "one self-contained page for the run: throughput and stalls per rank over time, "
        "GPU time lost to input, the slowest ranks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", help="stats log written by a loader, or a directory of them")
    p.add_argument("--out", help="PNG to write (needs matplotlib)")
    p.add_argument("--html", help="HTML page to write for the run (all ranks)")
    p.add_argument(
        "--gpu-hour-price",
        type=float,
        help="price of one GPU-hour: the HTML report also gives the money lost to input",
    )
    p.add_argument("--bin", type=float, help="seconds per point (default: 1 for --out, "
                   "about 80 points for --html)")  # fmt: skip
    p.set_defaults(func=_run)
    t = subparsers.add_parser(
        "top",
        help="live view of this node: each rank's throughput and stalls, the node cache",
        description="Show, refreshed in place, one row per training rank on this node "
        "(samples/s, share of time waited on storage, decode and host-to-device copies, "
        "batches that waited on storage, epoch and position) and one line for the node "
        "cache (hit rate, GB fetched and GB/s, fills in flight, evictions, throttle "
        "events, used/capacity). Plain lines when stdout is not a terminal.",
        epilog=TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("--cache-dir", help="the node cache directory the loaders use")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    t.add_argument("--iterations", type=int, help="stop after this many frames")
    t.set_defaults(func=_top)


def _top(args: argparse.Namespace) -> int:
    from .top import default_cache_dir, run_top

    main = threading.current_thread() is threading.main_thread()
    # Ctrl-C is how one leaves the view, not an interrupted job: no message, exit 0
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        return run_top(
            args.cache_dir or default_cache_dir(),
            interval=args.interval,
            iterations=args.iterations,
        )
    except KeyboardInterrupt:
        return 0
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def _run(args: argparse.Namespace) -> int:
    if args.gpu_hour_price is not None and not args.html:
        raise ValueError("--gpu-hour-price goes with --html (the price of lost GPU time)")
    if args.html or os.path.isdir(args.log):
        return _run_dir(args)
    records = read_records(args.log)
    _print_summary(summarize(records))
    _print_sources(records)
    return _plot(records, args)


def _print_sources(records: Records, prefix: str = "") -> None:
    """A mixture's log: one line of samples, share and storage wait per source."""
    per = source_totals(records)
    if per:
        print(
            f"{prefix}sources: "
            + ", ".join(
                f"{name} {int(s['samples'])} ({100 * s['share']:.1f}%, storage "
                f"{s['storage_s']:.2f} s)"
                for name, s in per.items()
            )
        )


def _print_summary(s: dict[str, float], prefix: str = "") -> None:
    print(
        f"{prefix}{int(s['batches'])} batches, {int(s['samples'])} samples in "
        f"{s['elapsed_s']:.1f} s: {s['samples_per_s']:.0f} samples/s"
    )
    print(
        f"{prefix}waiting: " + ", ".join(f"{k} {100 * s[f'{k}_fraction']:.1f}%" for k in WAIT_KINDS)
    )


def _plot(records: Records, args: argparse.Namespace) -> int:
    if args.out:
        try:
            plot_stalls(records, args.out, bin_s=args.bin or 1.0)
        except ImportError as exc:
            print(f"flashfeed report: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.out}")
    return 0


def _run_dir(args: argparse.Namespace) -> int:
    from .htmlreport import write_html_report
    from .runlog import read_run

    if not os.path.isdir(args.log):
        raise ValueError(
            f"{args.log} is not a directory: --html reports on a run directory holding one "
            "stats log per rank (*.jsonl)"
        )
    if args.html:
        run = write_html_report(
            args.log, args.html, gpu_hour_price=args.gpu_hour_price, bin_s=args.bin
        )
    else:
        run = read_run(args.log)
    for problem in run.problems:
        print(f"flashfeed report: note: {problem}", file=sys.stderr)
    for rank in sorted(run.ranks):
        _print_summary(summarize(run.ranks[rank]), prefix=f"rank {rank}: ")
        _print_sources(run.ranks[rank], prefix=f"rank {rank}: ")
    if args.html:
        print(f"wrote {args.html}")
    return _plot([r for rank in sorted(run.ranks) for r in run.ranks[rank]], args)

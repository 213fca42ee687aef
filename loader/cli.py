"""``flashfeed report LOG --out stalls.png``: a loader stats log as a summary and a plot."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .report import plot_stalls, read_stats_log, summarize

__all__ = ["register"]

EPILOG = """\
examples:
  flashfeed report stats.jsonl                      # summary only
  flashfeed report stats.jsonl --out stalls.png     # plus stall fractions over time
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="summarize a loader stats log (Loader(stats_log=...)) and plot its stalls",
        description="Read the JSON-lines stats log a loader wrote (stats_log=) and print "
        "samples/s and the fraction of time spent waiting on storage, decode and "
        "host-to-device copies; --out also draws them over time (needs matplotlib).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", help="stats log written by a loader (JSON lines)")
    p.add_argument("--out", help="PNG to write (needs matplotlib)")
    p.add_argument("--bin", type=float, default=1.0, help="seconds per point (default 1)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    records = read_stats_log(args.log)
    s = summarize(records)
    print(
        f"{int(s['batches'])} batches, {int(s['samples'])} samples in {s['elapsed_s']:.1f} s: "
        f"{s['samples_per_s']:.0f} samples/s"
    )
    print(
        "waiting: "
        + ", ".join(f"{k} {100 * s[f'{k}_fraction']:.1f}%" for k in ("storage", "decode", "h2d"))
    )
    if args.out:
        try:
            plot_stalls(records, args.out, bin_s=args.bin)
        except ImportError as exc:
            print(f"flashfeed report: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.out}")
    return 0

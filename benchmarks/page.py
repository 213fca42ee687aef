"""BENCHMARKS.md from a suite result: how to run, the machine, the tables, the plots, the
peers and what was not measured. ``make bench`` writes it; to rebuild it (and the plots) from
a results file:

    python benchmarks/page.py benchmarks/results/2026-11-29-host.json --out BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import machine_markdown, markdown

__all__ = ["benchmarks_page"]

HOW_TO_RUN = """\
```sh
make bench-venv     # .bench-venv: the peers from benchmarks/requirements.txt, layered over .venv
make bench          # every stage at the sizes below (~20 minutes on 2 cores) -> this page
make bench-quick    # the same stages at smoke-check sizes, under 5 minutes
bash benchmarks/gpu.sh   # one GPU, no network (--wheelhouse DIR): nvJPEG ceiling, loader, h2d
```

Each stage is also a script of its own (`benchmarks/<stage>.py --help`). The suite runs them
as child processes, one at a time, each starting and stopping its own SeaweedFS server (and
Ray, for ingest); comparisons inside a stage run side by side in interleaved rounds. Ratios
are ratios of medians with the min-max of the per-round ratios; "of limit" is the median
over the physical limit measured in the same run."""

NOTES = """\
- Noise: the machine's 2 cores are shared with other engineers' test and benchmark runs
  (another benchmark ran during part of this run); expect +-30-50% between runs. Compare the
  ratios of a row, measured in interleaved rounds, rather than absolute figures across rows.
- Cold reads drop the whole page cache (`echo 1 > /proc/sys/vm/drop_caches`, as root); where
  that is not permitted the suite falls back to per-file `posix_fadvise(DONTNEED)`, then
  O_DIRECT, and the JSON names the method used.
- Small sizes are dominated by fixed costs (Ray start-up, one Ray task per shard, server
  start): the scaling tables show how each figure approaches its steady state.
- GPU: this machine has none, and no GPU figure has been measured yet. `benchmarks/gpu.sh`
  measures the GPU path on one GPU in under 5 minutes: the Loader's mixed decode against a
  DALI pipeline fed from RAM (the nvJPEG ceiling), TokenLoader h2d against pinned memcpy, a
  2-epoch exactly-once check and the stall split, one result file per stage
  (`benchmarks/results/gpu-<date>-<host>/`).
- Not measured here: TokenLoader host-to-device copy (needs a GPU); litdata and mosaic
  reading from S3 (the peers stage reads their local conversions)."""


#: the design point's targets on a 2-CPU machine (seconds; MiB)
PLAN_TARGETS = {
    "open_s": 1.0,
    "rank_plan_s": 1.0,
    "node_order_s": 1.0,
    "resplit_s": 2.0,
    "peak_rss_mib": 1024.0,
}


def plan_section(plan: dict[str, Any], json_path: str, png: str | None = None) -> str:
    """Planning at scale, from a ``benchmarks/planbench.py`` results file."""
    lines = [
        "## Planning at scale",
        "",
        f"`python benchmarks/planbench.py` ([`{json_path}`]({json_path}), run apart from the "
        "suite above, on the same machine): synthetic manifests (no shard bytes) of 1,000 "
        "samples per shard, 8,192 ranks, 8 per node. A rank plans its node's share only; the "
        "whole-epoch plan (every rank's sequence, what each rank computed before planning "
        "became rank-local) is timed where it fits in memory.",
        "",
    ]
    design = plan.get("scale")
    if design:
        lines += [
            "Design point, measured in a fresh process (10^9 samples, 10^6 shards):",
            "",
            "| measure | value | target | |",
            "|---|---:|---:|---|",
        ]
        for key, target in PLAN_TARGETS.items():
            value = float(design[key])
            ok = "met" if value < target else "missed"
            lines.append(f"| `{key}` | {value:.3g} | < {target:g} | {ok} |")
        lines.append("")
    start = plan.get("loader_start")
    if start:
        lines += [
            f"Constructing a `Loader` for rank 4,099 of 8,192 on a local {start['shards']:,}-shard"
            f" manifest: {start['loader_start_s']:.2f} s (target < 3 s), after "
            f"{start['import_s']:.1f} s of importing torch and DALI.",
            "",
        ]
    lines += [
        "| shards | samples | open | rank plan | node order | re-split | whole epoch |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in plan.get("plan_cost", []):
        whole = "does not fit" if c.get("whole_epoch_s") is None else f"{c['whole_epoch_s']:.2f} s"
        lines.append(
            f"| {c['shards']:,} | {c['samples']:,} | {c['open_s']:.2f} s | "
            f"{c['rank_plan_s']:.2f} s | {c['node_order_s']:.2f} s | {c['resplit_s']:.2f} s | "
            f"{whole} |"
        )
    if png:
        lines += ["", f"![planning at scale]({png})"]
    return "\n".join(lines) + "\n"


def benchmarks_page(
    result: dict[str, Any],
    json_path: str,
    pngs: Sequence[str],
    plan: tuple[dict[str, Any], str, str | None] | None = None,
) -> str:
    """The whole page; ``json_path`` and ``pngs`` relative to where the page is written."""
    versions = result.get("versions", {})
    unavailable = result.get("unavailable", {})
    peers = []
    for k in ("webdataset", "ray", "nvidia-dali-cuda120", "litdata", "mosaicml-streaming"):
        why = unavailable.get(k)
        peers.append(f"- {k} {versions.get(k, '?')}" + (f": {why}" if why else ""))
    parts = [
        "# Benchmarks",
        "",
        "flashfeed against its peers (webdataset, Ray Data's writer, plain DALI, litdata, "
        "mosaicml-streaming) and against the physical limits of the machine, all measured in "
        f"one run of `make bench`. Latest result: [`{json_path}`]({json_path}), "
        f"{result.get('date', '?')}.",
        "",
        "## Machine",
        "",
        machine_markdown(result).rstrip(),
        "",
        "## Results",
        "",
        markdown(result).rstrip(),
        "",
        *([plan_section(*plan)] if plan else []),
        "## Plots",
        "",
        *[f"![{Path(p).stem}]({p})\n" for p in pngs],
        "## Peers",
        "",
        "Installed into `.bench-venv` from `benchmarks/requirements.txt` (the product's "
        "dependencies do not change). litdata and mosaicml-streaming import torchvision, and "
        "PyPI's torchvision fails beside the CPU build of torch 2.13, so that environment takes "
        "torch 2.14.1 + torchvision 0.29.1; flashfeed, Ray, DALI and webdataset come from "
        "`.venv` beneath it.",
        "",
        *peers,
        "",
        "## How to run",
        "",
        HOW_TO_RUN,
        "",
        "## Notes",
        "",
        NOTES,
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="a suite results JSON")
    p.add_argument("--out", default="BENCHMARKS.md")
    p.add_argument("--plots", action="store_true", help="also redraw the PNGs beside the JSON")
    p.add_argument(
        "--plan",
        default="benchmarks/results/plan.json",
        help="a planbench.py results file for the planning-at-scale section (if it exists)",
    )
    args = p.parse_args(argv)
    path = Path(args.results)
    result = json.loads(path.read_text())
    if args.plots:
        from plots import write_all

        write_all(result, path.parent, path.stem)
    base = Path(args.out).resolve().parent
    from plots import PLOTS

    pngs = [x for x in (path.parent / f"{path.stem}-{n}.png" for n in PLOTS) if x.exists()]
    rel = [os.path.relpath(x.resolve(), base) for x in pngs]
    plan_path = Path(args.plan)
    plan = None
    if plan_path.exists():
        png = plan_path.with_suffix(".png")
        plan = (
            json.loads(plan_path.read_text()),
            os.path.relpath(plan_path.resolve(), base),
            os.path.relpath(png.resolve(), base) if png.exists() else None,
        )
    page = benchmarks_page(result, os.path.relpath(path.resolve(), base), rel, plan)
    Path(args.out).write_text(page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

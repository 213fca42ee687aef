"""BENCHMARKS.md from a suite result: how to run, the machine, the tables, the plots, the
peers and what was not measured. ``make bench`` writes it; to rebuild it (and the plots) from
a results file:

    python -m benchmarks.page benchmarks/results/2026-11-29-host.json --out BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.report import machine_markdown, markdown, targets_markdown

__all__ = ["benchmarks_page", "fillcpu_section", "targets_section"]

HOW_TO_RUN = """\
```sh
make bench-venv     # .bench-venv: the peers from benchmarks/requirements.txt, layered over .venv
make bench          # every stage at the sizes below (~30 minutes on 2 cores) -> this page
make bench-quick    # the same stages at smoke-check sizes (5-10 minutes; numbers not published)
bash benchmarks/gpu.sh   # one GPU, no network (--wheelhouse DIR): nvJPEG ceiling, loader, h2d
```

Each stage also runs alone (`python -m benchmarks.stages.<name> --help`). The suite runs them
as child processes, one at a time, each starting and stopping its own SeaweedFS server (and
Ray, for ingest); comparisons inside a stage run side by side in interleaved rounds. Ratios
are ratios of medians with the min-max of the per-round ratios; "of limit" is the median
over the physical limit measured in the same run."""

HOW_MEASURED = """\
- Rounds: the full profile runs every comparison in 5 interleaved rounds (the shard-size
  targets stage, whose rounds hold about ten whole epochs each, in 3, as its targets ask),
  and the order of the runs rotates by one every round, so no run is always first (after a
  conversion, on a cold page cache) or last. Tables give the median with the min-max
  over rounds; a ratio is the ratio of medians with the min-max of the per-round ratios.
- Timers: every row of a table has the same boundaries, construction included. Loader rows
  start the clock before the loader (flashfeed's `Loader(...)`, a DataLoader, a DALI
  pipeline) is constructed and stop it at the first batch after a window of at least 5 s
  (epochs repeat until then); cold-start rows time whole epochs from construction to the last
  batch, for flashfeed as for the peers; a hot epoch is timed from the end of the first
  epoch. Start-up is `Loader(...)` to the first batch in a fresh process (a restart is
  one), DALI already imported, median of several; `benchmarks/stages/startup.py` also times it with
  the import and beside the same DALI pipeline's own start on bytes in RAM.
- Limits are measured in the same run with the product's own shapes: the decode ceiling is
  the Loader's own DALI pipeline (`build_pipeline`: exec_dynamic, the same operators,
  threads, reader process and prefetch) fed from JPEG bytes in RAM (it bounds flashfeed's
  Loader, whose pipeline it is; another DALI graph, such as the plain reader, may exceed
  it); the S3 GET limit uses the cache's default part size and GETs in flight; the PUT limit
  writes shard-sized objects, one PUT each, as many at once as ingest runs Ray tasks,
  several rounds; the ingest work ceiling runs ingest's per-image work alone (read, decode
  check, re-encode where asked; no Ray, tar or upload) in as many processes as Ray CPUs,
  every round, and ingest rows take the lower of it and the PUT limit; page-cache reads
  read each file whole, as the hit path does. A limit is
  the best round of its run, a result the median of its rounds. A result above its limit is
  a measurement error: the run lists it under `limit_errors` (a full run then exits 1), and
  the tables show the row as refused (never above 100%).
- Peers at their best documented settings: PIL peers decode with `Image.draft` (JPEG DCT
  scaling, the counterpart of DALI's crop decode) and keep their DataLoader workers across
  epochs; `wds+dali` sends webdataset's bytes through the same DALI graph as flashfeed;
  Ray Data writes with `map_batches`, one block per output shard, on an object store of
  1 GiB (several times the largest corpus); litdata and mosaicml-streaming also read cold
  from the same SeaweedFS with their own clients (litdata through boto3: its optional
  obstore client refuses a plain-http endpoint).
- Noise: the machine's 2 cores are shared with other engineers' tests and benchmarks and
  with the SeaweedFS server; the min-max columns show how far rounds moved. Compare the
  ratios of a row, measured in interleaved rounds, rather than absolute figures across rows.

The quick profile's result of 2026-11-29 (`2026-11-29-vm-quick.*`, since replaced) showed
flashfeed at 58.6 img/s, 0.37x litdata, in the peers stage. Its result file gives the cause:
that stage ran one round and timed 4 batches (256 images, 4.4 s) after 3 untimed ones, with
flashfeed first in its only round, straight after litdata's `optimize` had run its spawned
workers, and the load average at 2.6-3.6 on 2 cores. flashfeed's CPU per image was 3.6 ms,
as in the loader stage of the same run (3.5-3.6 ms at 221-263 img/s): it did the same work
per image but got about a fifth of a core (58.6 img/s x 3.6 ms): it spent most of that
window waiting, most likely for CPU (its shards sat on local disk, just written). One
4-second sample under contention is not a measurement; the rules above (time windows,
rotation, rounds) replace it, and the quick profile remains a smoke check."""

NOTES = """\
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
- Not measured here: TokenLoader host-to-device copy (needs a GPU)."""


def fillcpu_section(result: dict[str, Any]) -> str:
    """Client CPU per GB of a cache fill vs raw ranged GETs (benchmarks/stages/fillcpu.py)."""
    data = ((result.get("stages") or {}).get("fillcpu") or {}).get("data") or {}
    rounds = data.get("rounds") or []
    if not rounds:
        return ""
    import statistics

    methods = list(rounds[0])
    med = {m: statistics.median(r[m]["cpu_s_per_gb"] for r in rounds) for m in methods}
    ref = "raw-botocore" if "raw-botocore" in med else methods[-1]
    a = data.get("args", {})
    lines = [
        "## Cache fill: client CPU per GB",
        "",
        f"`benchmarks/stages/fillcpu.py`: {a.get('shards', '?')} shards x "
        f"{a.get('shard_size', '?')}, "
        f"part {a.get('part_size', '?')}, {a.get('concurrency', '?')} GETs in flight, "
        f"{len(rounds)} interleaved rounds; CPU seconds of the client process only. Target: "
        "fill <= 1.3x raw ranged GETs.",
        "",
        "| method | CPU s/GB (median, min-max) | vs raw |",
        "|---|---|---|",
    ]
    for m in methods:
        vals = [r[m]["cpu_s_per_gb"] for r in rounds]
        lines.append(
            f"| {m} | {med[m]:.3f} ({min(vals):.3f}-{max(vals):.3f}) | {med[m] / med[ref]:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def targets_section(result: dict[str, Any]) -> str:
    table = targets_markdown(result)
    if not table:
        return ""
    data = result["stages"]["targets"]["data"]
    sizes = " and ".join(str(k) for k in data.get("shards", {}))
    return (
        f"## Cold start on {sizes} MiB shards: targets\n\n"
        "`benchmarks/stages/targets.py`, run in `.bench-venv` beside litdata and "
        "mosaicml-streaming "
        "reading from the same SeaweedFS (which shares the 2 cores). Ratios are of medians, "
        "with the min-max of per-round ratios; the best cold peer is the fastest cold peer "
        "of the run.\n\n"
        "The cold epoch's ceiling is measured in the same rounds: the local first epoch while "
        "a plain download of the same shards from the same server runs beside it (the fill's "
        "GET reader in the cache's part size and GETs in flight, each chunk written to a "
        "file; no checksum, no progress marks, no need order), timed from `Loader(...)` to "
        "whichever ends last. A cold loader with a disk cache pays at least that download on "
        "the same 2 cores, so it bounds the cold epoch, and a cold epoch above its best round "
        "is refused. Where a virtual machine's host takes freed guest memory back, landing "
        "bytes in pages not touched lately is dear: on the 2-core VM of December 2026, `dd` of "
        "266 MB into a new file took 0.7-1.3 s of system CPU after an idle pause and 0.08 s "
        "right after another file's pages were freed (docs/LOADER.md). That comes on top of "
        "the server's and the client's CPU for the GETs, on the cores the decode needs.\n\n"
        + _steal_line(data)
        + table
    )


def _steal_line(data: dict[str, Any]) -> str:
    """How much CPU the host took from this VM during the runs (``/proc/stat`` steal)."""
    shares = [x for v in (data.get("cpu_steal") or {}).values() for x in v]
    if not shares:
        return ""
    worst = max(shares)
    return (
        f"CPU steal (time the host gave this VM's runnable CPUs to others) per run: median "
        f"{100 * statistics.median(shares):.0f}%, worst {100 * worst:.0f}%"
        + (": rounds with high steal are disturbed from outside.\n\n" if worst > 0.05 else ".\n\n")
    )


#: the design point's targets on a 2-CPU machine (seconds; MiB)
PLAN_TARGETS = {
    "open_s": 1.0,
    "rank_plan_s": 1.0,
    "node_order_s": 1.0,
    "resplit_s": 2.0,
    "peak_rss_mib": 1024.0,
}


def plan_section(plan: dict[str, Any], json_path: str, png: str | None = None) -> str:
    """Planning at scale, from a ``benchmarks/stages/planbench.py`` results file."""
    lines = [
        "## Planning at scale",
        "",
        f"`python -m benchmarks.stages.planbench` ([`{json_path}`]({json_path}), run apart "
        "from the "
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
        markdown(result, targets=False).rstrip(),
        "",
        *([t] if (t := targets_section(result)) else []),
        *([f] if (f := fillcpu_section(result)) else []),
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
        "## How it was measured",
        "",
        HOW_MEASURED,
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
        from benchmarks.plots import write_all

        write_all(result, path.parent, path.stem)
    base = Path(args.out).resolve().parent
    from benchmarks.plots import PLOTS

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

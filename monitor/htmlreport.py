"""``flashfeed report RUN_DIR --html out.html``: one self-contained page for a whole run.

A run directory holds the stats logs of its ranks (``Loader(stats_log=...)``, one JSON line
per batch, any file names ending in ``.jsonl``). The page shows, per rank, throughput and
the stall split over time, the storage stalls against the cache fills of that rank's
process, the GPU time lost to input (hours, fraction, and money with a GPU-hour price) per
rank and in total, and the slowest ranks. A partial run is the normal case (ranks killed,
a log cut off mid-line, a rank that never delivered a batch): each gets a note on the page
and on stderr, never a crash.
"""

from __future__ import annotations

import html
import time

from flashfeed.runtime.files import atomic_write
from flashfeed.telemetry import WAIT_KINDS

from .binning import MAX_POINTS_PER_CHART, bin_records, choose_bins, run_start
from .report import rank_summary
from .runlog import Run, read_run
from .svgchart import PALETTE, Series, chart

__all__ = ["render_html", "write_html_report"]

KIND_COLORS = {"storage": "#d62728", "decode": "#1f77b4", "h2d": "#9467bd"}


def _money(hours: float, price: float | None) -> str:
    return "" if price is None else f"<td>{hours * price:,.2f}</td>"


def render_html(
    run: Run, *, gpu_hour_price: float | None = None, bin_s: float | None = None
) -> str:
    """The report page (HTML with inline SVG and CSS only)."""
    if gpu_hour_price is not None and gpu_hour_price < 0:
        raise ValueError(f"--gpu-hour-price must be >= 0, got {gpu_hour_price}")
    t0 = run_start(run.ranks.values())
    t1 = max(recs[-1].t for recs in run.ranks.values())
    bins = choose_bins(t0, t1, bin_s, max_points=MAX_POINTS_PER_CHART)
    xs = bins.starts.tolist()
    ranks = sorted(run.ranks)
    sums = {rank: rank_summary(run.ranks[rank]) for rank in ranks}
    series = {rank: bin_records(run.ranks[rank], bins) for rank in ranks}
    esc = html.escape
    lost_h = sum(s["lost_s"] for s in sums.values()) / 3600
    gpu_h = sum(s["elapsed_s"] for s in sums.values()) / 3600
    price_head = "<th>lost money</th>" if gpu_hour_price is not None else ""
    rows = [
        f"<tr><td>rank {r}</td><td>{s['samples_per_s']:,.1f}</td><td>{s['elapsed_s']:,.1f}</td>"
        f"<td>{s['lost_s'] / 3600:.4f}</td><td>{100 * s['lost_fraction']:.1f}%</td>"
        + "".join(f"<td>{100 * s[f'{k}_s'] / s['elapsed_s']:.1f}%</td>" for k in WAIT_KINDS)
        + _money(s["lost_s"] / 3600, gpu_hour_price)
        + "</tr>"
        for r, s in sums.items()
    ]
    rows.append(
        f"<tr class='total'><td>all {len(ranks)} ranks</td><td>"
        f"{sum(s['samples_per_s'] for s in sums.values()):,.1f}</td><td>{gpu_h * 3600:,.1f}</td>"
        f"<td>{lost_h:.4f}</td><td>{100 * lost_h / gpu_h if gpu_h else 0:.1f}%</td>"
        + "<td></td>" * len(WAIT_KINDS)
        + _money(lost_h, gpu_hour_price)
        + "</tr>"
    )
    slowest = sorted(ranks, key=lambda r: sums[r]["samples_per_s"])[:5]
    median = sorted(s["samples_per_s"] for s in sums.values())[len(ranks) // 2]
    slow_items = []
    for r in slowest:
        s = sums[r]
        worst = max(WAIT_KINDS, key=lambda k: s[f"{k}_s"])
        slow_items.append(
            f"<li>rank {r}: {s['samples_per_s']:,.1f} samples/s "
            f"({100 * s['samples_per_s'] / median if median else 0:.0f}% of the median), "
            f"waited {100 * s['lost_fraction']:.1f}% of its time, mostly on {worst}</li>"
        )
    throughput = chart(
        xs,
        [Series(f"rank {r}", series[r].samples_per_s.tolist(), PALETTE[i % len(PALETTE)])
         for i, r in enumerate(ranks)],
        title="throughput per rank",
        y_label="samples/s",
    )  # fmt: skip
    per_rank = []
    for r in ranks:
        sr = series[r]
        per_rank.append(
            f"<h3>rank {r}</h3>"
            + chart(
                xs,
                [
                    Series(f"{k} stall", sr.fractions[k].tolist(), KIND_COLORS[k], "area")
                    for k in WAIT_KINDS
                ],
                title=f"rank {r} stalls",
                y_label="fraction waited",
                y_max=1.0,
                right=[Series("cache fills started", sr.fills.tolist(), "#2ca02c", "bars")],
                right_label="cache fills",
            )
        )
    notes = "".join(f"<li>{esc(p)}</li>" for p in run.problems)
    price_line = (
        f" &times; {gpu_hour_price:,.2f} per GPU-hour = <b>{lost_h * gpu_hour_price:,.2f}</b>"
        if gpu_hour_price is not None
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>flashfeed run report: {esc(run.path)}</title>
<style>
body {{ font: 14px/1.4 sans-serif; margin: 24px; color: #222; background: #fff; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
tr.total {{ font-weight: bold; background: #f3f3f3; }}
.notes {{ color: #8a4b00; }}
</style></head><body>
<h1>flashfeed run report</h1>
<p>{esc(run.path)}: {len(ranks)} rank(s), {sum(s["batches"] for s in sums.values()):,.0f}
batches, written {esc(time.strftime("%Y-%m-%d %H:%M:%S"))}.</p>
<h2>GPU time lost to input</h2>
<p>The consumers waited <b>{lost_h:.4f} GPU-hours</b> of {gpu_h:.4f}
({100 * lost_h / gpu_h if gpu_h else 0:.1f}%){price_line}.</p>
<table><tr><th>rank</th><th>samples/s</th><th>seconds</th><th>GPU-hours lost</th>
<th>lost</th>{"".join(f"<th>{k}</th>" for k in WAIT_KINDS)}{price_head}</tr>
{"".join(rows)}</table>
<h2>Slowest ranks</h2><ol>{"".join(slow_items)}</ol>
{f'<h2>Notes on the logs</h2><ul class="notes">{notes}</ul>' if notes else ""}
<h2>Throughput per rank</h2>
{throughput}
<h2>Stall split over time, against cache fills</h2>
<p>Fraction of each time step the rank's consumer waited, by cause; bars: cache fills its
process started (shards fetched from object storage).</p>
{"".join(per_rank)}
</body></html>
"""


def write_html_report(
    run_dir: str,
    out: str,
    *,
    gpu_hour_price: float | None = None,
    bin_s: float | None = None,
) -> Run:
    """Read ``run_dir``, write the page to ``out``; returns the run (with its problems)."""
    run = read_run(run_dir)
    page = render_html(run, gpu_hour_price=gpu_hour_price, bin_s=bin_s)
    atomic_write(out, page, mode=0o644)
    return run

"""The suite's result as tables: the machine it ran on, the headline comparisons (medians,
ratios with the min-max of per-round ratios, fraction of the physical limit) and scaling.

Pure functions of the merged result JSON (benchmarks/suite.py), so BENCHMARKS.md can be
rebuilt from any results file:

    python -m benchmarks.report benchmarks/results/2026-11-29-host.json > table.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks.benchmath import OverLimitError, check_limit, fmt, ratio, report_row, spread
from benchmarks.machine import PACKAGES, machine_info, package_versions
from benchmarks.targets_report import targets_markdown, targets_rows
from benchmarks.text_report import neardup_rows, neardupcurve_rows, token_rows

_fmt = fmt

__all__ = [
    "PACKAGES",
    "OverLimitError",
    "check_limit",
    "headline",
    "limit_errors",
    "machine_info",
    "main_variant",
    "markdown",
    "package_versions",
    "ratio",
    "scaling",
    "spread",
    "targets_markdown",
    "targets_rows",
]


def main_variant(variants: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The largest data size at the default worker count: the headline run of a stage."""
    ok = [v for v in variants if "data" in v and v.get("default_workers", True)]
    return max(ok, key=lambda v: v["factor"]) if ok else None


def limit_errors(result: dict[str, Any]) -> list[str]:
    """Every headline or targets row refused because its result exceeds its limit."""
    rows = headline(result) + targets_rows(result)
    return [r["refused"] for r in rows if r.get("refused")]


def headline(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per comparison of the headline runs."""
    st = result.get("stages", {})
    rows: list[dict[str, Any]] = []
    lim = st.get("limits", {}).get("data") or {}
    if (v := main_variant(st.get("ingest", []))) is not None:
        d = v["data"]
        ff = [x["mb_s"] for x in d["runs"]["flashfeed"]]
        ceil = d.get("ceilings", {})
        put = max(ceil.get("s3_put_rounds_mb_s") or [ceil.get("s3_put_mb_s") or 0.0]) or None
        # the per-image work alone in as many processes: the ceiling when it binds first
        work = max(ceil.get("work_rounds_mb_s") or [0.0]) or None
        limit, limit_name = put, "S3 PUT, ingest's shape"
        if work is not None and (put is None or work < put):
            limit, limit_name = work, "per-image work alone, as many processes as Ray CPUs"
        for peer in ("ray-data", "shardwriter"):
            other = [x["mb_s"] for x in d["runs"][peer]]
            rows.append(
                report_row(
                    "ingest",
                    f"corpus to S3, {v['label']}",
                    spread(ff),
                    "MB/s",
                    peer,
                    spread(other),
                    ratio(ff, other),
                    limit_name,
                    limit,
                )
            )
    if (v := main_variant(st.get("cache", []))) is not None:
        c = v["data"]["cold"]
        # the GET limit: the faster of the limits stage and this stage's own raw GETs
        s3 = max([*(lim.get("s3_get_gbps") or []), *c["raw_gbps"], *c.get("lean_gbps", [])])
        rows.append(
            report_row(
                "cache",
                f"cold warm-up from S3, {v['label']}",
                spread(c["warm_gbps"]),
                "GB/s",
                "raw parallel GET (s3fs)",
                spread(c["raw_gbps"]),
                ratio(c["warm_gbps"], c["raw_gbps"]),
                "GET through the fill's reader, best in run",
                s3,
            )
        )
        h = v["data"]["hit"]
        # the limit of a hit is reading the same files from the page cache, in the same stage
        rows.append(
            report_row(
                "cache",
                "hit path: get + read",
                spread([h["cache_gbps"]]),
                "GB/s",
                "read of the same files",
                spread(h.get("plain_rounds_gbps") or [h["plain_gbps"]]),
                ratio([h["cache_gbps"]], [h["plain_gbps"]]),
                "page-cache read, same files, best round",
                h.get("plain_best_gbps", h["plain_gbps"]),
            )
        )
    if (v := main_variant(st.get("loader", []))) is not None:
        im = v["data"]["images"]["rounds"]["img_per_s"]
        ceiling = max(im["decode-ceiling"])  # a limit: the best round of the run
        ff = im["flashfeed"]
        for peer in ("dali-reader", "wds+pil", "imagefolder+pil"):
            rows.append(
                report_row(
                    "loader",
                    f"images, {v['label']}",
                    spread(ff),
                    "img/s",
                    peer,
                    spread(im[peer]),
                    ratio(ff, im[peer]),
                    "decode ceiling (RAM), best round",
                    ceiling,
                )
            )
        tok = v["data"]["tokens_gbps"]
        memcpy = lim.get("memcpy_gbps") or tok.get("memcpy")
        rows.append(
            report_row(
                "tokens",
                "TokenLoader int32",
                spread([tok["tokens-int32"]]),
                "GB/s",
                "row gather (numpy)",
                spread([tok["row-gather"]]),
                ratio([tok["tokens-int32"]], [tok["row-gather"]]),
                "memcpy",
                memcpy,
            )
        )
    cold = ((st.get("coldstart") or {}).get("data") or {}).get("rounds") or {}
    if "ff-s3-first" in cold:
        for what, mine, ref, label in (
            ("first epoch from S3, cold cache", "ff-s3-first", "ff-local", "flashfeed local disk"),
            ("first epoch from S3, cold cache", "ff-s3-first", "wds-http", "wds over HTTP (cold)"),
            ("first epoch from S3, cold cache", "ff-s3-first", "dali-s3", "DALI s3:// (cold)"),
            ("every epoch streams (cache 1/2)", "ff-s3-2x-capacity", "ff-local", "flashfeed local"),
        ):
            if mine in cold and ref in cold:
                rows.append(
                    report_row(
                        "loader",
                        what,
                        spread(cold[mine]),
                        "img/s",
                        label,
                        spread(cold[ref]),
                        ratio(cold[mine], cold[ref]),
                    )
                )
    peers = (st.get("peers") or {}).get("data") or {}
    for peer in ("litdata", "mosaicml-streaming"):
        if peer in peers.get("rounds", {}).get("img_per_s", {}):
            r = peers["rounds"]["img_per_s"]
            rows.append(
                report_row(
                    "loader",
                    "images, peers stage",
                    spread(r["flashfeed"]),
                    "img/s",
                    peer,
                    spread(r[peer]),
                    ratio(r["flashfeed"], r[peer]),
                )
            )
    rows += token_rows(st)
    rows += neardup_rows(st)
    rows += neardupcurve_rows(st)
    ev = ((st.get("plan") or {}).get("data") or {}).get("eviction", [])
    for e in ev:
        if e["capacity"] == 0.5:
            rows.append(
                report_row(
                    "cache",
                    "hit rate, capacity 50%, 3 epochs",
                    spread([e["plan_aware"]]),
                    "fraction",
                    "LRU",
                    spread([e["lru"]]),
                    ratio([e["plan_aware"]], [max(e["lru"], 1e-9)]),
                    "Belady optimum",
                    e["optimum"],
                )
            )
    return rows


def scaling(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per stage and variant: the figure that grows (or should not) with size and workers."""
    st = result.get("stages", {})
    rows = []
    for v in st.get("ingest", []):
        if "data" in v:
            m = v["data"]["median_mb_s"]
            rows.append(
                {
                    "stage": "ingest",
                    "variant": v["label"],
                    "unit": "MB/s",
                    **{k: m[k] for k in ("flashfeed", "ray-data", "shardwriter")},
                }
            )
    for v in st.get("cache", []):
        if "data" in v:
            c = v["data"]["cold"]
            rows.append(
                {
                    "stage": "cache",
                    "variant": v["label"],
                    "unit": "GB/s",
                    "flashfeed": c["warm_median"],
                    "raw GET": c["raw_median"],
                }
            )
    for v in st.get("loader", []):
        if "data" in v:
            m = v["data"]["images"]["img_per_s"]
            rows.append(
                {
                    "stage": "loader",
                    "variant": v["label"],
                    "unit": "img/s",
                    **{
                        k: m.get(k)
                        for k in (
                            "flashfeed",
                            "dali-reader",
                            "wds+pil",
                            "wds+dali",
                            "decode-ceiling",
                        )
                    },
                }
            )
    for c in ((st.get("plan") or {}).get("data") or {}).get("plan_cost", []):
        row: dict[str, Any] = {"stage": "plan", "variant": f"{c['shards']:,} shards", "unit": "s"}
        keys: tuple[str, ...]
        if "rank_plan_s" in c:  # rank-local planning
            keys = ("open", "rank_plan", "node_order", "resplit", "whole_epoch")
        else:  # results of the whole-epoch planner, before planning became rank-local
            keys = ("open", "plan_epoch", "node_shard_order")
        rows.append({**row, **{k: c.get(f"{k}_s") for k in keys}})
    return rows


LIMITS = (
    ("memcpy_gbps", "memcpy (numpy, 256 MB)", "TokenLoader"),
    ("big_hot_gbps", "read one large file, page cache", "cache hit path"),
    ("big_cold_gbps", "read one large file, cold", "cache hit path after a restart"),
    ("read_hot_gbps", "read corpus JPEG files, page cache", "ingest read"),
    ("read_cold_gbps", "read corpus JPEG files, cold", "ingest read"),
    ("s3_get_gbps", "parallel ranged S3 GET, the fill's reader, bytes dropped", "cache warm-up"),
)


def limits_markdown(result: dict[str, Any]) -> str:
    """The physical limits measured in the run, median (min-max), and what each bounds."""
    lim = (result.get("stages", {}).get("limits") or {}).get("data") or {}
    lines = ["| limit | GB/s (min-max) | bounds |", "|---|---|---|"]
    for key, label, bounds in LIMITS:
        v = lim.get(key)
        if v is None:
            continue
        s = spread(v if isinstance(v, list) else [v])
        span = f" ({_fmt(s['min'])}-{_fmt(s['max'])})" if s["n"] > 1 else ""
        lines.append(f"| {label} | {_fmt(s['median'])}{span} | {bounds} |")
    loader = main_variant(result.get("stages", {}).get("loader", []))
    if loader is not None:
        c = spread(loader["data"]["images"]["rounds"]["img_per_s"]["decode-ceiling"])
        lines.append(f"| decode + crop from RAM (DALI), img/s | {_fmt(c['median'])} | loaders |")
    if lim.get("cold_method"):
        lines.append("")
        lines.append(f"Cold reads: page cache dropped with `{lim['cold_method']}`.")
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any], *, targets: bool = True) -> str:
    """The headline, targets (unless ``targets=False``) and scaling tables, and what did not
    run, as Markdown."""
    lines = [
        "| area | measure | flashfeed (median, min-max) | reference | ratio (min-max) "
        "| limit | of limit |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in headline(result):
        v, rv, q = r["value"], r["reference_value"], r["ratio"]
        mine = f"{_fmt(v['median'])} {r['unit']}"
        if v["n"] > 1:
            mine += f" ({_fmt(v['min'])}-{_fmt(v['max'])})"
        ref = f"{r['reference']} {_fmt(rv['median'])}" if rv else r["reference"]
        rat = f"{q['ratio']:.2f}x ({q['min']:.2f}-{q['max']:.2f})" if q else "-"
        lim = f"{r['limit']} {_fmt(r['limit_value'])}" if r["limit"] else "-"
        frac = f"{100 * r['of_limit']:.0f}%" if r["of_limit"] is not None else "-"
        if r.get("refused"):  # never more than 100%: the row is an error, not a result
            mine, rat, frac = "refused: above its limit", "-", "measurement error"
        lines.append(f"| {r['area']} | {r['measure']} | {mine} | {ref} | {rat} | {lim} | {frac} |")
    if targets and (table := targets_markdown(result)):
        lines += ["", "Cold start on real shard sizes (targets):", "", table.rstrip()]
    lines += ["", "Physical limits, measured in the same run:", "", limits_markdown(result)]
    lines += ["Scaling (medians):", ""]
    for stage_rows in _group(scaling(result)):
        keys = [k for k in stage_rows[0] if k not in ("stage", "variant", "unit")]
        lines.append(
            f"| {stage_rows[0]['stage']} ({stage_rows[0]['unit']}) | " + " | ".join(keys) + " |"
        )
        lines.append("|---" * (len(keys) + 1) + "|")
        for r in stage_rows:
            lines.append(f"| {r['variant']} | " + " | ".join(_fmt(r[k]) for k in keys) + " |")
        lines.append("")
    missing = {**result.get("unavailable", {})}
    for stage, err in result.get("errors", {}).items():
        missing[f"stage {stage}"] = err
    for i, why in enumerate(limit_errors(result)):
        missing[f"refused row {i + 1}"] = why
    if missing:
        lines.append("Not measured:")
        lines.append("")
        lines += [f"- {k}: {v}" for k, v in missing.items()]
    return "\n".join(lines).rstrip() + "\n"


def _group(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["stage"], []).append(r)
    return list(out.values())


def machine_markdown(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    load = ", ".join(f"{x:.1f}" for x in m.get("loadavg", []))
    vers = result.get("versions", {})
    lines = [
        f"- host `{m.get('host', '?')}`, {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
        f"{m.get('memory_gib', '?')} GiB, Linux {m.get('kernel', '?')}, GPU {m.get('gpu', 'none')}",
        f"- Python {m.get('python', '?')}, flashfeed commit `{m.get('commit', '?')}`, "
        f"device {result.get('device', 'cpu')}, profile `{result.get('profile', '?')}`, "
        f"{result.get('duration_s', 0) / 60:.1f} min, load average at start {load}",
        "- " + ", ".join(f"{k} {v}" for k, v in vers.items()),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m benchmarks.report RESULTS.json")
    with open(args[0]) as f:
        result = json.load(f)
    sys.stdout.write(machine_markdown(result) + "\n" + markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

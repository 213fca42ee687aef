"""PNG plots of a suite result: throughput per loader, stalls over time, cache hit rate vs
capacity, and scaling with data size. Each function writes one small PNG and returns its path.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["PLOTS", "eviction_plot", "loader_bars", "scaling_plot", "stalls_plot", "write_all"]

PLOTS = ("loaders", "stalls", "eviction", "scaling")

_DPI = 90
_FLASHFEED = "#1f77b4"
_PEER = "#999999"
_LIMIT = "#d62728"
_OTHERS = ("#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def loader_bars(result: dict[str, Any], out: Path) -> Path | None:
    """img/s per loader (median, min-max whiskers); the decode ceiling as a line."""
    st = result.get("stages", {})
    loader = [v for v in st.get("loader", []) if "data" in v and v.get("default_workers", True)]
    if not loader:
        return None
    main = max(loader, key=lambda v: v["factor"])
    rounds = main["data"]["images"]["rounds"]["img_per_s"]
    bars = [(k, _spread(v)) for k, v in rounds.items() if k != "decode-ceiling"]
    peers = ((st.get("peers") or {}).get("data") or {}).get("rounds", {}).get("img_per_s", {})
    for k in ("litdata", "mosaicml-streaming"):
        if k in peers:
            bars.append((f"{k}*", _spread(peers[k])))
    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = [b[0] for b in bars]
    med = [b[1][0] for b in bars]
    err = [[b[1][0] - b[1][1] for b in bars], [b[1][2] - b[1][0] for b in bars]]
    colors = [_FLASHFEED if n == "flashfeed" else _PEER for n in names]
    ax.bar(names, med, color=colors, yerr=err, capsize=4)
    for i, m in enumerate(med):
        ax.text(i, m * 0.05, f"{m:.0f}", ha="center", va="bottom", fontsize=9, color="white")
    ceiling = statistics.median(rounds["decode-ceiling"])
    ax.axhline(ceiling, color=_LIMIT, linestyle="--", linewidth=1)
    ax.text(
        len(names) - 0.5,
        ceiling,
        f"decode ceiling {ceiling:.0f}",
        color=_LIMIT,
        ha="right",
        va="bottom",
        fontsize=8,
    )
    ax.set_ylabel("images/s (decode + crop 224, batch 64)")
    note = " (* peers stage: same work, separate interleaved rounds)" if len(bars) > 4 else ""
    ax.set_title(f"Image loaders, {main['label']}, {result.get('device', 'cpu')}{note}", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=_DPI)
    plt.close(fig)
    return out


def stalls_plot(result: dict[str, Any], out: Path) -> Path | None:
    """Wait fraction by kind over time from the stalls stage's loader stats log."""
    from flashfeed.monitor.report import plot_stalls

    data = (result.get("stages", {}).get("stalls") or {}).get("data") or {}
    records = data.get("records")
    if not records:
        return None
    plot_stalls(records, str(out), bin_s=1.0)
    return out


def eviction_plot(result: dict[str, Any], out: Path) -> Path | None:
    """Hit rate over 3 epochs vs cache capacity: plan-aware, LRU, Belady's optimum."""
    rows = ((result.get("stages", {}).get("plan") or {}).get("data") or {}).get("eviction")
    if not rows:
        return None
    x = [100 * r["capacity"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(
        x,
        [100 * r["plan_aware"] for r in rows],
        "o-",
        color=_FLASHFEED,
        linewidth=3,
        label="flashfeed plan-aware",
    )
    ax.plot(x, [100 * r["optimum"] for r in rows], "--", color=_LIMIT, label="optimum (Belady)")
    ax.plot(x, [100 * r["lru"] for r in rows], "s-", color=_PEER, label="LRU")
    ax.set_xlabel("cache capacity (% of the dataset)")
    ax.set_ylabel("hit rate over 3 epochs (%)")
    ax.set_title("Node cache eviction (real ShardCache, plan order)", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=_DPI)
    plt.close(fig)
    return out


def scaling_plot(result: dict[str, Any], out: Path) -> Path | None:
    """Ingest MB/s and loader img/s against data size (default worker counts)."""
    st = result.get("stages", {})
    panels = []
    for stage, key, keys, unit in (
        ("ingest", "median_mb_s", ("flashfeed", "ray-data", "shardwriter"), "MB/s"),
        ("loader", None, ("flashfeed", "dali-reader", "wds+pil", "decode-ceiling"), "img/s"),
    ):
        vs = sorted(
            (v for v in st.get(stage, []) if "data" in v and v.get("default_workers")),
            key=lambda v: v["factor"],
        )
        if len(vs) < 2:
            continue
        series = {}
        for k in keys:
            if stage == "ingest":
                series[k] = [v["data"][key][k] for v in vs]
            else:
                series[k] = [v["data"]["images"]["img_per_s"][k] for v in vs]
        panels.append((stage, [v["factor"] for v in vs], series, unit))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (stage, xs, series, unit) in zip(axes[0], panels, strict=True):
        others = iter(_OTHERS)
        for k, ys in series.items():
            style = "--" if k == "decode-ceiling" else "o-"
            color = _FLASHFEED if k == "flashfeed" else (_LIMIT if k == "decode-ceiling" else None)
            ax.plot(xs, ys, style, label=k, color=color or next(others))
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x}x" for x in xs])
        ax.set_xlabel("data size")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{stage} vs data size", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=_DPI)
    plt.close(fig)
    return out


def write_all(result: dict[str, Any], folder: Path, stem: str) -> list[Path]:
    made = []
    for name, fn in (
        ("loaders", loader_bars),
        ("stalls", stalls_plot),
        ("eviction", eviction_plot),
        ("scaling", scaling_plot),
    ):
        path = fn(result, folder / f"{stem}-{name}.png")
        if path is not None:
            made.append(path)
    return made

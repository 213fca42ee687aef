"""``benchmarks/gpu.sh``'s result files: one JSON per stage, written whole as the stage ends,
and ``summary.md`` rendered from whatever is there (a stage killed by its time limit leaves a
note instead)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["STAGES", "headline", "render_summary", "write_result"]

STAGES = ("env", "corpus", "ceiling", "loader", "tokens", "exactly_once", "nvdec")


def write_result(results: str | Path, stage: str, data: dict[str, Any]) -> Path:
    """``<results>/<stage>.json``, written whole or not at all (a temporary name, renamed)."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{stage}.json"
    tmp = results / f".{stage}.json.tmp"
    tmp.write_text(json.dumps({"stage": stage, **data}, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def headline(stage: str, r: dict[str, Any]) -> str:
    line = _figures(stage, r)
    return f"{line} (CPU smoke run, not a GPU figure)" if r.get("cpu_smoke_run") else line


def _figures(stage: str, r: dict[str, Any]) -> str:
    if r.get("status") == "skipped":
        return f"skipped: {r.get('reason', '')}"
    if r.get("status") != "ok":
        return f"{r.get('status', '?')}: {r.get('error', '')}".strip()
    if stage == "env":
        cuda = f"CUDA {r.get('torch_cuda')}"
        return f"{r.get('gpu')}, torch {r.get('torch')} ({cuda}), DALI {r.get('dali')}"
    if stage == "corpus":
        return f"{r['images']} JPEGs, {r['bytes'] / 1e6:.0f} MB, {r['seconds']:.1f} s"
    if stage == "ceiling":
        return f"{r['img_per_s']:,.0f} img/s (DALI mixed decode from RAM)"
    if stage == "loader":
        ratio = r.get("vs_ceiling")
        vs = f", {ratio:.2f} of the ceiling" if ratio is not None else ""
        s = r["stalls"]
        return (
            f"{r['img_per_s']:,.0f} img/s{vs}; waits storage {s['storage']:.3f} s, "
            f"decode {s['decode']:.3f} s, h2d {s['h2d']:.3f} s"
        )
    if stage == "tokens":
        return (
            f"TokenLoader {r['loader_gb_per_s']:.1f} GB/s, pinned memcpy "
            f"{r['memcpy_gb_per_s']:.1f} GB/s ({r['vs_memcpy']:.2f}); the CPU gather alone "
            f"{r['cpu_gather_gb_per_s']:.1f} GB/s"
        )
    if stage == "exactly_once":
        return f"ok={r['ok']} over epochs {r['epochs']}, reader builds {r['builds']}"
    if stage == "nvdec":
        return (
            f"{r['codec']} clips of {r['clip']['frames']}: Loader {r['loader_clips_per_s']:,.1f} "
            f"clips/s, DALI decoder from RAM {r['ceiling_clips_per_s']:,.1f} "
            f"({r['vs_ceiling']:.2f})"
        )
    return ""


def render_summary(results: str | Path) -> Path:
    """``summary.md``: one line per stage from the result files present."""
    results = Path(results)
    lines = ["| stage | result |", "|---|---|"]
    for stage in STAGES:
        path = results / f"{stage}.json"
        if not path.exists():
            lines.append(f"| {stage} | not run |")
            continue
        try:
            line = headline(stage, json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            line = f"unreadable result: {exc!r}"
        lines.append(f"| {stage} | {line.replace('|', '/')} |")
    out = results / "summary.md"
    out.write_text("\n".join(lines) + "\n")
    return out

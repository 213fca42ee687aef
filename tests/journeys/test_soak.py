"""A short soak: benchmarks/stages/soak.py with 2 loader processes sharing one cache for 3 epochs;
open files, threads, child processes and memory must not grow after the first epoch."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import REPO
from support.loader_helpers import make_image_dataset


def _soak_module() -> Any:
    return importlib.import_module("benchmarks.stages.soak")


def test_two_loader_processes_five_epochs_nothing_grows(s3_prefix: str, tmp_path: Path) -> None:
    make_image_dataset(s3_prefix, [16, 16, 16, 16], size=16)
    out = tmp_path / "soak.json"
    # thread pools fill lazily up to their bound in the first epochs: judge after two of them
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.stages.soak",
        "--dataset",
        s3_prefix,
        "--processes",
        "2",
        "--epochs",
        "5",
    ]
    cmd += ["--warmup", "2", "--image-size", "16", "--batch-size", "8", "--out", str(out)]
    cmd += ["--cache-dir", str(tmp_path / "cache"), "--timeout", "150"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "nothing grew" in proc.stdout
    result = json.loads(out.read_text())
    assert not result["errors"] and not result["grew"]
    assert sorted((s["rank"], s["epoch"]) for s in result["samples"]) == [
        (r, e) for r in range(2) for e in range(5)
    ]
    assert all(s["samples"] == 32 for s in result["samples"])  # half of 64 each, every epoch
    # the shards were fetched once for the node: both ranks read one shared cache
    assert len(list((tmp_path / "cache").glob("*/data/shards/*.tar"))) == 4


def test_the_soak_judge_reports_growth_and_missing_epochs() -> None:
    soak = _soak_module()
    args = soak._parse(["--processes", "2", "--epochs", "4", "--warmup", "1"])
    flat = {"fds": 10, "threads": 8, "children": 1, "rss_mib": 300.0, "samples": 5}
    lines = [{"rank": 0, "epoch": e, **flat} for e in range(4)]
    lines += [{"rank": 1, "epoch": e, **flat, "fds": 10 + 3 * e} for e in range(3)]
    assert soak.judge(lines, args)["grew"] == []
    lines.append({"rank": 1, "epoch": 3, **flat, "fds": 19})
    result = soak.judge(lines, args)
    assert result["grew"] == ["rank 1: fds 13.0 -> peak 19.0"] and not result["errors"]
    assert soak.judge(lines[:-1], args)["errors"] == ["rank 1 reported 3 of 4 epochs"]


def test_the_soak_counts_only_threads_and_fds_that_stay() -> None:
    soak = _soak_module()
    # a fetch thread of the pass that just ended is in the first reading only; a leak stays
    readings = iter([
        {"fds": 12, "threads": 14, "children": 1, "rss_mib": 300.0},
        {"fds": 11, "threads": 12, "children": 1, "rss_mib": 301.0},
        {"fds": 11, "threads": 11, "children": 1, "rss_mib": 302.0},
    ])  # fmt: skip
    got = soak.settled(lambda: next(readings), readings=3, gap=0)
    assert got == {"fds": 11, "threads": 11, "children": 1, "rss_mib": 302.0}
    leak = [{"fds": 11, "threads": 15, "children": 1, "rss_mib": 300.0}] * 3
    assert soak.settled(iter(leak).__next__, readings=3, gap=0)["threads"] == 15

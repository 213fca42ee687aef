"""benchmarks/stages/feedcost.py runs at a tiny size, prints every way and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import REPO
from support.bench import load_bench


def test_feed_cost_benchmark_prints_every_way_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "feed.json"
    args = ["--batches", "3", "--rounds", "2", "--samples", "20", "--sample-kib", "4"]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.feedcost", *args, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.read_text())
    ways = ["copy, key list", "copy, key column", "in place, key list", "in place, key column"]
    assert sorted(result["rounds"]) == sorted(ways)
    assert all(len(v) == 2 and min(v) > 0 for v in result["rounds"].values())
    assert result["ratio_vs_copy_list"]["copy, key list"] == 1.0
    assert result["batches"] == 3 and result["sample_kib"] == 4
    for way in ways:
        assert any(line.startswith(way) for line in run.stdout.splitlines()), way
    assert "feed" in load_bench("suite").STAGES

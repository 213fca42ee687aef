"""benchmarks/stages/tfrecordcrc.py runs at a tiny size, prints its table and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import REPO


def test_crc_benchmark_prints_every_backend_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "crc.json"
    args = ["--size", "256KiB", "--record-size", "4KiB", "--python-mb", "0.05", "--rounds", "2"]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.tfrecordcrc", *args, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.read_text())
    assert result["ingest_uses"] == "google-crc32c"
    assert "python" in result["median_mb_s"] and "google-crc32c" in result["median_mb_s"]
    assert all(len(v) == 2 and min(v) > 0 for v in result["mb_s"].values())
    assert result["ratio_vs_python"]["python"] == 1.0
    assert 0 < result["python_bytes"] <= 0.05e6 + 4096 + 16
    assert result["bytes"] == 64 * (4096 + 16)
    assert "ingest uses google-crc32c" in run.stdout
    for name in result["median_mb_s"]:
        assert any(line.startswith(name) for line in run.stdout.splitlines()), name

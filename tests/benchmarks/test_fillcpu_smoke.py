"""benchmarks/stages/fillcpu.py runs at a tiny size with every row, our signed client's,
obstore's and pyarrow's included, and writes its rounds as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO


def test_fillcpu_prints_every_method_and_writes_its_rounds(tmp_path: Path) -> None:
    pytest.importorskip("obstore")  # in the dev extras
    out = tmp_path / "fillcpu.json"
    args = ["--shards", "1", "--shard-size", "1MiB", "--part-size", "256KiB", "--rounds", "1"]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.fillcpu", *args, "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    (round_,) = json.loads(out.read_text())["rounds"]
    methods = {"fill", "fill-s3fs", "raw-botocore", "raw-signed", "raw-obstore", "raw-pyarrow",
               "raw-s3fs", "raw-to-file"}  # fmt: skip
    assert set(round_) == methods
    for m, r in round_.items():
        assert r["bytes"] >= 1_000_000 and r["cpu_s_per_gb"] > 0, m
    printed = {line.split()[0] for line in run.stdout.splitlines() if line.split()}
    assert methods <= printed, run.stdout

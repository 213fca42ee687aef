"""benchmarks/stages/docfill.py stays runnable: at tiny sizes it checks the batch kernel
the loader calls (over shards it writes and opens) against the numpy passes, prints both
tables and writes their keys, and the suite runs it as a stage. No timed assertions:
benchmark numbers are not tests."""

from __future__ import annotations

import json
import subprocess

from support import REPO
from support.bench import bench_command, load_bench


def test_it_prints_and_writes_both_tables(tmp_path) -> None:
    out = tmp_path / "docfill.json"
    sizes = "--batch-sizes 4 16 --seq-len 256 --sets 2 --batches 2 --rounds 1 --compile-rounds 1"
    proc = subprocess.run(
        bench_command("stages.docfill", *sizes.split(), "--out", str(out)),
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    for heading in ("document outputs of a batch", "compiling the kernel"):
        assert heading in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["step"]) == {"4", "16"}
    for step in result["step"].values():
        assert set(step["gb_per_s"]) == {"numpy passes", "batch kernel", "memcpy (same bytes)"}
        assert all(v > 0 for v in step["gb_per_s"].values())
        assert step["batch_kernel_vs_numpy"] > 0 and step["batch_kernel_of_memcpy"] > 0
        assert step["bytes_per_batch"] > 0
    seconds = result["compile"]["seconds"]
    assert len(seconds) == 5 and all(v > 0 for v in seconds.values())


def test_the_suite_runs_it_as_a_stage() -> None:
    assert "docfill" in load_bench("suite").STAGES

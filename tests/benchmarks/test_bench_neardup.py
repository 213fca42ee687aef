"""benchmarks/stages/neardup.py stays runnable: tiny corpus, one round, both tables and its JSON.
No timed assertions: benchmark numbers are not tests."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from support.bench import load_bench


def test_neardup_benchmark_runs_and_reports_its_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("stages.neardup")
    out = tmp_path / "neardup.json"
    kernels = "flashfeed-rensa,flashfeed-numpy,rensa-strings,datasketch"
    argv = ["--bases", "40", "--rounds", "1", "--kernel-rounds", "2", "--kernels", kernels]
    argv += ["--out", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    for key in ("planted pairs", "flashfeed-rensa", "datasketch", "Ray CPUs", "scaling"):
        assert key in printed
    result = json.loads(out.read_text())
    assert set(result["ray_docs_per_s"]) == {"1", "2"}
    assert result["ray"]["1"][0]["docs"] == result["docs"] > 40
    measured = [k for k in result["kernels"] if "unavailable" not in k]
    assert [k["kernel"] for k in measured][:3] == kernels.split(",")[:3]
    for k in measured:
        assert len(k["rounds"]) == 2 and k["docs_per_s"] == statistics.median(k["rounds"])
        assert k["docs_per_s"] > 0 and 0.0 <= k["recall"] <= 1.0 and k["estimate_mae"] < 0.2
    text_report = load_bench("text_report")
    rows = text_report.neardup_rows({"neardup": {"data": result}})
    refs = [r["reference"] for r in rows]
    assert refs[0] == "1 Ray CPU" and "flashfeed-numpy" in refs  # datasketch: if installed
    assert rows and all(r["unit"] == "docs/s" and r["ratio"]["ratio"] > 0 for r in rows)

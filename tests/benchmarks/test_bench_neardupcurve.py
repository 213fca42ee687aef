"""benchmarks/stages/neardupcurve.py stays runnable: a tiny planting, one round, its tables,
its JSON and its report row. No timed assertions: benchmark numbers are not tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.bench import load_bench


def test_neardupcurve_benchmark_runs_and_reports_its_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("stages.neardupcurve")
    out = tmp_path / "curve.json"
    assert bench.main(["--bases", "40", "--seeds", "0", "--rounds", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for key in ("recall J>=t+.05", "P(document and its nearest", "documents per CPU second"):
        assert key in printed
    result = json.loads(out.read_text())
    (planting,) = result["plantings"]
    measured = set(planting["accuracy"])
    assert {"flashfeed", "flashfeed-estimate", "s-curve-exact", "s-curve-estimate"} <= measured
    assert measured | set(result["unavailable"]) == set(bench.METHODS)
    mine = planting["accuracy"]["flashfeed"]
    assert mine["removed"] > 0 and mine["removed_below"] == 0  # the exact check's promise
    curve = planting["curve"]["flashfeed"]
    assert sum(n for *_, n in curve) > 0 and all(0.0 <= p <= 1.0 for _, _, p, n in curve if n)
    speed = result["speed"]["median"]
    assert speed["flashfeed"] > 0 and result["speed_ratio"] > 0
    rows = load_bench("report").neardupcurve_rows({"neardupcurve": {"data": result}})
    if set(result["speed"]["rounds"]) - {"flashfeed"}:  # a peer ran
        assert rows and rows[0]["unit"] == "docs/CPU s" and rows[0]["ratio"]["ratio"] > 0

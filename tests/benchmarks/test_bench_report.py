"""The benchmark report keeps the driver honest: a result above the limit that bounds it is a
measurement error, refused by the report code and never shown as more than 100%. Pure
functions on small hand-made results; no timing."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import pytest

from support.bench import load_bench


def _load(name: str) -> ModuleType:
    return load_bench(name)


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return _load("report")


def _loader_result(flashfeed: list[float], ceiling: list[float]) -> dict[str, Any]:
    rounds = {
        "flashfeed": flashfeed,
        "dali-reader": [100.0] * len(flashfeed),
        "wds+pil": [90.0] * len(flashfeed),
        "imagefolder+pil": [80.0] * len(flashfeed),
        "decode-ceiling": ceiling,
    }
    data = {
        "images": {
            "img_per_s": {k: sorted(v)[len(v) // 2] for k, v in rounds.items()},
            "rounds": {"img_per_s": rounds},
        },
        "tokens_gbps": {"tokens-int32": 1.0, "row-gather": 2.0, "memcpy": 8.0},
    }
    return {
        "stages": {
            "limits": {"data": {"memcpy_gbps": 8.0}},
            "loader": [{"label": "4x", "factor": 4, "workers": 2, "data": data}],
        }
    }


def _percentages(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"(\d+)% (?:\||reached)", text)]


def test_check_limit_refuses_a_result_above_its_limit(report: ModuleType) -> None:
    assert report.check_limit(90.0, 100.0, "x") == pytest.approx(0.9)
    assert report.check_limit(100.0, 100.0, "x") == pytest.approx(1.0)
    assert report.check_limit(5.0, None, "x") is None
    with pytest.raises(report.OverLimitError, match="110% of its limit"):
        report.check_limit(110.0, 100.0, "loader vs ceiling")


def test_a_loader_row_above_the_decode_ceiling_is_refused(report: ModuleType) -> None:
    result = _loader_result([300.0, 320.0, 310.0], [250.0, 260.0, 255.0])
    rows = [r for r in report.headline(result) if r["area"] == "loader"]
    assert rows and all(r["refused"] and "measurement error" in r["refused"] for r in rows)
    table = report.markdown(result)
    assert "refused: above its limit" in table
    assert all(p <= 100 for p in _percentages(table))  # never more than 100%
    assert len(report.limit_errors(result)) == len(rows)


def test_a_row_within_its_limit_shows_its_fraction(report: ModuleType) -> None:
    result = _loader_result([200.0, 210.0, 190.0], [250.0, 260.0, 255.0])
    rows = [r for r in report.headline(result) if r["area"] == "loader"]
    assert rows and not any(r["refused"] for r in rows)
    table = report.markdown(result)
    # a limit is the best round of the run (260); a result its median (200)
    assert "refused" not in table and 77 in _percentages(table)
    assert report.limit_errors(result) == []


def _targets(hot: float, cold_ceiling: list[float] | None = None) -> dict[str, Any]:
    r = {
        "ff-s3-first-64": [240.0, 250.0, 245.0],
        "ff-local-first-64": [250.0, 255.0, 260.0],
        "ff-hot-64": [hot] * 3,
        "ceiling": [300.0, 310.0, 305.0],
        "startup-64": [0.4, 0.6, 0.45],
        "wds-http-64": [150.0, 160.0, 155.0],
        "litdata-s3": [180.0, 170.0, 175.0],
        "mosaic-s3": [120.0, 125.0, 130.0],
    }
    if cold_ceiling is not None:
        r["ceiling-cold-64"] = cold_ceiling
    data = {"images": 2400, "bytes": 256 << 20, "shards": {"64": 4}, "rounds": r}
    return {"stages": {"targets": {"data": data}}}


def test_targets_table_has_each_ratio_and_its_target(report: ModuleType) -> None:
    rows = report.targets_rows(_targets(hot=290.0))
    by = {r["measure"]: r for r in rows}
    cold = next(r for m, r in by.items() if m.startswith("first epoch from S3 (empty"))
    assert cold["ratio"]["ratio"] == pytest.approx(245.0 / 255.0)
    assert cold["target"] == 0.95 and cold["met"] is True
    best = next(r for m, r in by.items() if m == "first epoch from S3 / best cold peer")
    assert "litdata" in best["reference"] and best["met"] is True  # 245 / 175 = 1.4
    others = {"webdataset + PIL over HTTP", "mosaicml-streaming from S3"}
    assert {f"first epoch from S3 / {o}" for o in others} <= set(by)
    start = next(r for m, r in by.items() if m.startswith("Loader(...)"))
    assert start["value"]["median"] == pytest.approx(0.45) and start["met"] is True
    table = report.targets_markdown(_targets(hot=290.0))
    assert "| 64 MiB |" in table and ">= 1.3x" in table and "<= 0.5 s" in table


def test_a_hot_epoch_above_the_ceiling_is_refused(report: ModuleType) -> None:
    result = _targets(hot=400.0)
    hot = next(r for r in report.targets_rows(result) if r["measure"].startswith("hot epoch"))
    assert hot["refused"] and hot["met"] is None
    assert "measurement error" in report.targets_markdown(result)
    assert report.limit_errors(result) == [hot["refused"]]


def test_the_cold_epoch_shows_how_much_of_its_ceiling_it_reached(report: ModuleType) -> None:
    # the local epoch with a download beside it reached 0.90-0.92 of the local one: below
    # the 0.95 target, which the row says, with the fraction of that ceiling reached
    result = _targets(hot=290.0, cold_ceiling=[230.0, 235.0, 232.0])
    result["stages"]["targets"]["data"]["rounds"]["ff-s3-first-64"] = [220.0, 225.0, 230.0]
    cold = next(
        r
        for r in report.targets_rows(result)
        if r["measure"].startswith("first epoch from S3 (empty")
    )
    assert cold["met"] is False and cold["refused"] is None
    assert cold["ceiling"]["ratio"]["ratio"] == pytest.approx(232.0 / 255.0)
    assert cold["ceiling"]["reached"] == pytest.approx(225.0 / 235.0)
    table = report.targets_markdown(result)
    assert "below the target; 96% reached" in table
    assert all(p <= 100 for p in _percentages(table))


def test_a_cold_epoch_above_its_ceiling_is_refused(report: ModuleType) -> None:
    result = _targets(hot=290.0, cold_ceiling=[200.0, 210.0, 205.0])  # cold: 245 median
    cold = next(
        r
        for r in report.targets_rows(result)
        if r["measure"].startswith("first epoch from S3 (empty")
    )
    assert cold["refused"] and "measurement error" in cold["refused"] and cold["met"] is None
    assert "measurement error" in report.targets_markdown(result)
    assert cold["refused"] in report.limit_errors(result)


def test_page_explains_how_it_was_measured() -> None:
    page = _load("page").benchmarks_page(_targets(hot=290.0), "r.json", [])
    assert "## How it was measured" in page and "rotates" in page
    assert "58.6 img/s" in page  # the quick-profile anomaly and its cause
    assert "## Cold start on 64 MiB shards: targets" in page
    assert "CPU steal" not in page  # not measured: not claimed
    result = _targets(hot=290.0)
    result["stages"]["targets"]["data"]["cpu_steal"] = {"ff-s3-64": [0.01, 0.12, 0.02]}
    page = _load("page").benchmarks_page(result, "r.json", [])
    assert "median 2%, worst 12%: rounds with high steal are disturbed" in page


def test_targets_table_compares_with_dalis_own_reader(report: ModuleType) -> None:
    result = _targets(hot=290.0)
    result["stages"]["targets"]["data"]["rounds"].update(
        {
            "ff-local-64-hot": [300.0, 290.0, 310.0],
            "dali-reader-64-hot": [280.0, 300.0, 290.0],
            "dali-reader-64-first": [270.0, 280.0, 275.0],
        }
    )
    by = {r["measure"]: r for r in report.targets_rows(result)}
    hot = by["hot epoch, local / DALI's own webdataset reader, same operators"]
    assert hot["ratio"]["ratio"] == pytest.approx(300.0 / 290.0) and hot["met"] is True
    first = next(r for m, r in by.items() if m.startswith("first epoch, local, construction"))
    assert first["ratio"]["ratio"] == pytest.approx(255.0 / 275.0) and first["met"] is False


def test_targets_table_has_the_cpu_start_up_and_cold_vs_hot_rows(report: ModuleType) -> None:
    # CPU per image and start-ups are met at or below their bound; the cold epoch is also
    # compared with the same loader's hot epoch
    result = _targets(hot=290.0)
    result["stages"]["targets"]["data"]["rounds"].update(
        {
            "ff-local-64-hot-cpu-ms": [2.3, 2.2, 2.4],
            "dali-reader-64-hot-cpu-ms": [2.2, 2.2, 2.2],
            "startup-again-64": [0.3, 0.35, 0.4],
            "startup-s3-64": [1.2, 0.9, 1.1],
        }
    )
    by = {r["key"]: r for r in report.targets_rows(result)}
    cpu = by["cpu_vs_dali_reader"]
    assert cpu["ratio"]["ratio"] == pytest.approx(2.3 / 2.2) and cpu["met"] is False
    assert by["startup_again_s"]["met"] is True
    s3 = by["startup_s3_s"]
    assert s3["value"]["median"] == pytest.approx(1.1) and s3["met"] is False
    cold = by["cold_vs_hot"]
    assert cold["ratio"]["ratio"] == pytest.approx(245.0 / 290.0) and cold["met"] is False
    table = report.targets_markdown(result)
    assert "2.30 ms" in table and "<= 1.0x" in table and "<= 1.0 s" in table


def test_the_hot_epoch_against_the_dali_reader_is_bounded_by_its_layouts_ceiling(
    report: ModuleType,
) -> None:
    # the Loader's pipeline fed from RAM in the Loader's order ran at 0.97 of DALI's reader:
    # the 1.0x target lies above it, and the row says how much of it the Loader reached
    result = _targets(hot=290.0)
    rounds = result["stages"]["targets"]["data"]["rounds"]
    del rounds["ceiling"]  # an older result's one ceiling; each layout now has its own
    rounds.update(
        {
            "ceiling-64": [291.0, 300.0, 296.0],
            "ff-local-64-hot": [290.0, 295.0, 288.0],
            "dali-reader-64-hot": [305.0, 300.0, 310.0],
        }
    )
    by = {r["key"]: r for r in report.targets_rows(result)}
    hot = by["hot_vs_dali_reader"]
    assert hot["met"] is False and hot["refused"] is None
    assert hot["ceiling"]["ratio"]["ratio"] == pytest.approx(296.0 / 305.0)
    assert hot["ceiling"]["reached"] == pytest.approx(290.0 / 300.0)
    assert by["hot_vs_ceiling"]["reference_value"]["median"] == pytest.approx(296.0)
    line = next(ln for ln in report.targets_markdown(result).splitlines() if "DALI's own" in ln)
    assert "fed from RAM, same order: 0.97x" in line and "below the target; 97% reached" in line
    # a hot epoch above every round of its ceiling is a measurement error, not a win
    rounds["ff-local-64-hot"] = [320.0, 315.0, 318.0]
    hot = next(r for r in report.targets_rows(result) if r["key"] == "hot_vs_dali_reader")
    assert hot["refused"] and hot["met"] is None
    assert hot["refused"] in report.limit_errors(result)

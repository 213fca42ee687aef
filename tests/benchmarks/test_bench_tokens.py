"""benchmarks/stages/tokenize_bench.py stays runnable: at tiny sizes it measures every peer it can
import, prints its three tables and writes their keys, and the suite's report turns its
result into headline rows. No timed assertions: benchmark numbers are not tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from support import REPO
from support.bench import BENCH, bench_command, load_bench


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("tok") / "tokens.json"
    sizes = "--mb 0.2 --rounds 1 --token-rows 128 --seq-len 256 --shard-size 64KB --batch-size 8"
    per_cpu = "--percpu-mb 0.1 --shapes 300B --ray-cpus 1"
    args = [*sizes.split(), *per_cpu.split(), "--vocab", "600", "--out", str(out)]
    proc = subprocess.run(
        bench_command("stages.tokenize_bench", *args),
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text()), proc.stdout


def test_it_prints_and_writes_every_table(tiny_run) -> None:
    result, stdout = tiny_run
    for heading in ("tokenization,", "packing of its", "TokenLoader, CPU",
                    "token ingest per CPU", "where the CPU goes", "Ray start-up"):  # fmt: skip
        assert heading in stdout
    tok = result["tokenize"]
    assert {"flashfeed-ingest", "encode_batch", "encode_batch_fast"} <= set(tok["median_mb_s"])
    assert all(v > 0 for v in tok["median_mb_s"].values()) and tok["mb"] > 0.1
    pk = result["packing"]
    for mode in ("concat@4096", "best-fit@4096", "concat@256", "best-fit@256"):
        assert 0 <= pk[mode]["padding_pct"] < 100 and pk[mode]["truncated_pct"] == 0
    lo = result["loader"]["gb_per_s"]
    assert set(lo) == {"tokens only", "with document outputs", "memcpy (same bytes)",
                       "row gather into reused buffers, not a limit"}  # fmt: skip
    assert all(v > 0 for v in lo.values())
    per = result["per_cpu"]
    (row,) = per["table"]
    assert row["shape"] == "300B" and row["ray_cpus"] == 1 and row["documents"] > 100
    assert row["ingest_mb_per_cpu_s"] > 0 and row["vs_fast"] > 0 and row["vs_encode_batch"] > 0
    stages = per["stages"]["300B"]
    assert stages["encode_batch_fast"] > 0 and "PUT" in stages and per["ray_start_s"]["1"] > 0


def test_the_report_makes_headline_rows_of_it(tiny_run) -> None:
    report: ModuleType = load_bench("report")
    result, _ = tiny_run
    rows = report.headline({"stages": {"tokens": {"data": result}}})
    refs = {r["reference"] for r in rows if r["area"] == "tokens"}
    assert {"encode_batch", "encode_batch_fast", "tokens only"} <= refs
    assert "encode_batch_fast, 1 thread" in refs  # the per-CPU row
    loader = next(r for r in rows if r["reference"] == "tokens only")
    assert loader["limit"] == "memcpy of the same bytes" and loader["of_limit"] > 0


def test_the_suite_runs_it_as_a_stage() -> None:
    suite = load_bench("suite")
    assert "tokens" in suite.STAGES
    assert "--mb" in suite.QUICK.tokens_args and "--mb" in suite.FULL.tokens_args
    assert Path(BENCH / "stages" / "tokenize_bench.py").exists()


def test_only_the_loader_table_at_more_batch_sizes(tmp_path: Path) -> None:
    out = tmp_path / "loader.json"
    args = "--only loader --mb 0.05 --vocab 400 --rounds 1 --token-rows 64 --seq-len 128"
    proc = subprocess.run(
        bench_command("stages.tokenize_bench", *args.split(), "--batch-size", "4",
                      "--more-batch-sizes", "16", "--out", str(out)),
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert "tokenize" not in result and "packing" not in result
    assert "TokenLoader, CPU" in proc.stdout and "batch    16:" in proc.stdout
    more = result["loader"]["by_batch_size"]["16"]
    assert set(more["gb_per_s"]) == {"with document outputs", "memcpy (same bytes)",
                                     "row gather into reused buffers, not a limit"}  # fmt: skip
    assert more["of_row_gather"] > 0
    assert all(v > 0 for v in more["gb_per_s"].values()) and more["of_memcpy"] > 0
    # the CPU cost per batch of each timed loader, printed beside its rates
    assert set(more["cpu_us_per_batch"]) == {"with document outputs"}
    assert more["cpu_us_per_batch"]["with document outputs"] > 0 and "CPU us/batch" in proc.stdout
    assert set(result["loader"]["cpu_us_per_batch"]) == {"tokens only", "with document outputs"}

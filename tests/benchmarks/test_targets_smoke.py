"""benchmarks/stages/targets.py runs at a tiny size with every row it measures (DALI's own
reader, the hot epoch's ceiling, start-up local and from S3 with an empty cache, the cold
epoch and its peers) and prints each target with its ratio; benchmarks/stages/extsource.py
runs on the same tars. No timed assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.bench import load_bench


def test_targets_stage_measures_every_row_and_prints_each_target(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    load_bench("harness.corpus").synthetic_images(corpus, 200, seed=0)
    out = tmp_path / "targets.json"
    args = ["--corpus", str(corpus), "--mb", "8", "--shard-mib", "2", "--rounds", "1",
            "--startup-repeats", "1", "--min-seconds", "0.1", "--work", str(tmp_path / "work"),
            "--out", str(out)]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.targets", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    result = json.loads(out.read_text())
    rows = {
        "ceiling-2", "ceiling-2-cpu-ms", "ff-s3-first-2", "ff-hot-2", "ff-local-first-2",
        "ff-local-2-hot", "ff-local-2-hot-cpu-ms", "dali-reader-2-first", "dali-reader-2-hot",
        "dali-reader-2-hot-cpu-ms", "ceiling-cold-2", "startup-2", "startup-again-2",
        "startup-s3-2", "startup-s3-construct-2", "wds-http-2",
    }  # fmt: skip
    assert rows <= set(result["rounds"]), sorted(set(result["rounds"]))
    for name in rows:
        (value,) = result["rounds"][name]
        assert value > 0, name
    assert result["shards"] == {"2": len(list((tmp_path / "work" / "wds-2MiB").glob("*.tar")))}
    for measure in (
        "hot epoch, local / DALI's own webdataset reader",
        "CPU ms per image, hot, local / DALI's own webdataset reader",
        "first epoch, local, construction timed / DALI's own webdataset reader",
        "one loader from S3: its first epoch (empty cache) / its hot epoch",
        "first epoch from S3 / best cold peer",
        "Loader(...) to first batch, fresh process, from S3, empty cache",
        "Loader(...) to first batch, a second loader in the same process",
    ):
        assert f"| 2 MiB | {measure}" in run.stdout, measure
    hot = next(ln for ln in run.stdout.splitlines() if "| 2 MiB | hot epoch, local /" in ln)
    assert "the Loader's pipeline fed from RAM, same order" in hot
    # the stage that measures what external_source costs, on the same tars
    ext_out = tmp_path / "extsource.json"
    ext = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.extsource", "--tars",
         str(tmp_path / "work" / "wds-2MiB"), "--rounds", "1", "--out", str(ext_out)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    ways = json.loads(ext_out.read_text())["ways"]
    assert set(ways) == {"reader", "ram, shuffled", "ram, tar order", "ram, + label, key"}
    for way, row in ways.items():
        assert row["img_s"] > 0 and row["cpu_ms"] > 0 and len(row["epochs"]) == 1, way
        assert any(line.startswith(way) for line in ext.stdout.splitlines()), way
    assert ways["reader"]["speed_vs_reader"] == [1.0, 1.0, 1.0]
    assert "extsource" in load_bench("suite").STAGES

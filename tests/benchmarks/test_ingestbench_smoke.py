"""benchmarks/stages/ingestbench.py runs on a tiny corpus: its three writers, the PUT limit,
the work ceiling and the work+PUT ceiling measured in the same run, the fractions of the
ceilings printed, and Ray's fixed cost apart. No timed assertions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from flashfeed.ingest.samplecorpus import make_imagefolder

from support import REPO
from support.bench import bench_command


def test_ingestbench_prints_ceilings_and_fractions(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    make_imagefolder(corpus, classes=2, per_class=6)
    out = tmp_path / "ingest.json"
    args = ["--rounds", "1", "--shard-size", "16KB", "--num-cpus", "1", "--out", str(out)]
    run = subprocess.run(
        bench_command("stages.ingestbench", str(corpus), *args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(out.read_text())
    ceilings = result["ceilings"]
    assert ceilings["work_processes"] == 1 and len(ceilings["work_rounds_mb_s"]) == 1
    assert ceilings["work_mb_s"] > 0 and ceilings["s3_put_mb_s"] > 0
    assert ceilings["work_put_mb_s"] > 0 and len(ceilings["work_put_rounds_mb_s"]) == 1
    binding = min(ceilings["work_mb_s"], ceilings["s3_put_mb_s"], ceilings["work_put_mb_s"])
    ff = result["median_mb_s"]["flashfeed"]
    assert result["ratios"]["of_binding_ceiling"] == ff / binding
    assert result["ratios"]["of_put_limit"] == ff / ceilings["s3_put_mb_s"]
    assert {r["samples"] for r in result["runs"]["flashfeed"]} == {12}
    assert result["worker_warmup_s"] >= 0 and result["ray_start_s"] > 0
    assert "of min(PUT limit, work ceiling, work+PUT ceiling)" in run.stdout, run.stdout
    assert "with its shards' PUTs on the same cores" in run.stdout, run.stdout
    assert "per-image work alone in 1 processes" in run.stdout, run.stdout
    assert "flashfeed driver phases (median of rounds): prepare " in run.stdout, run.stdout
    assert " ms" in run.stdout and "before tasks " in run.stdout, run.stdout
    assert set(result["runs"]["flashfeed"][0]["phases"]) >= {"prepare", "assign", "commit"}

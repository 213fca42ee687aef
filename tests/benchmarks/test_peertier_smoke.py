"""benchmarks/stages/peertier.py's cold-epoch row runs at a tiny size: 2 jobs x 2 simulated
nodes read their first epoch through a training reader, without the cluster tier and with
it; what each job delivered is checked against the dataset's own keys. No timed assertions:
the counts (store bytes, samples) are what is pinned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO


def test_the_cold_epoch_row_reads_each_shard_once_with_the_tier(tmp_path: Path) -> None:
    out = tmp_path / "peertier.json"
    args = ["--scenarios", "cold-epoch", "--shards", "4", "--shard-mib", "0.25",
            "--samples-per-shard", "4", "--batch-size", "2", "--store-mbps", "8"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.peertier", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]  # a job's wrong keys exit non-zero
    result = json.loads(out.read_text())
    assert set(result) >= {"cold_epoch", "dataset_bytes"} and "sweep" not in result
    cold = result["cold_epoch"]
    # without the tier each of the 4 nodes reads its half of the dataset from the store
    assert cold["today"]["store_bytes"] == 2 * result["dataset_bytes"]
    assert cold["tier"]["store_bytes"] == result["dataset_bytes"]  # each shard once
    for tag in ("today", "tier"):
        nodes = cold[tag]["nodes"]
        assert [n["samples"] for n in nodes] == [8, 8, 8, 8], tag  # 16 samples a job, 2 ranks
        assert cold[tag]["seconds"] == max(n["seconds"] for n in nodes) > 0
    tier = cold["tier"]["nodes"]
    assert sum(n["bytes_from_peers"] for n in tier) == result["dataset_bytes"]
    assert sum(n["served_bytes"] for n in tier) == result["dataset_bytes"]
    assert "| cold first epoch 2 jobs x 2 nodes | store bytes / dataset | 2.00 | 1.00 |" in (
        run.stdout
    )


def test_a_job_that_repeats_or_misses_a_key_is_refused() -> None:
    from benchmarks.harness.peercold import SEEDS, _check_jobs

    samples = {"a/1": 10, "a/2": 10, "b/1": 5, "b/2": 5}

    def answers(second_node: list[str]) -> dict:
        return {
            (seed, r): {"keys": keys, "bytes": sum(samples[k] for k in keys)}
            for seed in SEEDS
            for r, keys in ((0, ["a/1", "a/2"]), (1, second_node))
        }

    _check_jobs(answers(["b/1", "b/2"]), samples)  # each key once: accepted
    with pytest.raises(RuntimeError, match=r"1 extra or repeated .*1 missing"):
        _check_jobs(answers(["a/1", "b/2"]), samples)
    with pytest.raises(RuntimeError, match=r"0 extra or repeated .*1 missing"):
        _check_jobs(answers(["b/2"]), samples)
    short = answers(["b/1", "b/2"])
    short[(1, 1)]["bytes"] -= 1  # every key, one member byte short
    with pytest.raises(RuntimeError, match="member bytes"):
        _check_jobs(short, samples)


def test_a_layout_that_would_drop_samples_is_refused_by_name() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.peertier", "--shards", "5"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 2 and "shards must be a multiple of 2" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.peertier", "--shards", "4",
         "--samples-per-shard", "3", "--batch-size", "4"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 2 and "batch size 4" in run.stderr

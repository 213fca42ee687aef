"""benchmarks/tokcold.py runs at a tiny size with its five rows (cold streaming by the
recorded layout, by the walk of a shard without one, by the walk of one with dictionaries,
local, the download ceiling), the bound made of the ceiling and the local epoch's last
window, when each cold epoch's last byte landed, and writes its rounds as JSON. No timed
assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_tokcold_prints_every_row_and_writes_its_rounds(tmp_path: Path) -> None:
    out = tmp_path / "tokcold.json"
    args = ["--shards", "2", "--shard-mib", "1", "--batch-mib", "0.25", "--seq-len", "512",
            "--rounds", "1"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.tokcold", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(out.read_text())
    rows = {"cold-stream", "cold-walk", "cold-dict", "local", "ceiling"}
    assert set(result["rounds"]) == rows
    for name in rows:
        (r,) = result["rounds"][name]
        assert r["gbps"] > 0 and r["batches"] == 2 * (1 << 20) // (512 * 2) // 16, name
        assert r["cpu_s"] > 0, name
    for name in ("cold-stream", "cold-walk", "cold-dict"):  # the cache's shards landed in it
        (r,) = result["rounds"][name]
        assert 0 < r["landed_s"] <= r["seconds"] and r["tail_s"] >= 0, name
    (local,) = result["rounds"]["local"]
    assert 0 < local["last_window_s"] <= local["seconds"]
    (limit,) = result["bound_rounds"]
    assert limit["seconds"] > result["rounds"]["ceiling"][0]["seconds"]
    assert result["of_local"]["local"] == 1.0 and result["of_bound"]["bound"] == 1.0
    printed = {line.split()[0] for line in run.stdout.splitlines() if line.split()}
    assert rows | {"bound"} <= printed, run.stdout


def test_the_bound_waits_for_what_the_plan_shuffles_together_last() -> None:
    from argparse import Namespace

    from benchmarks.stages.tokcold import last_window_batch
    from flashfeed.plan.plan import PlanOptions

    plain = PlanOptions(window=4, arrival_windows="first")
    assert last_window_batch(Namespace(shards=8), plain, 4096) == 2048  # the 2nd window
    assert last_window_batch(Namespace(shards=10), plain, 1000) == 800  # 2 shards left
    # one window, the first epoch's first: read in arrival slices, the back half last
    assert last_window_batch(Namespace(shards=2), plain, 4096) == 2048
    # every window of the first epoch in arrival slices (opt-in): the last window's back
    # half, read after its bytes landed
    every = PlanOptions(window=4, arrival_windows="all")
    assert last_window_batch(Namespace(shards=8), every, 4096) == 3072
    assert last_window_batch(Namespace(shards=10), every, 1000) == 900
    assert last_window_batch(Namespace(shards=2), every, 4096) == 2048
    assert PlanOptions(window=4) == plain  # the default slices the first window only
    even = PlanOptions(window=4, arrival_spacing="even", arrival_windows="all")
    assert last_window_batch(Namespace(shards=4), even, 800) == 700
    whole = PlanOptions(window=4, arrival_slices=1)
    assert last_window_batch(Namespace(shards=4), whole, 800) == 0

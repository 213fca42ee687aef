"""benchmarks/stages/inplace.py runs at a tiny size with every stage (text tokenized in the
loader beside its peers, local and cold from S3; token ids beside TokenLoader over ingested
Arrow; index time and requests) and writes its rows as JSON. No timed assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_inplace_stage_prints_every_row_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "inplace.json"
    args = ["--mb", "0.3", "--rounds", "1", "--files", "2", "--row-group", "100",
            "--seq-len", "256", "--vocab", "400", "--token-copies", "2", "--index-files", "12",
            "--index-rows", "50"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.inplace", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    text = result["text"]
    for ours in ("flashfeed local", "flashfeed S3 cold"):
        assert text[ours]["tokens_per_s"]["median"] > 0, ours
    peers = ("datasets streaming local", "datasets streaming S3 cold")
    assert all(text[p] == "not installed" or text[p]["tokens_per_s"]["median"] > 0 for p in peers)
    if text["datasets streaming local"] != "not installed":
        assert text["flashfeed local"]["vs"] == "datasets streaming local"
        assert text["flashfeed S3 cold"]["vs"] == "datasets streaming S3 cold"
    tokens = result["tokens"]
    for ours in ("PackedLoader, Parquet ids zstd", "PackedLoader, Parquet ids snappy"):
        assert tokens[ours]["vs"] == "TokenLoader, ingested Arrow"
        assert tokens[ours]["ratio"]["ratio"] > 0
    index = result["index"]
    assert index["files"] == 12 and index["units"] == 24
    assert index["requests"] == 1 + 2 * 12 + 3  # the listing, 2 per file, the commit
    assert "index 12 Parquet files on S3" in run.stdout

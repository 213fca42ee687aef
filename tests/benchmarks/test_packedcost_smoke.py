"""benchmarks/stages/packedcost.py runs at a tiny size (short documents, every document
output) and writes both sides' rates and the ratio as JSON. No timed assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_packedcost_stage_writes_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "packedcost.json"
    args = ["--mb", "0.2", "--token-copies", "2", "--rounds", "1", "--seq-len", "256",
            "--docs", "short", "--outputs", "--out", str(out)]  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "benchmarks.stages.packedcost", *args],
                         capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    packed = rows["PackedLoader epoch 2+, keep_decoded"]
    assert rows["TokenLoader, ingested Arrow"]["tokens_per_s"]["median"] > 0
    assert packed["vs"] == "TokenLoader, ingested Arrow" and packed["ratio"]["ratio"] > 0
    assert "outputs all" in run.stdout

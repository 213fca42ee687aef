"""benchmarks/stages/signcost.py runs at a tiny size, prints both signers and writes its rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import REPO


def test_signcost_prints_both_signers_and_writes_its_rounds(tmp_path: Path) -> None:
    out = tmp_path / "signcost.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.signcost", "--requests", "50",
         "--rounds", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=True, cwd=REPO,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert len(result["rounds"]) == 2
    for r in result["rounds"]:
        assert set(r) == {"ours", "botocore"} and all(us > 0 for us in r.values())
    printed = {line.split()[0] for line in run.stdout.splitlines() if line.split()}
    assert {"ours", "botocore"} <= printed, run.stdout

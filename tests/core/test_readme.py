"""The README's Python example runs as printed: real store, real Ray, real DALI."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from support import REPO

README = REPO / "README.md"


def _runnable_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if "EmbeddedStore(" in b]


def test_the_readme_example_runs_end_to_end(tmp_path):
    blocks = _runnable_blocks()
    assert len(blocks) == 1, "the README should hold exactly one self-contained example"
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", TMPDIR="/tmp")
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "64 samples in 4 shards"
    assert "format=webdataset" in lines[1] and "samples=64" in lines[1]
    assert lines[2] == "warmed 4 shards"
    assert lines[3] == "torch.Size([16, 3, 64, 64]) torch.int64 True"

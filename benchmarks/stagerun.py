"""How the suite runs its stages: each stage module as a child process with a timeout
(``Runner``), the corpus subsets they read, and what the peers' environment has installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.harness.child import REPO, module_command
from benchmarks.harness.corpus import pick_images
from benchmarks.profiles import Profile

__all__ = ["Runner", "ensure_corpus", "peer_status", "shards_for", "subset_corpus"]


class Runner:
    """Runs stage modules (``benchmarks.stages.<module>``) as children from the repository root,
    each with a timeout; collects their JSON or error. Paths in their arguments are absolute."""

    def __init__(self, work: Path, profile: Profile, product_py: str, peer_py: str) -> None:
        self.work, self.profile = work, profile
        self.product_py, self.peer_py = product_py, peer_py
        self.seconds: dict[str, float] = {}
        self.errors: dict[str, str] = {}

    def run(
        self,
        name: str,
        module: str,
        args: list[str],
        *,
        python: str | None = None,
        timeout: int | None = None,
        out_flag: str = "--out",
    ) -> dict[str, Any] | None:
        out = self.work / f"{name}.json"
        out.unlink(missing_ok=True)
        log = self.work / f"{name}.log"
        cmd = module_command(
            f"benchmarks.stages.{module}", *args, out_flag, str(out),
            python=python or self.product_py,
        )  # fmt: skip
        # the peers' environment finds the product's tools (SeaweedFS's weed) on PATH
        env = {**os.environ}
        env["PATH"] = os.pathsep.join([str(Path(self.product_py).parent), env.get("PATH", "")])
        print(f"[suite] {name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            with open(log, "w") as f:
                rc = subprocess.run(
                    cmd,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    check=False,
                    timeout=timeout or self.profile.stage_timeout_s,
                    env=env,
                    cwd=REPO,
                ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        self.seconds[name] = time.perf_counter() - t0
        if rc == 0 and out.exists():
            print(f"[suite] {name}: {self.seconds[name]:.0f} s", file=sys.stderr, flush=True)
            return json.loads(out.read_text())
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        why = "timed out" if rc == -1 else f"exit {rc}"
        self.errors[name] = f"{why}: {' / '.join(tail)[-300:]}"
        print(f"[suite] {name}: FAILED ({self.errors[name]}), see {log}", file=sys.stderr)
        return None


def subset_corpus(corpus: Path, dest: Path, nbytes: int) -> Path:
    """The first images of ``corpus`` (sorted) up to ``nbytes``, hard-linked into ``dest``."""
    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for f, _ in pick_images(corpus, nbytes):
        target = tmp / f.parent.name / f.name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, target)
    tmp.rename(dest)
    return dest


def ensure_corpus(corpus: Path, need_bytes: int, py: str) -> None:
    have = sum(f.stat().st_size for f in corpus.glob("class_*/*.jpg")) if corpus.exists() else 0
    if have < need_bytes:
        size = str(int(need_bytes * 1.05))
        cmd = module_command(
            "benchmarks.harness.corpus", "images", str(corpus.resolve()), python=py
        )
        subprocess.run([*cmd, "--size", size], check=True, cwd=REPO)


def shards_for(images: int) -> int:
    """Shards of the loader datasets: 4-10, ~256 images each (same rule for every stage)."""
    return max(4, min(10, images // 256))


def peer_status(stages: dict[str, Any], peer_py: str) -> tuple[dict[str, str], dict[str, str]]:
    """(package versions as the peer environment sees them, peer -> why it did not run)."""
    code = (
        "import json; from benchmarks import report; print(json.dumps(report.package_versions()))"
    )
    try:
        versions = json.loads(
            subprocess.run(
                [peer_py, "-c", code],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
                cwd=REPO,
            ).stdout
        )
    except (subprocess.SubprocessError, json.JSONDecodeError, OSError):
        versions = report.package_versions()
    missing = dict(((stages.get("peers") or {}).get("data") or {}).get("unavailable", {}))
    for name in ("litdata", "mosaicml-streaming"):
        if versions.get(name) == "not installed":
            missing.setdefault(name, "unavailable: not installed (make bench-venv)")
    return versions, missing

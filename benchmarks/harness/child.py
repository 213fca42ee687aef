"""Benchmark modules run as children (a stage of the suite, a fresh interpreter for a cold
import, a peer that needs a process of its own): ``python -m <module>`` from the repository
root, so ``benchmarks`` imports without touching ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["REPO", "module_command"]

REPO = Path(__file__).resolve().parents[2]


def module_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """The command line that runs ``module`` (``benchmarks.stages.x``); run it with
    ``cwd=REPO`` and absolute paths in ``args``."""
    if not module.startswith("benchmarks."):
        raise ValueError(f"module must be a benchmarks module, got {module!r}")
    return [python or sys.executable, "-m", module, *args]

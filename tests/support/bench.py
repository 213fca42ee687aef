"""Benchmark modules as the suite runs them: imported as ``benchmarks.<name>`` from the
repository root (``python -m pytest`` puts it on the path), or run with ``python -m``."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from support import REPO

BENCH = REPO / "benchmarks"


def load_bench(name: str) -> ModuleType:
    """``benchmarks.<name>``: ``"report"``, or a stage as ``"stages.neardup"``."""
    return importlib.import_module(f"benchmarks.{name}")


def bench_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``benchmarks.<module>``; run it with ``cwd=REPO``."""
    return [sys.executable, "-m", f"benchmarks.{module}", *args]

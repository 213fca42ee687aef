"""Load a benchmark script as a module, as the suite runs it (its siblings importable)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support import REPO

BENCH = REPO / "benchmarks"


def load_bench(name: str, *, prefix: str = "ffbench") -> ModuleType:
    """``benchmarks/<name>.py`` as a fresh module named ``<prefix>_<name>``."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # as when the scripts run: siblings import each other
    spec = importlib.util.spec_from_file_location(f"{prefix}_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

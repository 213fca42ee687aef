"""CPU seconds of a process tree, read from ``/proc``: what a run cost on a machine whose wall
clock other jobs share. ``TreeCPU.sample()`` before and after a run; the difference is the
CPU the tree spent, split into this process, Ray's task workers and everything else below
it: Ray's daemons (raylet, GCS, agents) and the rest (a store's servers)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from flashfeed.runtime.lifeline import descendants

__all__ = ["CPUSample", "TreeCPU"]

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CPUSample:
    """CPU seconds so far: this process, Ray's task workers, Ray's daemons, the other
    processes below it."""

    driver: float
    workers: float
    ray: float
    others: float

    def __sub__(self, other: CPUSample) -> CPUSample:
        return CPUSample(
            self.driver - other.driver,
            self.workers - other.workers,
            self.ray - other.ray,
            self.others - other.others,
        )

    @property
    def tasks(self) -> float:
        """The driver and Ray's workers: the work of the run itself."""
        return self.driver + self.workers


def _stat(pid: int) -> tuple[str, float] | None:
    """``(start time, CPU seconds)`` of a live process (its reaped children included)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is the state (field 3); utime, stime, cutime, cstime are fields 14-17
    ticks = sum(int(v) for v in fields[11:15])
    return fields[19], ticks / _TICK


def _role(pid: int) -> str:
    """``workers`` (a Ray task worker), ``ray`` (another Ray process) or ``others``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return "others"
    if b"default_worker.py" in cmd or cmd.startswith(b"ray::"):
        return "workers"
    return "ray" if b"ray" in cmd else "others"


class TreeCPU:
    """CPU seconds of this process and every process below it. A process that ends
    between two samples loses the CPU it spent since the first (Ray's workers and daemons
    live as long as Ray does)."""

    def __init__(self) -> None:
        self._me = os.getpid()
        self._seen: dict[int, tuple[str, str]] = {}

    def sample(self) -> CPUSample:
        secs = {"driver": 0.0, "workers": 0.0, "ray": 0.0, "others": 0.0}
        for pid in descendants([self._me]):
            stat = _stat(pid)
            if stat is None:
                continue
            start, spent = stat
            if pid == self._me:
                secs["driver"] += spent
                continue
            known = self._seen.get(pid)
            if known is None or known[0] != start:
                known = (start, _role(pid))
                self._seen[pid] = known
            secs[known[1]] += spent
        return CPUSample(**secs)

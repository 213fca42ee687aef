"""CPU seconds of a process tree, read from ``/proc``: what a run cost on a machine whose wall
clock other jobs share. ``TreeCPU.sample()`` before and after a run; ``after - before`` is
the CPU the tree spent in between, process by process, split into this process, Ray's task
workers, Ray's daemons (raylet, GCS, agents) and the rest (a store's servers)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from flashfeed.runtime.lifeline import descendants

__all__ = ["CPUSample", "TreeCPU"]

_TICK = os.sysconf("SC_CLK_TCK")
_ROLES = ("driver", "workers", "ray", "others")


@dataclass(frozen=True)
class CPUSample:
    """CPU seconds so far: this process, Ray's task workers, Ray's daemons, the other
    processes below it; ``procs``: each process's ``(start time, role, seconds)``. A
    difference also counts the worker processes that started (``new_workers``) and the
    processes that ended (``ended``: their CPU since the first sample is not known)."""

    driver: float
    workers: float
    ray: float
    others: float
    procs: dict[int, tuple[str, str, float]] = field(default_factory=dict, repr=False)
    new_workers: int = 0
    ended: int = 0

    def __sub__(self, before: CPUSample) -> CPUSample:
        secs = dict.fromkeys(_ROLES, 0.0)
        new = 0
        for pid, (start, role, spent) in self.procs.items():
            old = before.procs.get(pid)
            if old is not None and old[0] == start:
                secs[role] += spent - old[2]
            else:  # started since: all its CPU is the run's
                secs[role] += spent
                new += role == "workers"
        ended = sum(
            1 for pid, (start, *_) in before.procs.items()
            if pid not in self.procs or self.procs[pid][0] != start
        )  # fmt: skip
        return CPUSample(**secs, new_workers=new, ended=ended)

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
    """CPU seconds of this process and every process below it."""

    def __init__(self) -> None:
        self._me = os.getpid()
        self._roles: dict[tuple[int, str], str] = {}

    def sample(self) -> CPUSample:
        secs = dict.fromkeys(_ROLES, 0.0)
        procs: dict[int, tuple[str, str, float]] = {}
        for pid in descendants([self._me]):
            stat = _stat(pid)
            if stat is None:
                continue
            start, spent = stat
            if pid == self._me:
                role = "driver"
            else:
                role = self._roles.get((pid, start)) or self._roles.setdefault(
                    (pid, start), _role(pid)
                )
            secs[role] += spent
            procs[pid] = (start, role, spent)
        return CPUSample(**secs, procs=procs)

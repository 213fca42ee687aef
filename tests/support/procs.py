"""What tests see of processes through /proc: descendants, which are still alive, the
members of a session. Used to prove that nothing outlives its parent."""

from __future__ import annotations

import os

GONE_WITHIN = 10.0


def _stat(pid: int) -> tuple[int, str, str] | None:
    """``(ppid, state, start time)`` of a process, None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]


def descendants(root: int) -> dict[int, str]:
    """Every process below ``root``: pid -> start time (a reused pid is another process)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[0], []).append(int(entry))
            starts[int(entry)] = st[2]
    out: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in starts and pid not in out:
            out[pid] = starts[pid]
            todo.extend(children.get(pid, []))
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace").split("\n")[0][:60] for a in argv[:3])


def alive(procs: dict[int, str]) -> dict[int, str]:
    """Those of ``procs`` still running (zombies waiting for a reaper are dead)."""
    out = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and st[2] == start and st[1] != "Z":
            out[pid] = cmdline(pid)
    return out


def session_members(sid: int) -> list[str]:
    """Processes still running in session ``sid`` (a command started with its own session)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(f"{entry} {fields[0]}")
    return out

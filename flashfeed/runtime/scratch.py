"""Scratch folders owned by one process: removed by their owner, and swept by the next
folder made in the same place once their owner is gone, however it died.

A folder's name carries its owner: ``<prefix><pid>-<start>-<random>``, where ``<start>``
is the process's start time from ``/proc`` (so a pid the system gave to another process
since is not taken for the owner). The owner removes its folder when done (on close,
collection or a normal exit); a process killed by a signal cannot, so each new folder made
with the same prefix sweeps those of owners that no longer run. A forked child that
inherits an object holding a folder never removes its parent's folder.

Used for the loader's pass folders (``flashfeed-pass-`` in ``/dev/shm``) and for the
session folder of a Ray that ingest starts (``ffray-`` in ``/tmp``).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from flashfeed.runtime.lifeline import process_start

__all__ = ["make_owned_dir", "remove_owned", "sweep_orphans"]


def _owner(name: str, prefix: str) -> tuple[int, str] | None:
    """(pid, start time) named by folder ``name``; None for another name (a folder made by
    an older flashfeed, whose owner is unknown, is left alone)."""
    if not name.startswith(prefix):
        return None
    parts = name[len(prefix) :].split("-")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), parts[1]


def sweep_orphans(base: str, prefix: str) -> list[str]:
    """Remove the ``prefix`` folders in ``base`` whose owner no longer runs (or whose pid
    now names another process); returns their paths. Folders of running owners are kept,
    and so is any folder whose owner's state cannot be read."""
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        owner = _owner(name, prefix)
        if owner is None:
            continue
        pid, start = owner
        now = process_start(pid)
        if now is not None and now in (start, ""):
            continue
        path = os.path.join(base, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def make_owned_dir(prefix: str, base: str | None = None) -> str:
    """A new folder owned by this process in ``base`` (the system's temporary folder when
    None), made after sweeping the ``prefix`` folders of dead owners there."""
    where = tempfile.gettempdir() if base is None else base
    sweep_orphans(where, prefix)
    pid = os.getpid()
    start = process_start(pid) or "0"  # "0": not readable here
    return tempfile.mkdtemp(prefix=f"{prefix}{pid}-{start}-", dir=where)


def remove_owned(path: str, prefix: str) -> None:
    """Remove folder ``path`` if this process owns it (a forked child holding its parent's
    object leaves the parent's folder alone)."""
    owner = _owner(os.path.basename(path), prefix)
    if owner is not None and owner[0] != os.getpid():
        return
    shutil.rmtree(path, ignore_errors=True)

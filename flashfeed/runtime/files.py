"""Files that appear whole or not at all: written aside, then renamed into place.

Every local file flashfeed replaces (manifests, cache records, status files, pass files,
reports) goes through ``atomic_write``. The temporary file sits beside the target as
``<target>.<pid>.<random>.tmp``, so a reader never sees a partial file, and
``sweep_dead_tmp`` can remove what a writer killed mid-write left behind.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from typing import IO, Any

from flashfeed.runtime.lifeline import pid_alive

__all__ = ["Writer", "atomic_write", "atomic_write_json", "sweep_dead_tmp"]

Writer = Callable[[IO[bytes]], object]


def atomic_write(
    path: str,
    data: bytes | memoryview | str | Writer,
    *,
    mode: int = 0o600,
    fsync: bool = False,
    makedirs: bool = False,
) -> None:
    """Replace ``path`` with ``data`` (bytes, text, or a function that writes to the open
    binary file). ``mode`` is the file's exact mode (not narrowed by the umask); ``fsync``
    makes the bytes durable before the rename, for files that must survive a power loss."""
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise ValueError(f"mode must be a permission mode like 0o644, got {mode!r}")
    directory = os.path.dirname(path) or "."
    if makedirs:
        os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str, obj: Any, *, sort_keys: bool = True, **options: Any) -> None:
    """``atomic_write`` of ``obj`` as JSON; ``options`` as ``atomic_write``'s."""
    # dumps, not dump: dump to a file takes the pure-Python encoder, chunk by chunk
    atomic_write(path, json.dumps(obj, sort_keys=sort_keys), **options)


def sweep_dead_tmp(directory: str) -> int:
    """Remove the temporary files of ``atomic_write`` calls whose writer died; returns how
    many. A running writer's file is left alone."""
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        parts = name.rsplit(".", 3)
        dead = len(parts) == 4 and parts[3] == "tmp" and parts[1].isdigit()
        if dead and not pid_alive(int(parts[1])):
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed

"""Paths that stand for descriptors this process holds: ``/proc/self/fd/N``.

The node service hands a process open descriptors of shards it may read but could not open
by name (the files belong to the service, mode 0600). Opening ``/proc/self/fd/N`` by name
would check the file's mode again and fail, so ``open_binary`` duplicates the descriptor
instead: the map made from it (``map_readonly``) is the very page cache the file has, as with
a path.
"""

from __future__ import annotations

import mmap
import os
import re
from typing import BinaryIO

__all__ = ["fd_path", "is_fd_path", "map_readonly", "open_binary"]

_FD_PATH = re.compile(r"/proc/self/fd/(\d+)")


def fd_path(fd: int) -> str:
    """The path that stands for descriptor ``fd`` of this process."""
    return f"/proc/self/fd/{fd}"


def is_fd_path(path: str) -> bool:
    """True for a path that stands for a descriptor of this process (``fd_path``)."""
    return _FD_PATH.fullmatch(str(path)) is not None


def open_binary(path: str) -> BinaryIO:
    """``open(path, "rb")``, but a ``/proc/self/fd/N`` path reads a duplicate of
    descriptor N (from its start) instead of opening the file again by name."""
    found = _FD_PATH.fullmatch(str(path))
    if found is None:
        return open(path, "rb")
    fd = os.dup(int(found.group(1)))
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def map_readonly(path: str) -> mmap.mmap:
    """A read-only map of the whole file at ``path``, or of the file a ``/proc/self/fd/N``
    path stands for (through its descriptor, as ``open_binary`` reads it)."""
    with open_binary(path) as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

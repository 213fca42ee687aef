"""Advisory file locks (``flock``) shared by every process on the node.

The kernel drops a ``flock`` when its holder dies, so a ``kill -9`` never leaves a lock
behind. Locks from two ``open`` calls conflict even inside one process, so threads are
covered too. A shared lock on an entry's *use* file marks it in use; eviction needs the
exclusive lock and never waits for it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FileLock", "locked"]


class FileLock:
    """One lock on one file; create one per acquisition (not shared between threads)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, shared: bool = False, blocking: bool = True) -> bool:
        """Take the lock; with ``blocking=False`` return False at once if it is held."""
        if self._fd is not None:
            raise RuntimeError(f"lock {self.path} is already held by this object")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


@contextmanager
def locked(path: str, *, shared: bool = False) -> Iterator[FileLock]:
    """Hold a blocking lock on ``path`` for the ``with`` block."""
    lock = FileLock(path)
    lock.acquire(shared=shared)
    try:
        yield lock
    finally:
        lock.release()

"""Fills in progress, visible to every process on the node: which parts have arrived.

While a fill runs, ``<dataset dir>/.parts/<i>.live`` names its part files (a JSON line),
then holds one byte for the index and one per block (a fixed span, a chunk of the GETs'
bodies), set to 1 once written. The writer sets them through a shared memory map: a mark
is a store, not a system call (there is one per chunk of every fill). A reader maps the
part file (reserved to the shard's full size) and reads a sample once the blocks under it
are marked: samples are served while the rest of the shard is still arriving. The shard
is published as cached only by the fill's rename after its checksum matched; the live file
is removed when the fill ends, either way, and a dead fill's live file is swept with its
parts (it is bookkeeping: not counted as cached bytes).
"""

from __future__ import annotations

import json
import mmap
import os
import threading
import time
from typing import Any

__all__ = ["FillProgress", "FillView", "live_path"]

_HEADER = 4096

#: per live file of a fill running in this process: how often it has set marks (gone once
#: it ended); readers here wait on ``_MARKING`` for it to change instead of sleeping
_MARKED: dict[str, int] = {}
_MARKING = threading.Condition()


def _after_fork() -> None:
    """A forked child runs none of its parent's fills (its readers poll them), and a lock
    a parent's thread held at the fork would stay held here."""
    global _MARKING
    _MARKED.clear()
    _MARKING = threading.Condition()


os.register_at_fork(after_in_child=_after_fork)


def _bump(path: str, *, ended: bool = False) -> None:
    with _MARKING:
        if ended:
            _MARKED.pop(path, None)
        else:
            _MARKED[path] = _MARKED.get(path, 0) + 1
        _MARKING.notify_all()


def live_path(parts_dir: str, shard: int) -> str:
    """Where the fill of ``shard`` publishes its progress."""
    return os.path.join(parts_dir, f"{shard}.live")


class FillProgress:
    """The writer's side: created by the process holding the shard's fill lock."""

    def __init__(
        self, path: str, *, part: str, index_part: str | None, size: int, block: int
    ) -> None:
        if block <= 0:
            raise ValueError(f"block must be > 0, got {block}")
        self.path = path
        self.block = block
        self.size = size
        parts = -(-size // block)
        meta = {"part": part, "index": index_part, "size": size, "block": block}
        head = json.dumps(meta).encode() + b"\n"
        if len(head) > _HEADER:
            raise ValueError(f"part path too long for a progress header: {part!r}")
        self._flags = len(head)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, head + bytes(1 + parts))
            self._map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        _bump(path)
        os.replace(tmp, path)

    def index_ready(self) -> None:
        self._set(self._flags, self._flags + 1)

    def written(self, start: int, end: int) -> None:
        """Bytes ``[start, end)`` are in the part file: mark the blocks they cover whole."""
        first = -(-start // self.block)
        last = end // self.block if end < self.size else -(-self.size // self.block)
        if last > first:
            self._set(self._flags + 1 + first, self._flags + 1 + last)

    def _set(self, lo: int, hi: int) -> None:
        m = self._map
        if m is not None:
            m[lo:hi] = b"\x01" * (hi - lo)
            _bump(self.path)

    def close(self) -> None:
        """The fill ended (renamed into place or failed): readers see the file unlinked."""
        if self._map is None:
            return
        m, self._map = self._map, None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            m.close()
            _bump(self.path, ended=True)


class FillView:
    """The reader's side: an open handle on a live file, valid after the fill ends."""

    def __init__(self, fd: int, meta: dict[str, Any], flags: int, path: str = "") -> None:
        self._fd = fd
        self.path = path
        self._flags = flags
        self.part: str = meta["part"]
        self.index_part: str | None = meta["index"]
        self.size = int(meta["size"])
        self.block = int(meta["block"])

    @classmethod
    def open(cls, path: str) -> FillView | None:
        """The fill in progress at ``path``, or None when there is none."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        return cls.from_fd(fd, path)

    @classmethod
    def from_fd(cls, fd: int, path: str = "") -> FillView | None:
        """The fill whose live file is open as ``fd`` (now the view's; closed when it is no
        live file), e.g. one the node service handed over."""
        head = os.pread(fd, _HEADER, 0)
        end = head.find(b"\n")
        try:
            meta = json.loads(head[:end].decode()) if end > 0 else None
        except (ValueError, UnicodeDecodeError):
            meta = None
        if meta is None:
            os.close(fd)
            return None
        return cls(fd, meta, end + 1, path)

    def fileno(self) -> int:
        """The live file's descriptor (to hand it to another process)."""
        return self._fd

    def marks(self) -> int | None:
        """How often the fill has set marks, if it runs in this process (else None): take
        it before looking at the marks, then ``wait_marked`` with it."""
        with _MARKING:
            return _MARKED.get(self.path)

    def wait_marked(self, since: int | None, timeout: float) -> None:
        """Until the fill sets a mark after ``marks()`` said ``since`` (or it ends), at most
        ``timeout`` seconds: a sleep when the fill runs in another process."""
        if since is None:
            time.sleep(timeout)
            return
        with _MARKING:
            _MARKING.wait_for(lambda: _MARKED.get(self.path) != since, timeout)

    def index_ready(self) -> bool:
        return os.pread(self._fd, 1, self._flags) == b"\x01"

    def done(self, start: int, end: int) -> bool:
        """True when every byte of ``[start, end)`` has been written to the part file."""
        if end <= start:
            return True
        first, last = start // self.block, (end - 1) // self.block
        marks = os.pread(self._fd, last - first + 1, self._flags + 1 + first)
        return len(marks) == last - first + 1 and marks.count(1) == len(marks)

    def started(self) -> bool:
        """True once any block of the shard has been written (its first GETs answer)."""
        blocks = -(-self.size // self.block) if self.block > 0 else 0
        return blocks == 0 or 1 in os.pread(self._fd, blocks, self._flags + 1)

    def complete(self) -> bool:
        return self.done(0, self.size)

    def ended(self) -> bool:
        """The fill is over (its shard renamed into place, or it failed)."""
        return os.fstat(self._fd).st_nlink == 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

"""Per-rank status files, in the node cache directory or the user's runtime directory:
what ``flashfeed top`` reads.

Each loader process keeps one small JSON file, ``<root>/.status/rank<R>.<pid>.<n>.json``,
rewritten atomically (temporary file, then rename) at most every ``interval`` seconds while it
delivers batches, and removed when the loader closes. ``<root>`` is the node cache directory
for a loader that reads through one, else this user's runtime directory
(``local_status_root``: a loader reading a local dataset in place). A reader therefore sees
either the previous or the next state, never half of one, and no process serves anything:
``flashfeed top`` only reads files.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flashfeed.cache import NodeCache, read_node_cache

__all__ = [
    "STATUS_DIRNAME",
    "NodeCache",
    "RankStatus",
    "StatusWriter",
    "local_status_root",
    "open_local_status_root",
    "read_node_cache",
    "read_statuses",
    "status_dir",
]

STATUS_DIRNAME = ".status"
STATUS_VERSION = 1
#: a status file older than this (seconds) belongs to a loader that is gone
FORGET_AFTER_S = 600.0
_serial = itertools.count()


def status_dir(cache_dir: str) -> str:
    """Where the loaders using the node cache ``cache_dir`` keep their status files."""
    return os.path.join(cache_dir, STATUS_DIRNAME)


def local_status_root() -> str:
    """Where loaders without a node cache keep their status files (in its ``.status``):
    ``$FLASHFEED_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/flashfeed``, else
    ``<temp dir>/flashfeed-<uid>``. Per user, as the files a loader writes are."""
    explicit = os.environ.get("FLASHFEED_RUNTIME_DIR")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "flashfeed")
    return os.path.join(tempfile.gettempdir(), f"flashfeed-{os.getuid()}")


def open_local_status_root() -> str | None:
    """``local_status_root()``, created private (0700) and checked to be a directory of this
    user's, not a link (the temp dir is shared); None when it cannot be: the loader then
    keeps no status file, as a status never costs the training."""
    root = local_status_root()
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    return root


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


class StatusWriter:
    """Writes one rank's status file, at most every ``interval`` seconds."""

    def __init__(
        self,
        cache_dir: str,
        *,
        rank: int,
        node: str | None = None,
        dataset: str = "",
        interval: float = 0.5,
    ) -> None:
        if interval < 0:
            raise ValueError(f"status interval must be >= 0 seconds, got {interval}")
        self.dir = status_dir(cache_dir)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.rank = rank
        self.node = node or socket.gethostname()
        self.dataset = dataset
        self.interval = interval
        # several loaders of one rank (train and validation, say) keep a file each
        self.path = os.path.join(self.dir, f"rank{rank}.{os.getpid()}.{next(_serial)}.json")
        self._last = float("-inf")
        self._sweep_dead()

    def _sweep_dead(self) -> None:
        """Remove the files of this node's loaders that died without closing."""
        for st in read_statuses(os.path.dirname(self.dir), include_dead=True):
            if st.node == self.node and not _pid_alive(st.pid):
                with contextlib.suppress(OSError):
                    os.unlink(st.path)

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval

    def write(self, state: Callable[[], dict[str, Any]], *, force: bool = False) -> bool:
        """Write ``state()`` if ``interval`` has passed since the last write (or ``force``).
        A full or read-only disk costs the status, never the training."""
        if not force and not self.due():
            return False
        self._last = time.monotonic()
        body = {
            "version": STATUS_VERSION,
            "rank": self.rank,
            "pid": os.getpid(),
            "node": self.node,
            "dataset": self.dataset,
            "updated": time.time(),
            **state(),
        }
        try:
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(body, f)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


@dataclass(frozen=True)
class RankStatus:
    """One rank's status file as read back."""

    path: str
    rank: int
    pid: int
    node: str
    dataset: str
    updated: float
    data: dict[str, Any]

    def total(self, key: str) -> float:
        return float(self.data.get(key, 0) or 0)

    def wait(self, kind: str) -> float:
        return float((self.data.get("wait_s") or {}).get(kind, 0.0) or 0.0)


def read_statuses(cache_dir: str, *, include_dead: bool = False) -> list[RankStatus]:
    """The status files under ``cache_dir``, by rank. Files being replaced, unreadable or of
    another format are skipped; so are (unless ``include_dead``) loaders that are gone: a
    dead process on this node, or a file nobody updated for ``FORGET_AFTER_S``."""
    d = status_dir(cache_dir)
    try:
        names = sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []
    here, now, out = socket.gethostname(), time.time(), []
    for name in names:
        if not name.startswith("rank") or not name.endswith(".json"):
            continue
        path = os.path.join(d, name)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            st = RankStatus(
                path=path,
                rank=int(data["rank"]),
                pid=int(data["pid"]),
                node=str(data.get("node", "")),
                dataset=str(data.get("dataset", "")),
                updated=float(data["updated"]),
                data=data,
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not include_dead:
            if now - st.updated > FORGET_AFTER_S:
                continue
            if st.node == here and not _pid_alive(st.pid):
                continue
        out.append(st)
    out.sort(key=lambda s: (s.rank, s.pid))
    return out

"""Per-rank status files, in the node cache directory or the user's runtime directory:
what ``flashfeed top`` reads (``flashfeed.monitor``).

Each loader process keeps one small JSON file, ``<root>/.status/rank<R>.<pid>.<n>.json``,
rewritten atomically (temporary file, then rename) at most every ``interval`` seconds while it
delivers batches, and removed when the loader closes. ``<root>`` is the node cache directory
for a loader that reads through one, else this user's runtime directory
(``local_status_root``: a loader reading a local dataset in place). A reader therefore sees
either the previous or the next state, never half of one, and no process serves anything:
``flashfeed top`` only reads files. The file's keys are ``flashfeed.telemetry``'s.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import stat
import time
from collections.abc import Callable
from typing import Any

from flashfeed.runtime.files import atomic_write_json
from flashfeed.runtime.lifeline import pid_alive
from flashfeed.telemetry import (
    local_status_root,
    status_dir,
    status_files,
    status_object,
)

__all__ = ["StatusWriter", "open_local_status_root"]

_serial = itertools.count()


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
        for st in status_files(os.path.dirname(self.dir)):
            if st.node == self.node and not pid_alive(st.pid):
                with contextlib.suppress(OSError):
                    os.unlink(st.path)

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval

    def next_due(self) -> float:
        """The ``time.monotonic()`` from which the next ``write`` writes."""
        return self._last + self.interval

    def write(self, state: Callable[[], dict[str, Any]], *, force: bool = False) -> bool:
        """Write ``state()`` if ``interval`` has passed since the last write (or ``force``).
        A full or read-only disk costs the status, never the training."""
        if not force and not self.due():
            return False
        self._last = time.monotonic()
        body = status_object(
            rank=self.rank,
            pid=os.getpid(),
            node=self.node,
            dataset=self.dataset,
            updated=time.time(),
            state=state(),
        )
        try:
            atomic_write_json(self.path, body, sort_keys=False)  # in the order written
        except OSError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)

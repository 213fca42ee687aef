"""The status files of the loaders running on this node, as ``flashfeed top`` reads them
(the loader's ``StatusWriter`` keeps them; ``flashfeed.telemetry`` says what they hold), and
the node cache's own figures (``flashfeed.cache``'s public ``read_node_cache``)."""

from __future__ import annotations

import socket
import time

from flashfeed.cache import NodeCache, read_node_cache
from flashfeed.runtime.lifeline import pid_alive
from flashfeed.telemetry import (
    FORGET_AFTER_S,
    RankStatus,
    local_status_root,
    status_dir,
    status_files,
)

__all__ = [
    "NodeCache",
    "RankStatus",
    "local_status_root",
    "read_node_cache",
    "read_statuses",
    "status_dir",
]


def read_statuses(root: str, *, include_dead: bool = False) -> list[RankStatus]:
    """The status files under ``root`` (a node cache, or the runtime directory), by rank.
    Files being replaced, unreadable or of another format are skipped; so are (unless
    ``include_dead``) loaders that are gone: a dead process on this node, or a file nobody
    updated for ``FORGET_AFTER_S``."""
    found = status_files(root)
    if include_dead:
        return found
    here, now = socket.gethostname(), time.time()
    return [
        st
        for st in found
        if now - st.updated <= FORGET_AFTER_S and not (st.node == here and not pid_alive(st.pid))
    ]

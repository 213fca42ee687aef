"""The node service: one process owns a node's cache directory; loaders and commands of
every tenant talk to it over a Unix socket and map the shards it hands them as descriptors.

Select it with ``$FLASHFEED_NODE_SOCKET`` (or ``node=`` on ``open_source``); without it the
embedded ``ShardCache`` is used as before. ``flashfeed node serve CONFIG`` runs it.
"""

from __future__ import annotations

from .client import (
    SOCKET_ENV,
    NodeAccessError,
    NodeClient,
    NodeError,
    NodeQuotaError,
    NodeUnavailable,
    node_socket,
)
from .source import NodeShardSource

__all__ = [
    "SOCKET_ENV",
    "NodeAccessError",
    "NodeClient",
    "NodeError",
    "NodeQuotaError",
    "NodeShardSource",
    "NodeUnavailable",
    "node_socket",
]

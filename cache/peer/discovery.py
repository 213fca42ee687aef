"""Where the other nodes' peer servers are: the sources ``cache warm`` already reads.

A host list (``--hosts``, ``--hostfile``: node-rank order, ``cluster.parse_hosts`` and
``parse_hostfile``), the launcher's environment (``FLASHFEED_PEERS``), or the alive nodes of
the Ray cluster (their addresses). An entry without a port gets ``port``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..warm.cluster import alive_nodes, parse_hostfile, parse_hosts

__all__ = ["PEERS_ENV", "parse_listen", "peers_from", "peers_from_ray", "with_port"]

PEERS_ENV = "FLASHFEED_PEERS"


def parse_listen(text: object, *, name: str = "--listen") -> tuple[str, int]:
    """``host:port`` where a peer server listens (port 0: any free one)."""
    host, _, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{name} must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


def with_port(entry: str, port: int) -> str:
    """``host`` -> ``host:port``; ``host:p`` and ``[v6]:p`` stay as they are."""
    if entry.startswith("["):
        return entry if "]:" in entry else f"{entry}:{port}"
    if entry.count(":") == 1:
        return entry
    if ":" in entry:  # a bare IPv6 address
        return f"[{entry}]:{port}"
    return f"{entry}:{port}"


def peers_from(
    *, hosts: str | None = None, hostfile: str | None = None, port: int = 7460
) -> list[str]:
    """The peers' ``host:port``: from ``hosts``, else ``hostfile``, else ``FLASHFEED_PEERS``
    (comma-separated); empty when none is given."""
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    if hosts:
        entries = parse_hosts(hosts)
    elif hostfile:
        entries = parse_hostfile(hostfile)
    elif os.environ.get(PEERS_ENV):
        entries = parse_hosts(os.environ[PEERS_ENV])
    else:
        entries = []
    return [with_port(e, port) for e in entries]


def peers_from_ray(raw_nodes: Sequence[Mapping[str, Any]], *, port: int = 7460) -> list[str]:
    """The alive nodes of a ``ray.nodes()`` answer as peers (by their node address)."""
    return [with_port(n.address, port) for n in alive_nodes(raw_nodes) if n.address]

"""The node service as a peer of the cluster tier: the config's ``peers`` section.

::

    "peers": {"listen": "10.0.0.5:7460", "hosts": ["10.0.0.5", "10.0.0.6"],
              "token_file": "/etc/flashfeed/peer.token", "max_streams": 8, "rate": "1GiB"}

The service then serves its cache to the other nodes (a ``PeerServer`` in its own process)
and reads its tenants' misses from the peers holding them before the store (a ``PeerTier``
under its ``ShardCache``), checked against the manifest as every fill is. Concurrent misses
of one shard on several nodes single-flight at one node (the shard's rendezvous owner): the
others ask it to fill the shard (``POST /v1/fill``) and stream its fill as it lands. Such a
fill reads the store with the service's own credentials (a tenant's access was checked by
the node it asked) and is charged to the account ``(peers)``, within ``fill_quota``
(default: a quarter of the capacity; 0: this node neither fills for peers nor asks them
to). The section is read at start only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flashfeed.dataset import Dataset

from ..peer.auth import load_token
from ..peer.client import PeerTier
from ..peer.discovery import parse_listen, peers_from
from ..peer.server import PeerServer

__all__ = ["PeerConfig", "PeerSide", "parse_peers"]

_KNOWN = {"listen", "hosts", "hostfile", "port", "token_file", "max_streams", "rate", "fill_quota"}
_WILDCARD = {"0.0.0.0", "::", ""}


@dataclass(frozen=True)
class PeerConfig:
    """The ``peers`` section, validated: where this node serves, the nodes, the token."""

    listen: tuple[str, int]
    peers: tuple[str, ...]
    token: bytes
    max_streams: int
    rate: float
    fill_quota: int | None = None  # bytes of fills for peers (None: a quarter of the capacity)

    @property
    def address(self) -> str:
        host, port = self.listen
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_peers(data: Any) -> PeerConfig | None:
    """The ``peers`` section (None: the service is no peer). Raises ``ValueError`` naming
    the bad value; the discovery and token rules are the cluster tier's own."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"peers must be an object, got {data!r}")
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise ValueError(f"peers: unknown key(s) {unknown}; known: {sorted(_KNOWN)}")
    listen = parse_listen(data.get("listen"), name="peers.listen")
    if listen[0] in _WILDCARD or listen[1] == 0:
        raise ValueError(
            "peers.listen must be this node's address and port as its peers name it, "
            f"got {data.get('listen')!r}"
        )
    hosts = data.get("hosts")
    if isinstance(hosts, list) and all(isinstance(h, str) for h in hosts):
        hosts = ",".join(hosts)
    if hosts is not None and not isinstance(hosts, str):
        raise ValueError(f"peers.hosts must be a list of host[:port], got {hosts!r}")
    hostfile = data.get("hostfile")
    if hostfile is not None and not isinstance(hostfile, str):
        raise ValueError(f"peers.hostfile must be a path, got {hostfile!r}")
    port = data.get("port", listen[1])
    if isinstance(port, bool) or not isinstance(port, int):
        raise ValueError(f"peers.port must be an integer, got {port!r}")
    try:
        nodes = peers_from(hosts=hosts, hostfile=hostfile, port=port)
    except ValueError as exc:
        raise ValueError(f"peers: {exc}") from None
    token_file = data.get("token_file")
    if token_file is not None and not isinstance(token_file, str):
        raise ValueError(f"peers.token_file must be a path, got {token_file!r}")
    try:
        token = load_token(token_file=token_file)
    except ValueError as exc:
        raise ValueError(f"peers: {exc}") from None
    rate = _bytes(data.get("rate", 0), "peers.rate", "bytes a second; 0: unbounded")
    quota = data.get("fill_quota")
    if quota is not None:
        quota = _bytes(
            quota, "peers.fill_quota", "bytes of fills this node makes for its peers; 0: none"
        )
    cfg = PeerConfig(listen, tuple(nodes), token, data.get("max_streams", 8), float(rate), quota)
    try:
        PeerServer.check(max_streams=cfg.max_streams, rate=cfg.rate)
    except ValueError as exc:
        raise ValueError(f"peers.{exc}") from None
    return cfg


def _bytes(value: Any, name: str, means: str) -> int:
    """A byte count of the section (0 or "0": zero); the error says what it counts."""
    from flashfeed.units import parse_size

    if value in (0, "0"):
        return 0
    try:
        return parse_size(value, name=name)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{exc} ({means})") from None


class PeerSide:
    """The service's peer parts: ``server`` (its cache served to the others) and ``tier``
    (the fill source given to its ``ShardCache``: peers holding the shard, then the store)."""

    def __init__(
        self,
        cfg: PeerConfig,
        *,
        cache_root: str,
        fill: Callable[[Dataset, int], None] | None = None,
        open_dataset: Callable[[str], Dataset] | None = None,
    ) -> None:
        try:
            self.server = PeerServer(
                cache_dir=cache_root,
                token=cfg.token,
                address=cfg.listen,
                fill=fill,  # None: no fill route (501), and no node asks this one to fill
                open_dataset=open_dataset,
                max_streams=cfg.max_streams,
                rate=cfg.rate,
                stats=lambda: self.tier.stats(),
            )
        except OSError as exc:
            raise ValueError(
                f"peers.listen: cannot listen on {cfg.address}: {exc.strerror or exc}"
            ) from None
        self.address = self.server.address
        self.tier = PeerTier(
            peers=[p for p in cfg.peers if p not in (cfg.address, self.address)],
            token=cfg.token,
            self_address=self.address,
            delegate=fill is not None,
        )

    def start(self) -> None:
        self.server.start()

    def close(self) -> None:
        self.server.close()

"""The node service's config file: where the cache lives, its capacity, the service's own
store credentials, and each tenant's byte quota and job weights.

::

    {"cache_dir": "/nvme/flashfeed", "capacity": "800GiB",
     "socket": "/run/flashfeed/node.sock",
     "store": {"endpoint_url": "http://...", "key": "...", "secret": "..."},
     "admins": ["root"],
     "default_quota": "0",
     "tenants": {"alice": {"quota": "200GiB", "jobs": {"sweep": {"weight": 2}}}},
     "requests_per_s": 2000,
     "peers": {"listen": "10.0.0.5:7460", "hosts": ["10.0.0.5", "10.0.0.6"],
               "token_file": "/etc/flashfeed/peer.token"}}

A tenant is the Unix user on the other end of the socket; the service reads at most
``requests_per_s`` requests a second from each (a tenant's own entry may set its own; by
default 1,000 per core of the node, 0: unbounded). A loader asks about twice per shard it
fetches and seldom for a shard it holds; a flood beyond the rate waits in the flooder's own
socket instead of taking the cores the other tenants' loaders need.
Quotas, weights and rates are read again when the file changes (its mtime) or on SIGHUP;
``cache_dir``, ``socket``, ``store`` and ``peers`` (the service as a peer of the cluster
tier: ``peering.py``) are read at start only.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flashfeed.units import parse_size

from .peering import PeerConfig, parse_peers

__all__ = ["ConfigError", "ConfigWatch", "NodeConfig", "TenantConfig"]

DEFAULT_SOCKET = "/run/flashfeed/node.sock"
#: a tenant's requests a second by default, per core of the node: on 2 cores, another
#: tenant's hit p99 under a flood at this rate stays within 2x of idle (``nodebench``)
REQUESTS_PER_CORE = 1000
DEFAULT_REQUESTS_PER_S = float(REQUESTS_PER_CORE * (os.cpu_count() or 1))

log = logging.getLogger("flashfeed.node")


class ConfigError(ValueError):
    """The config file is unreadable or holds a bad value (named in the message)."""


@dataclass(frozen=True)
class TenantConfig:
    """One tenant's quota (bytes) and the weights of its named jobs (others weigh 1)."""

    quota: int
    weights: dict[str, float] = field(default_factory=dict)
    #: requests a second the service reads from this tenant (None: the node's default)
    requests_per_s: float | None = None

    def weight(self, job: str) -> float:
        return self.weights.get(job, 1.0)


@dataclass(frozen=True)
class NodeConfig:
    """The whole config file, validated."""

    cache_dir: str
    capacity: int
    socket: str
    store: dict[str, Any]
    tenants: dict[str, TenantConfig]
    default_quota: int
    admins: tuple[str, ...]
    grant_seconds: float
    peers: PeerConfig | None = None
    #: requests a second the service reads from each tenant (0: unbounded): a tenant that
    #: floods the service waits in its own socket and leaves the CPU to the others
    requests_per_s: float = DEFAULT_REQUESTS_PER_S

    def request_rate(self, name: str) -> float:
        """The requests a second the service reads from tenant ``name`` (0: unbounded)."""
        own = self.tenant(name).requests_per_s
        return self.requests_per_s if own is None else own

    @property
    def peer_fill_quota(self) -> int:
        """Bytes of the fills this node makes for its peers (``peering.py``)."""
        if self.peers is None:
            return 0
        quota = self.peers.fill_quota
        return self.capacity // 4 if quota is None else min(quota, self.capacity)

    def tenant(self, name: str) -> TenantConfig:
        """The tenant's config; one not listed gets ``default_quota`` and weights of 1."""
        return self.tenants.get(name) or TenantConfig(self.default_quota)

    @classmethod
    def parse(cls, data: Any, *, source: str) -> NodeConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the config must be a JSON object")
        known = {"cache_dir", "capacity", "socket", "store", "tenants", "default_quota",
                 "admins", "grant_seconds", "peers", "requests_per_s"}  # fmt: skip
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {unknown}; known: {sorted(known)}")
        cache_dir = data.get("cache_dir")
        if not isinstance(cache_dir, str) or not cache_dir:
            raise ConfigError(f"{source}: cache_dir must be a directory path, got {cache_dir!r}")
        store = data.get("store", {})
        if not isinstance(store, dict):
            raise ConfigError(f"{source}: store must be an object of storage options")
        tenants = {}
        raw = data.get("tenants", {})
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: tenants must be an object keyed by user name")
        for name, t in raw.items():
            tenants[name] = _tenant(name, t, source)
        grant = data.get("grant_seconds", 600)
        if isinstance(grant, bool) or not isinstance(grant, (int, float)) or grant <= 0:
            raise ConfigError(f"{source}: grant_seconds must be > 0, got {grant!r}")
        admins = data.get("admins", ["root"])
        if not isinstance(admins, list) or not all(isinstance(a, str) for a in admins):
            raise ConfigError(f"{source}: admins must be a list of user names, got {admins!r}")
        try:
            peers = parse_peers(data.get("peers"))
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        rate = data.get("requests_per_s", DEFAULT_REQUESTS_PER_S)
        return cls(
            cache_dir=os.path.abspath(cache_dir),
            capacity=_size(data.get("capacity"), "capacity", source, positive=True),
            socket=str(data.get("socket", DEFAULT_SOCKET)),
            store=dict(store),
            tenants=tenants,
            default_quota=_size(data.get("default_quota", 0), "default_quota", source),
            admins=tuple(admins),
            grant_seconds=float(grant),
            peers=peers,
            requests_per_s=_rate(rate, "requests_per_s", source),
        )

    @classmethod
    def read(cls, path: str) -> NodeConfig:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read node config {path}: {exc}") from None
        return cls.parse(data, source=path)


def _size(value: Any, name: str, source: str, *, positive: bool = False) -> int:
    if not positive and value in (0, "0"):
        return 0  # no quota: the tenant reads what others hold, and fills nothing
    try:
        n = parse_size(value, name=name)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if n < 0 or (positive and n == 0):
        raise ConfigError(
            f"{source}: {name} must be {'> 0' if positive else '>= 0'}, got {value!r}"
        )
    return n


def _tenant(name: str, t: Any, source: str) -> TenantConfig:
    if not isinstance(t, dict):
        raise ConfigError(f"{source}: tenant {name!r} must be an object with a quota")
    quota = _size(t.get("quota"), f"quota of tenant {name}", source)
    weights: dict[str, float] = {}
    jobs = t.get("jobs", {})
    if not isinstance(jobs, dict):
        raise ConfigError(f"{source}: jobs of tenant {name!r} must be an object")
    for job, j in jobs.items():
        w = j.get("weight", 1) if isinstance(j, dict) else None
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w <= 0:
            raise ConfigError(f"{source}: weight of job {job!r} of tenant {name!r} must be > 0")
        weights[job] = float(w)
    rate = t.get("requests_per_s")
    own = None if rate is None else _rate(rate, f"requests_per_s of tenant {name}", source)
    return TenantConfig(quota, weights, own)


def _rate(value: Any, name: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{source}: {name} must be a number >= 0 (0: unbounded), got {value!r}")
    return float(value)


class ConfigWatch:
    """The current config: read again when the file's mtime or size changed (looked at with
    one ``stat`` at each use, or at most every ``every`` seconds), or at once after
    ``reload()`` (SIGHUP). A bad new file keeps the last good config and says so in
    ``error``."""

    def __init__(self, path: str, *, every: float = 0.0) -> None:
        self.path = os.path.abspath(path)
        self.every = every
        self.config = NodeConfig.read(self.path)
        self.error: str | None = None
        self._stamp = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def reload(self) -> None:
        """Read the file again now (SIGHUP)."""
        with self._lock:
            self._stamp = None
            self._checked = -1e9
        self.current()

    def current(self) -> NodeConfig:
        now = time.monotonic()
        if now - self._checked < self.every:
            return self.config
        with self._lock:
            self._checked = now
            stamp = self._stat()
            if stamp is None or stamp == self._stamp:
                return self.config
            self._stamp = stamp
            try:
                config = NodeConfig.read(self.path)
                if config.peers != self.config.peers:
                    log.warning("the peers section changed: it applies after a restart")
                self.config = config
                self.error = None
            except ConfigError as exc:
                self.error = str(exc)
            return self.config

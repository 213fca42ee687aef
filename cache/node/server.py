"""``NodeService``: one process owns the node's cache directory and answers its tenants over
a Unix socket, handing out open descriptors of verified shards (see ``handlers.py`` for what
each request does, ``room.py`` for quotas, ``access.py`` for proofs of access).

One thread serves the requests, round robin by tenant (``loop.py``: a tenant flooding the
service waits behind its own requests); fills queue per job and share the fill workers by
job weight.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flashfeed.dataset import Dataset

from ..layout import DatasetDir, list_dataset_dirs, make_private_dir
from ..shardcache import ShardCache
from .accounting import Accounts
from .fairqueue import FairQueue
from .ledger import Ledger
from .loop import Inbox, Outbox, RequestLoop
from .peering import PeerSide
from .protocol import encode_message
from .tenants import ConfigWatch

__all__ = ["Connection", "NodeService"]

log = logging.getLogger("flashfeed.node")

#: the interpreter's thread switch interval in the service (seconds): a request waits for a
#: thread that holds the interpreter at most about this long (Python's default is 5 ms)
SWITCH_INTERVAL = 0.0005


@dataclass(eq=False)
class Connection:
    """One client: its socket, the Unix user behind it (the tenant) and its job."""

    sock: socket.socket
    tenant: str
    uid: int
    loop: RequestLoop
    job: str = "default"
    alive: bool = True
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    #: the loop's: requests read and not served yet, replies not taken yet, its registration
    inbox: Inbox = field(default_factory=Inbox)
    outbox: Outbox = field(default_factory=Outbox)
    events: int = 0

    @property
    def owner(self) -> tuple[str, str]:
        return (self.tenant, self.job)

    def reply(
        self, request: dict[str, Any], body: dict[str, Any], fds: list[int] | None = None
    ) -> None:
        """Answer ``request`` (its ``id`` echoed) now, or once the client takes it (the
        descriptors are duplicated meanwhile: the caller closes its own); a client gone
        meanwhile is no error."""
        self.loop.reply(self, encode_message({"id": request.get("id"), **body}), fds)


def peer_tenant(sock: socket.socket) -> tuple[str, int]:
    """The Unix user on the other end of ``sock`` (``SO_PEERCRED``): its name and uid."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:
        return f"uid{uid}", uid


class NodeService:
    """The node service of the config file at ``config_path`` (``tenants.NodeConfig``)."""

    def __init__(self, config_path: str, *, fill_workers: int = 4) -> None:
        self.watch = ConfigWatch(config_path)
        cfg = self.watch.config
        make_private_dir(cfg.cache_dir)
        os.chmod(cfg.cache_dir, 0o700)
        self.state_dir = make_private_dir(os.path.join(cfg.cache_dir, "state"))
        store_root = os.path.join(cfg.cache_dir, "store")
        #: the service as a peer of the cluster tier (the config's ``peers``: ``peering.py``)
        self.peer = None
        if cfg.peers is not None:
            fills = cfg.peer_fill_quota > 0
            self.peer = PeerSide(cfg.peers, cache_root=store_root,
                                 fill=self._peer_fill if fills else None,
                                 open_dataset=self._peer_open if fills else None)  # fmt: skip
        self.cache = ShardCache(
            store_root,
            capacity=cfg.capacity,
            storage_options=cfg.store or None,
            peers=None if self.peer is None else self.peer.tier,
        )
        self.cache.copies.durable_misses = False  # the ledger and accounts are the record
        self.ledger = Ledger(self.state_dir)
        self.dirs: dict[str, DatasetDir] = {d.key: d for d in list_dataset_dirs(self.cache.root)}
        resident = {}
        for d, e in self.cache.space.scan()[0]:
            self.dirs.setdefault(d.key, d)
            resident[(d.key, e.shard)] = e.size  # the shard and its index, as fills charge
        dropped, adopted = self.ledger.recover(resident)
        if dropped or adopted:
            log.info("recovered: %d charges of absent shards dropped, %d shards adopted",
                     dropped, adopted)  # fmt: skip
        self.accounts = Accounts(self.state_dir, self.ledger)
        self.datasets: dict[str, Dataset] = {}  # dataset key -> the service's Dataset
        self.grants: dict[tuple[str, str], float] = {}  # (tenant, key) -> until (monotonic)
        self.filling: set[tuple[str, int]] = set()
        #: reads of shards being filled, answered as their fills end (``handlers._get``)
        self.waiters: dict[tuple[str, int], list[tuple[Connection, dict[str, Any]]]] = {}
        #: shards verified since this service started (hits of others need one more check)
        self.verified: set[tuple[str, int]] = set()
        #: evictions the embedded cache made on its own, as last seen (``adminops.settle``)
        self.embedded_evictions = 0
        self.lock = threading.Lock()
        self.fills = FairQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._fill_workers = fill_workers
        from .handlers import serve_request

        self.loop = RequestLoop(lambda conn, request: serve_request(self, conn, request),
                                rate=lambda tenant: self.config.request_rate(tenant))  # fmt: skip
        self.sock: socket.socket | None = None

    @property
    def config(self) -> Any:
        return self.watch.current()

    # -- lifetime ---------------------------------------------------------------------------
    def bind(self) -> str:
        """Listen on the config's socket path (mode 0666: any local user may ask; who asks
        is told by the kernel, ``SO_PEERCRED``). A stale socket file is replaced."""
        path = self.config.socket
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                raise RuntimeError(f"a node service already listens on {path}")
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(path)
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o666)
        sock.listen(128)
        self.sock = sock
        return path

    def start(self) -> None:
        """Bind and start the threads (accept, the request loop, fill workers, counter
        flushes)."""
        from .handlers import fill_worker

        if self.sock is None:
            self.bind()
        targets = [self._accept, self._flusher, self.loop.run]
        targets += [lambda: fill_worker(self)] * self._fill_workers
        for target in targets:
            t = threading.Thread(target=target, daemon=True, name="flashfeed-node")
            t.start()
            self._threads.append(t)
        if self.peer is not None:
            self.peer.start()

    def serve_forever(self) -> None:
        """Run until SIGTERM or SIGINT; SIGHUP reads the config again."""
        sys.setswitchinterval(SWITCH_INTERVAL)
        signal.signal(signal.SIGHUP, lambda *_: self.watch.reload())
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        self.start()
        log.info("node service on %s, cache %s", self.config.socket, self.cache.root)
        if self.peer is not None:
            log.info("serving peers on %s; peers: %s", self.peer.address,
                     ", ".join(self.peer.tier.peers) or "none")  # fmt: skip
        try:
            while not self._stop.wait(1.0):
                pass
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        self.loop.close()
        self.fills.close()
        if self.sock is not None:
            path = self.config.socket
            self.sock.close()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if self.peer is not None:
            self.peer.close()
        self.accounts.flush()
        self.cache.close()

    def _flusher(self) -> None:
        while not self._stop.wait(2.0):
            self.accounts.flush()
            self.cache.counters.flush()  # its misses are not flushed one by one here

    # -- connections ------------------------------------------------------------------------
    def _accept(self) -> None:
        listening = self.sock
        while listening is not None and not self._stop.is_set():
            try:
                sock, _ = listening.accept()
            except OSError:
                return
            tenant, uid = peer_tenant(sock)
            self.loop.add(Connection(sock, tenant, uid, self.loop))

    # -- the service as a peer -------------------------------------------------------------
    def _peer_fill(self, dataset: Dataset, shard: int) -> None:
        """A fill another node asked for (``POST /v1/fill``: ``fills.fill_for_peers``)."""
        from .fills import fill_for_peers

        fill_for_peers(self, dataset, shard)

    def _peer_open(self, url: str) -> Dataset:
        return self.cache.open_dataset(url)

    def is_admin(self, conn: Connection) -> bool:
        return conn.tenant in self.config.admins

    def granted(self, conn: Connection, key: str) -> bool:
        until = self.grants.get((conn.tenant, key))
        return until is not None and until > time.monotonic()

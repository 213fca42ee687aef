"""``NodeClient``: a process's connection to the node service.

Requests carry ids and may be in flight from several threads at once (a loader's read-ahead
asks for several shards side by side); one reader thread hands each answer to its caller.
When the service goes away, calls wait for it to come back (with backoff, up to
``reconnect_timeout``) and then open their datasets again: what the process already holds
(open descriptors, mapped shards) keeps working meanwhile.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from ..errors import CacheError
from .access import presign_manifest
from .protocol import ProtocolError, recv_message, send_message

__all__ = [
    "SOCKET_ENV",
    "NodeAccessError",
    "NodeClient",
    "NodeError",
    "NodeQuotaError",
    "NodeUnavailable",
    "node_socket",
]

#: the environment variable that selects the node service (its socket path)
SOCKET_ENV = "FLASHFEED_NODE_SOCKET"
#: the job name a process reports (else ``default``)
JOB_ENV = "FLASHFEED_JOB"


def node_socket(given: str | None = None) -> str | None:
    """The node service's socket: ``given``, else ``$FLASHFEED_NODE_SOCKET``, else None
    (no service: the embedded cache)."""
    return given or os.environ.get(SOCKET_ENV) or None


class NodeError(CacheError):
    """The node service refused a request (its one-line reason)."""


class NodeAccessError(NodeError, PermissionError):
    """The tenant's own credentials cannot read the dataset."""


class NodeQuotaError(NodeError):
    """The request does not fit in the tenant's quota."""


class NodeUnavailable(NodeError, ConnectionError):
    """The node service is not there (and did not come back in time)."""


_KINDS = {"access": NodeAccessError, "quota": NodeQuotaError}


class NodeClient:
    """Talks to the node service at ``socket_path`` as job ``job`` of this Unix user."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        job: str | None = None,
        storage_options: dict[str, Any] | None = None,
        reconnect_timeout: float = 60.0,
    ) -> None:
        path = node_socket(socket_path)
        if path is None:
            raise ValueError(f"no node service socket given (socket_path= or ${SOCKET_ENV})")
        if reconnect_timeout < 0:
            raise ValueError(f"reconnect_timeout must be >= 0, got {reconnect_timeout!r}")
        self.socket_path = path
        self.job = job or os.environ.get(JOB_ENV) or "default"
        self.storage_options = storage_options
        self.reconnect_timeout = reconnect_timeout
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._pending: dict[int, Future[tuple[dict[str, Any], list[int]]]] = {}
        self._ids = itertools.count(1)
        self._keys: dict[str, str] = {}  # url -> dataset key (granted on this connection)
        self.tenant: str | None = None
        self.reconnects = 0
        self._closed = False

    # -- connection -------------------------------------------------------------------------
    def _connected(self, *, patient: bool = True) -> socket.socket:
        sock = self._sock
        if sock is not None:
            return sock
        with self._connect_lock:  # one thread connects and says hello; the others wait
            if self._sock is not None:
                return self._sock
            if self._closed:
                raise NodeUnavailable("the node client is closed")
            sock = self._dial(self.reconnect_timeout if patient else 0.0)
            threading.Thread(target=self._read, args=(sock,), daemon=True).start()
            hello, _ = self._call({"op": "hello", "job": self.job}, sock=sock)
            with self._lock:
                if self.tenant is not None:
                    self.reconnects += 1
                self.tenant = hello["tenant"]
                self._keys.clear()  # grants live in the service: a new connection asks again
                self._sock = sock
            return sock

    def _dial(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                if time.monotonic() + delay > deadline:
                    raise NodeUnavailable(
                        f"no node service on {self.socket_path} ({exc.strerror})"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _read(self, sock: socket.socket) -> None:
        try:
            while True:
                got = recv_message(sock)
                if got is None:
                    break
                reply, fds = got
                with self._lock:
                    future = self._pending.pop(int(reply.get("id", -1)), None)
                if future is None:
                    for fd in fds:
                        os.close(fd)
                else:
                    future.set_result((reply, fds))
        except (OSError, ProtocolError):
            pass
        finally:
            self._lost(sock)

    def _lost(self, sock: socket.socket) -> None:
        with self._lock:
            if self._sock is sock:
                self._sock = None
            pending, self._pending = self._pending, {}  # (one connection at a time)
        sock.close()
        for future in pending.values():
            future.set_exception(NodeUnavailable(f"node service on {self.socket_path} went away"))

    def _call(
        self,
        request: dict[str, Any],
        *,
        wait: bool = True,
        sock: socket.socket | None = None,
        patient: bool = True,
    ) -> tuple[dict[str, Any], list[int]]:
        """Send one request on the connection (``sock``, else the current one, made if
        needed) and wait for its answer."""
        sock = sock or self._connected(patient=patient)
        future: Future[tuple[dict[str, Any], list[int]]] = Future()
        rid = next(self._ids)
        with self._lock:
            self._pending[rid] = future
        try:
            send_message(sock, {**request, "id": rid})
        except OSError:
            self._lost(sock)
            raise NodeUnavailable(f"node service on {self.socket_path} went away") from None
        if not wait:
            with self._lock:
                self._pending.pop(rid, None)
            return {}, []
        reply, fds = future.result()
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            kind = str(reply.get("kind"))
            if kind == "grant":
                raise _Regrant(reply["error"])
            raise _KINDS.get(kind, NodeError)(reply["error"])
        return reply, fds

    def call(
        self,
        request: dict[str, Any],
        *,
        url: str | None = None,
        urls: Sequence[str] = (),
        wait: bool = True,
        patient: bool = True,
    ) -> tuple[dict[str, Any], list[int]]:
        """``request`` (with ``key`` filled in for ``url``, ``keys`` for ``urls``), retried
        across a restart of the service (reconnect, open the datasets again) until
        ``reconnect_timeout``; not ``patient``: ``NodeUnavailable`` at once while the
        service is away."""
        deadline = time.monotonic() + (self.reconnect_timeout if patient else 0.0)
        while True:
            try:
                if url is not None:
                    request = {**request, "key": self.open(url, patient=patient)}
                if urls:
                    request = {**request, "keys": [self.open(u, patient=patient) for u in urls]}
                return self._call(request, wait=wait, patient=patient)
            except _Regrant:
                if url is None and not urls:
                    raise NodeError("the node service asked for a dataset to be opened") from None
                with self._lock:
                    for u in (url, *urls):
                        self._keys.pop(str(u).rstrip("/"), None)
            except NodeUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    # -- requests ---------------------------------------------------------------------------
    def open(self, url: str, *, patient: bool = True) -> str:
        """Prove access to the dataset at ``url`` (a presigned GET of its manifest, made with
        this process's own credentials) and return its key at the service."""
        url = url.rstrip("/")
        known = self._keys.get(url)
        if known is not None:
            return known
        proof = presign_manifest(url, self.storage_options)
        reply, _ = self._call({"op": "open", "url": url, "proof": proof}, patient=patient)
        self._keys[url] = reply["key"]
        return reply["key"]

    def get(self, url: str, shard: int, *, patient: bool = True) -> tuple[int, int | None, bool]:
        """Open descriptors of a verified copy of the shard and of its index (None when it
        has none), and whether it was a hit. The caller owns (closes) them. ``patient``:
        wait for the service to come back (else ``NodeUnavailable`` at once)."""
        reply, fds = self.call({"op": "get", "shard": int(shard)}, url=url, patient=patient)
        if not fds:
            raise NodeError(f"the node service sent no descriptor for shard {shard} of {url}")
        return fds[0], (fds[1] if reply.get("index") and len(fds) > 1 else None), bool(reply["hit"])

    def partial(self, url: str, shard: int) -> tuple[int, int, int | None] | None:
        """Descriptors of the fill of ``shard`` running now: its live progress file, its
        part file and its index part (None for an Arrow shard); None when none runs (or
        the service is away)."""
        try:
            reply, fds = self.call({"op": "partial", "shard": int(shard)}, url=url, patient=False)
        except NodeUnavailable:
            return None
        if not reply.get("partial") or len(fds) not in (2, 3):
            for fd in fds:
                os.close(fd)
            return None
        return fds[0], fds[1], fds[2] if len(fds) == 3 else None

    def pin(self, url: str, shard: int, *, pinned: bool = True) -> None:
        self.call({"op": "pin", "shard": int(shard), "pinned": pinned}, url=url)

    def warm(self, url: str, shards: list[int], *, pin: bool = True) -> dict[str, Any]:
        """``warm_sources`` of one dataset."""
        return self.warm_sources([url], [(0, int(s)) for s in shards], pin=pin)

    def warm_sources(
        self, urls: Sequence[str], items: Sequence[tuple[int, int]], *, pin: bool = True
    ) -> dict[str, Any]:
        """Fetch (and pin for this job) the shards of one dataset or several (a mixture's
        sources): ``items`` are ``(place in urls, shard)`` in the order to fetch them;
        ``NodeQuotaError`` at once, before any fetch, when they cannot all fit."""
        request = {"op": "warm", "items": [[int(j), int(s)] for j, s in items], "pin": pin}
        reply, _ = self.call(request, urls=[u.rstrip("/") for u in urls])
        return reply

    def prefetch(self, url: str, shards: list[int]) -> None:
        """Ask for shards to be fetched in the background (a hint; no answer awaited)."""
        self.call({"op": "prefetch", "shards": [int(s) for s in shards]}, url=url, wait=False)

    def verify(self) -> dict[str, Any]:
        """Check every cached shard's checksum (admins); corrupt ones are removed."""
        return self.call({"op": "verify"})[0]

    def evict(self, url: str | None = None) -> dict[str, Any]:
        """Release this tenant's pins on ``url`` (None: on every dataset) and evict the
        shards charged to it there."""
        if url is None:
            return self.call({"op": "evict"})[0]
        return self.call({"op": "evict"}, url=url)[0]

    def status(self) -> dict[str, Any]:
        return self.call({"op": "status"})[0]

    def metrics(self) -> str:
        return str(self.call({"op": "metrics"})[0]["text"])

    def reload(self) -> dict[str, Any]:
        return self.call({"op": "reload"})[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Regrant(Exception):
    """The service has no grant for the dataset (it restarted, or the grant expired)."""

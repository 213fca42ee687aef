"""The node service's request loop: one thread reads every client's socket, never blocking on
one, and serves the requests that arrived round robin by tenant.

Each round takes one request of each tenant that has one waiting (of its connections in
turn), and the sockets are read again between rounds: a request of a quiet tenant waits for
at most one request of each other tenant, however many a flooding tenant has sent. Requests
are fast (no store I/O: fills go to the fill workers), so one thread serves them all with no
hand-over between threads, and a flood costs the other tenants no wait for the interpreter.

What a client may cost the service is bounded:
- at most ``QUEUED_PER_CONNECTION`` of its requests are read ahead; the rest wait unread in
  its socket (its sends block, costing it and the service nothing);
- a tenant over its ``requests_per_s`` is not served (nor read) until its next turn;
- a reply the client does not read waits in its connection (the socket never blocks the
  loop), and its further requests wait until it reads.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .pace import RequestPace
from .protocol import HEAD, MAX_FDS, ProtocolError, decode_message, message_size, received_fds

if TYPE_CHECKING:
    from .server import Connection

__all__ = ["QUEUED_PER_CONNECTION", "RequestLoop"]

log = logging.getLogger("flashfeed.node")

#: requests of one connection read ahead of their turn
QUEUED_PER_CONNECTION = 64
_READ = 64 << 10


class Inbox:
    """What a connection sent and the loop has not served yet: its bytes not yet a whole
    message, and its whole messages in order."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.messages: deque[dict[str, Any]] = deque()

    def feed(self, data: bytes) -> None:
        """Add ``data``; whole messages move to ``messages`` (``ProtocolError``: not this
        protocol, the connection is then dropped)."""
        self.buffer += data
        while len(self.buffer) >= HEAD.size:
            end = HEAD.size + message_size(self.buffer)
            if len(self.buffer) < end:
                return
            message = decode_message(bytes(self.buffer[HEAD.size : end]))
            del self.buffer[:end]
            self.messages.append(message)


class Outbox:
    """Replies a connection has not taken yet (its socket was full): each its bytes left and
    the descriptors still to go with them (this side's duplicates, closed once sent)."""

    def __init__(self) -> None:
        self.items: deque[tuple[bytes, list[int]]] = deque()

    def send(self, sock: socket.socket, data: bytes, fds: list[int] | None) -> bool:
        """Send ``data`` (with ``fds``) now, or queue what the socket does not take; False
        when something stays queued."""
        if self.items:
            self.items.append((data, [os.dup(fd) for fd in fds or ()]))
            return False
        sent = _send(sock, data, fds or [])
        if sent < len(data):
            self.items.append((data[sent:], [os.dup(fd) for fd in fds or ()] if sent == 0 else []))
            return False
        return True

    def flush(self, sock: socket.socket) -> bool:
        """Send what is queued, as far as the socket takes it; True once all is sent."""
        while self.items:
            data, fds = self.items[0]
            sent = _send(sock, data, fds)
            if sent == 0 and data:
                return False
            for fd in fds:
                os.close(fd)
            if sent < len(data):
                self.items[0] = (data[sent:], [])
                return False
            self.items.popleft()
        return True

    def drop(self) -> None:
        for _, fds in self.items:
            for fd in fds:
                os.close(fd)
        self.items.clear()


def _send(sock: socket.socket, data: bytes, fds: list[int]) -> int:
    """Bytes of ``data`` the (non-blocking) socket took; 0 when full. The fds go with the
    first byte."""
    try:
        if fds:
            return socket.send_fds(sock, [data], fds)
        return sock.send(data)
    except BlockingIOError:
        return 0


class RequestLoop:
    """Serves the requests of every connection ``add``ed, with ``handle(conn, request)`` (one
    thread: ``run`` until ``close``)."""

    def __init__(
        self,
        handle: Callable[[Connection, dict[str, Any]], None],
        *,
        rate: Callable[[str], float],
    ) -> None:
        self.handle = handle
        self.pace = RequestPace(rate)  # a tenant's requests a second (0: unbounded)
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._incoming: deque[Connection] = deque()  # added, or with replies to send
        self._turns: dict[str, deque[Connection]] = {}  # tenant -> its connections waiting
        self._conns: set[Connection] = set()  # served now
        self._closed = False

    # -- from any thread --------------------------------------------------------------------
    def add(self, conn: Connection) -> None:
        """Serve ``conn`` from now on."""
        conn.sock.setblocking(False)
        self._poke(conn)

    def _poke(self, conn: Connection) -> None:
        with self._lock:
            self._incoming.append(conn)
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass  # woken already

    def reply(self, conn: Connection, data: bytes, fds: list[int] | None) -> None:
        """Send a reply to ``conn`` now, or once its socket takes it (``Connection.reply``)."""
        with conn.send_lock:
            if not conn.alive:
                return
            try:
                if conn.outbox.send(conn.sock, data, fds):
                    return
            except OSError:
                conn.alive = False
        self._poke(conn)  # the loop watches for room in its socket (or drops it)

    def close(self) -> None:
        self._closed = True
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    # -- the loop's thread ------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self._closed:
                self._serve_round()
                self._settle()
                self._poll()
        finally:
            for conn in list(self._conns):
                self._drop(conn)
            self.sel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _poll(self) -> None:
        # no wait while a tenant may be served; else until the first one's rate allows it
        timeout = min((self.pace.wait(t) for t in self._turns), default=1.0)
        for key, events in self.sel.select(timeout):
            conn = key.data
            if conn is None:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            if not conn.alive:  # a reply to it failed (another thread): gone
                self._drop(conn)
                continue
            if events & selectors.EVENT_WRITE:
                self._flush(conn)
            if events & selectors.EVENT_READ and conn.alive:
                self._receive(conn)

    def _settle(self) -> None:
        """Register what other threads handed over: new connections, replies queued."""
        with self._lock:
            pending, self._incoming = self._incoming, deque()
        for conn in pending:
            if not conn.alive:
                self._drop(conn)
            elif conn not in self._conns:  # new
                self._conns.add(conn)
                self._watch(conn)
            else:
                self._flush(conn)

    def _watch(self, conn: Connection) -> None:
        """Watch ``conn`` for what it may do now: send more (while fewer than the limit of its
        requests wait and all its replies went), and take the replies it has not."""
        events = 0
        if len(conn.inbox.messages) < QUEUED_PER_CONNECTION and not conn.outbox.items:
            events |= selectors.EVENT_READ
        if conn.outbox.items:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if conn.events == 0:
            self.sel.register(conn.sock, events, conn)
        elif events == 0:
            self.sel.unregister(conn.sock)
        else:
            self.sel.modify(conn.sock, events, conn)
        conn.events = events

    def _receive(self, conn: Connection) -> None:
        try:
            data, ancdata, _, _ = conn.sock.recvmsg(
                _READ, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
            )
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        for fd in received_fds(ancdata):  # clients send none; never keep what one sends
            os.close(fd)
        if not data:
            self._drop(conn)
            return
        had = bool(conn.inbox.messages)
        try:
            conn.inbox.feed(data)
        except ProtocolError as exc:
            log.info("dropped a connection of tenant %s: %s", conn.tenant, exc)
            self._drop(conn)
            return
        if conn.inbox.messages and not had:
            self._turns.setdefault(conn.tenant, deque()).append(conn)
        self._watch(conn)

    def _flush(self, conn: Connection) -> None:
        with conn.send_lock:
            try:
                conn.outbox.flush(conn.sock)
            except OSError:
                conn.alive = False
        if not conn.alive:
            self._drop(conn)
            return
        if not conn.outbox.items and conn.inbox.messages and not self._waiting(conn):
            self._turns.setdefault(conn.tenant, deque()).append(conn)
        self._watch(conn)

    def _waiting(self, conn: Connection) -> bool:
        return conn in self._turns.get(conn.tenant, ())

    def _serve_round(self) -> None:
        """One request of each tenant with one waiting and its rate allowing it."""
        for tenant in list(self._turns):
            if not self.pace.take(tenant):
                continue
            conns = self._turns[tenant]
            conn = conns.popleft()
            request = conn.inbox.messages.popleft()
            if conn.alive:
                self.handle(conn, request)
            if conn.alive and conn.inbox.messages and not conn.outbox.items:
                conns.append(conn)  # its next request, after the tenant's other connections
            if not conns:
                del self._turns[tenant]
            if conn.alive:
                self._watch(conn)
            else:
                self._drop(conn)

    def backlog(self) -> dict[str, dict[str, int]]:
        """Per tenant: its connections and its requests read and waiting for their turn (of
        the loop's thread: a request's handler asks)."""
        out: dict[str, dict[str, int]] = {}
        for conn in self._conns:
            row = out.setdefault(conn.tenant, {"connections": 0, "queued": 0})
            row["connections"] += 1
            row["queued"] += len(conn.inbox.messages)
        return out

    def _drop(self, conn: Connection) -> None:
        self._conns.discard(conn)
        with conn.send_lock:
            conn.alive = False
            conn.outbox.drop()
        if conn.events:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0
        conns = self._turns.get(conn.tenant)
        if conns is not None and conn in conns:
            conns.remove(conn)
            if not conns:
                del self._turns[conn.tenant]
        conn.inbox.messages.clear()
        try:
            conn.sock.close()
        except OSError:
            pass

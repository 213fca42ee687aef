"""A TCP proxy on 127.0.0.1 in front of the real S3 server, for cold-start tests.

It parses the HTTP requests passing through (method, path, Range), counts them, can delay
each request or the chosen ones (a slow store, ``delay_if``), answer chosen ones 503
SlowDown (a throttling store) and cut chosen responses midway (a store failing
mid-transfer), and bound the bytes a second it passes back (``rate``: a store whose
bandwidth is the bottleneck, shared by all connections). Responses pass through untouched;
their bytes are counted on the request they answer (``Request.sent``, ``sent_bytes``: the
last request read on their connection, as clients that do not pipeline send them).
A request that waits for ``100 Continue`` before sending its body (botocore's PUTs) gets it
from the proxy, and goes upstream without ``Expect``.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Request", "SlowProxy", "is_shard_get"]


_EXPECT = re.compile(rb"(?im)^expect:[^\r\n]*\r\n")
_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
    + f"Content-Length: {len(_BODY)}\r\n\r\n".encode()
    + _BODY
)


@dataclass
class Request:
    method: str
    path: str
    range: tuple[int, int] | None  # [start, end) of a ranged GET
    at: float = 0.0  # time.monotonic() when the proxy read it
    conn: int = -1  # which client connection carried it (numbered as the proxy accepts them)
    sent: int = 0  # response bytes passed back for it so far


def is_shard_get(req: Request) -> bool:
    """A GET of a tar shard's bytes, not of a dataset whose prefix ends in ``-warmup`` (the
    one a test reads first to set its S3 client up, undelayed)."""
    return req.method == "GET" and req.path.endswith(".tar") and "-warmup/" not in req.path


@dataclass
class SlowProxy:
    upstream: tuple[str, int]
    delay: float = 0.0
    delay_if: Callable[[Request], bool] = field(default=lambda r: True)
    fail: Callable[[Request], bool] = field(default=lambda r: False)
    throttle: Callable[[Request], bool] = field(default=lambda r: False)
    requests: list[Request] = field(default_factory=list)
    rate: float = 0.0  # bytes a second passed back over all connections; 0: unbounded

    def __post_init__(self) -> None:
        self._next_send = time.monotonic()
        self._rate_lock = threading.Lock()
        self._server = self._listen()
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._closed = False
        self._accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _pace(self, n: int) -> None:
        """Wait for ``n`` bytes' turn at ``rate`` (one queue for every connection)."""
        if self.rate <= 0:
            return
        with self._rate_lock:
            now = time.monotonic()
            start = max(self._next_send, now)
            self._next_send = start + n / self.rate
        if start > now:
            time.sleep(start - now)

    def shard_bytes(self, needle: str = ".tar") -> int:
        """Bytes of the ranged GETs of objects whose path holds ``needle``, as asked."""
        with self._lock:
            return sum(
                r.range[1] - r.range[0]
                for r in self.requests
                if r.method == "GET" and needle in r.path and r.range is not None
            )

    def sent_bytes(self, needle: str = ".tar") -> int:
        """Response bytes passed back so far for GETs of objects whose path holds ``needle``
        (a running count: the bytes of responses still arriving are in it)."""
        with self._lock:
            found = [r for r in self.requests if r.method == "GET" and needle in r.path]
        return sum(r.sent for r in found)

    def _listen(self) -> socket.socket:
        return socket.create_server(("127.0.0.1", 0))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, needle: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if needle in r.path]

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._accepted += 1
            threading.Thread(target=self._serve, args=(client, self._accepted), daemon=True).start()

    def _serve(self, client: socket.socket, number: int) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        cut: list[int] = []  # set: the response stream is cut after this many more bytes
        answering: list[Request] = []  # the requests of this connection, the last one answered
        threading.Thread(
            target=self._pipe, args=(upstream, client, cut, self._pace, answering), daemon=True
        ).start()
        buf = b""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                while True:
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        break
                    head, rest = buf[: end + 4], buf[end + 4 :]
                    req, body = self._parse(head)
                    if len(rest) < body:
                        if _EXPECT.search(head):  # botocore's PUTs wait for 100 Continue
                            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                            buf = _EXPECT.sub(b"", head) + rest
                        break
                    buf = rest[body:]
                    req.at, req.conn = time.monotonic(), number
                    with self._lock:
                        self.requests.append(req)
                    answering[:] = [req]
                    if self.throttle(req):  # answered here, as S3 does: 503 SlowDown
                        client.sendall(_SLOW_DOWN)
                        continue
                    if self.fail(req):
                        cut.append(600)  # headers and a little body, then the connection dies
                    if self.delay and self.delay_if(req):
                        time.sleep(self.delay)
                    upstream.sendall(_EXPECT.sub(b"", head) + rest[:body])
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    @staticmethod
    def _parse(head: bytes) -> tuple[Request, int]:
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        rng = None
        if headers.get("range", "").startswith("bytes="):
            lo, hi = headers["range"][6:].split("-")
            rng = (int(lo), int(hi) + 1)
        return Request(method, path.split("?")[0], rng), int(headers.get("content-length", 0))

    @staticmethod
    def _pipe(
        src: socket.socket,
        dst: socket.socket,
        cut: list[int],
        pace: Callable[[int], None],
        answering: list[Request],
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                pace(len(data))
                if not data:
                    break
                if answering:
                    answering[-1].sent += len(data)
                if cut:
                    dst.sendall(data[: cut[0]])
                    for sock in (src, dst):
                        sock.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

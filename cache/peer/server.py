"""``PeerServer``: a node's shards served to the other nodes of its cluster, over HTTP.

Every request is signed with the cluster token (``auth.py``). What a peer may serve:

- ``GET /v1/have``: the announcement of what this node holds (``announce.py``): per
  dataset key, its complete shards and the fills running now; ``?since=INSTANCE.V``: only
  what changed since version V of this server's holdings (``holdings.py``), or the full
  announcement when V is too old;
- ``GET /v1/shard/<key>/<i>`` with a ``Range``: bytes of a complete shard (one that passed
  its fill's checksum and was renamed into place) or of a fill in progress, streamed as its
  blocks land (``progress.py``): a fill that fails cuts the response short, so the reader
  drops this node and goes on elsewhere; never bytes of an encrypted dataset (kept
  decrypted here, they would not match the manifest);
- ``GET /v1/index/<key>/<i>``: the shard's index, once it is here;
- ``POST /v1/fill/<key>/<i>`` (body ``{"url": ...}``): fill the shard from the store now,
  so that the nodes missing it stream it from this node (single flight across nodes);
- ``GET /v1/stats``: this node's counters (bytes served; a ``PeerNode``'s own fills, those
  asked for by peers among them, by source).

At most ``max_streams`` shard responses at once (503 beyond: the reader asks another
holder); ``rate`` bounds the bytes per second this node serves. Standalone
(``python -m flashfeed.cache.peer serve``) or inside another process (``start()``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flashfeed.crypto import is_encrypted
from flashfeed.dataset import Dataset

from ..layout import DatasetDir, dataset_key
from ..progress import FillView, live_path
from .auth import verify
from .holdings import HoldingsLog
from .pace import Throttle, parse_range
from .scan import scan_holdings

__all__ = ["PeerServer"]

log = logging.getLogger("flashfeed.cache.peer")

#: a dataset key is a directory name of the cache root (``layout.dataset_key``): never "."
#: or "..", never a path
_ROUTE = re.compile(r"^/v1/(shard|index|fill)/([A-Za-z0-9_][A-Za-z0-9_.-]{0,79})/(\d{1,12})$")
_HAVE = re.compile(r"^/v1/have(?:\?since=([0-9a-f]{1,32}\.\d{1,18}))?$")
_CHUNK = 1 << 20
_PACED = 64 << 10  # the pieces of a paced response (``rate``)
#: how long a response waits for a fill's next block, or for a fill asked for to start
_STALL = 30.0
_ANNOUNCE_EVERY = 0.5


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A reader that went away mid-response is routine (it moved to another source)."""
        log.debug("peer connection from %s ended early", client_address, exc_info=True)


class PeerServer:
    """Serve the shards of the cache at ``cache_dir`` to the nodes holding ``token``.

    ``address`` is ``(host, port)`` (port 0: any free one; ``address`` after ``start``
    says which). ``fill(dataset, shard)`` fills a shard from the store for ``/v1/fill``
    (a ``ShardCache.fetch``); without it the route answers 501.
    """

    def __init__(
        self,
        *,
        cache_dir: str,
        token: bytes,
        address: tuple[str, int] = ("127.0.0.1", 0),
        fill: Callable[[Dataset, int], Any] | None = None,
        open_dataset: Callable[[str], Dataset] | None = None,
        max_streams: int = 8,
        rate: float = 0.0,
        stats: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.check(max_streams=max_streams, rate=rate)
        if len(token) < 16:
            raise ValueError("token must be at least 16 bytes")
        self.root = os.path.abspath(cache_dir)
        self.token = token
        self._fill = fill
        self._open_dataset = open_dataset
        self._stats = stats
        self._streams = threading.BoundedSemaphore(max_streams)
        self._throttle = Throttle(rate)
        self._fills = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ff-peer-fill")
        self._pending: dict[tuple[str, int], Future[Any]] = {}
        self._lock = threading.Lock()
        self._announced: tuple[float, bytes] = (-1e9, b"")
        self.holdings = HoldingsLog()
        self._filling: dict[str, list[int]] = {}
        self._dirs: dict[str, DatasetDir] = {}
        self.served_bytes = 0
        self.refused = 0
        self._httpd = _Server(address, self._handler())
        self._thread: threading.Thread | None = None
        self._serving = threading.Event()

    @staticmethod
    def check(*, max_streams: Any, rate: Any) -> None:
        """Raise ``ValueError`` naming ``max_streams`` or ``rate`` where one is bad."""
        if isinstance(max_streams, bool) or not isinstance(max_streams, int) or max_streams < 1:
            raise ValueError(f"max_streams must be an integer >= 1, got {max_streams!r}")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise ValueError(f"rate must be >= 0 bytes/s, got {rate!r}")

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> PeerServer:
        """Serve in a daemon thread of this process; returns self."""
        self._thread = threading.Thread(
            target=self.serve_forever, name="ff-peer-server", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._serving.set()
        try:
            self._httpd.serve_forever()
        finally:
            self._serving.clear()

    def close(self) -> None:
        """Stop serving (if it serves), close the socket, drop the fills not yet started."""
        if self._serving.is_set():
            self._httpd.shutdown()
        self._httpd.server_close()
        self._fills.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what this node holds ----------------------------------------------------------------
    def announcement(self, since: str | None = None) -> bytes:
        """The JSON announcement, or with ``since`` (``instance.version``) the changes
        since that version when the log still has them (rebuilt at most every half second)."""
        with self._lock:
            at, body = self._announced
            fresh = time.monotonic() - at < _ANNOUNCE_EVERY
        if not fresh:
            body = self._rebuild()
        with self._lock:
            return self.holdings.body(since, self._filling, full=body, extra={"node": self.address})

    def _rebuild(self) -> bytes:
        held, filling = scan_holdings(self.root, self._dirs)
        with self._lock:
            self.holdings.update(held)
            self._filling = filling
            body = json.dumps({"node": self.address, **self.holdings.full(filling)}).encode()
            self._announced = (time.monotonic(), body)
        return body

    def counters(self) -> dict[str, Any]:
        """What ``GET /v1/stats`` answers: bytes served, requests refused, and the node's
        own counters (``stats``: a ``PeerNode``'s fills, for peers among them)."""
        return {
            "served_bytes": self.served_bytes,
            "refused": self.refused,
            **(self._stats() if self._stats is not None else {}),
        }

    def _dataset_dir(self, key: str, shard: int | None = None) -> DatasetDir | None:
        """The dataset's folder once its manifest and URL are in place; with ``shard``, a
        fill a peer asked for that has not yet made the folder is waited for."""
        d = DatasetDir(self.root, key)
        deadline = time.monotonic() + _STALL
        while not (os.path.isfile(d.manifest_path) and os.path.isfile(d.meta_path)):
            if shard is None or self._pending_fill(key, shard) is None:
                return None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return d

    # -- fills asked for by peers -------------------------------------------------------------
    def request_fill(self, key: str, shard: int, url: str) -> int:
        """Start filling ``shard`` of the dataset ``key`` (at ``url``); an HTTP status."""
        if self._fill is None:
            return 501
        d = self._dataset_dir(key)
        try:
            if d is not None:
                dataset = Dataset(d.url, d.manifest)
            elif self._open_dataset is not None:
                dataset = self._open_dataset(url)
                if dataset_key(dataset.url, dataset.manifest) != key:
                    return 409  # the store holds another version than the asker's
            else:
                return 404
        except Exception as exc:
            log.warning("peer fill of %s shard %d: cannot open %s: %s", key, shard, url, exc)
            return 502
        if not 0 <= shard < len(dataset.shards) or dataset.encrypted:
            return 404
        with self._lock:
            running = self._pending.get((key, shard))
            if running is None or running.done():
                fut = self._fills.submit(self._fill, dataset, shard)
                fut.add_done_callback(lambda f: self._fill_ended(f, key, shard))
                self._pending[(key, shard)] = fut
        return 202

    @staticmethod
    def _fill_ended(fut: Future[Any], key: str, shard: int) -> None:
        """A fill a peer asked for that failed says why (its readers only see it end)."""
        if not fut.cancelled() and fut.exception() is not None:
            exc = fut.exception()
            log.warning("fill of shard %d of %s asked by a peer failed: %r", shard, key, exc)

    def _pending_fill(self, key: str, shard: int) -> Future[Any] | None:
        with self._lock:
            f = self._pending.get((key, shard))
        return None if f is None or f.done() else f

    # -- HTTP ---------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("peer %s: " + format, self.address_string(), *args)

            def _authorized(self) -> bool:
                if verify(server.token, self.command, self.path, self.headers.get("Authorization")):
                    return True
                server.refused += 1
                self._status(401)
                return False

            def _status(self, code: int, body: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                have = _HAVE.match(self.path)
                if have is not None:
                    self._status(200, server.announcement(have.group(1)))
                    return
                if self.path == "/v1/stats":
                    self._status(200, json.dumps(server.counters()).encode())
                    return
                m = _ROUTE.match(self.path)
                if m is None or m.group(1) == "fill":
                    self._status(404)
                    return
                shard = int(m.group(3))
                d = server._dataset_dir(m.group(2), shard)
                if d is None or shard >= len(d.manifest.shards) or is_encrypted(d.manifest):
                    self._status(404)
                    return
                if m.group(1) == "index":
                    self._index(d, shard)
                elif server._streams.acquire(blocking=False):
                    try:
                        self._shard(d, shard)
                    finally:
                        server._streams.release()
                else:
                    self._status(503)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, 1 << 16))
                if not self._authorized():
                    return
                m = _ROUTE.match(self.path)
                if m is None or m.group(1) != "fill":
                    self._status(404)
                    return
                try:
                    url = str(json.loads(body)["url"])
                except (ValueError, KeyError, TypeError):
                    self._status(400)
                    return
                self._status(server.request_fill(m.group(2), int(m.group(3)), url))

            def _wait_for(self, d: DatasetDir, shard: int) -> tuple[str | None, FillView | None]:
                """The complete copy's path, or the fill in progress (waiting for one that
                was asked for to start)."""
                deadline = time.monotonic() + _STALL
                while True:
                    path = d.shard_path(shard)
                    if os.path.exists(path):
                        return path, None
                    view = FillView.open(live_path(d.parts_dir, shard))
                    if view is not None:
                        return None, view
                    if server._pending_fill(d.key, shard) is None or time.monotonic() > deadline:
                        return None, None
                    time.sleep(0.02)

            def _index(self, d: DatasetDir, shard: int) -> None:
                deadline = time.monotonic() + _STALL
                while True:
                    path, view = self._wait_for(d, shard)
                    source = path + ".idx" if path is not None else None
                    if view is not None:
                        if view.index_part is not None and view.index_ready():
                            source = view.index_part
                        elif not view.ended() and time.monotonic() < deadline:
                            view.close()
                            time.sleep(0.02)
                            continue
                        view.close()
                    try:
                        with open(source or "", "rb") as f:
                            data = f.read()
                    except OSError:
                        if view is not None and time.monotonic() < deadline:
                            continue  # the fill ended as we looked: its shard is in place now
                        self._status(404)
                        return
                    self._status(200, data)
                    return

            def _shard(self, d: DatasetDir, shard: int) -> None:
                size = d.manifest.shards[shard].bytes
                rng = parse_range(self.headers.get("Range"), size)
                if rng is None:
                    self._status(416)
                    return
                lo, hi = rng
                path, view = self._wait_for(d, shard)
                if path is None and view is None:
                    self._status(404)
                    return
                self.send_response(206)
                self.send_header("Content-Length", str(hi - lo))
                self.send_header("X-Flashfeed-State", "complete" if view is None else "filling")
                self.end_headers()
                try:
                    self._send(d, shard, path, view, lo, hi)
                except OSError:
                    self.close_connection = True  # cut short: the reader goes elsewhere
                finally:
                    if view is not None:
                        view.close()

            def _send(
                self,
                d: DatasetDir,
                shard: int,
                path: str | None,
                view: FillView | None,
                lo: int,
                hi: int,
            ) -> None:
                for _ in range(3):
                    try:
                        src = open(path if path is not None else view.part, "rb")  # type: ignore[union-attr]
                        break
                    except FileNotFoundError:
                        if view is None:
                            raise
                        # the fill ended between the look and the open: its shard is in
                        # place now (or it failed, or another fill runs): look again
                        view.close()
                        path, view = self._wait_for(d, shard)
                        if path is None and view is None:
                            raise OSError("the fill ended without its shard") from None
                else:
                    raise OSError("the shard's file kept moving")
                try:
                    at, moved = lo, time.monotonic()
                    step = _CHUNK if server._throttle.rate <= 0 else _PACED
                    while at < hi:
                        end = min(at + step, hi)
                        if view is not None and not view.done(at, end):
                            since = view.marks()
                            if view.ended():  # failed, or renamed into place: look again
                                view.close()
                                src.close()
                                path, view = self._wait_for(d, shard)
                                if path is None:
                                    raise OSError("the fill ended without its shard")
                                src = open(path, "rb")
                                continue
                            view.wait_marked(since, 0.05)
                            if time.monotonic() - moved > _STALL:
                                raise OSError("the fill stalled")
                            continue
                        data = os.pread(src.fileno(), end - at, at)
                        if len(data) != end - at:
                            raise OSError("short read of a cached shard")
                        server._throttle.take(len(data))
                        self.wfile.write(data)
                        at, moved = end, time.monotonic()
                        server.served_bytes += len(data)
                finally:
                    src.close()

        return Handler

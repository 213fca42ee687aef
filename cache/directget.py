"""Ranged GETs read straight into a caller's buffer: the lean path of a fill.

Through s3fs a part costs an event-loop hop and a body assembled from small chunks and
joined. Here the response body is read with ``readinto`` into the buffer the fill hands
over, chunk by chunk. Two ways to send the GET:

- with an ``endpoint_url`` (an S3-compatible store, flashfeed's home ground): one keep-alive
  ``http.client`` connection per thread and a SigV4 signature computed here (``sigv4.py``),
  a few microseconds a request instead of the milliseconds an SDK client spends in its
  event hooks; with many parts in flight that overhead is the larger part of the CPU;
- otherwise (AWS itself, where the bucket's region and addressing are botocore's business)
  a plain botocore client, thread-safe, one connection pool per process and set of options.

Used only when every storage option is one this path understands the same way s3fs does
(endpoint, region, keys or the default credential chain, client config); otherwise
``reader_for`` returns None and the fill goes through s3fs.
"""

from __future__ import annotations

import errno
import http.client
import os
import re
import ssl
import threading
from collections.abc import Iterator
from typing import Any, Protocol
from urllib.parse import urlsplit

from flashfeed.storage import frozen_options

from .sigv4 import s3_get_headers, s3_path

__all__ = ["DirectObject", "SignedObject", "reader_for", "warm_client"]

_CLIENTS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()
_SESSION: list[Any] = []  # one botocore session a process: the service model loads once


def _settings(fs: Any) -> dict[str, Any] | None:
    """The s3fs instance's client settings, or None if it uses options this path lacks."""
    if type(fs).__name__ != "S3FileSystem" or getattr(fs, "anon", False):
        return None
    if fs.requester_pays or fs.version_aware or fs.s3_additional_kwargs or fs.kwargs:
        return None
    if getattr(fs, "_session_is_owned", True) is False:  # a session the caller made
        return None
    client_kwargs = dict(fs.client_kwargs or {})
    if fs.endpoint_url and "endpoint_url" not in client_kwargs:
        client_kwargs["endpoint_url"] = fs.endpoint_url
    if set(client_kwargs) - {"endpoint_url", "region_name", "verify", "use_ssl"}:
        return None
    return {
        "key": fs.key,
        "secret": fs.secret,
        "token": fs.token,
        "client_kwargs": client_kwargs,
        "config_kwargs": dict(fs.config_kwargs or {}),
    }


def _client(settings: dict[str, Any], pool: int) -> Any:
    key = (os.getpid(), pool, frozen_options(settings))
    with _LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import botocore.config
            import botocore.session

            config = botocore.config.Config(
                **{**settings["config_kwargs"], "max_pool_connections": pool}
            )
            if not _SESSION or _SESSION[0][0] != os.getpid():
                _SESSION[:] = [(os.getpid(), botocore.session.get_session())]
            client = _SESSION[0][1].create_client(
                "s3",
                aws_access_key_id=settings["key"],
                aws_secret_access_key=settings["secret"],
                aws_session_token=settings["token"],
                config=config,
                **settings["client_kwargs"],
            )
            _CLIENTS[key] = client
    return client


class _Body(Protocol):
    def readinto(self, view: memoryview) -> int: ...
    def done(self) -> None: ...
    def abort(self) -> None: ...


class _Ranged:
    """What both ways share: a GET's body read into the caller's memory."""

    path: str

    def _open(self, start: int | None, end: int | None) -> tuple[_Body, int]:
        raise NotImplementedError

    def read_into(self, start: int, end: int, view: memoryview) -> None:
        """Fill ``view`` with bytes ``[start, end)`` of the object."""
        for _ in self.chunks(start, end, view):
            pass

    def chunks(self, start: int, end: int, buffer: memoryview) -> Iterator[memoryview]:
        """Bytes ``[start, end)`` in order, read into ``buffer`` (reused: each chunk is
        valid until the next is asked for), each chunk ``len(buffer)`` bytes but the last."""
        body, length = self._open(start, end)
        try:
            if length != end - start:
                raise ConnectionError(
                    f"s3://{self.path}: asked for {end - start} bytes, the server sends {length}"
                )
            left = end - start
            while left:
                chunk = buffer[: min(left, len(buffer))]
                _fill(body, chunk, self.path)
                left -= len(chunk)
                yield chunk
        except BaseException as exc:
            body.abort()
            if isinstance(exc, GeneratorExit | ConnectionError | OSError):
                raise
            raise _as_oserror(exc, self.path) from None
        body.done()

    def read(self) -> bytes:
        """The whole object (a small one: a shard's index)."""
        body, length = self._open(None, None)
        out = bytearray(length)
        try:
            _fill(body, memoryview(out), self.path)
        except BaseException as exc:
            body.abort()
            if isinstance(exc, ConnectionError | OSError):
                raise
            raise _as_oserror(exc, self.path) from None
        body.done()
        return bytes(out)


def _fill(body: _Body, view: memoryview, path: str) -> None:
    got = 0
    while got < len(view):
        n = body.readinto(view[got:])
        if not n:
            raise ConnectionError(f"s3://{path}: the body ended after {got} of {len(view)} bytes")
        got += n


class _HttpBody:
    def __init__(self, response: http.client.HTTPResponse, conn: _Connections, key: Any) -> None:
        self.response, self.conn, self.key = response, conn, key

    def readinto(self, view: memoryview) -> int:
        return self.response.readinto(view)

    def done(self) -> None:
        self.response.read()  # nothing left: the connection is ready for the next GET

    def abort(self) -> None:
        self.response.close()
        self.conn.drop(self.key)


class _Connections(threading.local):
    """One keep-alive connection per thread and server."""

    def __init__(self) -> None:
        self.open: dict[Any, http.client.HTTPConnection] = {}

    def get(self, key: tuple[str, str, int, bool, float]) -> http.client.HTTPConnection:
        conn = self.open.get(key)
        if conn is None:
            scheme, host, port, verify, timeout = key
            if scheme == "https":
                context = ssl.create_default_context()
                if not verify:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            self.open[key] = conn
        return conn

    def drop(self, key: Any) -> None:
        conn = self.open.pop(key, None)
        if conn is not None:
            conn.close()


_CONNECTIONS = _Connections()
_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")


class SignedObject(_Ranged):
    """One object on an S3-compatible endpoint, read with signed GETs of our own."""

    def __init__(self, endpoint: Endpoint, path: str) -> None:
        self.endpoint = endpoint
        self.path = path
        bucket, key = path.split("/", 1)
        self._url_path = s3_path(bucket, key)

    def _open(self, start: int | None, end: int | None) -> tuple[_Body, int]:
        ep = self.endpoint
        extra = {} if start is None or end is None else {"range": f"bytes={start}-{end - 1}"}
        for attempt in (0, 1):
            conn = _CONNECTIONS.get(ep.key)
            reused = conn.sock is not None
            headers = s3_get_headers(
                host=ep.host_header, path=self._url_path, region=ep.region, extra=extra,
                **ep.credentials(),
            )  # fmt: skip
            try:
                conn.request("GET", self._url_path, headers=headers)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                _CONNECTIONS.drop(ep.key)
                if reused and attempt == 0:
                    continue  # the server closed the idle connection: once more, on a new one
                raise
            except BaseException:
                _CONNECTIONS.drop(ep.key)
                raise
            break
        if response.status not in (200, 206):
            body = response.read(4096)
            response.close()
            _CONNECTIONS.drop(ep.key)
            found = _CODE.search(body)
            code = found.group(1).decode(errors="replace") if found else str(response.status)
            raise _http_error(response.status, code, response.reason, self.path)
        length = int(response.getheader("content-length") or -1)
        return _HttpBody(response, _CONNECTIONS, ep.key), length


class Endpoint:
    """Where and as whom the signed GETs go."""

    def __init__(self, url: str, *, region: str, verify: bool, timeout: float,
                 key: str | None, secret: str | None, token: str | None) -> None:  # fmt: skip
        parts = urlsplit(url)
        scheme = parts.scheme or "http"
        default = 443 if scheme == "https" else 80
        host = parts.hostname or ""
        port = parts.port or default
        shown = f"[{host}]" if ":" in host else host
        self.host_header = shown if port == default else f"{shown}:{port}"
        self.key = (scheme, host, port, verify, timeout)
        self.region = region
        self._static = None if key is None else {"access_key": key, "secret_key": secret or "",
                                                 "token": token}  # fmt: skip
        self._chain: Any = None

    def credentials(self) -> dict[str, Any]:
        if self._static is not None:
            return self._static
        frozen = self._chain.get_frozen_credentials()  # refreshed by botocore when due
        return {"access_key": frozen.access_key, "secret_key": frozen.secret_key,
                "token": frozen.token}  # fmt: skip

    @classmethod
    def build(cls, settings: dict[str, Any]) -> Endpoint | None:
        """The endpoint of these client settings, or None where botocore must decide
        (no endpoint URL, one with a path, options of its own, no credentials found)."""
        kwargs = settings["client_kwargs"]
        url = kwargs.get("endpoint_url")
        config = settings["config_kwargs"]
        if not url or set(config) - {"connect_timeout", "read_timeout", "retries"}:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query:
            return None
        timeout = float(max(config.get("connect_timeout", 60), config.get("read_timeout", 60)))
        region = (kwargs.get("region_name") or os.environ.get("AWS_REGION")
                  or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")  # fmt: skip
        verify = kwargs.get("verify", True) is not False
        ep = cls(url, region=region, verify=verify, timeout=timeout, key=settings["key"],
                 secret=settings["secret"], token=settings["token"])  # fmt: skip
        if settings["key"] is None:
            import botocore.session

            ep._chain = botocore.session.get_session().get_credentials()
            if ep._chain is None:
                return None
        return ep


class DirectObject(_Ranged):
    """One object read through a plain botocore client."""

    def __init__(self, client: Any, path: str) -> None:
        self.client = client
        self.path = path
        self.bucket, self.key = path.split("/", 1)

    def _open(self, start: int | None, end: int | None) -> tuple[_Body, int]:
        kwargs = {} if start is None or end is None else {"Range": f"bytes={start}-{end - 1}"}
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key, **kwargs)
        except Exception as exc:
            raise _as_oserror(exc, self.path) from None
        return _BotoBody(response["Body"]), int(response.get("ContentLength", -1))


class _BotoBody:
    def __init__(self, body: Any) -> None:
        self.body = body
        fp = getattr(getattr(body, "_raw_stream", None), "_fp", None)
        self._readinto = getattr(fp, "readinto", None)  # http.client's, under urllib3

    def readinto(self, view: memoryview) -> int:
        if self._readinto is not None:
            return int(self._readinto(view))
        data = self.body.read(len(view))  # another botocore: read, then copy once
        view[: len(data)] = data
        return len(data)

    def done(self) -> None:
        release = getattr(getattr(self.body, "_raw_stream", None), "release_conn", None)
        if release is not None:
            release()  # the whole body was read: the connection goes back to the pool
        else:
            self.body.close()

    def abort(self) -> None:
        self.body.close()


_ENDPOINTS: dict[Any, Endpoint | None] = {}


def _endpoint(settings: dict[str, Any]) -> Endpoint | None:
    key = frozen_options(settings)
    with _LOCK:
        if key not in _ENDPOINTS:
            _ENDPOINTS[key] = Endpoint.build(settings)
        return _ENDPOINTS[key]


def reader_for(fs: Any, path: str, *, connections: int) -> SignedObject | DirectObject | None:
    """The object ``path`` ("bucket/key") of the s3fs instance ``fs`` through signed GETs
    of our own or a plain botocore client, or None when neither can stand in for s3fs
    with its options."""
    settings = _settings(fs)
    if settings is None or "/" not in path:
        return None
    endpoint = _endpoint(settings)
    if endpoint is not None:
        return SignedObject(endpoint, path)
    try:
        client = _client(settings, max(10, connections))
    except Exception:  # an option botocore refuses: s3fs keeps the job
        return None
    return DirectObject(client, path)


def warm_client(fs: Any, *, connections: int) -> threading.Thread | None:
    """Create the botocore client ``reader_for`` will use, in a daemon thread, now: its
    set-up (the S3 service model, about 0.1-0.5 s) then overlaps the loader's own start
    instead of delaying the first fill. The thread, or None when there is nothing to set
    up (signed GETs of our own need no client)."""
    settings = _settings(fs)
    if settings is None or _endpoint(settings) is not None:
        return None
    pool = max(10, connections)
    if (os.getpid(), pool, frozen_options(settings)) in _CLIENTS:
        return None

    def create() -> None:
        try:
            _client(settings, pool)
        except Exception:  # the fill meets the same error and falls back to s3fs
            pass

    thread = threading.Thread(target=create, name="ff-s3-client", daemon=True)
    thread.start()
    return thread


def _as_oserror(exc: BaseException, path: str) -> BaseException:
    """botocore's errors as the ones s3fs raises, so retries and messages stay the same."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        if isinstance(exc, OSError | ConnectionError | TimeoutError) or not isinstance(
            exc, Exception
        ):
            return exc
        return ConnectionError(f"{type(exc).__name__}: {exc}")
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return _http_error(status, code, str(error.get("Message", "")), path)


def _http_error(status: int, code: str, message: str, path: str) -> OSError:
    """An S3 error response as the exception s3fs raises for it."""
    text = f"s3://{path}: {code} {message}".strip()
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "404"):
        return FileNotFoundError(errno.ENOENT, text)
    if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return PermissionError(errno.EACCES, text)
    if status == 503 or code == "SlowDown":
        return OSError(errno.EBUSY, text)
    if status >= 500:
        return OSError(errno.EREMOTEIO, text)
    return OSError(errno.EIO, text)

"""Signed GETs of our own on an S3-compatible endpoint: the lean way a fill reads.

One keep-alive ``http.client`` connection per thread, server and process (a forked child
opens its own), and a SigV4 signature computed here (``sigv4.py``): a few microseconds a
request, where an SDK client spends milliseconds in its event hooks, the larger part of a
fill's CPU with many parts in flight. Used for endpoints given by URL (SeaweedFS, MinIO,
any S3-compatible store); AWS itself, where the bucket's region and addressing are
botocore's business, is not.
"""

from __future__ import annotations

import http.client
import os
import re
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

from flashfeed.s3.rangedbody import Body, RangedObject, http_error
from flashfeed.s3.sigv4 import s3_get_headers, s3_path
from flashfeed.storage import S3Options

__all__ = ["Endpoint", "SignedObject", "connect"]


def connect(key: tuple[str, str, int, bool, float]) -> http.client.HTTPConnection:
    """A new (unopened) connection for an endpoint's ``(scheme, host, port, verify, timeout)``;
    ``verify`` off accepts any certificate."""
    scheme, host, port, verify, timeout = key
    if scheme != "https":
        return http.client.HTTPConnection(host, port, timeout=timeout)
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)


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
    """One keep-alive connection per thread, server and process. A forked child (DALI's
    reader processes are forked, and may fill through a cache of their own) inherits the
    forking thread's connections: it opens its own instead of writing on its parent's."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.open: dict[Any, http.client.HTTPConnection] = {}

    def _mine(self) -> dict[Any, http.client.HTTPConnection]:
        if self.pid != os.getpid():  # inherited through fork: the parent's connections
            for conn in self.open.values():
                conn.close()  # this process's copy of the socket only: no shutdown
            self.open, self.pid = {}, os.getpid()
        return self.open

    def get(self, key: tuple[str, str, int, bool, float]) -> http.client.HTTPConnection:
        open_ = self._mine()
        conn = open_.get(key)
        if conn is None:
            conn = open_[key] = connect(key)
        return conn

    def drop(self, key: Any) -> None:
        conn = self._mine().pop(key, None)
        if conn is not None:
            conn.close()


_CONNECTIONS = _Connections()
_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")


class SignedObject(RangedObject):
    """One object on an S3-compatible endpoint, read with signed GETs of our own."""

    def __init__(self, endpoint: Endpoint, path: str) -> None:
        self.endpoint = endpoint
        self.path = path
        bucket, key = path.split("/", 1)
        self._url_path = s3_path(bucket, key)

    def _open(self, start: int | None, end: int | None) -> tuple[Body, int]:
        extra = {} if start is None or end is None else {"range": f"bytes={start}-{end - 1}"}
        response = self._request("GET", extra)
        length = int(response.getheader("content-length") or -1)
        return _HttpBody(response, _CONNECTIONS, self.endpoint.key), length

    def size(self) -> int:
        return int(self.info()["size"])

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``: fewer where the object ends sooner, as s3fs reads them."""
        body, length = self._open(start, end)
        out = bytearray(length if length >= 0 else end - start)
        view, got = memoryview(out), 0
        try:
            while got < len(out):
                n = body.readinto(view[got:])
                if not n:
                    raise ConnectionError(
                        f"s3://{self.path}: the body ended after {got} of {len(out)} bytes"
                    )
                got += n
        except BaseException:
            body.abort()
            raise
        body.done()
        return bytes(out)

    def info(self) -> dict[str, Any]:
        """One HEAD: the object's ``size`` and ``ETag`` (None when the store gives none)."""
        response = self._request("HEAD", {})
        response.read()  # a HEAD has no body: the connection is ready for the next request
        return {
            "size": int(response.getheader("content-length") or -1),
            "ETag": response.getheader("etag"),
        }

    def _request(self, method: str, extra: dict[str, str]) -> http.client.HTTPResponse:
        ep = self.endpoint
        for attempt in (0, 1):
            conn = _CONNECTIONS.get(ep.key)
            reused = conn.sock is not None
            headers = s3_get_headers(
                host=ep.host_header, path=self._url_path, region=ep.region, extra=extra,
                method=method, **ep.credentials(),
            )  # fmt: skip
            try:
                conn.request(method, self._url_path, headers=headers)
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
            raise http_error(response.status, code, response.reason, self.path)
        return response


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
    def build(cls, options: S3Options) -> Endpoint | None:
        """The endpoint of these options, or None where botocore must decide (no endpoint
        URL, one with a path, client config of its own, no credentials found)."""
        url = options.endpoint_url
        config = options.config_kwargs()
        if not url or set(config) - {"connect_timeout", "read_timeout", "retries"}:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query:
            return None
        timeout = float(max(config.get("connect_timeout", 60), config.get("read_timeout", 60)))
        verify = options.client_kwargs().get("verify", True) is not False
        ep = cls(url, region=options.region, verify=verify, timeout=timeout, key=options.key,
                 secret=options.secret, token=options.token)  # fmt: skip
        if options.key is None:
            import botocore.session

            ep._chain = botocore.session.get_session().get_credentials()
            if ep._chain is None:
                return None
        return ep

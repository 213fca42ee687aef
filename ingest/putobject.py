"""One shard, one PUT: the lean way ingest uploads a finished in-memory shard.

On an S3-compatible endpoint given by URL the PUT is signed here (``cache/sigv4``, payload
declared unsigned as S3 allows) and sent over one keep-alive ``http.client`` connection per
thread: the body goes out in one ``sendall`` that holds no GIL, so a shard uploads while the
next one is built in the same task. s3fs signs the payload on plain HTTP (a SHA-256 pass
over the shard), adds a checksum pass, and runs its event loop in Python: about a third of
an image shard task's time. Everything else (local paths, AWS, options that change a
request) goes through ``storage.write_bytes``. Either way the object appears whole or not
at all: a single PUT is atomic on S3.
"""

from __future__ import annotations

import http.client
import os
import re
import threading
from typing import Any

from flashfeed import storage

__all__ = ["put_object"]

_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
_RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class _Connections(threading.local):
    """One keep-alive connection per thread, endpoint and process (a forked child opens
    its own rather than writing on its parent's socket)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.open: dict[Any, http.client.HTTPConnection] = {}

    def get(self, endpoint: Any) -> tuple[http.client.HTTPConnection, bool]:
        """The connection and whether it was used before."""
        if self.pid != os.getpid():
            self.open, self.pid = {}, os.getpid()
        conn = self.open.get(endpoint.key)
        if conn is not None:
            return conn, True
        from flashfeed.cache.signedget import connect

        conn = self.open[endpoint.key] = connect(endpoint.key)
        return conn, False

    def drop(self, endpoint: Any) -> None:
        conn = self.open.pop(endpoint.key, None)
        if conn is not None:
            conn.close()


_CONNECTIONS = _Connections()


def _put(obj: Any, data: bytes | memoryview) -> None:
    """One signed PUT of ``data`` to ``obj`` (a ``cache.signedget.SignedObject``); a reused
    connection the server closed while idle is replaced once."""
    from flashfeed.cache.rangedbody import http_error
    from flashfeed.cache.sigv4 import s3_get_headers, s3_path

    ep = obj.endpoint
    path = s3_path(*obj.path.split("/", 1))
    for attempt in (0, 1):
        conn, reused = _CONNECTIONS.get(ep)
        headers = s3_get_headers(
            host=ep.host_header, path=path, region=ep.region, method="PUT",
            extra={"content-type": "application/octet-stream"}, **ep.credentials(),
        )  # fmt: skip
        try:
            conn.request("PUT", path, body=data, headers=headers)
            response = conn.getresponse()
            body = response.read()
        except _RETRYABLE:
            _CONNECTIONS.drop(ep)
            if reused and attempt == 0:
                continue
            raise
        except BaseException:
            _CONNECTIONS.drop(ep)
            raise
        break
    if response.status != 200:
        _CONNECTIONS.drop(ep)
        found = _CODE.search(body)
        code = found.group(1).decode(errors="replace") if found else str(response.status)
        raise http_error(response.status, code, response.reason, obj.path)


def put_object(
    url: str, data: bytes | memoryview, *, storage_options: dict[str, Any] | None = None
) -> None:
    """Write ``data`` to ``url`` whole or not at all, retried as ``storage.call`` retries;
    a signed PUT of our own where the endpoint allows, else ``storage.write_bytes``."""
    signed = storage.signed_object(url, storage_options)
    if signed is None:
        storage.write_bytes(url, data, storage_options=storage_options)
        return
    storage.call(lambda: _put(signed, data), url=url, what="write", storage_options=storage_options)

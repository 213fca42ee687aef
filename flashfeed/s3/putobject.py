"""One shard, one PUT: the lean way ingest uploads a finished in-memory shard.

On an S3-compatible endpoint given by URL the PUT is signed here (``cache/sigv4``, payload
declared unsigned as S3 allows) and sent over one keep-alive ``http.client`` connection per
thread: the body goes out in one ``sendall`` that holds no GIL, so a shard uploads while the
next one is built in the same task. s3fs signs the payload on plain HTTP (a SHA-256 pass
over the shard), adds a checksum pass, and runs its event loop in Python: about a third of
an image shard task's time. Everything else (local paths, AWS, options that change a
request) goes through ``storage.write_bytes``. Either way the object appears whole or not
at all: a single PUT is atomic on S3.

The driver's few requests go the same way (``list_keys``: the done-records of an earlier
run; ``delete_objects``: ``_work/`` dropped by name after the commit), so a run with a
local source and an S3 destination needs no s3fs client on the driver.
"""

from __future__ import annotations

import base64
import errno
import functools
import hashlib
import html
import http.client
import os
import re
import threading
from typing import Any
from urllib.parse import quote
from xml.sax.saxutils import escape as xml_escape

from fsspec.core import split_protocol

from flashfeed import storage

__all__ = ["delete_objects", "list_keys", "put_object"]

_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
_KEY = re.compile(rb"<Key>([^<]*)</Key>")
_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")
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
        from flashfeed.s3.signedget import connect

        conn = self.open[endpoint.key] = connect(endpoint.key)
        return conn, False

    def drop(self, endpoint: Any) -> None:
        conn = self.open.pop(endpoint.key, None)
        if conn is not None:
            conn.close()


_CONNECTIONS = _Connections()


def _send(
    endpoint: Any,
    method: str,
    path: str,
    body: bytes | memoryview | None = None,
    *,
    query: str = "",
    extra: dict[str, str] | None = None,
    name: str = "",
) -> bytes:
    """One signed request on the thread's keep-alive connection to ``endpoint`` (a
    ``cache.signedget.Endpoint``); its response body. A reused connection the server closed
    while idle is replaced once; an error response raises as s3fs would for ``name``."""
    from flashfeed.s3.rangedbody import http_error
    from flashfeed.s3.sigv4 import s3_get_headers

    target = f"{path}?{query}" if query else path
    for attempt in (0, 1):
        conn, reused = _CONNECTIONS.get(endpoint)
        headers = s3_get_headers(
            host=endpoint.host_header, path=path, region=endpoint.region, method=method,
            query=query, extra=extra, **endpoint.credentials(),
        )  # fmt: skip
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except _RETRYABLE:
            _CONNECTIONS.drop(endpoint)
            if reused and attempt == 0:
                continue
            raise
        except BaseException:
            _CONNECTIONS.drop(endpoint)
            raise
        break
    if response.status != 200:
        _CONNECTIONS.drop(endpoint)
        found = _CODE.search(data)
        code = found.group(1).decode(errors="replace") if found else str(response.status)
        raise http_error(response.status, code, response.reason, name)
    return data


def _put(obj: Any, data: bytes | memoryview) -> None:
    """One signed PUT of ``data`` to ``obj`` (a ``cache.signedget.SignedObject``)."""
    from flashfeed.s3.sigv4 import s3_path

    path = s3_path(*obj.path.split("/", 1))
    extra = {"content-type": "application/octet-stream"}
    _send(obj.endpoint, "PUT", path, data, extra=extra, name=obj.path)


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


def _query(params: dict[str, str]) -> str:
    """The canonical query string of ``params``: keys sorted, values encoded as S3 signs."""
    return "&".join(f"{k}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))


def list_keys(
    url: str, *, storage_options: dict[str, Any] | None = None, page: int = 1000
) -> list[str] | None:
    """The full URLs of every object under the folder ``url``, sorted: signed
    ListObjectsV2 pages of ``page`` keys (no s3fs on the driver's path); None where the
    endpoint does not allow them (then list with ``storage.list_files``)."""
    if page < 1:
        raise ValueError(f"page must be >= 1, got {page}")
    probe = storage.signed_object(storage.join(url, "_"), storage_options)
    if probe is None:
        return None
    bucket, _, key = probe.path.partition("/")
    prefix = key[:-1]  # the folder, with its slash
    keys: list[str] = []
    params = {"list-type": "2", "max-keys": str(page), "prefix": prefix}
    while True:
        query = _query(params)
        send = functools.partial(
            _send, probe.endpoint, "GET", f"/{bucket}", query=query, name=bucket
        )
        reply: bytes = storage.call(send, url=url, what="list", storage_options=storage_options)
        keys += [html.unescape(k.decode()) for k in _KEY.findall(reply)]
        token = _TOKEN.search(reply)
        if b"<IsTruncated>true</IsTruncated>" not in reply or token is None:
            break
        params["continuation-token"] = html.unescape(token.group(1).decode())
    protocol, _ = split_protocol(url)
    return sorted(f"{protocol}://{bucket}/{k}" for k in keys)


def delete_objects(
    urls: list[str], *, storage_options: dict[str, Any] | None = None, batch: int = 1000
) -> bool:
    """Delete the objects at ``urls`` (one bucket) by name, no listing: one signed
    DeleteObjects request per ``batch`` (S3 takes 1,000 at most); a name with no object is
    no error. False (nothing done) where the endpoint does not allow it; a key the store
    could not delete raises."""
    if not 1 <= batch <= 1000:
        raise ValueError(f"batch must be in 1..1000, got {batch}")
    found = [storage.signed_object(u, storage_options) for u in urls]
    objs = [o for o in found if o is not None]
    if not objs or len(objs) < len(found):
        return False
    buckets = {o.path.partition("/")[0] for o in objs}
    if len(buckets) != 1:
        raise ValueError(f"delete_objects takes one bucket's objects, got {sorted(buckets)}")
    bucket = buckets.pop()
    for at in range(0, len(objs), batch):
        keys = "".join(
            f"<Object><Key>{xml_escape(o.path.partition('/')[2])}</Key></Object>"
            for o in objs[at : at + batch]
        )
        body = f"<Delete><Quiet>true</Quiet>{keys}</Delete>".encode()
        extra = {
            "content-md5": base64.b64encode(hashlib.md5(body).digest()).decode(),
            "content-type": "application/xml",
        }
        send = functools.partial(
            _send, objs[0].endpoint, "POST", f"/{bucket}", body,
            query="delete=", extra=extra, name=bucket,
        )  # fmt: skip
        reply: bytes = storage.call(
            send, url=urls[0], what="delete", storage_options=storage_options
        )
        if b"<Error>" in reply:
            refused = _CODE.search(reply)
            code = refused.group(1).decode(errors="replace") if refused else "?"
            raise OSError(errno.EIO, f"s3://{bucket}: DeleteObjects refused a key: {code}")
    return True

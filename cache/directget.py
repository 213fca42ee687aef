"""Ranged GETs read straight into the mapped part file: the lean path of a fill.

Through s3fs a part costs an event-loop hop, a body assembled from small chunks and joined,
then a ``pwrite`` copy into the page cache. Here a plain botocore client (thread-safe, one
connection pool per process and set of options) sends the GET and the response body is
read with ``readinto`` straight into the part file's memory map: the bytes are copied
once, from the socket into the page cache, and hashed from there.

Used only when every storage option is one this client understands the same way s3fs does
(endpoint, region, keys or the default credential chain, client config); otherwise
``reader_for`` returns None and the fill goes through s3fs.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

from flashfeed.storage import frozen_options

__all__ = ["DirectObject", "reader_for"]

_CLIENTS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


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
            client = botocore.session.get_session().create_client(
                "s3",
                aws_access_key_id=settings["key"],
                aws_secret_access_key=settings["secret"],
                aws_session_token=settings["token"],
                config=config,
                **settings["client_kwargs"],
            )
            _CLIENTS[key] = client
    return client


class DirectObject:
    """One object read through the plain client: ranges into a buffer, or whole."""

    def __init__(self, client: Any, path: str) -> None:
        self.client = client
        self.path = path
        self.bucket, self.key = path.split("/", 1)

    def read_into(self, start: int, end: int, view: memoryview) -> None:
        """Fill ``view`` with bytes ``[start, end)`` of the object."""
        body = self._get(Range=f"bytes={start}-{end - 1}")
        try:
            got = _read_body(body, view)
        except Exception as exc:
            body.close()
            raise _as_oserror(exc, self.path) from None
        if got != end - start:
            body.close()
            raise ConnectionError(f"s3://{self.path}: asked for {end - start} bytes, got {got}")
        _release(body)

    def read(self) -> bytes:
        """The whole object (a small one: a shard's index)."""
        body = self._get()
        try:
            data = body.read()
        except Exception as exc:
            body.close()
            raise _as_oserror(exc, self.path) from None
        _release(body)
        return bytes(data)

    def _get(self, **kwargs: str) -> Any:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key, **kwargs)["Body"]
        except Exception as exc:
            raise _as_oserror(exc, self.path) from None


def reader_for(fs: Any, path: str, *, connections: int) -> DirectObject | None:
    """The object ``path`` ("bucket/key") of the s3fs instance ``fs`` through the plain
    client, or None when this path cannot stand in for s3fs with its options."""
    settings = _settings(fs)
    if settings is None or "/" not in path:
        return None
    try:
        client = _client(settings, max(10, connections))
    except Exception:  # an option botocore refuses: s3fs keeps the job
        return None
    return DirectObject(client, path)


def _read_body(body: Any, view: memoryview) -> int:
    """Read the response body into ``view``; the bytes read."""
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    readinto = getattr(fp, "readinto", None)
    if readinto is None:  # another botocore: read, then copy once
        data = body.read(len(view) + 1)
        view[: len(data)] = data[: len(view)]
        return len(data)
    got = 0
    while got < len(view):
        n = readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _release(body: Any) -> None:
    raw = getattr(body, "_raw_stream", None)
    release = getattr(raw, "release_conn", None)
    if release is not None:
        release()  # the whole body was read: the connection goes back to the pool
    else:
        body.close()


def _as_oserror(exc: Exception, path: str) -> Exception:
    """botocore's errors as the ones s3fs raises, so retries and messages stay the same."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        if isinstance(exc, OSError | ConnectionError | TimeoutError):
            return exc
        return ConnectionError(f"{type(exc).__name__}: {exc}")
    error = response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    text = f"s3://{path}: {code} {error.get('Message', '')}".strip()
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "404"):
        return FileNotFoundError(errno.ENOENT, text)
    if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return PermissionError(errno.EACCES, text)
    if status == 503 or code == "SlowDown":
        return OSError(errno.EBUSY, text)
    if status >= 500:
        return OSError(errno.EREMOTEIO, text)
    return OSError(errno.EIO, text)

"""Ranged GETs read straight into a caller's buffer: the lean path of a fill.

Through s3fs a part costs an event-loop hop and a body assembled from small chunks and
joined. Here the response body is read with ``readinto`` into the buffer the fill hands
over, chunk by chunk (``rangedbody.py``). Two ways to send the GET:

- with an ``endpoint_url`` (an S3-compatible store, flashfeed's home ground): signed GETs
  of our own (``signedget.py``);
- otherwise (AWS itself, where the bucket's region and addressing are botocore's business)
  a plain botocore client, thread-safe, one connection pool per process and set of options.

Both read the storage options ``storage.filesystem`` parsed once (``S3Options``), and are
used only when a plain GET fetches what s3fs would with them (``S3Options.plain_gets``);
otherwise ``reader_for`` returns None and the fill goes through s3fs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from flashfeed.storage import S3Options, s3_options_of

from .rangedbody import Body, RangedObject, as_oserror
from .signedget import Endpoint, SignedObject

__all__ = ["DirectObject", "SignedObject", "reader_for", "warm_client"]

_CLIENTS: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()
_SESSION: list[Any] = []  # one botocore session a process: the service model loads once


def _options(fs: Any) -> S3Options | None:
    """The parsed options of an s3fs instance of ``storage.filesystem``, or None when a
    plain GET would not fetch what s3fs fetches with them."""
    if type(fs).__name__ != "S3FileSystem":
        return None
    options = s3_options_of(fs)
    return options if options is not None and options.plain_gets else None


def _client(options: S3Options, pool: int) -> Any:
    key = (os.getpid(), pool, options)
    with _LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import botocore.config
            import botocore.session

            config = botocore.config.Config(
                **{**options.config_kwargs(), "max_pool_connections": pool}
            )
            if not _SESSION or _SESSION[0][0] != os.getpid():
                _SESSION[:] = [(os.getpid(), botocore.session.get_session())]
            client = _SESSION[0][1].create_client(
                "s3",
                aws_access_key_id=options.key,
                aws_secret_access_key=options.secret,
                aws_session_token=options.token,
                config=config,
                **options.client_kwargs(),
            )
            _CLIENTS[key] = client
    return client


class DirectObject(RangedObject):
    """One object read through a plain botocore client."""

    def __init__(self, client: Any, path: str) -> None:
        self.client = client
        self.path = path
        self.bucket, self.key = path.split("/", 1)

    def _open(self, start: int | None, end: int | None) -> tuple[Body, int]:
        kwargs = {} if start is None or end is None else {"Range": f"bytes={start}-{end - 1}"}
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key, **kwargs)
        except Exception as exc:
            raise as_oserror(exc, self.path) from None
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


_ENDPOINTS: dict[S3Options, Endpoint | None] = {}


def _endpoint(options: S3Options) -> Endpoint | None:
    with _LOCK:
        if options not in _ENDPOINTS:
            _ENDPOINTS[options] = Endpoint.build(options)
        return _ENDPOINTS[options]


def reader_for(fs: Any, path: str, *, connections: int) -> SignedObject | DirectObject | None:
    """The object ``path`` ("bucket/key") of the s3fs instance ``fs`` through signed GETs
    of our own or a plain botocore client, or None when neither can stand in for s3fs
    with its options."""
    options = _options(fs)
    if options is None or "/" not in path:
        return None
    endpoint = _endpoint(options)
    if endpoint is not None:
        return SignedObject(endpoint, path)
    try:
        client = _client(options, max(10, connections))
    except Exception:  # an option botocore refuses: s3fs keeps the job
        return None
    return DirectObject(client, path)


def warm_client(fs: Any, *, connections: int) -> threading.Thread | None:
    """Create the botocore client ``reader_for`` will use, in a daemon thread, now: its
    set-up (the S3 service model, about 0.1-0.5 s) then overlaps the loader's own start
    instead of delaying the first fill. The thread, or None when there is nothing to set
    up (signed GETs of our own need no client)."""
    options = _options(fs)
    if options is None or _endpoint(options) is not None:
        return None
    pool = max(10, connections)
    if (os.getpid(), pool, options) in _CLIENTS:
        return None

    def create() -> None:
        try:
            _client(options, pool)
        except Exception:  # the fill meets the same error and falls back to s3fs
            pass

    thread = threading.Thread(target=create, name="ff-s3-client", daemon=True)
    thread.start()
    return thread

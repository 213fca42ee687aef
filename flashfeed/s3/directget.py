"""The table of object-store readers a fill picks from, and the botocore one.

Every reader offers ranged reads into the caller's buffer (``RangedReader``). The table
(``BACKENDS``, in order; ``register_backend`` adds one) is asked in turn, and the first
backend that can stand in for s3fs with the storage options reads the object:

- ``signed``: with an ``endpoint_url`` (an S3-compatible store, flashfeed's home ground),
  signed GETs of our own (``signedget.py``): the response body read with ``readinto``
  into the fill's buffer, where s3fs costs an event-loop hop and a joined body a part;
- ``botocore``: otherwise (AWS itself, where the bucket's region and addressing are
  botocore's business) a plain botocore client, one connection pool per process and set of
  options;
- ``s3fs``: any fsspec filesystem, with any options (``fs.cat_file``): it always can.

The lean ones read the options ``storage.filesystem`` parsed once (``S3Options``) and
stand in only where a plain GET fetches what s3fs would (``S3Options.plain_gets``).
obstore (Rust object_store) is not in the table: it measured 1.5x our signed client's CPU
per GB (docs/CACHE.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flashfeed import storage
from flashfeed.s3.rangedbody import Body, RangedObject, RangedReader, as_oserror
from flashfeed.s3.signedget import Endpoint, SignedObject
from flashfeed.storage import S3Options, s3_options_of

__all__ = [
    "BACKENDS",
    "Backend",
    "DirectObject",
    "FsObject",
    "RangedReader",
    "SignedObject",
    "open_reader",
    "reader_for",
    "reader_for_url",
    "register_backend",
    "signed_endpoint",
    "warm_client",
]

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

    def size(self) -> int:
        try:
            return int(self.client.head_object(Bucket=self.bucket, Key=self.key)["ContentLength"])
        except Exception as exc:
            raise as_oserror(exc, self.path) from None


class FsObject:
    """One object read through an fsspec filesystem (s3fs): each range a ``cat_file``,
    copied into the caller's buffer. Reads with any storage options."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.path = path

    def size(self) -> int:
        return int(self.fs.size(self.path))

    def read_into(self, start: int, end: int, view: memoryview) -> None:
        data = self.fs.cat_file(self.path, start=start, end=end)
        if len(data) != end - start:
            raise ConnectionError(
                f"s3://{self.path}: asked for {end - start} bytes, got {len(data)}"
            )
        view[: len(data)] = data

    def chunks(self, start: int, end: int, buffer: memoryview) -> Iterator[memoryview]:
        for lo in range(start, end, len(buffer)):
            hi = min(lo + len(buffer), end)
            self.read_into(lo, hi, buffer[: hi - lo])
            yield buffer[: hi - lo]

    def read(self) -> bytes:
        return bytes(self.fs.cat_file(self.path))


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


def signed_endpoint(options: S3Options) -> Endpoint | None:
    """The endpoint signed GETs of our own reach with these options (built once a
    process), or None where they cannot stand in for s3fs (``Endpoint.build``)."""
    if not options.plain_gets:
        return None
    return _endpoint(options)


def _endpoint(options: S3Options) -> Endpoint | None:
    with _LOCK:
        if options not in _ENDPOINTS:
            _ENDPOINTS[options] = Endpoint.build(options)
        return _ENDPOINTS[options]


#: ``open(fs, options, path, connections)``: a reader of ``path`` ("bucket/key"), or None
#: where this backend cannot stand in for s3fs (``options``: parsed, None when not S3's)
Opener = Callable[[Any, "S3Options | None", str, int], "RangedReader | None"]


@dataclass(frozen=True)
class Backend:
    """One way to read objects. ``lean``: it reads into the caller's buffer without a
    bytes object a part (the fill writes its chunks as they arrive); otherwise the fill
    takes the ``cat_file`` bytes of the filesystem and writes them whole."""

    name: str
    open: Opener
    lean: bool = True


def _signed(fs: Any, options: S3Options | None, path: str, connections: int) -> Any:
    endpoint = _endpoint(options) if options is not None and "/" in path else None
    return None if endpoint is None else SignedObject(endpoint, path)


def _botocore(fs: Any, options: S3Options | None, path: str, connections: int) -> Any:
    if options is None or "/" not in path:
        return None
    try:
        client = _client(options, max(10, connections))
    except Exception:  # an option botocore refuses: s3fs keeps the job
        return None
    return DirectObject(client, path)


def _fsspec(fs: Any, options: S3Options | None, path: str, connections: int) -> Any:
    return FsObject(fs, path)


#: the backends in the order they are asked; the last one (s3fs) always answers
BACKENDS: list[Backend] = [
    Backend("signed", _signed),
    Backend("botocore", _botocore),
    Backend("s3fs", _fsspec, lean=False),
]


def register_backend(backend: Backend, *, before: str = "s3fs") -> None:
    """Add ``backend`` to the table, asked just before the backend named ``before``."""
    names = [b.name for b in BACKENDS]
    if backend.name in names:
        raise ValueError(f"a reader backend named {backend.name!r} is already registered")
    if before not in names:
        raise ValueError(f"before={before!r}: no such backend (have {names})")
    BACKENDS.insert(names.index(before), backend)


def open_reader(fs: Any, path: str, *, connections: int) -> tuple[Backend, RangedReader]:
    """The first backend of the table that reads ``path`` of ``fs``, and its reader."""
    options = _options(fs)
    for backend in BACKENDS:
        reader = backend.open(fs, options, path, connections)
        if reader is not None:
            return backend, reader
    raise ValueError(f"no reader backend reads {path!r} of a {type(fs).__name__}")


def reader_for(fs: Any, path: str, *, connections: int) -> RangedReader | None:
    """The lean reader of ``path`` ("bucket/key") of the s3fs instance ``fs`` (signed GETs
    of our own or a plain botocore client), or None when only s3fs reads it with its
    options."""
    backend, reader = open_reader(fs, path, connections=connections)
    return reader if backend.lean else None


def reader_for_url(
    url: str, storage_options: dict[str, Any] | None, *, connections: int
) -> RangedReader | None:
    """``reader_for`` of an ``s3://`` URL; where signed GETs of our own read it (the first
    backend of the table), no s3fs filesystem is made (importing s3fs and its AWS client
    libraries costs about a second of a cold start)."""
    if BACKENDS and BACKENDS[0].name == "signed":
        found = storage.signed_object(url, storage_options)
        if found is not None:
            return found
    fs, path = storage.filesystem(url, storage_options)
    return reader_for(fs, path, connections=connections)


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

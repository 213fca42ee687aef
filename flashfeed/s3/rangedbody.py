"""A GET's body read into the caller's memory, and S3 errors as the ones s3fs raises.

Shared by the ways a fill sends its GETs (``signedget.py``, ``directget.py``): each opens
a response (``_open``); reading it in reused chunks, whole, or into a view is here.
``RangedReader`` is what every reader of the backend table (``directget.py``) offers.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Protocol

__all__ = ["Body", "RangedObject", "RangedReader", "as_oserror", "http_error"]


class Body(Protocol):
    def readinto(self, view: memoryview) -> int: ...
    def done(self) -> None: ...
    def abort(self) -> None: ...


class RangedReader(Protocol):
    """Ranged reads of one object (``path``: "bucket/key"), whatever sends the requests.

    Errors are the ones s3fs raises (``FileNotFoundError``, ``PermissionError``,
    ``OSError`` with an errno), so that retries and messages do not depend on the backend.
    """

    path: str

    def size(self) -> int:
        """The object's size in bytes."""
        ...

    def read_into(self, start: int, end: int, view: memoryview) -> None:
        """Fill ``view`` (``end - start`` bytes) with bytes ``[start, end)``."""
        ...

    def chunks(self, start: int, end: int, buffer: memoryview) -> Iterator[memoryview]:
        """Bytes ``[start, end)`` in order, read into the reused ``buffer``."""
        ...

    def read(self) -> bytes:
        """The whole object (a small one: a shard's index)."""
        ...


class RangedObject:
    """What the lean backends share: a GET's body read into the caller's memory."""

    path: str

    def _open(self, start: int | None, end: int | None) -> tuple[Body, int]:
        raise NotImplementedError

    def size(self) -> int:
        """The object's size in bytes."""
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
            raise as_oserror(exc, self.path) from None
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
            raise as_oserror(exc, self.path) from None
        body.done()
        return bytes(out)


def _fill(body: Body, view: memoryview, path: str) -> None:
    got = 0
    while got < len(view):
        n = body.readinto(view[got:])
        if not n:
            raise ConnectionError(f"s3://{path}: the body ended after {got} of {len(view)} bytes")
        got += n


def as_oserror(exc: BaseException, path: str) -> BaseException:
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
    return http_error(status, code, str(error.get("Message", "")), path)


def http_error(status: int, code: str, message: str, path: str) -> OSError:
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

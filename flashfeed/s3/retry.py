"""Which storage failures are worth retrying, and for how long.

``RetryPolicy`` bounds attempts and total time; ``is_transient`` tells throttling, resets and a
restarting server (retry) from missing objects and refused credentials (do not), for every
storage path alike; ``is_throttle`` picks out the answers that ask for fewer requests.
``is_refused`` tells a closed port: worth the patient budget only from an endpoint that has
answered before (a server restarting under a running job), not on first contact (a typo in
the endpoint, a store that is not up), where ``FIRST_CONTACT`` fails within seconds.
"""

from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass, replace

__all__ = [
    "DEFAULT_RETRY",
    "FIRST_CONTACT",
    "RetryPolicy",
    "env_retry",
    "is_auth_error",
    "is_refused",
    "is_throttle",
    "is_transient",
]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts and in total time.

    The attempts allow ~20 s of waiting on average, so a server that restarts (a few seconds
    down) is ridden out; ``deadline`` is the bound that callers tune.
    """

    attempts: int = 12
    base_delay: float = 0.2
    max_delay: float = 5.0
    deadline: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < 0 or self.deadline <= 0:
            raise ValueError("base_delay and max_delay must be >= 0 and deadline > 0")

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))


DEFAULT_RETRY = RetryPolicy()
#: a refused connection to an endpoint that never answered: a few quick tries, then the error
FIRST_CONTACT = RetryPolicy(attempts=3, base_delay=0.1, max_delay=0.3, deadline=1.0)


def env_retry(base: RetryPolicy = DEFAULT_RETRY) -> RetryPolicy:
    """``base`` with the total budget of ``FLASHFEED_RETRY_DEADLINE`` (seconds) when set:
    tests and impatient users shorten it. The one place that reads the variable."""
    value = os.environ.get("FLASHFEED_RETRY_DEADLINE")
    if not value:
        return base
    try:
        deadline = float(value)
    except ValueError:
        deadline = float("nan")
    if not deadline > 0:
        raise ValueError(f"FLASHFEED_RETRY_DEADLINE must be seconds > 0, got {value!r}")
    return replace(base, deadline=deadline)


def _transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        import aiohttp

        types.append(aiohttp.ClientError)
    except ImportError:  # pragma: no cover - s3fs depends on aiohttp
        pass
    try:
        from botocore import exceptions as bexc

        types += [
            bexc.EndpointConnectionError,
            bexc.ConnectionClosedError,
            bexc.ReadTimeoutError,
            bexc.ConnectTimeoutError,
        ]
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


# One classification for every storage path (s3fs, botocore, the fill's own signed GETs),
# matched case-insensitively in "<type>: <message>". A throttling answer is also transient.
_THROTTLE_MARKERS = (
    "slowdown",
    "slow down",
    "503",
    "throttl",
    "toomanyrequests",
    "requestlimitexceeded",
    "reduce your request rate",
)
_TRANSIENT_MARKERS = (
    "serviceunavailable",
    "internalerror",
    "internal error",
    "internal server error",
    "requesttimeout",
    "connection reset",
    "connection refused",
    "cannot connect",
    "server disconnected",
    "try again",
)
_AUTH_MARKERS = ("signaturedoesnotmatch", "invalidaccesskeyid", "accessdenied", "forbidden")
# s3fs maps a 500 during a server restart to EREMOTEIO and a 503 SlowDown to EBUSY
_EREMOTEIO = getattr(errno, "EREMOTEIO", errno.EIO)
_TRANSIENT_ERRNOS = frozenset({_EREMOTEIO, errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT})


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".lower()


def is_throttle(exc: BaseException) -> bool:
    """True when the store asked us to slow down (S3 503 SlowDown and its relatives).

    s3fs turns a 503 answer into ``OSError(EBUSY, <server message>)``.
    """
    if isinstance(exc, OSError) and exc.errno == errno.EBUSY:
        return True
    text = _text(exc)
    return any(m in text for m in _THROTTLE_MARKERS)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: throttling, resets, a server that is (re)starting
    (5xx). Missing objects and refused credentials are never retried."""
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
        return False
    if isinstance(exc, _transient_types()):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    text = _text(exc)
    return any(m in text for m in _TRANSIENT_MARKERS) or is_throttle(exc)


def is_auth_error(exc: BaseException) -> bool:
    """True when the store refused the credentials (or the access they grant)."""
    text = _text(exc)
    return isinstance(exc, PermissionError) or any(m in text for m in _AUTH_MARKERS)


def is_refused(exc: BaseException) -> bool:
    """True when nothing listens at the endpoint (ECONNREFUSED), looking through the
    wrappers botocore and aiohttp put around it."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError) or (
            isinstance(e, OSError) and e.errno == errno.ECONNREFUSED
        ):
            return True
        kwargs = getattr(e, "kwargs", None)
        inner = kwargs.get("error") if isinstance(kwargs, dict) else None
        todo += [e.__cause__, e.__context__, getattr(e, "os_error", None)]
        if isinstance(inner, BaseException):
            todo.append(inner)
    return False

"""One retry classification for every storage path: what the cache's ranged fetches retry,
``storage.call`` retries too, and ``FLASHFEED_RETRY_DEADLINE`` is read in one place."""

from __future__ import annotations

import errno

import pytest

from flashfeed import storage
from flashfeed.cache.fetch.ranged import is_retryable
from flashfeed.cache.options import CacheOptions, default_retry
from flashfeed.s3.retry import (
    DEFAULT_RETRY,
    RetryPolicy,
    env_retry,
    is_auth_error,
    is_throttle,
    is_transient,
)

FAILURES = [
    # (exception, retried, throttle)
    (OSError(errno.EBUSY, "Please reduce your request rate."), True, True),
    (OSError("TooManyRequests: slow down"), True, True),
    (OSError("RequestLimitExceeded"), True, True),
    (OSError(121, "We encountered an internal error, please try again."), True, False),
    (OSError(errno.EREMOTEIO, "Internal Server Error"), True, False),
    (ConnectionResetError("reset"), True, False),
    (TimeoutError("read timed out"), True, False),
    (OSError("ServiceUnavailable"), True, False),
    (FileNotFoundError("gone"), False, False),
    (PermissionError("AccessDenied"), False, False),
    (OSError(errno.EIO, "s3://b/k: InvalidRange"), False, False),
    (ValueError("bad header"), False, False),
]


@pytest.mark.parametrize(("exc", "retried", "throttle"), FAILURES, ids=lambda v: repr(v)[:40])
def test_the_cache_and_the_storage_layer_classify_alike(exc, retried, throttle):
    assert is_transient(exc) is retried
    assert is_retryable(exc) is retried
    assert is_throttle(exc) is throttle


@pytest.mark.parametrize("message", ["SlowDown", "TooManyRequests", "Throttling: rate exceeded"])
def test_storage_calls_retry_a_throttling_answer(message):
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError(message)
        return "ok"

    quick = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.002, deadline=5)
    assert storage.call(flaky, url="s3://b/k", what="read", retry=quick) == "ok"
    assert len(calls) == 3


def test_refused_credentials_are_named_whatever_the_case():
    assert is_auth_error(OSError("An error occurred (SignatureDoesNotMatch)"))
    assert is_auth_error(OSError("403 forbidden"))
    assert not is_auth_error(OSError("SlowDown"))


def test_the_retry_deadline_variable_is_read_by_one_function(monkeypatch):
    monkeypatch.delenv("FLASHFEED_RETRY_DEADLINE", raising=False)
    assert env_retry() == DEFAULT_RETRY
    assert default_retry() == RetryPolicy(attempts=10)
    monkeypatch.setenv("FLASHFEED_RETRY_DEADLINE", "2.5")
    assert env_retry() == RetryPolicy(attempts=DEFAULT_RETRY.attempts, deadline=2.5)
    assert default_retry() == RetryPolicy(attempts=10, deadline=2.5)
    assert CacheOptions(capacity=1).retry_policy == RetryPolicy(attempts=10, deadline=2.5)
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("FLASHFEED_RETRY_DEADLINE", bad)
        with pytest.raises(ValueError, match=f"FLASHFEED_RETRY_DEADLINE .* got '{bad}'"):
            env_retry()

"""Fixtures of the loader tests."""

from __future__ import annotations

import pytest

from benchmarks.harness.slowproxy import SlowProxy


@pytest.fixture
def proxy(s3_store):
    """The real S3 server behind a proxy that can delay requests (``SlowProxy``)."""
    p = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    yield p
    p.close()

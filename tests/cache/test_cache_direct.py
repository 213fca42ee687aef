"""The lean fill path: ranged GETs read straight into a buffer, against the real S3 server.

Its errors must read like the ones s3fs raises (the retry rules depend on them), and it
must step aside for storage options it does not understand.
"""

from __future__ import annotations

import errno

import numpy as np
import pytest

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed import storage
from flashfeed.cache.fetch.ranged import is_retryable, is_throttle
from flashfeed.s3.directget import SignedObject, reader_for


@pytest.fixture
def proxy(s3_store):
    p = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    yield p
    p.close()


def _object(s3_prefix: str, size: int, opts=None) -> tuple[str, bytes]:
    data = np.random.default_rng(7).bytes(size)
    url = f"{s3_prefix}/blob.bin"
    storage.write_bytes(url, data, storage_options=opts)
    return url, data


def test_ranges_are_read_into_the_buffer_given(s3_prefix):
    url, data = _object(s3_prefix, 300_001)
    fs, path = storage.filesystem(url)
    obj = reader_for(fs, path, connections=4)
    assert obj is not None
    out = bytearray(len(data))
    view = memoryview(out)
    for lo, hi in [(0, 1), (1, 65_536), (65_536, 300_001)]:
        obj.read_into(lo, hi, view[lo:hi])
    assert bytes(out) == data
    again = bytearray(10)  # the connection went back to its pool and serves the next GET
    obj.read_into(100, 110, memoryview(again))
    assert bytes(again) == data[100:110]
    assert obj.read() == data


def test_signed_gets_on_keys_that_need_encoding_in_reused_chunks(s3_prefix):
    data = np.random.default_rng(3).bytes(2_500_000)
    for name in ("a b+c=d.tar", "ü/~x(1)&y.idx"):
        url = f"{s3_prefix}/{name}"
        storage.write_bytes(url, data)
        fs, path = storage.filesystem(url)
        obj = reader_for(fs, path, connections=2)
        assert isinstance(obj, SignedObject)  # an endpoint URL: the signed path
        buffer = memoryview(bytearray(1 << 20))
        got = [bytes(c) for c in obj.chunks(1000, 2_400_000, buffer)]
        assert [len(c) for c in got] == [1 << 20, 1 << 20, 2_399_000 - (2 << 20)]
        assert b"".join(got) == data[1000:2_400_000]
        assert obj.read() == data


def test_errors_read_like_the_ones_s3fs_raises(s3_prefix, s3_store, proxy):
    url, _ = _object(s3_prefix, 1000)
    fs, path = storage.filesystem(url + ".missing")
    missing = reader_for(fs, path, connections=2)
    assert missing is not None
    with pytest.raises(FileNotFoundError):
        missing.read_into(0, 10, memoryview(bytearray(10)))
    with pytest.raises(FileNotFoundError):
        missing.read()

    wrong = {"endpoint_url": s3_store.info.endpoint, "key": "nobody", "secret": "wrong"}
    fs, path = storage.filesystem(url, wrong)
    refused = reader_for(fs, path, connections=2)
    assert refused is not None
    with pytest.raises(PermissionError) as caught:
        refused.read_into(0, 10, memoryview(bytearray(10)))
    assert not is_retryable(caught.value)

    proxy.throttle = lambda req: req.method == "GET"
    via = {**s3_store.info.storage_options(), "endpoint_url": proxy.endpoint}
    fs, path = storage.filesystem(url, via)
    throttled = reader_for(fs, path, connections=2)
    assert throttled is not None
    with pytest.raises(OSError) as caught:
        throttled.read_into(0, 10, memoryview(bytearray(10)))
    assert caught.value.errno == errno.EBUSY and is_throttle(caught.value)

    proxy.throttle = lambda req: False
    proxy.fail = lambda req: req.method == "GET"  # the response is cut mid-body
    with pytest.raises(Exception) as caught:
        throttled.read_into(0, 1000, memoryview(bytearray(1000)))
    assert is_retryable(caught.value)


def test_options_it_does_not_understand_leave_the_job_to_s3fs(s3_prefix):
    url, _ = _object(s3_prefix, 100)
    fs, path = storage.filesystem(url, {"requester_pays": True})
    assert reader_for(fs, path, connections=2) is None
    fs, path = storage.filesystem(url, {"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256"}})
    assert reader_for(fs, path, connections=2) is None

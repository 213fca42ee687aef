"""A token dataset read cold through ``slowproxy.SlowProxy``: the node cache that lands its
shards in small delayed parts, and the journeys both kinds of shard (with a recorded record
batch layout, and walked as they land) must walk the same way."""

from __future__ import annotations

import numpy as np
import pytest

from flashfeed.cache import ShardCache
from flashfeed.dataset import Dataset
from flashfeed.errors import FlashfeedError
from flashfeed.loader import TokenLoader
from flashfeed.s3.retry import RetryPolicy

__all__ = [
    "assert_cold_resume_is_exact",
    "assert_same_batches",
    "cold_cache",
    "rows_of",
    "serve_until_it_fails",
]


def cold_cache(prefix, proxy, tmp_path, *, name="cache", delay=0.05, retry=None, part="16KiB"):
    """The dataset behind the proxy (``delay`` seconds a request) and an empty cache that
    fetches one ``part`` at a time, so a shard takes many delayed GETs to land."""
    proxy.delay = delay
    ds = Dataset.open(prefix, storage_options={"endpoint_url": proxy.endpoint})
    retry = retry or RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, deadline=10)
    cache = ShardCache(
        str(tmp_path / name), capacity=1 << 30, retry=retry, part_size=part, concurrency=1
    )
    return ds, cache


def rows_of(batches) -> tuple[list[str], np.ndarray]:
    """Every delivered key, in order, and the token rows stacked."""
    keys = [k for b in batches for k in b["__key__"]]
    return keys, np.concatenate([b["tokens"].numpy() for b in batches])


def assert_cold_resume_is_exact(s3_prefix, proxy, tmp_path, local: str, *, head: int, part):
    """Take ``head`` batches cold, save the state, resume on a second empty cache (the rest
    streams from the store again): the delivered keys and rows equal one local epoch."""
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path, delay=0.02, part=part)
    loader = TokenLoader(ds, batch_size=8, cache=cache, seed=2, window=2)
    it = iter(loader)
    first = [next(it) for _ in range(head)]
    state = loader.state_dict()
    it.close()
    loader.close()
    cache.close()
    ds2, cache2 = cold_cache(s3_prefix, proxy, tmp_path, name="cache2", delay=0.02, part=part)
    again = TokenLoader(ds2, batch_size=8, cache=cache2, seed=2, window=2)
    again.load_state_dict(state)
    keys, rows = rows_of(first + list(again))
    local_keys, local_rows = rows_of(list(TokenLoader(local, batch_size=8, seed=2, window=2)))
    assert keys == local_keys and np.array_equal(rows, local_rows)
    again.close()
    cache2.close()


def assert_same_batches(cold, hot) -> None:
    """Two epochs delivered the same batches: the same outputs, each equal."""
    assert len(cold) == len(hot) > 0
    for a, b in zip(cold, hot, strict=True):
        assert a.keys() == b.keys()
        for name, value in a.items():
            other = b[name]
            if hasattr(value, "numpy"):
                assert np.array_equal(value.numpy(), other.numpy()), name
            else:
                assert value == other, name


def serve_until_it_fails(loader) -> tuple[str, int]:
    """Iterate until the loader raises its ``FlashfeedError``: its message (one line) and
    how many batches were served before it."""
    got = 0
    with pytest.raises(FlashfeedError) as err:
        for _ in loader:
            got += 1
    message = str(err.value)
    assert "\n" not in message, message
    return message, got

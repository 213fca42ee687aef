"""A token dataset read cold through ``slowproxy.SlowProxy``: the node cache that lands its
shards in small delayed parts, and the journeys both kinds of shard (with a recorded record
batch layout, and walked as they land) must walk the same way."""

from __future__ import annotations

import numpy as np

from flashfeed.cache import ShardCache
from flashfeed.dataset import Dataset
from flashfeed.loader import TokenLoader
from flashfeed.retry import RetryPolicy

__all__ = ["assert_cold_resume_is_exact", "cold_cache", "rows_of"]


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

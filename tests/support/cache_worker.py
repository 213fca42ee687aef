"""A separate process using a cache dir, for the multi-process cache tests.

``python cache_worker.py ACTION ROOT DATASET SHARD [OPTIONS-JSON]``; prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time

from flashfeed import Dataset
from flashfeed.cache import ShardCache


def main() -> None:
    action, root, url, shard = sys.argv[1:5]
    opts = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    barrier = opts.pop("barrier", None)
    slow = opts.pop("slow_write", 0.0)
    if slow:
        from flashfeed.cache.fetch import fill

        real = fill.OrderedHasher.add  # every fill path hashes each part in transit

        def slow_add(self: fill.OrderedHasher, offset: int, data: bytes | memoryview) -> None:
            time.sleep(slow)
            real(self, offset, data)

        fill.OrderedHasher.add = slow_add  # type: ignore[method-assign]
    ds = Dataset.open(url)
    cache = ShardCache(root, **opts)
    if barrier:
        while not os.path.exists(barrier):
            time.sleep(0.005)
    if action == "get":
        path = cache.get(ds, int(shard))
        cache.close()
        print(json.dumps({"path": path, "stats": cache.counters.snapshot()}), flush=True)
    elif action == "hold":  # keep the shard in use until stdin closes
        with cache.open(ds, int(shard)) as path:
            print(json.dumps({"path": path}), flush=True)
            sys.stdin.read()
        cache.close()


if __name__ == "__main__":
    main()

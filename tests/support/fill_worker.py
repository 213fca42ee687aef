"""A process that fills a cache with every shard of a dataset, slowly, to be SIGKILLed.

``python fill_worker.py ROOT DATASET`` (the AWS_* variables point at the store). Prints
``ready`` once the cache is open, then ``filled <i>`` after each shard, so a test can aim
its kill at any point of the warm whatever the machine's speed; each part sleeps a little as
it is hashed in transit (every fill path does that), so a kill lands mid-fill, mid-rename or
between shards.
"""

from __future__ import annotations

import sys
import time

from flashfeed import Dataset
from flashfeed.cache import ShardCache
from flashfeed.cache.fetch import fill


def main() -> None:
    root, url = sys.argv[1:3]
    real = fill.OrderedHasher.add

    def slow_add(self: fill.OrderedHasher, offset: int, data: bytes | memoryview) -> None:
        time.sleep(0.004)
        real(self, offset, data)

    fill.OrderedHasher.add = slow_add  # type: ignore[method-assign]
    ds = Dataset.open(url)
    with ShardCache(root, capacity="8MiB", part_size="16KiB", concurrency=2) as cache:
        print("ready", flush=True)
        for i in range(len(ds.shards)):
            cache.get(ds, i)
            print(f"filled {i}", flush=True)


if __name__ == "__main__":
    main()

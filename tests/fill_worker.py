"""A process that fills a cache with every shard of a dataset, slowly, to be SIGKILLed.

``python fill_worker.py ROOT DATASET`` (the AWS_* variables point at the store); each part
write sleeps a little so a kill lands mid-fill, mid-rename or between shards.
"""

from __future__ import annotations

import sys
import time

from flashfeed import Dataset
from flashfeed.cache import ShardCache, fill


def main() -> None:
    root, url = sys.argv[1:3]
    real = fill._pwrite_all

    def slow_write(fd: int, data: bytes, offset: int) -> None:
        time.sleep(0.004)
        real(fd, data, offset)

    fill._pwrite_all = slow_write
    ds = Dataset.open(url)
    print("ready", flush=True)
    with ShardCache(root, capacity="8MiB", part_size="16KiB", concurrency=2) as cache:
        for i in range(len(ds.shards)):
            cache.get(ds, i)


if __name__ == "__main__":
    main()

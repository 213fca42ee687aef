"""A tenant's training loop for the node quota stage, run as that tenant's Unix user:
``EPOCHS`` epochs of ``ShardDataset`` over ``URL`` through the node service
(``$FLASHFEED_NODE_SOCKET``, job ``$FLASHFEED_JOB``), started when the file ``GO`` appears,
fetching ``READAHEAD`` shards ahead (``auto``: sized from what it measures).

Prints one JSON line when ready, one per epoch (its wall-clock start and end, samples
delivered and distinct keys among them), and the source's counters last.

    python quotatenant.py URL EPOCHS SEED GO READAHEAD
"""

from __future__ import annotations

import json
import os
import sys
import time


def _say(**body: object) -> None:
    print(json.dumps(body), flush=True)


def main(argv: list[str]) -> int:
    url, epochs, seed, go, ahead = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    from flashfeed.loader import ShardDataset

    readahead = ahead if ahead == "auto" else int(ahead)
    ds = ShardDataset(url, shuffle=True, seed=seed, readahead=readahead)
    _say(
        ready=True,
        pid=os.getpid(),
        source=type(ds.source).__name__,
        readahead_budget=ds.readahead_budget,
    )
    while not os.path.exists(go):
        time.sleep(0.01)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        start = time.time()
        keys: set[str] = set()
        samples = 0
        for sample in ds:
            keys.add(sample["__key__"])
            samples += 1
        _say(epoch=epoch, start=start, end=time.time(), samples=samples, unique=len(keys))
    _say(stats=ds.source.stats())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

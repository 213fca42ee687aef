"""A simulated node of the cluster tier: a ``PeerNode`` driven by JSON lines on stdin.

``python peernode.py CACHE_DIR LISTEN_HOST S3_ENDPOINT [--rate BYTES_PER_S] [--part-size S]
[--capacity BYTES] [--loader 1]``
with ``FLASHFEED_PEER_TOKEN`` set (the AWS_* variables give the credentials; the endpoint is
the node's own counting proxy). Prints ``{"address": ...}`` once it serves, then answers
each command line with one JSON line (``--loader 1``: imports the training reader before it
serves, so an ``epoch`` starts without that cost):

- ``{"peers": [...]}``: the cluster's nodes;
- ``{"fetch": URL, "shards": [...]}``: fetch those shards into the cache (a warm);
- ``{"assign": URL, "owners": {shard: address}}``: the placement's store readers;
- ``{"epoch": URL, "rank": r, "world": w, "seed": s, "batch_size": b, "start_at": t}``: a
  training reader (``ShardDataset`` over this node's cache, so through its peers) reads
  rank ``r`` of ``w``'s share of epoch 0 (one rank a node), from wall-clock time ``t`` on
  (nodes told the same ``t`` start together); answers its seconds from ``t``, how late it
  began, the samples and member bytes delivered and the delivered keys;
- ``{"stats": true}``: the tier's counters and the bytes this node served.

It dies with its parent (``lifeline``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from flashfeed.cache import ShardCache
from flashfeed.cache.layout import dataset_key
from flashfeed.cache.peer.auth import load_token
from flashfeed.cache.peer.node import PeerNode
from flashfeed.dataset import Dataset
from flashfeed.runtime.lifeline import tie_to_parent


def read_epoch(cache: ShardCache, ds: Dataset, cmd: dict[str, Any]) -> dict[str, Any]:
    """The ``epoch`` command: one rank's epoch 0 as the training process reads it."""
    from flashfeed.loader.shard_dataset import ShardDataset  # torch: imported when used

    reader = ShardDataset(
        ds, batch_size=int(cmd.get("batch_size", 8)), cache=cache, rank=int(cmd["rank"]),
        world_size=int(cmd["world"]), ranks_per_node=1, seed=int(cmd.get("seed", 0)),
    )  # fmt: skip
    start_at = float(cmd.get("start_at", time.time()))
    time.sleep(max(0.0, start_at - time.time()))
    late = time.time() - start_at
    keys: list[str] = []
    nbytes = 0
    try:
        for sample in reader:
            keys.append(sample["__key__"])
            nbytes += sum(len(v) for v in sample.values() if isinstance(v, bytes))
    finally:
        reader.close()
    seconds = time.time() - start_at
    return {"seconds": seconds, "late": late, "samples": len(keys), "bytes": nbytes, "keys": keys}


def main() -> None:
    tie_to_parent(os.getppid(), kernel_signal=False)
    root, host, endpoint = sys.argv[1:4]
    flags = dict(zip(sys.argv[4::2], sys.argv[5::2], strict=True))
    if flags.get("--loader") == "1":
        import flashfeed.loader.shard_dataset  # noqa: F401
    node = PeerNode(
        cache_dir=root,
        token=load_token(),
        listen=(host, 0),
        storage_options={"endpoint_url": endpoint},
        rate=float(flags.get("--rate", 0)),
        cache_kwargs={
            "part_size": flags.get("--part-size", "256KiB"),
            "concurrency": 4,
            "capacity": int(flags["--capacity"]) if "--capacity" in flags else None,
        },
    ).start()
    print(json.dumps({"address": node.address}), flush=True)
    datasets: dict[str, Any] = {}

    def opened(url: str) -> Any:
        """The dataset at ``url``, opened once."""
        if url not in datasets:
            datasets[url] = node.cache.open_dataset(url)
        return datasets[url]

    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "peers" in cmd:
                node.set_peers(cmd["peers"])
                out: dict = {"ok": True}
            elif "assign" in cmd:
                url = cmd["assign"]
                ds = opened(url)
                key = dataset_key(ds.url, ds.manifest)
                node.tier.assign(key, {int(s): a for s, a in cmd["owners"].items()})
                out = {"ok": True}
            elif "fetch" in cmd:
                url = cmd["fetch"]
                ds = opened(url)
                start = time.monotonic()
                for i in cmd["shards"]:
                    node.cache.fetch(ds, i)
                out = {"ok": True, "seconds": time.monotonic() - start}
            elif "epoch" in cmd:
                url = cmd["epoch"]
                ds = opened(url)
                out = {"ok": True, **read_epoch(node.cache, ds, cmd)}
            else:
                out = {}
            out["stats"] = node.tier.stats()
            out["served"] = node.server.served_bytes
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        print(json.dumps(out), flush=True)
    node.close()


if __name__ == "__main__":
    main()

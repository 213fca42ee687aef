"""A simulated node of the cluster tier: a ``PeerNode`` driven by JSON lines on stdin.

``python peer_node.py CACHE_DIR LISTEN_HOST S3_ENDPOINT [--rate BYTES_PER_S] [--part-size S]``
with ``FLASHFEED_PEER_TOKEN`` set (the AWS_* variables give the credentials; the endpoint is
the node's own counting proxy). Prints ``{"address": ...}`` once it serves, then answers
each command line with one JSON line:

- ``{"peers": [...]}``: the cluster's nodes;
- ``{"fetch": URL, "shards": [...]}``: fetch those shards into the cache (a warm);
- ``{"assign": URL, "owners": {shard: address}}``: the placement's store readers;
- ``{"stats": true}``: the tier's counters and the bytes this node served.

It dies with its parent (``lifeline``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from flashfeed.cache.layout import dataset_key
from flashfeed.cache.peer.auth import load_token
from flashfeed.cache.peer.node import PeerNode
from flashfeed.runtime.lifeline import tie_to_parent


def main() -> None:
    tie_to_parent(os.getppid(), kernel_signal=False)
    root, host, endpoint = sys.argv[1:4]
    flags = dict(zip(sys.argv[4::2], sys.argv[5::2], strict=True))
    node = PeerNode(
        cache_dir=root,
        token=load_token(),
        listen=(host, 0),
        storage_options={"endpoint_url": endpoint},
        rate=float(flags.get("--rate", 0)),
        cache_kwargs={"part_size": flags.get("--part-size", "256KiB"), "concurrency": 4},
    ).start()
    print(json.dumps({"address": node.address}), flush=True)
    datasets = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "peers" in cmd:
                node.set_peers(cmd["peers"])
                out: dict = {"ok": True}
            elif "assign" in cmd:
                url = cmd["assign"]
                ds = datasets.get(url) or datasets.setdefault(url, node.cache.open_dataset(url))
                key = dataset_key(ds.url, ds.manifest)
                node.tier.assign(key, {int(s): a for s, a in cmd["owners"].items()})
                out = {"ok": True}
            elif "fetch" in cmd:
                url = cmd["fetch"]
                ds = datasets.get(url) or datasets.setdefault(url, node.cache.open_dataset(url))
                start = time.monotonic()
                for i in cmd["shards"]:
                    node.cache.fetch(ds, i)
                out = {"ok": True, "seconds": time.monotonic() - start}
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

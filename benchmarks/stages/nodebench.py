"""Node service benchmark: the service against the embedded cache, and a flood's effect.

  hot epoch    one epoch of ``ShardDataset`` over a cached dataset: through the node
               service (descriptors handed over a Unix socket, ``FLASHFEED_NODE_SOCKET``)
               vs the embedded ``ShardCache`` (``cache_dir=``); rounds interleaved
  hit          one shard read that hits: ``NodeClient.get`` (a round trip, two descriptors)
               vs the embedded ``ShardCache.get`` plus opening the file; p50 and p99
  flood        the same service hits' p99 while another Unix user (``nobody``) floods the
               service with reads, as a ratio of the idle p99 (the goal: within 2x): at the
               service's default ``requests_per_s`` (1,000 per core), unbounded (0), and at
               ``--flood-rate``
  token hot, cold epoch   ``TokenLoader`` GB/s over a cached token dataset, and a first
               epoch from an empty cache, service vs embedded (``harness/nodeload.py``)

Prints a table and writes JSON. Not a timed test: run it by hand, as root (the service and
the flooding user are real).

    python -m benchmarks.stages.nodebench --shards 16 --shard-size 4MiB --out .bench/node.json
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.benchmath import fmt, ratio
from benchmarks.harness.datasets import random_dataset, token_dataset
from benchmarks.harness.nodeload import loader_rows, through_node_service
from benchmarks.harness.nodeservice import NodeServiceProc
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from benchmarks.harness.store import start_store
from benchmarks.harness.unixusers import SITE, user_python
from flashfeed.runtime import lifeline
from flashfeed.units import parse_size

_FLOOD = """
import os, site, sys, time
site.addsitedir(sys.argv[1])
from flashfeed.cache.node import NodeClient
url, seconds = sys.argv[2], float(sys.argv[3])
client = NodeClient()
os.close(client.get(url, 0)[0])
print("flooding", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(200):
        client.call({"op": "get", "shard": 0}, url=url, wait=False)
    client.status()
"""


def _epoch(ds: Any, epoch: int) -> float:
    """Samples a second of epoch ``epoch`` of ``ds`` (made, and read once, beforehand)."""
    ds.set_epoch(epoch)
    t0 = time.perf_counter()
    n = sum(1 for _ in ds)
    return n / (time.perf_counter() - t0)


def _hits(get: Any, shards: int, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        get(i % shards)
        out.append(time.perf_counter() - t0)
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--shard-size", default="4MiB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hits", type=int, default=2000)
    p.add_argument("--token-rows", type=int, default=4096, help="rows of 2,048 tokens")
    p.add_argument("--flood-rate", type=float, default=1000.0,
                   help="requests_per_s of the flooding tenant in the second flood")  # fmt: skip
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("nodebench runs the service and a flooding user: run it as root")
    from flashfeed.cache import ShardCache
    from flashfeed.cache.node import NodeClient

    root = tempfile.mkdtemp(prefix="ffnodebench-", dir="/tmp")
    os.chmod(root, 0o755)
    # removed again last at exit: the loaders' caches flush their counters at exit too
    atexit.register(shutil.rmtree, root, True)
    bench = start_store(os.path.join(root, "s3"), bucket="flashfeed", export_env=True)
    node = cache = None
    flooder = user_python("nobody")
    if flooder is None:
        raise SystemExit("no Python that user nobody may run flashfeed with, for the flood")
    try:
        url = "s3://flashfeed/nodebench"
        random_dataset(url, args.shards, parse_size(args.shard_size))
        node = NodeServiceProc(os.path.join(root, "service"), {
            "cache_dir": os.path.join(root, "node"), "capacity": "8GiB",
            "store": bench.store.info.storage_options(), "default_quota": "8GiB"})  # fmt: skip
        node.start()
        sock = node.socket
        client = NodeClient(sock, reconnect_timeout=30)
        embedded_dir = os.path.join(root, "embedded")
        cache = ShardCache(embedded_dir, capacity="8GiB")
        ds = cache.open_dataset(url)
        for i in range(args.shards):  # both caches hot before any timing
            cache.get(ds, i)
            for fd in client.get(url, i)[:2]:
                if fd is not None:
                    os.close(fd)

        from flashfeed.loader import ShardDataset

        through_node = through_node_service(sock, lambda: ShardDataset(url, shuffle=False))
        through_cache = ShardDataset(url, shuffle=False, cache_dir=embedded_dir)
        for d in (through_node, through_cache):
            for _ in d:  # hot: every shard handed to this process's reader once
                pass
        count = iter(range(1, 10**6))
        epochs = run_rounds({"node": lambda: _epoch(through_node, next(count)),
                             "embedded": lambda: _epoch(through_cache, next(count))},
                            args.rounds)  # fmt: skip

        def node_get(i: int) -> None:
            fd, idx, _ = client.get(url, i)
            os.close(fd)
            if idx is not None:
                os.close(idx)

        def embedded_get(i: int) -> None:
            os.close(os.open(cache.get(ds, i), os.O_RDONLY))
            os.close(os.open(cache.get(ds, i) + ".idx", os.O_RDONLY))

        idle = _hits(node_get, args.shards, args.hits)
        local = _hits(embedded_get, args.shards, args.hits)

        def flooded_hits(rate: float | None) -> list[float]:
            """Hits while ``nobody`` floods the service, read at ``rate`` requests a second
            (the config's ``requests_per_s`` for that tenant; 0: unbounded; None: the
            service's default)."""
            paced = {} if rate is None else {"requests_per_s": rate}
            node.write_config(tenants={"nobody": {"quota": "8GiB", **paced}})
            if client.reload().get("error_in_config"):
                raise SystemExit("the node config was refused")
            flood = lifeline.popen([flooder, "-c", _FLOOD, SITE, url, "60"], user="nobody",
                                   cwd="/", stdout=subprocess.PIPE,
                                   env={**os.environ, "FLASHFEED_NODE_SOCKET": sock, "HOME": "/tmp",
                                        "PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
            if flood.stdout is None or flood.stdout.readline().strip() != b"flooding":
                raise SystemExit("the flooding process did not start")
            time.sleep(0.5)
            got = _hits(node_get, args.shards, args.hits)
            flood.kill()
            flood.wait()
            while "nobody" in client.status().get("requests", {}):
                time.sleep(0.1)  # until what the flood left is served and its socket closed
            time.sleep(1.0)  # and the killed flooder torn down: the next row measured idle
            return got

        by_default = flooded_hits(None)
        flooded = flooded_hits(0)
        paced = flooded_hits(args.flood_rate)
        idle_again = _hits(node_get, args.shards, args.hits)
        tokens_url = "s3://flashfeed/nodebench-tokens"
        token_dataset(tokens_url, rows=args.token_rows, seq_len=2048)
        loads = loader_rows(sock=sock, client=client, tokens_url=tokens_url, images_url=url,
                            embedded_dir=embedded_dir, rounds=args.rounds)  # fmt: skip
    finally:
        if cache is not None:
            cache.close()  # its counters flushed now, not at exit into a removed folder
        if node is not None:
            node.stop()
        bench.stop()
        shutil.rmtree(root, ignore_errors=True)

    idle_p99 = statistics.median([_pct(idle, 0.99), _pct(idle_again, 0.99)])
    rows = {
        "hot_epoch_samples_per_s": {k: v for k, v in epochs.items()},
        "hot_epoch_node_vs_embedded": ratio(epochs["node"], epochs["embedded"]),
        "hit_us": {name: {"p50": _pct(v, 0.5) * 1e6, "p99": _pct(v, 0.99) * 1e6}
                   for name, v in (("node idle", idle), ("embedded", local),
                                   ("flood, default", by_default),
                                   ("flood, unbounded", flooded), ("flood, paced", paced),
                                   ("node idle again", idle_again))},
        "default_flood_p99_vs_idle_p99": _pct(by_default, 0.99) / idle_p99,
        "flooded_p99_vs_idle_p99": _pct(flooded, 0.99) / idle_p99,
        "paced_flood_p99_vs_idle_p99": _pct(paced, 0.99) / idle_p99,
        **loads,
    }  # fmt: skip
    e = rows["hot_epoch_node_vs_embedded"]
    print(f"hot epoch (samples/s, median of {args.rounds}): node "
          f"{fmt(statistics.median(epochs['node']))}, embedded "
          f"{fmt(statistics.median(epochs['embedded']))}, ratio {e['ratio']:.2f} "
          f"({e['min']:.2f}-{e['max']:.2f})")  # fmt: skip
    print(f"{'hit':<18}{'p50 us':>10}{'p99 us':>10}")
    for name, v in rows["hit_us"].items():
        print(f"{name:<18}{fmt(v['p50']):>10}{fmt(v['p99']):>10}")
    print(f"p99 under a flood / idle p99 (goal <= 2): the flooder at the default rate "
          f"{rows['default_flood_p99_vs_idle_p99']:.2f}; unbounded "
          f"{rows['flooded_p99_vs_idle_p99']:.2f}; at requests_per_s {args.flood_rate:g}: "
          f"{rows['paced_flood_p99_vs_idle_p99']:.2f}")  # fmt: skip
    for name, key, medians, unit, goal in (
        ("token hot", "token_hot", "token_gb_per_s", "GB/s", 0.98),
        ("cold epoch", "cold_epoch", "cold_samples_per_s", "samples/s", 0.95),
    ):
        r = rows[f"{key}_node_vs_embedded"]
        med = rows["medians"][medians]
        print(f"{name} ({unit}, median of {args.rounds}): node {fmt(med['node'])}, embedded "
              f"{fmt(med['embedded'])}, ratio {r['ratio']:.2f} ({r['min']:.2f}-{r['max']:.2f}; "
              f"goal >= {goal})")  # fmt: skip
    if args.out:
        write_json(args.out, {"args": vars(args), **rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

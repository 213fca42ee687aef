"""The reader's side of the cluster tier at 1,000 nodes: what a node keeps of its peers'
holdings, and the time to take in a round of their announcements, as frozensets of ints
(the reader before, ``benchmarks/harness/setreader.py``) and as ``ShardSet``
(``holdings.apply``), side by side in one run, on the same answers.

Each peer's answers come from its own ``HoldingsLog`` (the server's code): its full
announcement (with 4 fills running), then the delta after ``--churn`` fills and as many
evictions. Two kinds of holdings of a ``--shards`` (1M) dataset:

  job     ``--peers`` (1,000) peers, each holding its share of the dataset and the shares of
          ``--replicas`` - 1 neighbours (3,000 shards a peer)
  sweep   ``--sweep-peers`` (100) peers, each holding ``--sweep-held`` (125,000) random
          shards, a node's share in runs of 8 (1,000 of them as sets need about 10 GB)

Per reader: the memory its state keeps after a full round (tracemalloc: what the round
allocated and still holds, the ShardSets' buffers included; and the ShardSets' own bytes),
the seconds to apply the full round and the delta round (answers parsed from JSON
beforehand; the best of ``--rounds``), and one lookup of the peers holding a shard (the scan
``PeerAttempt.next_peer`` makes), averaged over 1,000 random shards.

    python -m benchmarks.stages.peerheld --out .bench/peerheld.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness.results import write_json
from benchmarks.harness.setreader import apply_sets
from flashfeed.cache.peer.holdings import HoldingsLog, apply

KEY = "k" * 32  # a dataset key is 32 characters (``layout.dataset_key``)

Reader = Callable[[Any, Any], Any]


def job_holdings(shards: int, peers: int, replicas: int, rng: np.random.Generator) -> list:
    """Each peer's share of a random split of the dataset, and its next neighbours' shares."""
    shares = np.array_split(rng.permutation(shards), peers)
    return [
        np.concatenate([shares[(p + j) % peers] for j in range(replicas)]) for p in range(peers)
    ]


def answers(
    held: list[np.ndarray], shards: int, churn: int, rng: np.random.Generator
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each peer's full announcement, then its delta after ``churn`` fills and evictions."""
    fulls, deltas = [], []
    for have in held:
        log = HoldingsLog()
        log.update({KEY: (shards, have)})
        since = f"{log.instance}.{log.version}"
        fills = {KEY: rng.integers(0, shards, 4).tolist()}
        fulls.append(json.loads(json.dumps(log.full(fills))))
        now = set(have.tolist())
        now -= set(rng.choice(have, min(churn, len(have)), replace=False).tolist())
        now |= set(rng.integers(0, shards, churn).tolist())
        log.update({KEY: (shards, now)})
        delta = log.delta(since, fills)
        if delta is None:
            raise RuntimeError("the log answers no delta one version behind")
        deltas.append(json.loads(json.dumps(delta)))
    return fulls, deltas


def _best(rounds: int, run: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
        del out
        gc.collect()
    return best


def measure(
    apply_: Reader, fulls: list, deltas: list, probes: list[int], rounds: int
) -> dict[str, Any]:
    """One reader's memory and seconds on these answers."""
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    states = [apply_(None, f) for f in fulls]
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    sets = [s[2][KEY].complete for s in states]
    held = sum(len(c) for c in sets)
    own = sum(c.nbytes for c in sets if hasattr(c, "nbytes"))
    full_s = _best(rounds, lambda: [apply_(None, f) for f in fulls])
    delta_s = _best(rounds, lambda: [apply_(s, d) for s, d in zip(states, deltas, strict=True)])
    found = 0
    t0 = time.perf_counter()
    for shard in probes:  # as ``next_peer`` scans a tier's holdings
        found += len(
            [p for p, st in enumerate(states) if shard in getattr(st[2].get(KEY), "complete", ())]
        )
    lookup_s = (time.perf_counter() - t0) / len(probes)
    return {
        "kept_bytes": kept - start,
        "peak_bytes": peak - start,
        "own_bytes": own,
        "held_numbers": held,
        "full_round_s": full_s,
        "delta_round_s": delta_s,
        "lookup_s": lookup_s,
        "holders_found": found,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shards", type=int, default=1_000_000)
    p.add_argument("--peers", type=int, default=1000)
    p.add_argument("--replicas", type=int, default=3, help="copies of each share in the job")
    p.add_argument("--sweep-peers", type=int, default=100)
    p.add_argument("--sweep-held", type=int, default=125_000)
    p.add_argument("--churn", type=int, default=8, help="fills and evictions before the delta")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=".bench/peerheld.json")
    args = p.parse_args(argv)
    for name in ("shards", "peers", "replicas", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.replicas > args.peers or args.sweep_held > args.shards:
        p.error("--replicas must be <= --peers and --sweep-held <= --shards")
    rng = np.random.default_rng(0)
    kinds = {
        "job": job_holdings(args.shards, args.peers, args.replicas, rng),
        "sweep": [
            rng.choice(args.shards, args.sweep_held, replace=False) for _ in range(args.sweep_peers)
        ],
    }
    out: dict[str, Any] = {"args": vars(args), "rows": {}}
    for kind, held in kinds.items():
        if not held:
            continue
        t0 = time.perf_counter()
        fulls, deltas = answers(held, args.shards, args.churn, rng)
        print(f"{kind}: {len(held)} peers' answers made in {time.perf_counter() - t0:.1f} s")
        row = {}
        probes = rng.integers(0, args.shards, 1000).tolist()
        for reader, apply_ in (("sets", apply_sets), ("ShardSet", apply)):
            row[reader] = measure(apply_, fulls, deltas, probes, args.rounds)
            gc.collect()  # the reader's states go before the next one is measured
        if row["sets"]["holders_found"] != row["ShardSet"]["holders_found"]:
            raise RuntimeError(f"{kind}: the readers disagree on who holds the shards probed")
        out["rows"][kind] = {"peers": len(held), "per_peer": len(held[0]), **row}
        del fulls, deltas
    print(
        f"\nthe reader's holdings of a {args.shards:,}-shard dataset, after one full round "
        f"(tracemalloc), and its seconds (best of {args.rounds}):"
    )
    print(
        "| peers x shards each | reader | kept MB | B a number | full round s | "
        "delta round s | lookup us |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind, r in out["rows"].items():
        label = f"{kind}: {r['peers']:,} x {r['per_peer']:,}"
        for reader in ("sets", "ShardSet"):
            m = r[reader]
            print(
                f"| {label} | {reader} | {m['kept_bytes'] / 1e6:.1f} | "
                f"{m['kept_bytes'] / m['held_numbers']:.1f} | {m['full_round_s']:.3f} | "
                f"{m['delta_round_s']:.3f} | {m['lookup_s'] * 1e6:.0f} |"
            )
        a, b = r["sets"], r["ShardSet"]
        print(
            f"| {label} | sets / ShardSet | {a['kept_bytes'] / b['kept_bytes']:.1f}x | | "
            f"{a['full_round_s'] / b['full_round_s']:.1f}x | "
            f"{a['delta_round_s'] / b['delta_round_s']:.1f}x | "
            f"{a['lookup_s'] / b['lookup_s']:.2f}x |"
        )
    for kind, r in out["rows"].items():
        m = r["ShardSet"]
        print(
            f"{kind}: the ShardSets' own buffers {m['own_bytes'] / 1e6:.1f} MB "
            f"({m['own_bytes'] / m['held_numbers']:.2f} B a number)"
        )
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``flashfeed cache warm --sweep FILE``: the command-line side of a sweep's warm."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flashfeed.plan.plan import PlanOptions
from flashfeed.units import parse_size

from ..peer.sweep import load_sweep
from ..peer.sweepwarm import sweep_summary, warm_sweep
from .cliprint import warm_errors

__all__ = ["warm_sweep_command"]


def _say(message: str) -> None:
    print(f"flashfeed cache warm: warning: {message}", file=sys.stderr)


def warm_sweep_command(args: argparse.Namespace) -> int:
    """Check the flags, plan the sweep as one, warm every node, print per node what came
    from the store and what from peers; exit 1 when a node or a shard failed."""
    if args.sweep is None:
        raise ValueError("--local warms the nodes of a sweep here: add --sweep FILE")
    given = {
        "DATASET": args.dataset,
        "--node-rank": args.node_rank,
        "--num-nodes": args.num_nodes,
        "--world-size": args.world_size,
        "--hosts": args.hosts,
        "--hostfile": args.hostfile,
        "--peers": args.peers,
        "--peer-self": args.peer_self,
    }
    clash = [name for name, value in given.items() if value is not None]
    plan = PlanOptions()
    defaults = {
        "--ranks-per-node": (args.ranks_per_node, 1),
        "--epochs": (args.epochs, 1),
        "--seed": (args.seed, plan.seed),
        "--shuffle/--no-shuffle": (args.shuffle, plan.shuffle),
        "--window": (args.window, plan.window),
        "--drop-last/--no-drop-last": (args.drop_last, plan.drop_last),
    }
    clash += [name for name, (value, default) in defaults.items() if value != default]
    if clash:
        raise ValueError(
            f"--sweep takes the dataset, the hosts and each job's plan from its file: drop "
            f"{', '.join(clash)}"
        )
    if args.local and args.ray_address is not None:
        raise ValueError("--local and --ray-address: a sweep warms here or on a Ray cluster")
    if not args.local and args.ray_address is None:
        raise ValueError("--sweep runs on a Ray cluster (--ray-address) or here (--local)")
    sweep = load_sweep(args.sweep)
    capacity = parse_size(args.capacity, name="--capacity") if args.capacity else None
    kwargs: dict[str, Any] = {
        "capacity": capacity,
        "concurrency": args.concurrency,
        "part_size": args.part_size,
    }
    results = warm_sweep(
        sweep,
        args.cache_dir,
        address=args.ray_address,
        local=args.local,
        port=args.peer_port,
        token_file=args.peer_token_file,
        cache_kwargs=kwargs,
        warn=_say,
    )
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for line in sweep_summary(results):
            print(line)
    errors = warm_errors(results)
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0

"""The options and help texts of ``flashfeed cache``'s commands: plan, cluster, peers, sweep."""

from __future__ import annotations

import argparse
from typing import Any

from flashfeed.plan.plan import PlanOptions

__all__ = [
    "EVICT_EPILOG",
    "RAW",
    "STATUS_EPILOG",
    "VERIFY_EPILOG",
    "WARM_EPILOG",
    "cluster_options",
    "peer_options",
    "peer_spec",
    "plan_options",
    "sweep_options",
]

RAW = argparse.RawDescriptionHelpFormatter

WARM_EPILOG = """\
examples:
  # before a 4-node run with 8 GPUs per node, on node 2 (torchrun --node-rank 2):
  flashfeed cache warm s3://flashfeed/photos-v1 --cache-dir /nvme/ff-cache \\
      --node-rank 2 --num-nodes 4 --ranks-per-node 8 --epochs 3 --seed 0 --capacity 500GiB
  # the loader's other plan options, when the run changes them:
  flashfeed cache warm s3://flashfeed/photos-v1 --cache-dir /nvme/ff-cache \\
      --world-size 32 --ranks-per-node 8 --node-rank 2 --window 8 --no-drop-last
  # every node of a Ray cluster at once, node ranks in the launcher's order:
  flashfeed cache warm s3://flashfeed/photos-v1 --cache-dir /nvme/ff-cache \\
      --ranks-per-node 8 --ray-address auto --hostfile hosts.txt
  # a mixture: every source's share of each node, on every node of the cluster
  flashfeed cache warm mix.json --ranks-per-node 8 --ray-address auto --hostfile hosts.txt
  # under SLURM: scontrol's order is SLURM_NODEID's
  flashfeed cache warm s3://flashfeed/photos-v1 --ranks-per-node 8 --ray-address auto \\
      --hosts "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd,)"
  # a sweep (several jobs, one dataset, different nodes): each shard leaves the store once
  # and is copied between the nodes; sweep.json lists the jobs (docs/CACHE.md, "Sweep warm"):
  #   {"dataset": "s3://flashfeed/photos-v1", "jobs": [
  #     {"name": "lr-1", "hosts": ["node01", "node02"], "ranks_per_node": 8, "seed": 0},
  #     {"name": "lr-2", "hosts": ["node03", "node04"], "ranks_per_node": 8, "seed": 1}]}
  flashfeed cache warm --sweep sweep.json --ray-address auto --cache-dir /nvme/ff-cache
  # the same on this machine, each node a peer server on 127.0.0.N:PORT (a simulation):
  flashfeed cache warm --sweep sim.json --local --cache-dir '/tmp/sim/{host}'

--cache-dir defaults to $FLASHFEED_CACHE_DIR, else ~/.cache/flashfeed (as for the loaders); in a
cluster warm each node reads its own.
"""
STATUS_EPILOG = """\
examples:
  flashfeed cache status /nvme/ff-cache
  flashfeed cache status /nvme/ff-cache --dataset s3://flashfeed/photos-v1 \\
      --node-rank 2 --num-nodes 4 --ranks-per-node 8 --epochs 3
"""
VERIFY_EPILOG = """\
example:
  flashfeed cache verify /nvme/ff-cache     # exit 1 if a corrupt shard was found (and removed)
"""
EVICT_EPILOG = """\
examples:
  flashfeed cache evict /nvme/ff-cache --dataset s3://flashfeed/photos-v1
  flashfeed cache evict /nvme/ff-cache --all
"""


def plan_options(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """One flag for each input of the plan, with the loader's defaults (``Loader(seed=0,
    shuffle=True, window=4, drop_last=True)``). Without ``defaults`` (status) a flag not
    given is None: the last read order the cache was told is used instead."""
    g = p.add_argument_group("the run's plan (the same values the loader gets)")
    plan = PlanOptions()

    def dflt(value: object) -> object:
        return value if defaults else None

    g.add_argument("--node-rank", type=int, metavar="R", help="this node's rank (0)")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--num-nodes", type=int, metavar="N", help="nodes in the run (1)")
    size.add_argument(
        "--world-size", type=int, metavar="W", help="ranks in the run (nodes x ranks per node)"
    )
    g.add_argument(
        "--ranks-per-node", type=int, default=dflt(1), metavar="K", help="ranks per node (1)"
    )
    g.add_argument("--epochs", type=int, default=dflt(1), metavar="E", help="epochs to cover (1)")
    g.add_argument(
        "--seed", type=int, default=dflt(plan.seed), metavar="S", help="the plan's seed (0)"
    )
    g.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=dflt(plan.shuffle),
        help="shuffle shards and samples (default: shuffle)",
    )
    g.add_argument(
        "--window",
        type=int,
        default=dflt(plan.window),
        metavar="N",
        help=f"shards whose samples are mixed together ({plan.window})",
    )
    g.add_argument(
        "--drop-last",
        action=argparse.BooleanOptionalAction,
        default=dflt(plan.drop_last),
        help="drop the uneven tail of an epoch (default: drop)",
    )


def cluster_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a Ray cluster: every node at once, one task per node")
    g.add_argument("--ray-address", metavar="ADDR", help="warm every listed node of this cluster")
    hosts = g.add_mutually_exclusive_group()
    hosts.add_argument(
        "--hosts",
        metavar="H0,H1,...",
        help="the nodes in the launcher's node-rank order, by hostname or address",
    )
    hosts.add_argument(
        "--hostfile",
        metavar="FILE",
        help="the same, one host per line ('#' comments); see docs/CACHE.md per launcher",
    )


def peer_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the cluster tier: read from the other nodes before the store")
    g.add_argument(
        "--peers",
        metavar="H0:P,H1:P,...",
        help="the nodes' peer servers (`python -m flashfeed.cache.peer serve`), in node-rank "
        "order for a cluster warm; the token: $FLASHFEED_PEER_TOKEN or --peer-token-file",
    )
    g.add_argument("--peer-port", type=int, default=7460, help="where an entry has no port")
    g.add_argument(
        "--peer-self",
        metavar="HOST:PORT",
        help="this node's own peer server (one-node warm): it may then read shards from the "
        "store for the cluster; without it, this warm reads peers' copies, then the store",
    )
    g.add_argument("--peer-token-file", metavar="FILE", help="the cluster token (mode 0600)")


def sweep_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a sweep: several jobs of one dataset, planned as one")
    g.add_argument(
        "--sweep",
        metavar="FILE",
        help="a JSON file of the jobs (dataset, hosts, plan options): each shard is read from "
        "the store at one node and copied to the others (needs --ray-address or --local)",
    )
    g.add_argument(
        "--local",
        action="store_true",
        help="run every node's warm of the sweep on this machine (--cache-dir with {host})",
    )


def peer_spec(args: argparse.Namespace) -> dict[str, Any] | None:
    """``cache warm --peers``: what each warm's cache makes its ``PeerTier`` of."""
    if not args.peers:
        if args.peer_self or args.peer_token_file:
            raise ValueError("--peer-self and --peer-token-file need --peers")
        return None
    from ..peer.discovery import peers_from

    peers = peers_from(hosts=args.peers, port=args.peer_port)
    return {
        "peers": peers,
        "self": args.peer_self,
        "ranked": args.ray_address is not None,
        "token_file": args.peer_token_file,
    }

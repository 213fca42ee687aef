"""``cache warm --sweep``: every node of every job of a sweep warms at once, on one plan.

The driver reads the manifest, plans all shares together (``sweep.plan_sweep``: each shard's
store read at one node, every other node's copy from a planned source), then runs each
node's warm (``cluster.warm_node``, the task of a cluster warm) with its own ``--peers``
spec: on the nodes of a Ray cluster (one pinned task per node), or with ``local``, all here,
each node a cache directory of its own (a simulation on 127.0.0.N addresses). Each node's
result says what it read from the store and what from peers.
"""

from __future__ import annotations

import http.client
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flashfeed.dataset import Dataset

from ..warm.cluster import driver_storage_options, map_hosts, warm_node
from .auth import load_token
from .client import PeerTier
from .sweep import Sweep, SweepNode, plan_sweep

__all__ = ["sweep_summary", "warm_sweep"]

log = logging.getLogger("flashfeed.cache")


def _local_dirs(template: str | None, nodes: Sequence[SweepNode]) -> list[str]:
    if not template or "{host}" not in template:
        raise ValueError(
            f"--local warms every node of the sweep on this machine: --cache-dir must hold "
            f"{{host}} so each node has its own cache (e.g. /tmp/sim/{{host}}), got {template!r}"
        )
    dirs = [template.replace("{host}", n.hostname) for n in nodes]
    if len(set(dirs)) != len(dirs):
        raise ValueError("--local: two nodes of the sweep have the same host, so the same cache")
    return dirs


def _run_local(
    nodes: Sequence[SweepNode],
    url: str,
    dirs: Sequence[str],
    kwargs: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="ff-sweep") as pool:
        futures = [
            pool.submit(warm_node, url, d, n.share, kw)
            for n, d, kw in zip(nodes, dirs, kwargs, strict=True)
        ]
        return [f.result() for f in futures]


def _run_ray(
    nodes: Sequence[SweepNode],
    url: str,
    cache_dir: str | None,
    kwargs: Sequence[dict[str, Any]],
    address: str | None,
    warn: Callable[[str], None],
) -> list[dict[str, Any]]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init(address=address, configure_logging=False, log_to_driver=False)
    ranked, extra = map_hosts(ray.nodes(), [n.hostname for n in nodes])
    for n in extra:
        warn(f"Ray node {n.describe()} is in no job of the sweep: not warmed")
    task = ray.remote(num_cpus=1, max_retries=0)(warm_node)
    refs = [
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node.node_id, soft=False)
        ).remote(url, cache_dir, n.share, kw)
        for n, ray_node, kw in zip(nodes, ranked, kwargs, strict=True)
    ]
    results = ray.get(refs)
    for ray_node, r in zip(ranked, results, strict=True):
        r["node_id"] = ray_node.node_id
        r["address"] = ray_node.address
    return results


def _server_counters(tier: PeerTier, peer: str) -> dict[str, int] | None:
    """The counters of ``peer``'s server (``GET /v1/stats``), or None when it cannot say."""
    try:
        resp = tier.request(peer, "GET", "/v1/stats")
        data = resp.read(1 << 16)
        resp.close()
        if resp.status != 200:
            return None
        out = json.loads(data)
        return {str(k): int(v) for k, v in out.items()}
    except (OSError, http.client.HTTPException, ValueError, TypeError, AttributeError):
        return None


def warm_sweep(
    sweep: Sweep,
    cache_dir: str | None,
    *,
    address: str | None = None,
    local: bool = False,
    port: int = 7460,
    token_file: str | None = None,
    cache_kwargs: dict[str, Any],
    warn: Callable[[str], None] = log.warning,
) -> list[dict[str, Any]]:
    """Warm every node of ``sweep`` on one plan (see the module docstring); one result per
    node, job after job, with ``job``, ``peer``, the plan's share of it (``planned``) and
    what its peer server did meanwhile (``server``: its counters' change, None when it
    could not say)."""
    if local == (address is not None):
        raise ValueError("a sweep warm runs on a Ray cluster (--ray-address) or here (--local)")
    nodes = sweep.nodes(port=port)
    dirs = _local_dirs(cache_dir, nodes) if local else []
    # no token: one line now, not one per node
    tier = PeerTier(peers=[n.peer for n in nodes], token=load_token(token_file=token_file))
    options = driver_storage_options(cache_kwargs.get("storage_options"))
    dataset = Dataset.open(sweep.dataset, storage_options=options)
    placement, specs = plan_sweep(dataset, nodes, max_serving=sweep.max_serving, seed=sweep.seed)
    reads = placement.store_reads()
    served = Counter(str(c.source) for c in placement.copies)
    kwargs = [
        {
            **cache_kwargs,
            "storage_options": options,
            "peers": {**specs[n.peer], "token_file": token_file},
        }
        for n in nodes
    ]
    before = [_server_counters(tier, n.peer) for n in nodes]
    if local:
        results = _run_local(nodes, sweep.dataset, dirs, kwargs)
    else:
        results = _run_ray(nodes, sweep.dataset, cache_dir, kwargs, address, warn)
    after = [_server_counters(tier, n.peer) for n in nodes]
    for n, r, b, a in zip(nodes, results, before, after, strict=True):
        r["job"], r["peer"] = n.job, n.peer
        # what the node's peer server did meanwhile: its fills asked for by peers, its copies
        r["server"] = None if a is None or b is None else {k: a[k] - b.get(k, 0) for k in a}
        r["planned"] = {
            "store_reads": reads.get(n.peer, 0),
            "copies_in": len(specs[n.peer]["sources"]),
            "copies_served": served.get(n.peer, 0),
            "waves": placement.waves(),
        }
    return results


def sweep_summary(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per node: what came from the store, what from peers, what the plan gave it."""
    lines = []
    store = 0
    for r in results:
        if r.get("error"):
            continue
        p = r.get("peers", {})
        s, c = int(p.get("bytes_from_store", 0)), int(p.get("bytes_from_peers", 0))
        store += s
        plan = r["planned"]
        server = r.get("server") or {}
        s += int(server.get("bytes_from_store", 0))
        store += int(server.get("bytes_from_store", 0))
        served = f", {server['served_bytes'] / 1e6:.1f} MB served" if server else ""
        lines.append(
            f"job {r['job']} node {r['node_rank']} ({r['peer']}): {r['fetched']} fetched, "
            f"{r['already']} already here; {s / 1e6:.1f} MB from the store, {c / 1e6:.1f} MB "
            f"from peers{served} (planned: {plan['store_reads']} store reads, "
            f"{plan['copies_in']} copies in, {plan['copies_served']} served)"
        )
    lines.append(
        f"sweep: {store / 1e6:.1f} MB read from the store (by the warms, and by the nodes' "
        "peer servers for peers that asked first)"
    )
    return lines

"""What the node quota stage reports, from what it sampled: each tenant's most resident
bytes against its quota (in shards over), each tenant's share of the store bytes while both
read their cold first epoch against its job's weight share, and the tables it prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flashfeed.units import format_size

__all__ = [
    "SHARE_TOLERANCE",
    "cold_window",
    "fill_shares",
    "print_tables",
    "quota_figures",
    "run_figures",
    "weights_arg",
]

MiB = float(1 << 20)
#: a tenant's share of the fill bytes may differ from its weight share by this fraction
SHARE_TOLERANCE = 0.10


def weights_arg(text: str) -> list[tuple[float, float]]:
    """``"1:1,2:1"`` -> ``[(1.0, 1.0), (2.0, 1.0)]``: the two tenants' job weights per run."""
    runs = []
    for part in text.split(","):
        a, sep, b = part.partition(":")
        try:
            pair = (float(a), float(b))
        except ValueError:
            pair = (0.0, 0.0)
        if not sep or min(pair) <= 0:
            raise ValueError(f"weights must be like 1:1,2:1 (each > 0), got {text!r}")
        runs.append(pair)
    return runs


def quota_figures(
    samples: Sequence[Mapping[str, Any]], users: Sequence[str], quota: int, shard_bytes: float
) -> dict[str, dict[str, Any]]:
    """Per tenant: its most resident bytes over ``samples`` (``resident[user]``), how far
    over ``quota`` that was in bytes and in shards, and whether within one shard."""
    out = {}
    for user in users:
        most = max((int(s["resident"].get(user, 0)) for s in samples), default=0)
        over = most - quota
        out[user] = {
            "quota": quota,
            "max_resident": most,
            "over_bytes": over,
            "shards_over": over / shard_bytes,
            "within_one_shard": over <= shard_bytes,
        }
    return out


def cold_window(epochs: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[float, float]:
    """The wall-clock span in which every tenant was in its first epoch (the cold one: its
    reads miss and wait for fills)."""
    firsts = [e[0] for e in epochs.values()]
    return max(float(f["start"]) for f in firsts), min(float(f["end"]) for f in firsts)


def fill_shares(
    times: Sequence[float],
    fetched: Mapping[str, Sequence[float]],
    weights: Mapping[str, float],
    window: tuple[float, float],
) -> dict[str, dict[str, float]]:
    """Per tenant: store bytes delivered in ``window`` (its running count ``fetched[user]``
    sampled at ``times``, read between samples by interpolation), bytes a second, its share
    of all of them, its weight's share and the ratio of the two (1.0: exactly by weight)."""
    t0, t1 = window
    span = t1 - t0
    if span <= 0:
        raise ValueError(f"the tenants' cold epochs do not overlap (window {t0:.3f}..{t1:.3f})")
    got = {u: float(np.interp(t1, times, c) - np.interp(t0, times, c)) for u, c in fetched.items()}
    total = sum(got.values())
    weight_sum = sum(weights.values())
    out = {}
    for user, n in got.items():
        share = n / total if total else 0.0
        wshare = weights[user] / weight_sum
        out[user] = {
            "bytes": n,
            "bytes_per_s": n / span,
            "share": share,
            "weight_share": wshare,
            "ratio": share / wshare,
            "within_tolerance": abs(share / wshare - 1.0) <= SHARE_TOLERANCE,
        }
    return out


def run_figures(
    args: Any,
    w: dict[str, float],
    samples: list[dict[str, Any]],
    out: dict[str, list[dict[str, Any]]],
    final: list[dict[str, Any]],
) -> dict[str, Any]:
    """A run's figures from the stage's samples, the tenants' JSON lines (``out``) and the
    service's last report rows (``final``); every epoch of every tenant must have delivered
    each sample once."""
    users = args.users
    epochs = {u: [m for m in out[u] if "epoch" in m] for u in users}
    for u in users:
        want = args.shards * args.per_shard
        bad = [e for e in epochs[u] if e["samples"] != want or e["unique"] != want]
        if len(epochs[u]) != args.epochs or bad:
            raise RuntimeError(f"tenant {u} delivered {epochs[u]} (each epoch: {want} samples)")
    times = [s["t"] for s in samples]
    fetched = {u: [s["fetched"][u] - samples[0]["fetched"][u] for s in samples] for u in users}
    window = cold_window(epochs)
    quarter = (window[1] - window[0]) / 4
    middle = (window[0] + quarter, window[1] - quarter)
    quota = args.quota_shards * args.shard_bytes
    tenants = quota_figures(samples, users, quota, args.shard_bytes)
    shares = fill_shares(times, fetched, w, window)
    steady = fill_shares(times, fetched, w, middle)
    for u in users:
        ends = [float(np.interp(e["end"], times, fetched[u])) for e in epochs[u]]
        rows = [r for r in final if r["tenant"] == u]
        tenants[u].update(
            share=shares[u],
            steady_share=steady[u],
            weight=w[u],
            store_bytes_by_epoch=[b - a for a, b in zip([0.0, *ends], ends, strict=False)],
            service_fetched_bytes=sum(r["fetched_bytes"] for r in rows),
            evictions_suffered=sum(r["evictions_suffered"] for r in rows),
            evictions_caused=sum(r["evictions_caused"] for r in rows),
            max_held_evicted=max(s["held_evicted"][u] for s in samples),
            epoch_seconds=[e["end"] - e["start"] for e in epochs[u]],
            stats=next((m["stats"] for m in out[u] if "stats" in m), {}),
        )
    held = [s["disk"] + sum(s["held_evicted"].values()) for s in samples]
    return {
        "weights": [w[u] for u in users],
        "window_s": window[1] - window[0],
        "samples": len(samples),
        "max_used": max(s["used"] for s in samples),
        "max_disk": max(s["disk"] for s in samples),
        "max_disk_with_held": max(held),
        "tenants": tenants,
        "series": samples,
    }


def print_tables(args: Any, runs: list[dict[str, Any]]) -> None:
    """The stage's two tables: quotas (and what the tenants fetched and held), shares."""
    cap = args.capacity_shards * args.shard_bytes
    print(
        f"node quotas: 2 tenants x {args.shards} shards of {format_size(args.shard_bytes)} "
        f"({args.per_shard} samples), quota {args.quota_shards} shards each, capacity "
        f"{args.capacity_shards} shards ({format_size(cap)}), store "
        f"{format_size(args.rate_bytes)}/s, {args.epochs} epochs, loaders fetch "
        f"{args.readahead} shards ahead"
    )
    print(
        f"{'weights':<8}{'tenant':<10}{'max resident':>13}{'quota':>8}{'shards over':>12}"
        f"{'store MiB by epoch':>22}{'held evicted':>13}{'evicted':>9}{'caused':>7}"
    )
    for run in runs:
        wt = ":".join(f"{x:g}" for x in run["weights"])
        for u, t in run["tenants"].items():
            by_epoch = ", ".join(f"{b / MiB:.1f}" for b in t["store_bytes_by_epoch"])
            print(
                f"{wt:<8}{u:<10}{t['max_resident'] / MiB:>9.1f} MiB{t['quota'] / MiB:>8.1f}"
                f"{t['shards_over']:>12.2f}{by_epoch:>22}"
                f"{t['max_held_evicted'] / MiB:>9.1f} MiB{t['evictions_suffered']:>9.0f}"
                f"{t['evictions_caused']:>7.0f}"
            )
        print(
            f"{'':<8}node: charged max {run['max_used'] / MiB:.1f} MiB, files max "
            f"{run['max_disk'] / MiB:.1f} MiB, with evicted files held "
            f"{run['max_disk_with_held'] / MiB:.1f} MiB (capacity {cap / MiB:.1f} MiB)"
        )
    print(
        "fill share while both tenants read their cold first epoch, and in its middle half "
        "(goal: ratio 0.90-1.10)"
    )
    print(
        f"{'weights':<8}{'tenant':<10}{'window s':>9}{'MiB/s':>8}{'share':>8}"
        f"{'weight share':>14}{'ratio':>8}{'middle share':>14}{'ratio':>8}"
    )
    for run in runs:
        wt = ":".join(f"{x:g}" for x in run["weights"])
        for u, t in run["tenants"].items():
            s, m = t["share"], t["steady_share"]
            print(
                f"{wt:<8}{u:<10}{run['window_s']:>9.1f}{s['bytes_per_s'] / MiB:>8.2f}"
                f"{s['share']:>8.3f}{s['weight_share']:>14.3f}{s['ratio']:>8.2f}"
                f"{m['share']:>14.3f}{m['ratio']:>8.2f}"
            )

"""Resuming packed loading on another world size: the states of every rank, merged.

Each rank packs its own documents, so after the same number of steps the ranks have
consumed different numbers of them. The states of all ranks of the old job say exactly
where each stopped; merged, they are one lock-step position (every rank consumed the
fewest any rank did, ``m``) plus what lies beyond it: the documents some rank delivered
past ``m`` (skipped when the new split meets them) and the ones a rank stopped inside
(continued from that token). A pure function of the states and the plan, the same on
every new rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flashfeed.plan.plan import PlanOptions, Segment, Topology, rank_plan

__all__ = ["check_job", "merge_deliveries", "merge_states"]


def _int(state: dict[str, Any], name: str) -> int:
    v = state.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"packed state field {name!r} must be an integer >= 0, got {v!r}")
    return v


def check_job(states: Sequence[dict[str, Any]], agree: Sequence[str]) -> tuple[int, int]:
    """``(world size, ranks per node)`` of the job that saved ``states``: one of each of its
    ranks, agreeing on every field of ``agree`` (saved after the same step)."""
    if not states:
        raise ValueError("resuming on another world size needs the state of every rank, got none")
    first = states[0]
    world = _int(first, "world_size")
    ranks = sorted(_int(s, "rank") for s in states)
    if ranks != list(range(world)):
        raise ValueError(
            f"resuming on another world size needs the state of every one of the {world} "
            f"ranks that saved it, got ranks {ranks}"
        )
    for s in states[1:]:
        for k in agree:
            if s.get(k) != first.get(k):
                raise ValueError(
                    f"the states disagree on {k!r} ({first.get(k)!r} and {s.get(k)!r}): "
                    "they were not saved after the same step of one job"
                )
    return world, _int(first, "ranks_per_node")


def merge_states(
    states: Sequence[dict[str, Any]], shard_sizes: np.ndarray, options: PlanOptions
) -> tuple[dict[str, Any], set[int], dict[int, int]]:
    """``(position state, documents to skip, document -> token to continue at)`` from the
    states of every rank of one job (rank 0 to world_size - 1, saved after the same step)."""
    world, rpn = check_job(
        states, ("epoch", "world_size", "ranks_per_node", "dataset", "prior", "seed")
    )
    first = states[0]
    prior = [Segment(int(a), int(b), int(c)) for a, b, c in first["prior"]]
    taken = [_int(s, "consumed") for s in states]
    m = min(taken)
    shares = [
        rank_plan(
            shard_sizes,
            options=options,
            epoch=_int(s, "epoch"),
            topology=Topology(world, rpn),
            rank=s["rank"],
            segments=prior,
        ).samples
        for s in states
    ]
    skip, resume = merge_deliveries(states, taken, shares)
    segments = [*prior, Segment(world, rpn, m)] if m else prior
    position = dict(first)
    position["segments"] = [[g.world_size, g.ranks_per_node, g.samples_per_rank] for g in segments]
    return position, skip, resume


def merge_deliveries(
    states: Sequence[dict[str, Any]], taken: Sequence[int], shares: Sequence[np.ndarray]
) -> tuple[set[int], dict[int, int]]:
    """``(documents to skip, document -> token to continue at)`` of a job whose ranks took
    ``taken`` documents of their ``shares`` (plan order): what a rank delivered beyond the
    fewest any took, the document each stopped inside, and what the states already carried
    from an earlier resume."""
    m = min(taken)
    skip: set[int] = set()
    resume: dict[int, int] = {}
    for s in states:
        skip.update(int(d) for d in s.get("skip", []))
        resume.update((int(d), int(o)) for d, o in s.get("resume_at", []))
    for s, c, share in zip(states, taken, shares, strict=True):
        skip.update(share[m:c].tolist())
        offset = _int(s, "doc_offset")
        if offset and c < len(share):
            resume[int(share[c])] = offset
    for d in skip:
        resume.pop(d, None)
    return skip, resume

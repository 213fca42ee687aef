"""What one node warms of a target, a dataset or a mixture: its datasets and the
``(dataset number, shard)`` pairs it reads, in order of first need (``share_units``). A
dataset is a mixture of one: every warm (into a cache here, through a node service, on
each node of a cluster) fetches such pairs, one loop for both (``warm.warm_pairs``).

The order is the loader's own: ``NodeShare.order`` for one dataset; for a mixture the same
``MixPlanner`` over the same shard tables, options, topology and batch (a deal is cut to
whole batches when the loader drops a last partial one), node by node, epoch after epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flashfeed.dataset import Dataset
from flashfeed.plan.mixplan import MixPlanner, SourceTable
from flashfeed.plan.mixture import Mixture

from .nodeshare import NodeShare

if TYPE_CHECKING:
    from ..shardcache import ShardCache

__all__ = ["ShareUnits", "mixture_order", "open_sources", "share_units"]


@dataclass(frozen=True)
class ShareUnits:
    """A node's share of a target: its ``datasets``, their ``names`` (a mixture's sources;
    None for one dataset) and the ``(dataset number, shard)`` pairs read, in read order (one
    dataset's with its repeats, epoch after epoch: eviction's look-ahead takes them all)."""

    datasets: tuple[Dataset, ...]
    order: list[tuple[int, int]]
    mixture: Mixture | None = None

    @property
    def names(self) -> tuple[str, ...] | None:
        return None if self.mixture is None else tuple(self.mixture.names)

    def first_needs(self) -> list[tuple[int, int]]:
        """The pairs in order of first need, each once."""
        return list(dict.fromkeys(self.order))


def share_units(
    target: Dataset | Mixture,
    share: NodeShare,
    *,
    batch: int = 1,
    storage_options: dict[str, Any] | None = None,
    cache: ShardCache | None = None,
) -> ShareUnits:
    """``share`` of ``target``: an open dataset, or a mixture whose sources are opened here
    (manifests through ``cache`` when given). ``batch``: the loader's batch size, for a
    mixture's plan."""
    if isinstance(target, Mixture):
        datasets = open_sources(target, storage_options, cache=cache)
        order = mixture_order(target, datasets, share, batch=batch)
        return ShareUnits(tuple(datasets), order, target)
    return ShareUnits((target,), [(0, i) for i in share.order(target)])


def open_sources(
    mixture: Mixture,
    storage_options: dict[str, Any] | None = None,
    *,
    cache: ShardCache | None = None,
) -> list[Dataset]:
    """Every source's dataset (manifests through ``cache`` when given, kept there for
    offline runs); a source that cannot be opened is named."""
    out = []
    for s in mixture.sources:
        try:
            if cache is not None:
                out.append(cache.open_dataset(s.url))
            else:
                out.append(Dataset.open(s.url, storage_options=storage_options))
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"mixture source {s.key!r} ({s.url}) cannot be opened: {exc}"
            ) from None
    return out


def mixture_order(
    mixture: Mixture, datasets: Sequence[Dataset], share: NodeShare, *, batch: int = 1
) -> list[tuple[int, int]]:
    """(source number, shard) pairs this node reads, in order of first need, epoch after
    epoch (each shard once: its first need). ``batch``: the loader's batch size."""
    tables = [
        SourceTable(s.key, str(d.manifest.digest), d.manifest.shard_samples)
        for s, d in zip(mixture.sources, datasets, strict=True)
    ]
    planner = MixPlanner(
        mixture, tables, share.options, batch=batch if share.options.drop_last else 1
    )
    at = planner.start(0, share.topology)
    seen: set[int] = set()
    order: list[tuple[int, int]] = []
    for _ in range(share.epochs):
        for v in planner.node_shard_order(at, share.node_rank):
            if v not in seen:
                seen.add(v)
                s = int(planner.shard_offsets.searchsorted(v, side="right")) - 1
                order.append((s, v - int(planner.shard_offsets[s])))
        at = planner.next_epoch(at)
    return order

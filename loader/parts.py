"""What every flashfeed loader is made of, built in one place.

``Loader``, ``TokenLoader`` and ``ShardDataset`` take the same keywords for the dataset's
storage, this rank's place in the job, the plan options and the telemetry
(``SharedKeywords``). ``loader_parts`` turns them into one frozen ``LoaderParts``, checked
once, and ``PlannedLoader`` takes it whole: each loader adds only its own options.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from flashfeed.dataset import Dataset
from flashfeed.plan.mixture import Mixture, is_mixture_file, load_mixture
from flashfeed.plan.plan import PlanOptions

from .distributed import DistContext, resolve_context
from .mixsource import MixtureDataset, SourceCheck, open_mixture
from .readahead import readahead_budget_bytes
from .sources import CacheShardSource, ShardSource, open_dataset, open_source

__all__ = ["LoaderParts", "SharedKeywords", "Telemetry", "loader_parts", "readahead_shards"]

#: which loader reads which shard format (said when a dataset reaches the wrong one)
_READERS = {
    "webdataset": "Loader or ShardDataset",
    "arrow": "TokenLoader",
    "parquet": "PackedLoader",
    "jsonl": "PackedLoader",
}


class SharedKeywords(TypedDict, total=False):
    """The keywords every loader takes; defaults are those of ``loader_parts``.

    ``cache_dir``/``cache``/``source``/``storage_options``: where shard bytes come from;
    ``rank``/``world_size``/``ranks_per_node``: this process's place in the job (default:
    torch.distributed, then the launcher's environment); ``seed``/``shuffle``/``drop_last``/
    ``window``/``arrival_windows``: the plan (``arrival_windows="all"``: every window of the
    first epoch read front to back in arrival slices, for a faster cold first epoch;
    ``PlanOptions``); ``readahead``/``readahead_budget``: how far ahead of need shards
    are fetched (``"auto"``: from the measured fetch time and batch rate; an int: that many
    shards; never more bytes than the budget, default half the cache up to 4 GiB);
    ``ledger_dir``/``stats_log``/``prometheus_port``/
    ``prometheus_addr``: telemetry; ``dataset_version``: read this version of the dataset
    (a saved state's ``"dataset"``) instead of the one the URL holds now.
    """

    cache_dir: str | None
    rank: int | None
    world_size: int | None
    ranks_per_node: int | None
    seed: int
    shuffle: bool
    drop_last: bool
    window: int
    arrival_windows: str
    readahead: int | str
    readahead_budget: int | str | None
    cache: Any
    source: ShardSource | None
    storage_options: dict[str, Any] | None
    ledger_dir: str | None
    stats_log: str | None
    prometheus_port: int | None
    prometheus_addr: str
    dataset_version: str | None


@dataclass(frozen=True)
class Telemetry:
    """Where a loader reports: the ledger of delivered keys, the stats log, Prometheus
    (``prometheus_addr``: the address it listens on; loopback unless a server elsewhere
    scrapes it)."""

    ledger_dir: str | None = None
    stats_log: str | None = None
    prometheus_port: int | None = None
    prometheus_addr: str = "127.0.0.1"


@dataclass(frozen=True)
class LoaderParts:
    """The shared parts of a loader: dataset, topology, plan options, source, telemetry."""

    dataset: Dataset | MixtureDataset
    ctx: DistContext
    options: PlanOptions
    source: ShardSource
    telemetry: Telemetry
    #: shards fetched ahead of need; None: sized from measurements (``"auto"``)
    readahead: int | None = None
    #: bytes the shards fetched ahead of need may hold at most
    readahead_budget: int = 1 << 30


def loader_parts(
    loader: str,
    dataset: str | Dataset | Mixture | Mapping[str, Any],
    *,
    shard_format: str | tuple[str, ...],
    keywords: Mapping[str, Any],
    mixture_check: SourceCheck | None = None,
) -> LoaderParts:
    """The parts of loader ``loader`` (its class name, for messages) reading ``dataset``,
    whose shards must be ``shard_format``, from the user's ``SharedKeywords``.
    ``mixture_check``: what the loader needs of a mixture's sources, in place of one shard
    format and schema (``shard_format`` then applies to one dataset only)."""
    unknown = sorted(set(keywords) - SharedKeywords.__optional_keys__)
    if unknown:
        raise TypeError(
            f"{loader}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}"
        )
    return _build(
        loader, dataset, shard_format=shard_format, mixture_check=mixture_check, **keywords
    )


def _build(
    loader: str,
    dataset: str | Dataset | Mixture | Mapping[str, Any],
    *,
    shard_format: str | tuple[str, ...],
    mixture_check: SourceCheck | None,
    cache_dir: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    ranks_per_node: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    window: int = 4,
    arrival_windows: str = "first",
    readahead: int | str = "auto",
    readahead_budget: int | str | None = None,
    cache: Any = None,
    source: ShardSource | None = None,
    storage_options: dict[str, Any] | None = None,
    ledger_dir: str | None = None,
    stats_log: str | None = None,
    prometheus_port: int | None = None,
    prometheus_addr: str = "127.0.0.1",
    dataset_version: str | None = None,
) -> LoaderParts:
    """``loader_parts`` with the shared keywords' defaults: the options are checked before
    anything is opened, the source after the dataset (it needs its shard table)."""
    shards_ahead = readahead_shards(readahead)
    telemetry = Telemetry(ledger_dir, stats_log, prometheus_port, prometheus_addr)
    options = PlanOptions(
        seed=seed, shuffle=shuffle, drop_last=drop_last, window=window,
        arrival_windows=arrival_windows,
    )  # fmt: skip
    ctx = resolve_context(rank=rank, world_size=world_size, ranks_per_node=ranks_per_node)
    if isinstance(dataset, Mixture | Mapping) or is_mixture_file(dataset):
        mixture = load_mixture(dataset)  # type: ignore[arg-type]
        mix, routed = open_mixture(
            mixture, storage_options=storage_options, cache_dir=cache_dir, cache=cache,
            check=mixture_check,
        )  # fmt: skip
        if mixture_check is None:
            _check_format(loader, mix.url, mix.manifest.shard_format, shard_format)
        if source is not None:
            raise ValueError(f"{loader}: source= reads one dataset; a mixture routes its own")
        if dataset_version is not None:
            raise ValueError(
                f"{loader}: dataset_version= names one dataset's version; a mixture's state "
                "records each source's dataset"
            )
        budget = readahead_budget_bytes(readahead_budget, routed)
        return LoaderParts(mix, ctx, options, routed, telemetry, shards_ahead, budget)
    ds = open_dataset(
        dataset, storage_options, cache_dir=cache_dir, cache=cache, version=dataset_version
    )
    found = ds.manifest.shard_format
    if found not in _formats(shard_format):
        raise ValueError(
            f"{ds.url} holds {found} shards; {loader} reads {shard_format} shards"
            + (f" (use {_READERS[found]} for {found})" if found in _READERS else "")
        )
    if source is None:
        source = open_source(ds, cache_dir=cache_dir, cache=cache, storage_options=storage_options)
    if isinstance(source, CacheShardSource):  # warns once if warmed for another share
        from flashfeed.cache import check_warm_record

        check_warm_record(source.cache, ds, options, ctx.topology, ctx.node_rank)
    budget = readahead_budget_bytes(readahead_budget, source)
    return LoaderParts(ds, ctx, options, source, telemetry, shards_ahead, budget)


def _formats(shard_format: str | tuple[str, ...]) -> tuple[str, ...]:
    return shard_format if isinstance(shard_format, tuple) else (shard_format,)


def _check_format(loader: str, url: str, found: str, shard_format: str | tuple[str, ...]) -> None:
    if found not in _formats(shard_format):
        raise ValueError(
            f"{url} holds {found} shards; {loader} reads {shard_format} shards"
            + (f" (use {_READERS[found]} for {found})" if found in _READERS else "")
        )


def readahead_shards(readahead: int | str) -> int | None:
    """The ``readahead=`` keyword: None for ``"auto"``, else a shard count >= 0."""
    if readahead == "auto":
        return None
    if isinstance(readahead, bool) or not isinstance(readahead, int) or readahead < 0:
        raise ValueError(f"readahead must be 'auto' or a shard count >= 0, got {readahead!r}")
    return readahead

"""The telemetry a loader leaves behind, defined once for its writers and its readers.

Two formats: the **stats record**, one JSON line per delivered batch in a loader's stats log
(``Loader(stats_log=...)``, read by ``flashfeed report``), and the **status file**, one small
JSON object per running loader (``<root>/.status/rank<R>.<pid>.<n>.json``, read by
``flashfeed top``). The loader writes them through ``StatsRecord.to_json`` and
``RankState.to_json``; ``flashfeed.monitor`` reads them back through ``parse_record`` and
``parse_status``, so a key is spelled in one place. Nothing here needs torch or DALI.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "FORGET_AFTER_S",
    "RECORD_FIELDS",
    "RECORD_OPTIONAL",
    "RECORD_REQUIRED",
    "STATUS_DIRNAME",
    "STATUS_HEADER",
    "STATUS_VERSION",
    "WAIT_KINDS",
    "RankState",
    "RankStatus",
    "StatsRecord",
    "default_cache_dir",
    "local_status_root",
    "parse_record",
    "parse_status",
    "status_dir",
    "status_files",
    "status_object",
]

#: the causes a consumer's wait for its next batch is split into
WAIT_KINDS = ("storage", "decode", "h2d")


@dataclass(frozen=True)
class StatsRecord:
    """One delivered batch as its stats-log line: when (``t``, ``time.time()`` at delivery),
    the rank's position, the consumer's waits by cause and its step time; a
    mixture's samples per source; the cache fills this process had started so far (on the
    lines where the loader read the cache's counters)."""

    t: float
    rank: int
    epoch: int
    batch: int
    samples: int
    storage: float
    decode: float
    h2d: float
    step: float
    sources: Mapping[str, int] = field(default_factory=dict)
    waited_on_storage: bool = False
    cache_fills: int | None = None
    cache_fetched_bytes: int | None = None

    def wait(self, kind: str) -> float:
        """Seconds the consumer waited before this batch on ``kind`` (one of WAIT_KINDS)."""
        return float(getattr(self, kind))

    @property
    def start(self) -> float:
        """When the consumer began waiting for this batch (its waits: ``WAIT_KINDS``)."""
        return self.t - (self.storage + self.decode + self.h2d)

    def to_json(self) -> dict[str, Any]:
        """The log line's object: optional fields only when they hold something."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in RECORD_OPTIONAL and not value and value != 0:
                continue  # an empty ``sources``, no cache counters
            out[f.name] = dict(value) if f.name == "sources" else value
        return out


#: every key a stats record may hold, in the order the loader writes them
RECORD_FIELDS = tuple(f.name for f in fields(StatsRecord))
#: without these a line is not a stats record (hand-written logs may hold only these)
RECORD_REQUIRED = ("t", "samples")
#: keys a loader writes only when they apply (a mixture's sources, a node cache's fills)
RECORD_OPTIONAL = ("sources", "cache_fills", "cache_fetched_bytes")
_WRITTEN = tuple(k for k in RECORD_FIELDS if k not in RECORD_OPTIONAL)


def _count(value: Any, key: str) -> int:
    if type(value) is int and value >= 0:  # what a loader writes: the common case, fast
        return value
    n = float(value)
    if not n.is_integer() or n < 0:
        raise ValueError(f"{key!r} must be a whole count, got {value!r}")
    return int(n)


def parse_record(obj: Any, *, strict: bool = False) -> StatsRecord:
    """A stats record from a log line's object. ``t`` and ``samples`` are required, the rest
    default to 0 (older and hand-written logs); ``strict`` asks for exactly the keys a loader
    writes. A bad record is a ``ValueError`` naming the key."""
    if type(obj) is not dict and not isinstance(obj, Mapping):
        raise ValueError(f"a stats record is a JSON object, got {type(obj).__name__}")
    for k in _WRITTEN if strict else RECORD_REQUIRED:
        if k not in obj:
            raise ValueError(f"missing key {k!r}")
    unknown = sorted(set(obj) - set(RECORD_FIELDS)) if strict else []
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}")
    get = obj.get
    try:
        sources = get("sources") or {}
        if type(sources) is not dict and not isinstance(sources, Mapping):
            raise ValueError(f"'sources' must be an object, got {sources!r}")
        fills, fetched = get("cache_fills"), get("cache_fetched_bytes")
        return StatsRecord(
            float(obj["t"]),
            int(get("rank", 0)),
            int(get("epoch", 0)),
            int(get("batch", 0)),
            _count(obj["samples"], "samples"),
            float(get("storage", 0.0)),
            float(get("decode", 0.0)),
            float(get("h2d", 0.0)),
            float(get("step", 0.0)),
            {str(k): _count(v, "sources") for k, v in sources.items()} if sources else {},
            bool(get("waited_on_storage", False)),
            None if fills is None else _count(fills, "cache_fills"),
            None if fetched is None else _count(fetched, "cache_fetched_bytes"),
        )
    except (TypeError, OverflowError) as exc:
        raise ValueError(str(exc)) from None


# ---- status files ------------------------------------------------------------------------

STATUS_DIRNAME = ".status"
STATUS_VERSION = 1
#: a status file older than this (seconds) belongs to a loader that is gone
FORGET_AFTER_S = 600.0
#: the keys the status writer puts before the rank's state
STATUS_HEADER = ("version", "rank", "pid", "node", "dataset", "updated")


@dataclass(frozen=True)
class RankState:
    """What ``flashfeed top`` shows of one loader: running totals and the position (the
    body of its status file; every field defaults to nothing done yet)."""

    epoch: int = 0
    batch: int = 0
    epoch_samples: int = 0
    batches: int = 0
    samples: int = 0
    elapsed_s: float = 0.0
    #: seconds waited by cause (WAIT_KINDS)
    wait_s: Mapping[str, float] = field(default_factory=dict)
    batches_waited_on_storage: int = 0
    #: a mixture's totals per source: {"samples": n, "storage_s": seconds}
    sources: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: the node cache's room as the loader last measured it: used_bytes, capacity
    cache: Mapping[str, int | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The status file's body: every field in order, ``sources`` only for a mixture."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "sources":
                if not value:
                    continue
                value = {k: dict(v) for k, v in value.items()}
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out


def _float_map(value: Any) -> dict[str, float]:
    return {str(k): float(v or 0.0) for k, v in value.items()}


#: how each ``RankState`` field is read back from a status file (a missing or null key
#: keeps the field's default)
_STATE_READERS: dict[str, Any] = {
    "epoch": int,
    "batch": int,
    "epoch_samples": int,
    "batches": int,
    "samples": int,
    "elapsed_s": float,
    "wait_s": _float_map,
    "batches_waited_on_storage": int,
    "sources": lambda v: {str(name): _float_map(per) for name, per in v.items()},
    "cache": lambda v: {str(k): None if n is None else int(n) for k, n in v.items()},
}


@dataclass(frozen=True)
class RankStatus:
    """One loader's status file as read back: who wrote it, when, and its state."""

    path: str
    rank: int
    pid: int
    node: str
    dataset: str
    updated: float
    state: RankState

    def total(self, key: str) -> float:
        """A running total or position field of the state (``samples``, ``epoch``...)."""
        return float(getattr(self.state, key) or 0)

    def wait(self, kind: str) -> float:
        return float(self.state.wait_s.get(kind, 0.0) or 0.0)


def status_object(
    *, rank: int, pid: int, node: str, dataset: str, updated: float, state: Mapping[str, Any]
) -> dict[str, Any]:
    """A status file's object: the header (``STATUS_HEADER``), then the rank's state
    (``RankState.to_json``)."""
    header = (STATUS_VERSION, rank, pid, node, dataset, updated)
    return {**dict(zip(STATUS_HEADER, header, strict=True)), **state}


def parse_status(data: Any, path: str) -> RankStatus:
    """A status file's object; ``rank``, ``pid`` and ``updated`` are required, the state's
    fields default. Anything else is a ``ValueError``, ``KeyError`` or ``TypeError``."""
    if not isinstance(data, Mapping):
        raise TypeError(f"a status file holds a JSON object, got {type(data).__name__}")
    state = RankState(
        **{
            name: read(data[name])
            for name, read in _STATE_READERS.items()
            if data.get(name) is not None
        }
    )
    return RankStatus(
        path=path,
        rank=int(data["rank"]),
        pid=int(data["pid"]),
        node=str(data.get("node", "")),
        dataset=str(data.get("dataset", "")),
        updated=float(data["updated"]),
        state=state,
    )


def status_dir(root: str) -> str:
    """Where the loaders using ``root`` (a node cache, or the runtime directory) keep their
    status files."""
    return os.path.join(root, STATUS_DIRNAME)


#: the variable naming a node's cache directory, on every node
CACHE_DIR_ENV = "FLASHFEED_CACHE_DIR"


def default_cache_dir() -> str:
    """The node cache used when none is given, by loaders, ``cache`` commands, cluster warms
    and ``flashfeed top`` alike: ``$FLASHFEED_CACHE_DIR``, else ``~/.cache/flashfeed``."""
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "flashfeed"
    )


def local_status_root() -> str:
    """Where loaders without a node cache keep their status files (in its ``.status``):
    ``$FLASHFEED_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/flashfeed``, else
    ``<temp dir>/flashfeed-<uid>``. Per user, as the files a loader writes are."""
    explicit = os.environ.get("FLASHFEED_RUNTIME_DIR")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "flashfeed")
    return os.path.join(tempfile.gettempdir(), f"flashfeed-{os.getuid()}")


def status_files(root: str) -> list[RankStatus]:
    """Every readable status file under ``root``, dead loaders' included, by rank and pid.
    Files being replaced, unreadable or of another format are skipped."""
    d = status_dir(root)
    try:
        names = sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        if not name.startswith("rank") or not name.endswith(".json"):
            continue
        path = os.path.join(d, name)
        try:
            with open(path, encoding="utf-8") as f:
                out.append(parse_status(json.load(f), path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    out.sort(key=lambda s: (s.rank, s.pid))
    return out

"""A mixture: several datasets read as one, each with a weight, the weights on a schedule.

A ``Mixture`` is a value, like ``PlanOptions``: its sources (dataset URLs or local paths),
their relative weights, a weight schedule (piecewise constant changes and linear ramps at
given global sample counts) and the length of one epoch. ``flashfeed.plan.mixplan`` turns it into
each rank's order; ``load_mixture`` reads its file form (JSON, or YAML when PyYAML is
installed)::

    {"sources": [{"url": "s3://b/web/", "weight": 3, "name": "web"},
                 {"url": "s3://b/code/", "weight": 1}],
     "schedule": [{"at": 1000000, "weights": {"web": 1, "code": 1}, "ramp": 200000}],
     "length": 5000000}

Every bad value is one ``ValueError`` naming it, raised where the value is built.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Change", "Mixture", "Source", "load_mixture"]


def _weight(what: str, value: object, *, zero: bool = False) -> float:
    """A finite weight > 0 (or >= 0 with ``zero``), or one error naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{what} must be a number, got {value!r}")
    w = float(value)
    if not math.isfinite(w) or w < 0 or (w == 0 and not zero):
        need = ">= 0" if zero else "> 0"
        raise ValueError(f"{what} must be a finite number {need}, got {value!r}")
    return w


def _count(what: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")
    return int(value)


def _default_name(url: str) -> str:
    tail = url.rstrip("/").rsplit("/", 1)[-1]
    return tail or url


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture: its ``url`` (fsspec URL or local path), its relative
    ``weight`` (> 0, finite) and its ``name`` (default: the URL's last part), unique in the
    mixture: keys, ledgers, schedules and resume states speak of sources by name."""

    url: str
    weight: float = 1.0
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ValueError(f"a mixture source's url must be a non-empty string, got {self.url!r}")
        name = _default_name(self.url) if self.name is None else self.name
        if not isinstance(name, str) or not name or ":" in name or "/" in name:
            raise ValueError(
                f"source name must be a non-empty string without ':' or '/', got {name!r}"
            )
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "weight", _weight(f"weight of source {name!r}", self.weight))

    @property
    def key(self) -> str:
        return str(self.name)


@dataclass(frozen=True)
class Change:
    """From global sample ``at`` on, the weights move to ``weights`` (source name -> weight;
    a source not named keeps its weight): at once (``ramp=0``, piecewise constant) or
    linearly over the next ``ramp`` samples. A schedule weight may be 0 (a source off)."""

    at: int
    weights: Mapping[str, float]
    ramp: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _count("schedule change 'at'", self.at, low=0))
        object.__setattr__(self, "ramp", _count("schedule change 'ramp'", self.ramp, low=0))
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ValueError(
                f"schedule change at {self.at}: weights must be a non-empty mapping of source "
                f"name to weight, got {self.weights!r}"
            )
        clean = {
            str(k): _weight(f"schedule weight of {k!r} at {self.at}", v, zero=True)
            for k, v in self.weights.items()
        }
        object.__setattr__(self, "weights", dict(sorted(clean.items())))

    def __hash__(self) -> int:
        return hash((self.at, self.ramp, tuple(self.weights.items())))


@dataclass(frozen=True)
class Mixture:
    """Datasets read as one, by weight.

    ``sources``: ``Source`` values (or URLs, weight 1); ``schedule``: ``Change`` values in
    order of ``at``, none starting before the previous ramp ends; the epoch's length: ``length``
    global samples, or ``until`` a named source's every sample was read once (default: as
    many samples as all sources hold together).
    """

    sources: tuple[Source, ...]
    schedule: tuple[Change, ...] = ()
    length: int | None = None
    until: str | None = None
    origin: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.sources, str | Source) or not isinstance(self.sources, Sequence):
            raise ValueError(f"sources must be a list of sources, got {self.sources!r}")
        sources = tuple(s if isinstance(s, Source) else _as_source(s) for s in self.sources)
        if not sources:
            raise ValueError("a mixture needs at least one source, got an empty source list")
        _unique(sources)
        object.__setattr__(self, "sources", sources)
        names = [s.key for s in sources]
        changes = tuple(c if isinstance(c, Change) else _as_change(c) for c in self.schedule)
        end = -1
        for c in changes:
            unknown = sorted(set(c.weights) - set(names))
            if unknown:
                raise ValueError(
                    f"schedule change at {c.at} names unknown source(s) {unknown}; the sources "
                    f"are {names}"
                )
            if c.at < end:
                raise ValueError(
                    f"schedule change at {c.at} starts before the previous one ends ({end}): "
                    "changes must be in order and must not overlap"
                )
            end = c.at + c.ramp
        object.__setattr__(self, "schedule", changes)
        self._check_schedule_weights()
        if self.length is not None and self.until is not None:
            raise ValueError(
                f"give an epoch length or until=, not both (length={self.length}, "
                f"until={self.until!r})"
            )
        if self.length is not None:
            object.__setattr__(self, "length", _count("mixture length", self.length, low=1))
        if self.until is not None and self.until not in names:
            raise ValueError(f"until={self.until!r} is not a source of this mixture ({names})")

    def _check_schedule_weights(self) -> None:
        current = dict(zip(self.names, self.weights, strict=True))
        for c in self.schedule:
            current.update(c.weights)
            if sum(current.values()) <= 0:
                raise ValueError(f"schedule change at {c.at} turns every source off")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.key for s in self.sources)

    @property
    def weights(self) -> np.ndarray:
        """The starting weights, normalised to sum 1."""
        w = np.array([s.weight for s in self.sources], dtype=np.float64)
        return w / w.sum()

    def source(self, name: str) -> Source:
        for s in self.sources:
            if s.key == name:
                return s
        raise ValueError(f"no source named {name!r} in this mixture ({list(self.names)})")

    def knots(self) -> tuple[np.ndarray, np.ndarray]:
        """The weight curve as knots: global sample counts (non-decreasing; a jump is two
        knots at one count) and the normalised weights there, one row per knot, linear
        between knots and constant after the last."""
        xs, rows = [0], [self.weights]
        current = dict(zip(self.names, (s.weight for s in self.sources), strict=True))
        for c in self.schedule:
            xs.append(c.at)
            rows.append(rows[-1])
            current.update(c.weights)
            w = np.array([current[n] for n in self.names], dtype=np.float64)
            xs.append(c.at + c.ramp)
            rows.append(w / w.sum())
        return np.asarray(xs, dtype=np.float64), np.vstack(rows)

    def to_dict(self) -> dict[str, Any]:
        """The file form (``load_mixture`` reads it back)."""
        out: dict[str, Any] = {
            "sources": [{"url": s.url, "weight": s.weight, "name": s.name} for s in self.sources]
        }
        if self.schedule:
            out["schedule"] = [
                {"at": c.at, "weights": dict(c.weights), "ramp": c.ramp} for c in self.schedule
            ]
        if self.length is not None:
            out["length"] = self.length
        if self.until is not None:
            out["until"] = self.until
        return out

    @property
    def digest(self) -> str:
        """Names, weights, schedule and length: what a resume state records of the mix."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Mixture:
        """A mixture file (``.json``, or ``.yaml``/``.yml`` with PyYAML): relative source
        paths are taken from the file's folder."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read mixture file {str(p)!r}: {exc}") from None
        if p.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ValueError(
                    f"mixture file {str(p)!r} is YAML: install pyyaml, or write it as JSON"
                ) from None
            try:
                raw = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ValueError(f"mixture file {str(p)!r} is not valid YAML: {exc}") from None
        else:
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"mixture file {str(p)!r} is not valid JSON: {exc}") from None
        try:
            return from_dict(raw, base=p.parent.resolve(), origin=str(p))
        except ValueError as exc:
            raise ValueError(f"mixture file {str(p)!r}: {exc}") from None


_TOP_KEYS = {"sources", "schedule", "length", "until"}
_SOURCE_KEYS = {"url", "weight", "name"}
_CHANGE_KEYS = {"at", "weights", "ramp"}


def _strict(what: str, raw: object, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a mapping, got {raw!r}")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{what} has unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(raw))
    if missing:
        raise ValueError(f"{what} lacks key(s) {missing}")
    return raw


def _as_source(raw: object, base: Path | None = None) -> Source:
    if isinstance(raw, str):
        return Source(raw)
    d = _strict("a source", raw, _SOURCE_KEYS, {"url"})
    url = d["url"]
    relative = isinstance(url, str) and url.strip() and "://" not in url
    if base is not None and relative and not os.path.isabs(url):
        url = str(base / url)
    return Source(url, d.get("weight", 1.0), d.get("name"))


def _as_change(raw: object) -> Change:
    d = _strict("a schedule change", raw, _CHANGE_KEYS, {"at", "weights"})
    return Change(d["at"], d["weights"], d.get("ramp", 0))


def _unique(sources: Sequence[Source]) -> None:
    seen_names: dict[str, Source] = {}
    seen_urls: dict[str, Source] = {}
    for s in sources:
        url = s.url.rstrip("/")
        if url in seen_urls:
            raise ValueError(f"source {s.url!r} appears twice in the mixture")
        if s.key in seen_names:
            raise ValueError(
                f"two sources are named {s.key!r} ({seen_names[s.key].url} and {s.url}): "
                "give each a distinct name"
            )
        seen_names[s.key], seen_urls[url] = s, s


def from_dict(raw: object, *, base: Path | None = None, origin: str | None = None) -> Mixture:
    """A mixture from its file form, every key checked."""
    d = _strict("the mixture", raw, _TOP_KEYS, {"sources"})
    sources = d["sources"]
    if not isinstance(sources, list):
        raise ValueError(f"'sources' must be a list, got {sources!r}")
    schedule = d.get("schedule", [])
    if not isinstance(schedule, list):
        raise ValueError(f"'schedule' must be a list, got {schedule!r}")
    return Mixture(
        tuple(_as_source(s, base) for s in sources),
        tuple(_as_change(c) for c in schedule),
        length=d.get("length"),
        until=d.get("until"),
        origin=origin,
    )


def load_mixture(value: Mixture | str | os.PathLike[str] | Mapping[str, Any]) -> Mixture:
    """A ``Mixture`` as given, read from a file path, or built from its file form's dict."""
    if isinstance(value, Mixture):
        return value
    if isinstance(value, Mapping):
        return from_dict(dict(value))
    if isinstance(value, str | os.PathLike):
        return Mixture.from_file(value)
    raise ValueError(f"a mixture must be a Mixture, a file path or a dict, got {value!r}")


def is_mixture_file(value: object) -> bool:
    """A path that names a mixture file (by its suffix), not a dataset."""
    return isinstance(value, str | os.PathLike) and str(value).endswith((".json", ".yaml", ".yml"))

"""The one reader of loaders' stats logs (``Loader(stats_log=...)``: a JSON line per batch,
``flashfeed.telemetry.StatsRecord``), for the text report, the PNG and the HTML page.

A log is read whole and each line checked against the schema. ``read_stats_log`` takes one
log at its word: a line that is not a record is an error naming it. ``read_run`` reads a run
directory (one log per rank) the way a partial run needs: a log cut off mid-line (a rank
killed while writing), an empty log, lines that are not records each become a note in
``Run.problems``, never a crash.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from flashfeed.errors import FlashfeedError
from flashfeed.telemetry import StatsRecord, parse_record

__all__ = [
    "LogLine",
    "Run",
    "RunError",
    "as_records",
    "log_lines",
    "read_records",
    "read_run",
    "read_stats_log",
]


class RunError(FlashfeedError, ValueError):
    """A run directory that holds nothing to report (the command exits 1, naming why)."""


class LogLine(NamedTuple):
    """One non-blank line of a log: its record, or why it is not one; ``last`` when it is
    the final line and no newline follows it (written mid-record)."""

    lineno: int
    record: StatsRecord | None
    error: str
    last: bool


def log_lines(data: bytes) -> Iterator[LogLine]:
    """The lines of a log's bytes, each parsed through the stats-record schema."""
    lines = data.split(b"\n")
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = lineno == len(lines)  # the split leaves b"" last after a final newline
        try:
            yield LogLine(lineno, parse_record(json.loads(raw)), "", last)
        except ValueError as exc:  # JSON, UTF-8 and schema errors alike
            yield LogLine(lineno, None, str(exc), last)


def as_records(records: Iterable[StatsRecord | Mapping[str, Any]]) -> list[StatsRecord]:
    """Records as read, or their JSON objects (a benchmark's saved records), as records."""
    return [r if type(r) is StatsRecord else parse_record(r) for r in records]


def read_records(path: str) -> list[StatsRecord]:
    """The per-batch records of one stats log, in the file's order; a malformed line is a
    ``ValueError`` naming it."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    for line in log_lines(data):
        if line.record is None:
            raise ValueError(f"{path}:{line.lineno}: not a loader stats record ({line.error})")
        out.append(line.record)
    if not out:
        raise ValueError(f"{path}: no batches recorded")
    return out


def read_stats_log(path: str) -> list[dict[str, Any]]:
    """``read_records`` as JSON objects (the schema's keys), for scripts that keep them."""
    return [r.to_json() for r in read_records(path)]


@dataclass
class Run:
    """The batches of a run by rank (each rank's in time order), and what was wrong with
    its logs."""

    path: str
    ranks: dict[int, list[StatsRecord]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _read_rank_log(path: str, run: Run) -> None:
    name = os.path.basename(path)
    with open(path, "rb") as f:
        data = f.read()
    if not data.strip():
        run.problems.append(f"{name}: empty: this rank never recorded a batch")
        return
    bad = 0
    for line in log_lines(data):
        if line.record is not None:
            run.ranks.setdefault(line.record.rank, []).append(line.record)
        elif line.last:
            run.problems.append(
                f"{name}: the last line is cut off mid-record (the rank was still writing "
                "or was killed); the batches before it are counted"
            )
        else:
            bad += 1
    if bad:
        run.problems.append(f"{name}: {bad} line(s) are not loader stats records; skipped")


def read_run(run_dir: str) -> Run:
    """Every ``*.jsonl`` stats log under ``run_dir`` (not recursive), grouped by rank."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(
            f"{run_dir}: no such run directory: give the directory of the loaders' stats "
            "logs (or one log file without --html)"
        )
    logs = sorted(n for n in os.listdir(run_dir) if n.endswith(".jsonl"))
    if not logs:
        raise RunError(
            f"{run_dir} holds no stats logs (*.jsonl): point the loaders' stats_log= at files "
            "in this directory (one per rank), then report on it"
        )
    run = Run(run_dir)
    for name in logs:
        try:
            _read_rank_log(os.path.join(run_dir, name), run)
        except OSError as exc:
            run.problems.append(f"{name}: unreadable ({exc.strerror or exc})")
    if not run.ranks:
        raise RunError(
            f"{run_dir}: none of its {len(logs)} stats log(s) holds a batch yet: "
            + "; ".join(run.problems)
        )
    for recs in run.ranks.values():
        recs.sort(key=lambda r: r.t)
    return run

"""The one results writer: JSON written whole (temp file + rename, so a reader never sees half
a result), and a suite run's files in ``benchmarks/results`` (JSON, plots, the Markdown of its
tables) with the table it prints."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.child import REPO

__all__ = ["RESULTS", "RunFiles", "result_stem", "write_json", "write_run"]

#: where the suite's results live (JSON, Markdown, plots)
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class RunFiles:
    """What ``write_run`` wrote, and the table to print."""

    json: Path
    pngs: tuple[Path, ...]
    table: str


def write_json(path: str | os.PathLike[str], data: Any, *, indent: int | None = 1) -> Path:
    """``data`` as JSON at ``path`` (parents made), all or nothing."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    os.replace(tmp, out)
    return out


def result_stem(started: dt.datetime, profile: str, device: str) -> str:
    """``<date>-<host>[-<profile>][-<device>]``: the full CPU run has neither suffix."""
    suffix = "" if profile == "full" else f"-{profile}"
    suffix += "" if device == "cpu" else f"-{device}"
    return f"{started:%Y-%m-%d}-{platform.node()}{suffix}"


def write_run(result: dict[str, Any], results: str | os.PathLike[str], stem: str) -> RunFiles:
    """A suite run as ``<stem>.json``, its plots and ``<stem>.md`` (machine, tables) in
    ``results``; the table is what the suite prints."""
    from benchmarks import plots, report
    from benchmarks.page import fillcpu_section

    folder = Path(results)
    json_path = write_json(folder / f"{stem}.json", result)
    pngs = plots.write_all(result, folder, stem)
    table = report.markdown(result)
    fill = fillcpu_section(result)
    md = report.machine_markdown(result) + "\n" + table + ("\n" + fill if fill else "")
    (folder / f"{stem}.md").write_text(md)
    return RunFiles(json_path, tuple(pngs), table)

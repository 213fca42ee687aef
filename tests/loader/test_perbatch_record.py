"""The per-batch stats path (``StatsRecorder.add``, no ``BatchTiming`` unless read) accounts
exactly as ``record`` does: totals, per-batch entries, log lines, and the status file once
due; a real loader's feeder reports the bytes ahead of need as the sum over those shards."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flashfeed.loader.telemetry.stats import BatchTiming, StatsRecorder

TIMINGS = [
    BatchTiming(
        t=10.0 + i,
        rank=1,
        epoch=i // 3,
        batch=i % 3,
        samples=4 + i,
        storage=0.002 * (i % 2),
        decode=0.01 * i,
        h2d=0.001,
        step=0.1 + i,
        sources=(("a", 2), ("b", 2 + i)),
    )
    for i in range(7)
]


def _feed(rec: StatsRecorder, *, fast: bool) -> dict:
    for t in TIMINGS:
        if fast:
            rec.add(t.t, t.rank, t.epoch, t.batch, t.samples, t.storage, t.decode, t.h2d,
                    t.step, t.sources)  # fmt: skip
        else:
            rec.record(t)
    out = rec.summary()
    out["sources"] = rec.sources
    out["status"] = rec.status()
    rec.close()
    return out


def test_add_accounts_as_record_does(tmp_path: Path) -> None:
    logs = {fast: tmp_path / f"log-{fast}.jsonl" for fast in (False, True)}
    got = {fast: _feed(StatsRecorder(rank=1, log=str(logs[fast])), fast=fast) for fast in logs}
    assert got[True] == got[False]
    lines = {fast: logs[fast].read_text().splitlines() for fast in logs}
    assert len(lines[True]) == len(TIMINGS) and lines[True] == lines[False]
    first = json.loads(lines[True][1])
    assert first["samples"] == 5 and first["waited_on_storage"] is True
    per_batch = got[True]["per_batch"]
    assert [(b["epoch"], b["batch"]) for b in per_batch] == [(i // 3, i % 3) for i in range(7)]
    assert [b["waited_on_storage"] for b in per_batch] == [bool(i % 2) for i in range(7)]
    assert got[True]["samples"] == sum(t.samples for t in TIMINGS)
    assert got[True]["wait_s"]["decode"] == pytest.approx(sum(t.decode for t in TIMINGS))
    assert got[True]["sources"]["b"]["samples"] == sum(2 + i for i in range(7))


def test_status_file_written_once_due(tmp_path: Path) -> None:
    rec = StatsRecorder(rank=0, status_dir=str(tmp_path), status_interval=0.05)
    status = rec._status
    assert status is not None
    t = TIMINGS[0]
    rec.add(t.t, 0, 0, 0, 4, 0.0, 0.0, 0.0, 0.0)
    assert json.loads(Path(status.path).read_text())["batches"] == 1
    rec.add(t.t, 0, 0, 1, 4, 0.0, 0.0, 0.0, 0.0)  # not due yet: the file stays
    assert json.loads(Path(status.path).read_text())["batches"] == 1
    time.sleep(0.1)
    rec.add(t.t, 0, 0, 2, 4, 0.0, 0.0, 0.0, 0.0)
    state = json.loads(Path(status.path).read_text())
    assert state["batches"] == 3 and state["batch"] == 2
    rec.close()

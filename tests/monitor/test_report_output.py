"""``flashfeed report``'s text is a contract (scripts grep it): on a fixed run it prints what
it printed before the monitor had its own package, line for line."""

from __future__ import annotations

import json
import random
from pathlib import Path

from flashfeed.cli import main as cli_main


def _fixed_run(d: Path) -> None:
    """Three ranks of 120 batches (seeded waits), rank 1 a mixture's, rank 2 cut mid-record,
    rank 3 empty."""
    rng = random.Random(3)
    for rank in (0, 1, 2):
        t, fills, lines = 100.0 + rank * 0.3, 0, []
        for b in range(120):
            w = [rng.random() * 0.01 for _ in range(3)]
            t += 0.05 + sum(w)
            fills += rng.random() < 0.2
            rec = {"t": t, "rank": rank, "epoch": b // 60, "batch": b % 60, "samples": 8,
                   "storage": w[0], "decode": w[1], "h2d": w[2], "step": 0.01}  # fmt: skip
            if rank == 1:
                rec["sources"] = {"x": 5, "y": 3}
            rec["waited_on_storage"] = w[0] > 0.001
            if rank != 2:
                rec["cache_fills"], rec["cache_fetched_bytes"] = fills, fills * 1000
            lines.append(json.dumps(rec) + "\n")
        (d / f"rank{rank}.jsonl").write_text("".join(lines) + ('{"t": 1' if rank == 2 else ""))
    (d / "rank3.jsonl").write_text("")


def test_the_run_summary_is_unchanged(tmp_path, capsys):
    _fixed_run(tmp_path)
    assert cli_main(["report", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "rank 0: 120 batches, 960 samples in 7.8 s: 123 samples/s",
        "rank 0: waiting: storage 8.1%, decode 7.6%, h2d 7.8%",
        "rank 1: 120 batches, 960 samples in 7.7 s: 125 samples/s",
        "rank 1: waiting: storage 7.9%, decode 7.0%, h2d 7.8%",
        "rank 1: sources: x 600 (62.5%, storage 0.38 s), y 360 (37.5%, storage 0.23 s)",
        "rank 2: 120 batches, 960 samples in 7.7 s: 124 samples/s",
        "rank 2: waiting: storage 7.7%, decode 7.7%, h2d 7.5%",
    ]
    assert err.splitlines() == [
        "flashfeed report: note: rank2.jsonl: the last line is cut off mid-record (the rank "
        "was still writing or was killed); the batches before it are counted",
        "flashfeed report: note: rank3.jsonl: empty: this rank never recorded a batch",
    ]


def test_one_log_and_a_bad_line_are_unchanged(tmp_path, capsys):
    _fixed_run(tmp_path)
    assert cli_main(["report", str(tmp_path / "rank1.jsonl")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "120 batches, 960 samples in 7.7 s: 125 samples/s",
        "waiting: storage 7.9%, decode 7.0%, h2d 7.8%",
        "sources: x 600 (62.5%, storage 0.38 s), y 360 (37.5%, storage 0.23 s)",
    ]
    assert cli_main(["report", str(tmp_path / "rank2.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"flashfeed report: error: {tmp_path / 'rank2.jsonl'}:121: not a loader stats record "
        "(Expecting ',' delimiter: line 1 column 8 (char 7))"
    )

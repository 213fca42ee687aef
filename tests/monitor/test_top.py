"""``flashfeed top``: per-rank status files, the node cache line, and a real terminal."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flashfeed.cli import main as cli_main
from flashfeed.loader.telemetry.status import StatusWriter
from flashfeed.monitor.status import read_statuses, status_dir
from flashfeed.monitor.top import TopView

from support.monitor_helpers import running_ranks, wait_for

TMUX = shutil.which("tmux")
FLASHFEED = str(Path(sys.executable).with_name("flashfeed"))
ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%\s+(\d+)\s+(\d+)"
)


@pytest.fixture(autouse=True)
def _own_runtime_dir(tmp_path, monkeypatch):
    """Loaders reading local data keep status files in the user's runtime directory, which
    top also shows: each test here gets its own, so other loaders on the machine stay out."""
    monkeypatch.setenv("FLASHFEED_RUNTIME_DIR", str(tmp_path / "runtime"))


def rows(text: str) -> dict[int, tuple[str, ...]]:
    """rank -> the numbers of its row, from a frame of ``flashfeed top``."""
    out = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            out[int(m.group(1))] = (*m.groups()[1:], line.split("POSITION")[-1])
    return out


def test_an_empty_cache_dir_says_no_loader_runs(tmp_path, capsys):
    assert cli_main(["top", "--cache-dir", str(tmp_path), "--iterations", "1"]) == 1
    out = capsys.readouterr().out
    assert f"no loader status files in {status_dir(str(tmp_path))}" in out
    assert "cache_dir=" in out


def test_a_missing_cache_dir_is_one_clear_error(tmp_path, capsys):
    assert cli_main(["top", "--cache-dir", str(tmp_path / "nope"), "--iterations", "1"]) == 1
    err = capsys.readouterr().err
    assert "no cache directory at" in err and "--cache-dir" in err


def test_bad_interval_is_refused(tmp_path, capsys):
    assert cli_main(["top", "--cache-dir", str(tmp_path), "--interval", "0"]) == 2
    assert "--interval must be > 0" in capsys.readouterr().err


def test_status_files_are_replaced_whole_and_removed_on_close(tmp_path):
    w = StatusWriter(str(tmp_path), rank=3, dataset="ds", interval=0.0)
    assert w.write(lambda: {"samples": 8, "epoch": 1})
    assert w.write(lambda: {"samples": 16, "epoch": 1})
    names = os.listdir(status_dir(str(tmp_path)))
    assert names == [os.path.basename(w.path)]  # no temporary file left behind
    (st,) = read_statuses(str(tmp_path))
    assert (st.rank, st.pid, st.total("samples"), st.dataset) == (3, os.getpid(), 16, "ds")
    w.close()
    assert read_statuses(str(tmp_path)) == []


def test_a_dead_rank_is_not_shown(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.makedirs(status_dir(str(tmp_path)))
    body = {"rank": 0, "pid": dead.pid, "node": socket.gethostname(), "updated": time.time()}
    Path(status_dir(str(tmp_path)), f"rank0.{dead.pid}.json").write_text(json.dumps(body))
    assert read_statuses(str(tmp_path)) == []
    assert [s.pid for s in read_statuses(str(tmp_path), include_dead=True)] == [dead.pid]
    StatusWriter(str(tmp_path), rank=0)  # a new loader on the node sweeps it
    assert read_statuses(str(tmp_path), include_dead=True) == []


def test_frames_of_two_ranks_from_their_loaders(tmp_path):
    with running_ranks(tmp_path) as run:
        wait_for("both status files", lambda: len(read_statuses(run.cache_dir)) == 2)
        view = TopView(run.cache_dir)
        first = "\n".join(view.frame())
        wait_for(
            "the ranks to move on",
            lambda: all(
                s.total("samples") > 0 and s.updated > time.time() - 5
                for s in read_statuses(run.cache_dir)
            ),
        )
        time.sleep(2)
        second = "\n".join(view.frame())
    assert set(rows(first)) == set(rows(second)) == {0, 1}, second
    assert "cache: hit" in second and "GB/s" in second and "used" in second
    for rank in (0, 1):
        assert rows(first)[rank] != rows(second)[rank], (first, second)


@pytest.mark.skipif(TMUX is None, reason="tmux not installed (apt-get install tmux)")
def test_top_in_a_real_terminal_shows_both_ranks_updating(tmp_path):
    sock = str(tmp_path / f"tmux-{uuid.uuid4().hex[:8]}")
    tmux = [TMUX, "-S", sock]
    with running_ranks(tmp_path) as run:
        wait_for("both status files", lambda: len(read_statuses(run.cache_dir)) == 2)
        # the pane's command ends by itself: nothing outlives a killed test run for long
        command = f"timeout 300 {FLASHFEED} top --cache-dir {run.cache_dir} --interval 0.5"
        env = {**os.environ, "TERM": "xterm"}
        subprocess.run(
            [*tmux, "new-session", "-d", "-x", "160", "-y", "20", command], check=True, env=env
        )
        try:

            def capture() -> str:
                return subprocess.run(
                    [*tmux, "capture-pane", "-p"], capture_output=True, text=True, check=True
                ).stdout

            first = wait_for("both rows in the pane", lambda: (t := capture()) and
                             len(rows(t)) == 2 and t)  # fmt: skip
            second = wait_for(
                "the rows to change", lambda: (t := capture()) and len(rows(t)) == 2 and
                all(rows(t)[r] != rows(first)[r] for r in (0, 1)) and t
            )  # fmt: skip
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert "flashfeed top" in first.splitlines()[0]  # refreshed in place: the header on top
    assert first.count("flashfeed top") == 1 and second.count("flashfeed top") == 1
    assert set(rows(second)) == {0, 1}
    assert "cache: hit" in second


def test_two_loaders_of_one_rank_keep_a_row_each(tmp_path):
    train = StatusWriter(str(tmp_path), rank=0, dataset="s3://b/train", interval=0.0)
    val = StatusWriter(str(tmp_path), rank=0, dataset="s3://b/val", interval=0.0)
    for w, n in ((train, 64), (val, 8)):
        w.write(lambda n=n: {"samples": n, "elapsed_s": 1.0, "epoch": 0, "batch": 3})
    frame = TopView(str(tmp_path)).frame()
    mine = [line for line in frame if ROW.match(line)]
    assert len(mine) == 2, frame
    assert mine[0].endswith("s3://b/train") and mine[1].endswith("s3://b/val"), frame
    val.close()
    assert [s.dataset for s in read_statuses(str(tmp_path))] == ["s3://b/train"]

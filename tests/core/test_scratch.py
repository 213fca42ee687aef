"""Scratch folders (the loader's pass folders in /dev/shm, an embedded Ray's session folder
in /tmp): only their owner removes them, a forked child never removes its parent's, and a
folder whose owner was killed is swept by the next folder made with the same prefix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from flashfeed.loader.image.dali_runner import PASS_PREFIX
from flashfeed.runtime.lifeline import process_start
from flashfeed.runtime.scratch import make_owned_dir, remove_owned, sweep_orphans

from support.loader_helpers import stub_runner

PREFIX = "fftest-"


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])


def _folder(base: Path, pid: int, start: str) -> Path:
    path = base / f"{PREFIX}{pid}-{start}-abcd1234"
    path.mkdir()
    (path / "pass-0.npz").write_bytes(b"x")
    return path


def test_a_killed_owners_folder_is_swept_and_a_running_owners_is_kept(tmp_path: Path) -> None:
    live, dead = _sleeper(), _sleeper()
    try:
        deadline = time.monotonic() + 10
        while not (process_start(live.pid) and process_start(dead.pid)):
            assert time.monotonic() < deadline, "the children never showed in /proc"
            time.sleep(0.01)
        kept = _folder(tmp_path, live.pid, str(process_start(live.pid)))
        orphan = _folder(tmp_path, dead.pid, str(process_start(dead.pid)))
        dead.kill()
        dead.wait()
        made = make_owned_dir(PREFIX, str(tmp_path))
        assert not orphan.exists()
        assert kept.exists() and (kept / "pass-0.npz").exists()
        assert os.path.basename(made).startswith(f"{PREFIX}{os.getpid()}-")
        assert sweep_orphans(str(tmp_path), PREFIX) == []  # our own folder is ours: kept
    finally:
        live.kill()
        live.wait()
    assert sweep_orphans(str(tmp_path), PREFIX) == [str(kept)]


def test_a_pid_that_now_names_another_process_is_not_the_owner(tmp_path: Path) -> None:
    mine = process_start(os.getpid())
    assert mine and mine.isdigit()
    reused = _folder(tmp_path, os.getpid(), str(int(mine) + 1))  # same pid, other start
    ours = _folder(tmp_path, os.getpid(), mine)
    assert sweep_orphans(str(tmp_path), PREFIX) == [str(reused)]
    assert ours.exists()


def test_folders_of_unknown_owners_and_other_names_are_left_alone(tmp_path: Path) -> None:
    old = tmp_path / f"{PREFIX}k2j4h1x0"  # an older flashfeed's name: owner unknown
    other = tmp_path / "someone-else-1-2-3"
    old.mkdir()
    other.mkdir()
    assert sweep_orphans(str(tmp_path), PREFIX) == []
    assert old.exists() and other.exists()


def test_a_forked_child_never_removes_its_parents_folder(tmp_path: Path) -> None:
    path = make_owned_dir(PREFIX, str(tmp_path))
    pid = os.fork()
    if pid == 0:  # the child: what a DALI reader or torch worker holding the loader does
        try:
            remove_owned(path, PREFIX)
            os._exit(0 if os.path.isdir(path) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.isdir(path)
    remove_owned(path, PREFIX)
    assert not os.path.exists(path)


def test_a_loader_runner_removes_its_pass_folder_on_close_and_in_no_forked_child() -> None:
    runner = stub_runner()
    assert os.path.basename(runner.pass_dir).startswith(f"{PASS_PREFIX}{os.getpid()}-")
    pid = os.fork()
    if pid == 0:
        try:
            runner._cleanup()  # the finaliser a collected copy of the runner would run
            os._exit(0 if os.path.isdir(runner.pass_dir) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.isdir(runner.pass_dir)
    runner.close()
    assert not os.path.exists(runner.pass_dir)

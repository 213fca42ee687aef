"""The one atomic write (``flashfeed.runtime.files``): a file appears whole or not at all, with
the mode asked for, and what a killed writer left is swept."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flashfeed.runtime.files import atomic_write, atomic_write_json, sweep_dead_tmp


def test_the_file_gets_the_exact_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        atomic_write(str(tmp_path / "a"), b"x", mode=0o644)
        atomic_write_json(str(tmp_path / "b.json"), {"k": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600
    assert (tmp_path / "b.json").read_text() == '{"k": 1}'


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "t"
    atomic_write(str(target), "old")

    def broken(f: object) -> None:
        f.write(b"half")  # type: ignore[attr-defined]
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk gone"):
        atomic_write(str(target), broken)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_a_bad_mode_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must be a permission mode"):
        atomic_write(str(tmp_path / "x"), b"", mode=0o4755)


def test_a_killed_writers_temporary_is_swept_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    # a child writes aside and is SIGKILLed before its rename
    code = (
        "import os, sys\n"
        "from flashfeed.runtime.files import atomic_write\n"
        "def hang(f):\n"
        "    f.write(b'partial'); f.flush(); print('ready', flush=True); os.kill(os.getpid(), 9)\n"
        "atomic_write(sys.argv[1], hang)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "shard.json")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == -9 and "ready" in proc.stdout
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith("shard.json.") and left[0].endswith(".tmp")
    live = tmp_path / f"other.json.{os.getpid()}.abcd1234.tmp"
    live.write_bytes(b"in progress")
    assert sweep_dead_tmp(str(tmp_path)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [live.name]
    assert not (tmp_path / "shard.json").exists()

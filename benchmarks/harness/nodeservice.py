"""A node service (``flashfeed node serve``) run as a real process of this one, on a config
written here, for stages that measure it; and what a tenant's process holds of its cache."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from typing import Any

from flashfeed.runtime import lifeline

__all__ = [
    "NodeServiceProc",
    "held_evicted_bytes",
    "start_service",
    "stop_service",
    "wait_listening",
]

_BOOT = "import sys; from flashfeed.cli import main; sys.exit(main())"


def start_service(
    config_path: str, sock: str, log: str, *, log_level: str = "warning", timeout: float = 30.0
) -> subprocess.Popen[bytes]:
    """``flashfeed node serve config_path`` (its output appended to ``log``), once it
    listens on ``sock``; it dies with this process. A service that exits or does not listen
    in ``timeout`` seconds raises, with the tail of its log."""
    cmd = [sys.executable, "-c", _BOOT, "node", "serve", config_path, "--log-level", log_level]
    with open(log, "ab") as out:
        proc = lifeline.popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    return wait_listening(proc, sock, log, timeout=timeout)


def wait_listening(
    proc: subprocess.Popen[bytes], sock: str, log: str, *, timeout: float = 30.0
) -> subprocess.Popen[bytes]:
    """``proc``, a node service started elsewhere, once it listens on ``sock``; one that
    exits or does not listen in ``timeout`` seconds raises, with the tail of ``log``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the node service exited: {_tail(log)}")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
            return proc
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    raise RuntimeError(f"the node service did not listen in {timeout:g} s: {_tail(log)}")


def stop_service(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the service (SIGKILL after 10 s) and wait for it; None or ended: nothing."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(log: str, chars: int = 3000) -> str:
    try:
        with open(log, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


class NodeServiceProc:
    """``flashfeed node serve`` on ``config`` (written 0600 to ``<base>/node.json``; its
    ``socket`` defaults to ``<base>/run/node.sock``, reachable by every local user), its
    log in ``<base>/node.log``. It dies with this process."""

    def __init__(self, base: str, config: dict[str, Any], *, log_level: str = "warning") -> None:
        run = os.path.join(base, "run")
        os.makedirs(run, mode=0o755, exist_ok=True)
        os.chmod(base, 0o755)  # tenants reach the socket; the cache dir itself stays 0700
        self.base = base
        self.config = {"socket": os.path.join(run, "node.sock"), **config}
        self.socket = str(self.config["socket"])
        self.config_path = os.path.join(base, "node.json")
        self.log = os.path.join(base, "node.log")
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None
        self.write_config()

    def write_config(self, **changes: Any) -> None:
        """The config with ``changes``, replaced in one step (a running service reads it
        again on its next look, or at ``reload``)."""
        self.config.update(changes)
        tmp = self.config_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.config, f)
        os.replace(tmp, self.config_path)

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until it listens (its log's tail in the error otherwise)."""
        self.proc = start_service(
            self.config_path, self.socket, self.log, log_level=self.log_level, timeout=timeout
        )

    def kill(self) -> None:
        """SIGKILL it and wait (a crash, for the fault tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        stop_service(self.proc)

    def log_tail(self, chars: int = 3000) -> str:
        return _tail(self.log, chars)


def held_evicted_bytes(pid: int, under: str) -> int:
    """Bytes of files under ``under`` that process ``pid`` holds open after they were
    removed (shards evicted while held: their disk space returns when it lets go); 0 when
    the process is gone. Each file counts once, however many descriptors it has."""
    seen: set[tuple[int, int]] = set()
    total = 0
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return 0
    prefix = os.path.join(os.path.realpath(under), "")
    for name in fds:
        path = os.path.join(fd_dir, name)
        try:
            target = os.readlink(path)
            st = os.stat(path)
        except OSError:
            continue
        if st.st_nlink or not stat.S_ISREG(st.st_mode) or not target.startswith(prefix):
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total

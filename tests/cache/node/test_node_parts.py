"""The node service's pure parts: its config file, its wire format, its presigned proofs."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from urllib.parse import parse_qs, urlsplit

import pytest

from flashfeed.cache.node.access import presign_manifest
from flashfeed.cache.node.protocol import recv_message, send_message
from flashfeed.cache.node.tenants import ConfigError, ConfigWatch, NodeConfig


def _cfg(**over):
    return {"cache_dir": "/nvme/ff", "capacity": "1GiB", **over}


def test_config_reads_quotas_and_weights():
    cfg = NodeConfig.parse(
        _cfg(tenants={"alice": {"quota": "2GiB", "jobs": {"sweep": {"weight": 3}}}}), source="t"
    )
    assert cfg.tenant("alice").quota == 2 << 30
    assert cfg.tenant("alice").weight("sweep") == 3.0 and cfg.tenant("alice").weight("x") == 1.0
    assert cfg.tenant("nobody").quota == 0  # no default quota: fills nothing


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_cfg(capacity="0"), "capacity must be > 0"),
        (_cfg(tenants={"a": {"quota": "lots"}}), "quota of tenant a"),
        (_cfg(tenants={"a": {"quota": "1GiB", "jobs": {"j": {"weight": 0}}}}), "weight of job 'j'"),
        (_cfg(quotas={}), "unknown key(s) ['quotas']"),
        ({"capacity": "1GiB"}, "cache_dir must be a directory path"),
    ],
)
def test_config_errors_name_the_value(data, message):
    with pytest.raises(ConfigError, match="^t: .*" + re.escape(message)):
        NodeConfig.parse(data, source="t")


def test_config_watch_rereads_a_changed_file_and_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(_cfg(tenants={"a": {"quota": "1MiB"}})))
    watch = ConfigWatch(str(path), every=0.0)
    assert watch.current().tenant("a").quota == 1 << 20
    path.write_text(json.dumps(_cfg(tenants={"a": {"quota": "2MiB"}})))
    os.utime(path, ns=(1, 10**18))  # a new mtime, whatever the clock's resolution
    assert watch.current().tenant("a").quota == 2 << 20
    path.write_text("{not json")
    os.utime(path, ns=(1, 2 * 10**18))
    assert watch.current().tenant("a").quota == 2 << 20
    assert watch.error is not None and "cannot read node config" in watch.error


def test_messages_carry_descriptors(tmp_path):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    f = tmp_path / "shard"
    f.write_bytes(b"shard bytes")
    fd = os.open(f, os.O_RDONLY)
    try:
        send_message(a, {"id": 1, "hit": True}, [fd])
        sender = threading.Thread(target=send_message, args=(a, {"id": 2, "big": "x" * 300_000}))
        sender.start()  # more than a socket buffer: read while it is sent
        message, fds = recv_message(b)
        assert message == {"id": 1, "hit": True} and len(fds) == 1
        assert os.pread(fds[0], 5, 0) == b"shard"
        os.close(fds[0])
        message, fds = recv_message(b)
        assert len(message["big"]) == 300_000 and fds == []
        sender.join()
        a.close()
        assert recv_message(b) is None
    finally:
        os.close(fd)
        b.close()


def test_a_presigned_proof_holds_no_secret():
    url = presign_manifest(
        "s3://bucket/ds",
        {"endpoint_url": "http://127.0.0.1:9000", "key": "AKID", "secret": "TOPSECRET"},
    )
    parts = urlsplit(url)
    assert parts.path == "/bucket/ds/manifest.json"
    query = parse_qs(parts.query)
    assert query["X-Amz-Credential"][0].startswith("AKID/")
    assert query["X-Amz-Expires"] == ["60"] and len(query["X-Amz-Signature"][0]) == 64
    assert "TOPSECRET" not in url

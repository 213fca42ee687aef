"""The table of reader backends, against the real S3 server: every backend reads the same
bytes and raises the same errors, the fill's choice is a lookup in the table, and a session
token travels signed with every request."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed import storage
from flashfeed.s3 import directget
from flashfeed.s3.directget import (
    BACKENDS,
    Backend,
    FsObject,
    SignedObject,
    open_reader,
    reader_for,
    register_backend,
)
from flashfeed.storage import s3_options_of


@dataclass
class HeaderProxy(SlowProxy):
    """The test proxy, also keeping each request's headers (lower-case names)."""

    heads: list[dict[str, str]] = field(default_factory=list)

    def _parse(self, head: bytes):  # type: ignore[override]
        lines = head.decode("latin-1").split("\r\n")[1:]
        self.heads.append(
            {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines if ":" in x)}
        )
        return SlowProxy._parse(head)


def _object(s3_prefix: str, size: int) -> tuple[str, bytes]:
    data = np.random.default_rng(11).bytes(size)
    url = f"{s3_prefix}/blob.bin"
    storage.write_bytes(url, data)
    return url, data


def _by_name(name: str) -> Backend:
    return next(b for b in BACKENDS if b.name == name)


@pytest.mark.parametrize("name", ["signed", "botocore", "s3fs"])
def test_every_backend_reads_the_same_bytes_and_size(s3_prefix, name):
    url, data = _object(s3_prefix, 1_300_007)
    fs, path = storage.filesystem(url)
    reader = _by_name(name).open(fs, s3_options_of(fs), path, 2)
    assert reader is not None
    assert reader.size() == len(data)
    out = bytearray(len(data))
    view = memoryview(out)
    for lo, hi in [(0, 1), (1, 700_000), (700_000, len(data))]:
        reader.read_into(lo, hi, view[lo:hi])
    assert bytes(out) == data
    buffer = memoryview(bytearray(1 << 18))
    assert b"".join(bytes(c) for c in reader.chunks(5, 1_000_005, buffer)) == data[5:1_000_005]
    assert reader.read() == data


@pytest.mark.parametrize("name", ["signed", "botocore", "s3fs"])
def test_every_backend_raises_what_s3fs_raises_for_a_missing_object(s3_prefix, name):
    fs, path = storage.filesystem(f"{s3_prefix}/not-there.bin")
    reader = _by_name(name).open(fs, s3_options_of(fs), path, 2)
    assert reader is not None
    with pytest.raises(FileNotFoundError):
        reader.size()
    with pytest.raises(FileNotFoundError):
        reader.read_into(0, 10, memoryview(bytearray(10)))


def test_the_fills_reader_is_the_first_backend_that_can_stand_in(s3_prefix):
    url, data = _object(s3_prefix, 1000)
    fs, path = storage.filesystem(url)
    backend, reader = open_reader(fs, path, connections=2)
    assert backend.name == "signed" and isinstance(reader, SignedObject)
    fs, path = storage.filesystem(url, {"requester_pays": True})  # not a plain GET
    backend, reader = open_reader(fs, path, connections=2)
    assert backend.name == "s3fs" and isinstance(reader, FsObject)
    assert reader.read() == data
    assert reader_for(fs, path, connections=2) is None  # the fill writes s3fs's bytes itself


def test_a_registered_backend_is_asked_in_its_place(s3_prefix, monkeypatch):
    url, data = _object(s3_prefix, 5000)
    fs, path = storage.filesystem(url)
    asked: list[str] = []

    def counting(fs, options, path, connections):
        asked.append(path)
        return FsObject(fs, path)

    monkeypatch.setattr(directget, "BACKENDS", list(BACKENDS))
    register_backend(Backend("counting", counting), before="signed")
    assert [b.name for b in directget.BACKENDS] == ["counting", "signed", "botocore", "s3fs"]
    reader = reader_for(fs, path, connections=2)
    assert isinstance(reader, FsObject) and reader.read() == data and asked == [path]
    with pytest.raises(ValueError, match="'counting' is already registered"):
        register_backend(Backend("counting", counting))
    with pytest.raises(ValueError, match="before='nope': no such backend"):
        register_backend(Backend("other", counting), before="nope")


def _botocore_signature(head: dict[str, str], path: str, key: str, secret: str) -> str:
    """The signature botocore's own signer gives the request whose headers were seen."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    names = head["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    request = AWSRequest(
        method="GET",
        url=f"http://{head['host']}{path}",
        headers={n: head[n] for n in names if n != "host"},
    )
    request.context["timestamp"] = head["x-amz-date"]
    auth = S3SigV4Auth(Credentials(key, secret, head["x-amz-security-token"]), "s3", "us-east-1")
    assert auth.signed_headers(auth.headers_to_sign(request)) == ";".join(names)
    to_sign = auth.string_to_sign(request, auth.canonical_request(request))
    return str(auth.signature(to_sign, request))


@pytest.mark.parametrize("name", ["signed", "botocore", "s3fs"])
def test_a_session_token_is_sent_and_signed_by_every_backend(s3_prefix, s3_store, name):
    """SeaweedFS issues no temporary credentials and refuses a token it did not issue
    (InvalidAccessKeyId), so the token is seen through a recording proxy: every backend
    sends it, among the signed headers, and it reaches the server (which decides by it).
    Our signer's signature is the one botocore's ``S3SigV4Auth`` computes for the same
    request."""
    url, _ = _object(s3_prefix, 200_000)
    info = s3_store.info
    proxy = HeaderProxy(("127.0.0.1", info.s3_port))
    try:
        token = f"session-token-of-{name}/with+odd=chars"
        opts = {"endpoint_url": proxy.endpoint, "key": info.access_key,
                "secret": info.secret_key, "token": token}  # fmt: skip
        fs, path = storage.filesystem(url, opts)
        assert s3_options_of(fs).token == token
        reader = _by_name(name).open(fs, s3_options_of(fs), path, 2)
        assert reader is not None
        with pytest.raises(PermissionError):  # a refusal, never retried as transient
            reader.read_into(100_000, 150_000, memoryview(bytearray(50_000)))
        gets = [
            (h, r) for h, r in zip(proxy.heads, proxy.requests, strict=True) if r.method == "GET"
        ]
        assert gets
        for head, request in gets:
            assert head["x-amz-security-token"] == token
            signed = head["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
            assert "x-amz-security-token" in signed and "range" in signed
            if name == "signed":
                theirs = _botocore_signature(head, request.path, info.access_key, info.secret_key)
                assert head["authorization"].endswith(f"Signature={theirs}")
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def virtual_store(tmp_path_factory):
    """A SeaweedFS of its own that also serves ``{bucket}.localhost`` (``-s3.domainName``):
    the shared one is started without a domain, so it serves path-style requests only."""
    from flashfeed.cli import devstore as store_module

    root = tmp_path_factory.mktemp("vhost")
    weed = root / "weed-with-domain"
    weed.write_text(f'#!/bin/sh\nexec {store_module.find_weed()} "$@" -s3.domainName=localhost\n')
    weed.chmod(0o755)
    store = store_module.EmbeddedStore(root / "store", port=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_module, "find_weed", lambda: str(weed))
        try:
            store.start()
            store.make_bucket("vbucket")
            yield store
        finally:
            store.stop()


@pytest.mark.parametrize("name", ["botocore", "s3fs"])
def test_virtual_hosted_addressing_against_the_real_server(virtual_store, monkeypatch, name):
    """``{"s3": {"addressing_style": "virtual"}}`` sends each GET to ``vbucket.localhost``
    (resolved to 127.0.0.1 here: this machine's resolver knows only ``localhost``). Our
    signed client speaks path style only, so it steps aside for botocore."""
    import socket

    info = virtual_store.info
    resolved: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(host, str) and host.endswith(".localhost"):
            resolved.append(host)
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    data = np.random.default_rng(5).bytes(300_000)
    storage.write_bytes("s3://vbucket/v/blob.bin", data, storage_options=info.storage_options())
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    opts = {
        "endpoint_url": f"http://localhost:{info.s3_port}",
        "key": info.access_key,
        "secret": info.secret_key,
        "config_kwargs": {"s3": {"addressing_style": "virtual"}},
    }
    fs, path = storage.filesystem("s3://vbucket/v/blob.bin", opts)
    options = s3_options_of(fs)
    assert _by_name("signed").open(fs, options, path, 2) is None
    backend, _ = open_reader(fs, path, connections=2)
    assert backend.name == "botocore"
    reader = _by_name(name).open(fs, options, path, 2)
    assert reader is not None
    out = bytearray(100_000)
    reader.read_into(150_000, 250_000, memoryview(out))
    assert bytes(out) == data[150_000:250_000]
    assert reader.size() == len(data)
    assert "vbucket.localhost" in resolved

"""Encryption at rest: AES-256-GCM sealed shards from ingest, verified without the key,
decrypted into the node cache (0600) and read by the loader; tampering named."""

from __future__ import annotations

import base64
import json
import os
import secrets
import stat
from pathlib import Path

import pytest

from flashfeed import CorruptShardError, Dataset, crypto, storage
from flashfeed.cache import ShardCache
from flashfeed.cli import main
from flashfeed.format.manifest import MANIFEST_NAME, Manifest
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.loader import Loader

KEY = crypto.EncryptionKey(bytes(range(32)))
MARKER = b"plaintext-marker-that-must-not-be-stored"


def test_keys_parse_from_hex_base64_file_and_env_and_never_show(tmp_path: Path) -> None:
    hexkey, b64 = KEY.secret.hex(), base64.b64encode(KEY.secret).decode()
    assert crypto.EncryptionKey.parse(hexkey, what="x") == KEY
    assert crypto.EncryptionKey.parse(b64 + "\n", what="x") == KEY
    (tmp_path / "k").write_text(hexkey + "\n")
    assert crypto.load_key(key_file=str(tmp_path / "k")) == KEY
    assert crypto.load_key(env={crypto.ENV_KEY_FILE: str(tmp_path / "k")}) == KEY
    assert crypto.load_key(env={crypto.ENV_KEY: b64}) == KEY
    assert crypto.load_key(env={}) is None
    assert hexkey not in repr(KEY) and hexkey not in str(KEY) and KEY.key_id in repr(KEY)
    assert KEY.key_id.startswith("sha256:") and len(KEY.key_id) == 23
    with pytest.raises(ValueError, match="not a 256-bit key") as err:
        crypto.EncryptionKey.parse(hexkey[:-2], what="$FLASHFEED_ENCRYPTION_KEY")
    assert hexkey[:-2] not in str(err.value)
    with pytest.raises(ValueError, match="cannot read the encryption key file"):
        crypto.load_key(key_file=str(tmp_path / "nope"))


def _manifest(plain: dict[str, dict]) -> Manifest:
    from flashfeed.format.manifest import ShardInfo

    info = ShardInfo("shards/000000.tar", 1, 1, "xxh3_128:00")
    extra = {"encryption": crypto.encryption_record(KEY, plain)}
    return Manifest(name="m", shard_format="webdataset", schema={}, shards=(info,), extra=extra)


def test_seal_is_fresh_per_object_and_authenticated_with_its_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(crypto.ENV_KEY, raising=False)
    monkeypatch.delenv(crypto.ENV_KEY_FILE, raising=False)
    data = MARKER * 100
    a, plain = crypto.seal_shard(data, "shards/000000.tar", KEY)
    b, _ = crypto.seal_shard(data, "shards/000000.tar", KEY)
    assert a != b and a[4:16] != b[4:16]  # a fresh 96-bit nonce each time
    assert MARKER not in a and len(a) == len(data) + crypto.OVERHEAD
    m = _manifest({"shards/000000.tar": plain})
    info = m.shards[0]
    assert crypto.open_shard(m, info, a, dataset="ds", key=KEY) == data
    flipped = bytearray(a)
    flipped[len(a) // 2] ^= 1
    with pytest.raises(CorruptShardError, match=r"shards/000000\.tar of dataset ds fails auth"):
        crypto.open_shard(m, info, bytes(flipped), dataset="ds", key=KEY)
    moved, _ = crypto.seal_shard(data, "shards/000001.tar", KEY)  # a shard swapped in
    with pytest.raises(CorruptShardError, match="moved from another path"):
        crypto.open_shard(m, info, moved, dataset="ds", key=KEY)
    other = crypto.EncryptionKey(secrets.token_bytes(32))
    with pytest.raises(crypto.MissingKeyError, match=f"encrypted with key {KEY.key_id}"):
        crypto.open_shard(m, info, a, dataset="ds", key=other)
    with pytest.raises(crypto.MissingKeyError, match="FLASHFEED_ENCRYPTION_KEY"):
        crypto.key_for(m, None)
    assert crypto.cached_info(m, info).bytes == len(data)


@pytest.mark.usefixtures("ray_session")
def test_encrypted_ingest_verify_cache_and_loader(
    tmp_path: Path, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(crypto.ENV_KEY, raising=False)
    monkeypatch.delenv(crypto.ENV_KEY_FILE, raising=False)
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=8, size=(24, 24))
    keyfile = tmp_path / "key"
    keyfile.write_text(KEY.secret.hex())
    keyfile.chmod(0o600)
    common = dict(source=str(src), samples_per_shard=4, seed=1, progress="none")
    with pytest.raises(ValueError, match="needs a key"):
        IngestConfig(dest=f"{s3_prefix}/x", encrypt=True, **common)
    plain = run(IngestConfig(dest=f"{s3_prefix}/plain", **common))
    sealed = run(
        IngestConfig(dest=f"{s3_prefix}/enc", encrypt=True, encrypt_key_file=str(keyfile), **common)
    )
    m = sealed.manifest
    text = storage.read_bytes(f"{s3_prefix}/enc/{MANIFEST_NAME}")
    assert m.extra["encryption"]["key_id"] == KEY.key_id
    assert KEY.secret.hex().encode() not in text and str(keyfile).encode() not in text
    assert json.loads(text)["config"]["encrypt"] == KEY.key_id
    # stored bytes are sealed; their plaintext is the unencrypted run's shard, byte for byte
    for p, s in zip(plain.manifest.shards, m.shards, strict=True):
        stored = storage.read_bytes(f"{s3_prefix}/enc/{s.path}")
        assert stored[:4] == b"FFE1" and b"JFIF" not in stored
        assert crypto.cached_info(m, s).checksum == p.checksum
    # verify checks the stored bytes: no key needed
    assert main(["verify", f"{s3_prefix}/enc"]) == 0
    # reading without the key is a clear error; with it, the same samples
    with pytest.raises(crypto.MissingKeyError, match=KEY.key_id):
        Dataset.open(f"{s3_prefix}/enc").read_shard(0)
    monkeypatch.setenv(crypto.ENV_KEY_FILE, str(keyfile))
    assert list(Dataset.open(f"{s3_prefix}/enc")) == list(Dataset.open(f"{s3_prefix}/plain"))
    # the CLI flag, with the key from the environment
    args = ["ingest", str(src), f"{s3_prefix}/cli", "--encrypt", "--samples-per-shard", "4"]
    assert main([*args, "--json"]) == 0
    cli = Dataset.open(f"{s3_prefix}/cli")
    assert cli.encrypted and cli.manifest.extra["encryption"]["key_id"] == KEY.key_id
    assert sorted(k for k, _ in cli) == sorted(k for k, _ in Dataset.open(f"{s3_prefix}/plain"))
    # the node cache keeps decrypted 0600 copies, checked against the plaintext checksum
    ds = Dataset.open(f"{s3_prefix}/enc")
    root = tmp_path / "cache"
    with ShardCache(root, capacity="64MiB") as cache:
        path = cache.get(ds, 0)
        assert Path(path).read_bytes() == Dataset.open(f"{s3_prefix}/plain").read_shard(0)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        loader = Loader(ds, batch_size=4, image_size=16, cache=cache, shuffle=False, train=False)
        labels = [int(x) for b in loader for x in b["label"]]
    assert len(labels) == m.num_samples
    assert main(["cache", "verify", str(root)]) == 0
    # a shard replaced together with its manifest entry still fails authentication
    bad = bytearray(storage.read_bytes(f"{s3_prefix}/enc/{m.shards[1].path}"))
    bad[100] ^= 0xFF
    storage.write_bytes(f"{s3_prefix}/enc/{m.shards[1].path}", bytes(bad))
    d = m.to_dict()  # version 1: the shards inline, where an edit is one line
    d["shards"][1]["checksum"] = storage.checksum(bytes(bad))
    storage.write_bytes(f"{s3_prefix}/enc/{MANIFEST_NAME}", json.dumps(d).encode())
    ds = Dataset.open(f"{s3_prefix}/enc")
    with ShardCache(tmp_path / "c2", capacity="64MiB") as cache:
        with pytest.raises(CorruptShardError, match=r"shards/000001\.tar of dataset .* fails"):
            cache.get(ds, 1)
        assert not list((tmp_path / "c2").rglob("000001.tar"))

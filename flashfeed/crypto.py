"""Optional client-side encryption at rest: AES-256-GCM, one sealed object per shard.

A sealed shard is ``MAGIC | nonce (12 bytes, fresh per object) | ciphertext | tag (16)``;
the shard's path inside the dataset is authenticated with it, so a shard moved or swapped
to another path fails like a tampered one. The manifest's ``bytes``/``checksum`` describe
the stored (sealed) bytes, so ``flashfeed verify`` and the cache's in-transit check work
without the key; ``extra.encryption`` names the scheme, the key id (a hash, never the key)
and each shard's plaintext size and checksum, which the node cache checks its decrypted
copies against. Needs the ``cryptography`` package (``pip install flashfeed[crypto]``).

The key: 32 bytes given as 64 hex characters or base64, from a file
(``FLASHFEED_ENCRYPTION_KEY_FILE`` or an explicit path) or ``FLASHFEED_ENCRYPTION_KEY``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flashfeed.format.manifest import Manifest, ShardInfo

from . import storage
from .errors import CorruptShardError, FlashfeedError

__all__ = [
    "ENV_KEY",
    "ENV_KEY_FILE",
    "SCHEME",
    "EncryptionKey",
    "MissingKeyError",
    "cached_info",
    "encryption_record",
    "is_encrypted",
    "key_for",
    "load_key",
    "open_shard",
    "seal_shard",
]

SCHEME = "aes-256-gcm"
ENV_KEY = "FLASHFEED_ENCRYPTION_KEY"
ENV_KEY_FILE = "FLASHFEED_ENCRYPTION_KEY_FILE"
MAGIC = b"FFE1"
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = len(MAGIC) + NONCE_BYTES + TAG_BYTES


class MissingKeyError(FlashfeedError, ValueError):
    """An encrypted dataset was read without its key, or with another key."""


def _aesgcm(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise FlashfeedError(
            "encrypted datasets need the 'cryptography' package: pip install 'flashfeed[crypto]'"
        ) from None
    return AESGCM(key)


@dataclass(frozen=True)
class EncryptionKey:
    """A 256-bit key. Its ``repr`` and ``str`` show the key id only."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) != 32:
            raise ValueError("an encryption key must be exactly 32 bytes (AES-256)")

    @property
    def key_id(self) -> str:
        """A public name of the key: recorded in manifests, safe to log."""
        digest = hashlib.sha256(b"flashfeed-key-id\0" + self.secret).hexdigest()
        return f"sha256:{digest[:16]}"

    def __repr__(self) -> str:
        return f"EncryptionKey(key_id={self.key_id!r})"

    __str__ = __repr__

    @classmethod
    def parse(cls, text: str | bytes, *, what: str) -> EncryptionKey:
        """A key written as 64 hex characters or base64 of 32 bytes (``what`` names where
        it came from; the error never shows the value)."""
        raw = text.strip() if isinstance(text, bytes) else text.strip().encode()
        if len(raw) == 64:
            try:
                return cls(bytes.fromhex(raw.decode("ascii")))
            except (ValueError, UnicodeDecodeError):
                pass
        try:
            decoded = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        if len(decoded) == 32:
            return cls(decoded)
        raise ValueError(
            f"{what} is not a 256-bit key: give 64 hex characters or base64 of 32 bytes "
            '(e.g. from `python -c "import secrets; print(secrets.token_hex(32))"`)'
        )


def load_key(
    *, key_file: str | None = None, env: Mapping[str, str] | None = None
) -> EncryptionKey | None:
    """The key from ``key_file``, else ``$FLASHFEED_ENCRYPTION_KEY_FILE``, else
    ``$FLASHFEED_ENCRYPTION_KEY``; None when none is set."""
    env = os.environ if env is None else env
    path = key_file or env.get(ENV_KEY_FILE)
    if path:
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(
                f"cannot read the encryption key file {path}: {exc.strerror}"
            ) from None
        return EncryptionKey.parse(text, what=f"key file {path}")
    value = env.get(ENV_KEY)
    if value:
        return EncryptionKey.parse(value, what=f"${ENV_KEY}")
    return None


def _aad(path: str) -> bytes:
    return b"flashfeed-shard\0" + path.encode("utf-8")


def seal_shard(data: bytes, path: str, key: EncryptionKey) -> tuple[bytes, dict[str, Any]]:
    """``(sealed bytes, plaintext record)`` of one shard's bytes at ``path``."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = MAGIC + nonce + _aesgcm(key.secret).encrypt(nonce, data, _aad(path))
    return sealed, {"bytes": len(data), "checksum": storage.checksum(data)}


def is_encrypted(manifest: Manifest) -> bool:
    return isinstance(manifest.extra.get("encryption"), dict)


def encryption_record(key: EncryptionKey, plaintext: Mapping[str, Mapping[str, Any]]) -> dict:
    """The manifest's ``extra.encryption``: scheme, key id, plaintext size/checksum by path."""
    return {
        "scheme": SCHEME,
        "key_id": key.key_id,
        "plaintext": {p: dict(plaintext[p]) for p in sorted(plaintext)},
    }


def _record(manifest: Manifest) -> dict[str, Any]:
    rec = manifest.extra.get("encryption")
    if not isinstance(rec, dict) or rec.get("scheme") != SCHEME:
        scheme = rec.get("scheme") if isinstance(rec, dict) else rec
        raise MissingKeyError(
            f"dataset {manifest.name!r} is encrypted with {scheme!r}; this flashfeed reads "
            f"{SCHEME!r} only"
        )
    return rec


def key_for(manifest: Manifest, key: EncryptionKey | None = None) -> EncryptionKey:
    """The key that opens this encrypted dataset: ``key`` or the configured one, checked
    against the key id the manifest records."""
    rec = _record(manifest)
    key = key or load_key()
    if key is None:
        raise MissingKeyError(
            f"dataset {manifest.name!r} is encrypted (key {rec.get('key_id')}): set "
            f"${ENV_KEY} or ${ENV_KEY_FILE} to its key"
        )
    if key.key_id != rec.get("key_id"):
        raise MissingKeyError(
            f"dataset {manifest.name!r} was encrypted with key {rec.get('key_id')}, "
            f"the key given is {key.key_id}: use the key it was written with"
        )
    return key


def open_shard(
    manifest: Manifest,
    info: ShardInfo,
    sealed: bytes | memoryview,
    *,
    dataset: str,
    key: EncryptionKey | None = None,
) -> bytes:
    """The plaintext of one sealed shard; tampering, a wrong path or a wrong key is a
    ``CorruptShardError`` naming the shard and the dataset."""
    key = key_for(manifest, key)
    head = bytes(sealed[: len(MAGIC) + NONCE_BYTES])
    if len(sealed) < OVERHEAD or head[: len(MAGIC)] != MAGIC:
        raise CorruptShardError(
            f"shard {info.path} of dataset {dataset} is not a sealed flashfeed shard"
        )
    try:
        from cryptography.exceptions import InvalidTag
    except ImportError:
        _aesgcm(key.secret)  # raises the install hint
        raise
    try:
        return bytes(
            _aesgcm(key.secret).decrypt(head[len(MAGIC) :], sealed[len(head) :], _aad(info.path))
        )
    except InvalidTag:
        raise CorruptShardError(
            f"shard {info.path} of dataset {dataset} fails authentication (AES-GCM tag, "
            f"key {key.key_id}): it was tampered with, corrupted or moved from another path"
        ) from None


def cached_info(manifest: Manifest, info: ShardInfo) -> ShardInfo:
    """What a node-cache copy of the shard must match: the plaintext size and checksum for
    an encrypted dataset (the cache holds decrypted 0600 files), else the manifest entry."""
    if not is_encrypted(manifest):
        return info
    plain = _record(manifest).get("plaintext", {}).get(info.path)
    if not isinstance(plain, dict):
        raise CorruptShardError(
            f"the manifest of {manifest.name!r} lacks the plaintext record of shard {info.path}"
        )
    return replace(info, bytes=int(plain["bytes"]), checksum=str(plain["checksum"]))

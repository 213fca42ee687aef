"""Peers prove they belong to the cluster: an HMAC of each request under the cluster token.

The token never crosses the network: a request carries ``FFPeer t=<unix time>,n=<nonce>,
s=<hex HMAC-SHA256 of method, path, time and nonce>``; a server accepts it within
``SKEW`` seconds of its own clock. The token comes from the caller, ``FLASHFEED_PEER_TOKEN``
or a file only its owner may read (``--token-file``, the config file's ``peer_token_file``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import time

__all__ = ["SKEW", "TOKEN_ENV", "load_token", "sign", "verify"]

TOKEN_ENV = "FLASHFEED_PEER_TOKEN"
#: how far a request's time may be from the server's (seconds)
SKEW = 60.0
_MIN_TOKEN = 16


def _mac(token: bytes, method: str, path: str, when: str, nonce: str) -> str:
    msg = f"{method}\n{path}\n{when}\n{nonce}".encode()
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


def sign(token: bytes, method: str, path: str, *, now: float | None = None) -> str:
    """The ``Authorization`` header value of one request."""
    when = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(8)
    return f"FFPeer t={when},n={nonce},s={_mac(token, method, path, when, nonce)}"


def verify(
    token: bytes, method: str, path: str, header: str | None, *, now: float | None = None
) -> bool:
    """Whether ``header`` signs this request with ``token``, recently enough."""
    if not header or not header.startswith("FFPeer "):
        return False
    fields = dict(p.partition("=")[::2] for p in header[7:].split(","))
    when, nonce, mac = fields.get("t", ""), fields.get("n", ""), fields.get("s", "")
    if not when.isascii() or not when.isdigit():
        return False
    clock = time.time() if now is None else now
    if abs(clock - int(when)) > SKEW:
        return False
    return hmac.compare_digest(mac, _mac(token, method, path, when, nonce))


def load_token(token: str | bytes | None = None, *, token_file: str | None = None) -> bytes:
    """The cluster token: given, read from ``token_file`` (mode 0600 or stricter), or from
    ``FLASHFEED_PEER_TOKEN``. At least 16 bytes."""
    if token is None and token_file is not None:
        try:
            st = os.stat(token_file)
            with open(token_file, "rb") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ValueError(
                f"cannot read the peer token file {token_file}: {exc.strerror}"
            ) from None
        if st.st_mode & 0o077:
            raise ValueError(
                f"peer token file {token_file} is readable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): `chmod 600 {token_file}`"
            )
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    if token is None:
        raise ValueError(
            f"no peer token: give token=, a token file or set {TOKEN_ENV} (the same on every node)"
        )
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if len(raw) < _MIN_TOKEN:
        raise ValueError(f"the peer token must be at least {_MIN_TOKEN} bytes, got {len(raw)}")
    return raw

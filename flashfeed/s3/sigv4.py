"""AWS Signature Version 4 for one S3 GET: the headers that authorize it.

A pure function of the request, the credentials and the time, so the fill can sign a ranged
GET in microseconds instead of going through a full SDK client per request. The payload is
declared unsigned (``UNSIGNED-PAYLOAD``), as S3 allows for any request; a GET has none.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from urllib.parse import quote

__all__ = ["UNSIGNED", "s3_get_headers", "s3_path", "s3_presigned_query"]

UNSIGNED = "UNSIGNED-PAYLOAD"
_ALGORITHM = "AWS4-HMAC-SHA256"


def s3_path(bucket: str, key: str) -> str:
    """The path-style request path of ``bucket/key``, percent-encoded as S3 signs it."""
    return quote(f"/{bucket}/{key}", safe="/~")


@functools.lru_cache(maxsize=16)
def _signing_key(secret: str, day: str, region: str) -> bytes:
    k = hmac.digest(f"AWS4{secret}".encode(), day.encode(), "sha256")
    for part in (region, "s3", "aws4_request"):
        k = hmac.digest(k, part.encode(), "sha256")
    return k


def s3_get_headers(
    *,
    host: str,
    path: str,
    region: str,
    access_key: str,
    secret_key: str,
    token: str | None = None,
    extra: dict[str, str] | None = None,
    now: float | None = None,
    method: str = "GET",
    query: str = "",
) -> dict[str, str]:
    """The headers of a signed GET of ``path`` (already encoded, see ``s3_path``) on
    ``host`` (with its port when not the scheme's default). ``extra`` headers (a Range,
    say) are signed too; ``now`` fixes the time (seconds since the epoch) for tests;
    ``method`` signs another request (a HEAD; a PUT or POST, its payload unsigned) the same
    way; ``query``: the canonical query string (keys sorted, values encoded), if any."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    day = stamp[:8]
    headers = {"host": host, "x-amz-content-sha256": UNSIGNED, "x-amz-date": stamp}
    if token:
        headers["x-amz-security-token"] = token
    for name, value in (extra or {}).items():
        headers[name.lower()] = value
    names = sorted(headers)
    signed = ";".join(names)
    lines = "".join(f"{n}:{headers[n].strip()}\n" for n in names)
    canonical = "\n".join([method, path, query, lines, signed, UNSIGNED])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join([_ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    signature = hmac.new(
        _signing_key(secret_key, day, region), to_sign.encode(), "sha256"
    ).hexdigest()
    headers["authorization"] = (
        f"{_ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed}, "
        f"Signature={signature}"
    )
    del headers["host"]  # http.client sends its own
    return headers


def s3_presigned_query(
    *,
    host: str,
    path: str,
    region: str,
    access_key: str,
    secret_key: str,
    token: str | None = None,
    expires: int = 60,
    now: float | None = None,
    method: str = "GET",
) -> str:
    """The query string of a presigned ``method`` of ``path`` on ``host`` (query
    authorization, valid ``expires`` seconds): whoever holds the URL may make that one
    request until then, without ever seeing the secret key."""
    if not 1 <= expires <= 604800:
        raise ValueError(f"expires must be in 1..604800 seconds, got {expires!r}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    day = stamp[:8]
    scope = f"{day}/{region}/s3/aws4_request"
    params = {
        "X-Amz-Algorithm": _ALGORITHM,
        "X-Amz-Credential": f"{access_key}/{scope}",
        "X-Amz-Date": stamp,
        "X-Amz-Expires": str(expires),
        "X-Amz-SignedHeaders": "host",
    }
    if token:
        params["X-Amz-Security-Token"] = token
    query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items())
    )
    canonical = "\n".join([method, path, query, f"host:{host}\n", "host", UNSIGNED])
    to_sign = "\n".join([_ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    signature = hmac.new(
        _signing_key(secret_key, day, region), to_sign.encode(), "sha256"
    ).hexdigest()
    return f"{query}&X-Amz-Signature={signature}"

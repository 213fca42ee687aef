"""Proof of access without a shared secret: the tenant presigns a GET of the dataset's
``manifest.json`` with its own credentials and hands over only that URL; the service makes
the request and grants the tenant the dataset when the store answers with the very header
the service serves (``check_presigned``). The secret key never leaves the tenant.
"""

from __future__ import annotations

import hashlib
import http.client
from typing import Any
from urllib.parse import urlsplit

from flashfeed import storage
from flashfeed.format.manifest import manifest_url
from flashfeed.s3.options import S3Options
from flashfeed.s3.sigv4 import s3_path, s3_presigned_query

__all__ = ["AccessRefused", "check_presigned", "presign_manifest"]

#: seconds a presigned proof is valid: long enough to reach the service, no longer
PROOF_SECONDS = 60


class AccessRefused(PermissionError):
    """The store refused the tenant's own credentials for the dataset."""


def presign_manifest(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """A presigned GET of ``url``'s ``manifest.json`` with the caller's own credentials
    (``storage_options``, else the environment), valid ``PROOF_SECONDS``."""
    if not url.startswith(("s3://", "s3a://")):
        raise ValueError(f"the node service serves datasets on S3, got {url!r}")
    options = S3Options.parse(storage_options)
    if not options.endpoint_url or options.key is None:
        raise ValueError(
            f"presigning access to {url} needs an endpoint URL and credentials "
            "(AWS_ENDPOINT_URL and AWS_ACCESS_KEY_ID, or storage_options)"
        )
    bucket, _, key = manifest_url(url).split("://", 1)[1].partition("/")
    path = s3_path(bucket, key)
    parts = urlsplit(options.endpoint_url)
    default = 443 if parts.scheme == "https" else 80
    host = parts.hostname or ""
    host = host if (parts.port or default) == default else f"{host}:{parts.port}"
    query = s3_presigned_query(
        host=host, path=path, region=options.region, access_key=options.key,
        secret_key=options.secret or "", token=options.token, expires=PROOF_SECONDS,
    )  # fmt: skip
    return f"{parts.scheme}://{host}{path}?{query}"


def check_presigned(
    presigned: str,
    *,
    url: str,
    tenant: str,
    store_options: dict[str, Any] | None,
    timeout: float = 10.0,
) -> None:
    """Make the presigned request; return when the store served the header of ``url`` the
    service reads with its own credentials, else raise ``AccessRefused`` (one line)."""
    refused = f"access refused to dataset {url.rstrip('/')} for tenant {tenant}"
    parts = urlsplit(presigned)
    own = urlsplit(S3Options.parse(store_options).endpoint_url or "")
    bucket, _, key = manifest_url(url).split("://", 1)[1].partition("/")
    if (parts.hostname, parts.port) != (own.hostname, own.port) or parts.path != s3_path(
        bucket, key
    ):
        raise AccessRefused(f"{refused}: the proof is not a request of its manifest on this store")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request("GET", f"{parts.path}?{parts.query}")
        response = conn.getresponse()
        body = response.read()
    except OSError as exc:
        raise AccessRefused(f"{refused}: the store could not be asked ({exc})") from None
    finally:
        conn.close()
    if response.status != 200:
        raise AccessRefused(f"{refused} (the store answered {response.status})")
    served = storage.read_bytes(manifest_url(url), storage_options=store_options)
    if hashlib.sha256(body).digest() != hashlib.sha256(served).digest():
        raise AccessRefused(f"{refused}: the manifest it can read is not the one served here")

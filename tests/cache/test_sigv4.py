"""The fill's own SigV4 signature equals botocore's for the same request, byte for byte."""

from __future__ import annotations

import calendar
import time

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from flashfeed.s3.sigv4 import UNSIGNED, s3_get_headers, s3_path


class _UnsignedPayload(S3SigV4Auth):
    """botocore's S3 signer with the payload declared unsigned, as the fill sends it."""

    def _should_sha256_sign_payload(self, request: AWSRequest) -> bool:
        return False


@pytest.mark.parametrize("token", [None, "session/token+=="])
@pytest.mark.parametrize(
    "key", ["shards/000001.tar", "a b/c+d=e/ü~x.tar", "deep/dir/with%percent&amp.idx"]
)
def test_signature_matches_botocore(key: str, token: str | None):
    path = s3_path("my-bucket", key)
    request = AWSRequest(
        method="GET", url=f"http://127.0.0.1:8333{path}", headers={"Range": "bytes=5-99"}
    )
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    _UnsignedPayload(creds, "s3", "eu-west-1").add_auth(request)
    when = calendar.timegm(time.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    ours = s3_get_headers(
        host="127.0.0.1:8333", path=path, region="eu-west-1", access_key=creds.access_key,
        secret_key=creds.secret_key, token=token, extra={"Range": "bytes=5-99"}, now=when,
    )  # fmt: skip
    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-content-sha256"] == UNSIGNED
    assert ours.get("x-amz-security-token") == token
    assert "host" not in ours  # the HTTP client sends the Host it was signed with


def test_a_different_secret_or_range_changes_the_signature():
    base = dict(host="h:1", path="/b/k", region="us-east-1", access_key="A", now=1.7e9)
    one = s3_get_headers(secret_key="s1", extra={"range": "bytes=0-9"}, **base)
    assert one != s3_get_headers(secret_key="s2", extra={"range": "bytes=0-9"}, **base)
    assert one != s3_get_headers(secret_key="s1", extra={"range": "bytes=0-8"}, **base)

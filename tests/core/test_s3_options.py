"""S3 storage options are parsed once into one value, ``S3Options``, with the AWS
environment read in that one place; s3fs and the fill's own readers are built from it."""

from __future__ import annotations

import numpy as np
import pytest

from flashfeed import storage
from flashfeed.s3.directget import SignedObject, reader_for
from flashfeed.storage import S3Options, s3_options_of

ENV = {
    "AWS_ENDPOINT_URL": "http://env-host:9000",
    "AWS_ACCESS_KEY_ID": "envkey",
    "AWS_SECRET_ACCESS_KEY": "envsecret",
    "AWS_SESSION_TOKEN": "envtoken",
    "AWS_REGION": "eu-west-3",
}


def test_the_environment_fills_what_the_options_leave_out():
    o = S3Options.parse(None, env=ENV)
    assert (o.endpoint_url, o.region, o.key, o.secret, o.token) == (
        "http://env-host:9000", "eu-west-3", "envkey", "envsecret", "envtoken",
    )  # fmt: skip
    given = S3Options.parse(
        {"endpoint_url": "http://mine:1", "key": "k", "secret": "s",
         "client_kwargs": {"region_name": "ap-south-1"}},
        env=ENV,
    )  # fmt: skip
    assert (given.endpoint_url, given.region, given.key, given.secret, given.token) == (
        "http://mine:1", "ap-south-1", "k", "s", None,
    )  # fmt: skip
    assert S3Options.parse(None, env={}).region == "us-east-1"
    assert S3Options.parse(None, env={"AWS_DEFAULT_REGION": "a", "AWS_REGION": "b"}).region == "a"


def test_equal_options_are_one_hashable_value_with_defaults_applied():
    a = S3Options.parse({"config_kwargs": {"read_timeout": 9}}, env=ENV)
    b = S3Options.parse({"config_kwargs": {"read_timeout": 9}}, env=dict(ENV))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != S3Options.parse({"config_kwargs": {"read_timeout": 10}}, env=ENV)
    config = a.config_kwargs()
    assert config["read_timeout"] == 9 and config["connect_timeout"] == 5
    assert config["retries"] == {"max_attempts": 1, "mode": "standard"}
    config["read_timeout"] = 1  # a copy: the value does not change
    assert a.config_kwargs()["read_timeout"] == 9
    kwargs = a.s3fs_kwargs()
    assert kwargs["client_kwargs"] == {"endpoint_url": "http://env-host:9000",
                                       "region_name": "eu-west-3"}  # fmt: skip
    assert (kwargs["key"], kwargs["secret"], kwargs["token"]) == ("envkey", "envsecret", "envtoken")


@pytest.mark.parametrize(
    ("options", "plain"),
    [
        ({}, True),
        ({"default_block_size": 1 << 20, "client_kwargs": {"verify": False}}, True),
        ({"requester_pays": True}, False),
        ({"anon": True}, False),
        ({"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256"}}, False),
        ({"version_aware": True}, False),
        ({"client_kwargs": {"proxies": {"http": "p"}}}, False),
        ({"some_future_option": 1}, False),
    ],
)
def test_plain_gets_only_for_options_that_do_not_change_a_request(options, plain):
    assert S3Options.parse(options, env=ENV).plain_gets is plain


def test_filesystems_and_the_fills_readers_share_the_parsed_value(s3_prefix, s3_store):
    url = f"{s3_prefix}/blob.bin"
    data = np.random.default_rng(1).bytes(70_000)
    storage.write_bytes(url, data)
    info = s3_store.info
    opts = {"endpoint_url": info.endpoint, "key": info.access_key, "secret": info.secret_key}
    fs, path = storage.filesystem(url, opts)
    parsed = s3_options_of(fs)
    assert parsed == S3Options.parse(opts)
    assert fs.client_kwargs["endpoint_url"] == parsed.endpoint_url == info.endpoint
    obj = reader_for(fs, path, connections=2)
    assert isinstance(obj, SignedObject)
    assert obj.endpoint.region == parsed.region
    assert obj.read() == data


def test_given_credentials_win_over_a_wrong_environment(s3_prefix, s3_store, monkeypatch):
    url = f"{s3_prefix}/blob.bin"
    data = np.random.default_rng(2).bytes(10_000)
    storage.write_bytes(url, data)
    info = s3_store.info
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    opts = {"key": info.access_key, "secret": info.secret_key}  # endpoint from the env
    fs, path = storage.filesystem(url, opts)
    obj = reader_for(fs, path, connections=2)
    assert isinstance(obj, SignedObject)
    assert obj.read() == data
    wrong, wrong_path = storage.filesystem(url)  # the environment's (wrong) secret
    with pytest.raises(PermissionError):
        reader_for(wrong, wrong_path, connections=2).read()  # type: ignore[union-attr]

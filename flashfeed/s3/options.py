"""S3 storage options parsed once: the AWS environment and ``storage_options`` become one
hashable ``S3Options`` that every S3 client flashfeed makes is built from (s3fs through
``flashfeed.storage.filesystem``, the cache fill's own readers through ``s3_options_of``)."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["S3Options", "env_storage_options", "frozen_options"]


def env_storage_options(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The S3 settings of the standard AWS environment variables, as ``storage_options``:
    ``endpoint_url`` (``AWS_ENDPOINT_URL``), ``key`` and ``secret`` (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``) and ``token`` (``AWS_SESSION_TOKEN``), each only when set.

    What a driver hands to tasks that may not share its environment (Ray workers)."""
    env = os.environ if env is None else env
    opts: dict[str, Any] = {}
    if env.get("AWS_ENDPOINT_URL"):
        opts["endpoint_url"] = env["AWS_ENDPOINT_URL"]
    if env.get("AWS_ACCESS_KEY_ID"):
        opts["key"] = env["AWS_ACCESS_KEY_ID"]
        opts["secret"] = env.get("AWS_SECRET_ACCESS_KEY")
    if env.get("AWS_SESSION_TOKEN"):
        opts["token"] = env["AWS_SESSION_TOKEN"]
    return opts


# s3fs options that do not change how an object's bytes are fetched (caching of listings,
# block sizes of its own file objects, upload sizes): a fill may read beside s3fs with them
_GET_NEUTRAL = frozenset({
    "default_block_size", "default_fill_cache", "default_cache_type", "use_listings_cache",
    "listings_expiry_time", "max_paths", "max_concurrency", "fixed_upload_size",
    "cache_regions", "skip_instance_cache",
})  # fmt: skip


@dataclass(frozen=True)
class S3Options:
    """S3 storage options parsed once, with the AWS environment read once: the one value
    every S3 client flashfeed makes is built from (s3fs through ``filesystem``, and the
    fill's own readers through ``s3_options_of``). Hashable: a cache key for clients."""

    endpoint_url: str | None
    region: str
    key: str | None = None
    secret: str | None = None
    token: str | None = None
    #: client keywords besides the endpoint and region (``verify``, ``use_ssl``...)
    client: tuple[tuple[str, Any], ...] = ()
    #: botocore ``Config`` keywords, flashfeed's defaults applied
    config: tuple[tuple[str, Any], ...] = ()
    #: every other s3fs option, as given
    extra: tuple[tuple[str, Any], ...] = ()
    # the three above as given (dicts), to build clients from: not part of the value
    given: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = field(
        default=({}, {}, {}), compare=False, repr=False
    )

    @classmethod
    def parse(
        cls, storage_options: dict[str, Any] | None, *, env: Mapping[str, str] | None = None
    ) -> S3Options:
        """``storage_options`` over the AWS environment (``env``, default ``os.environ``):
        the given endpoint, region and credentials win; the environment fills the rest."""
        opts = dict(storage_options or {})
        from_env = env_storage_options(env)
        environ = os.environ if env is None else env
        client = dict(opts.pop("client_kwargs", {}) or {})
        given = opts.pop("endpoint_url", None) or from_env.get("endpoint_url")
        endpoint = client.pop("endpoint_url", None) or given
        region = client.pop("region_name", None) or (
            environ.get("AWS_DEFAULT_REGION") or environ.get("AWS_REGION") or "us-east-1"
        )
        config = dict(opts.pop("config_kwargs", {}) or {})
        # flashfeed retries itself (bounded, with jitter); botocore's own retries multiply that.
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", 5)
        config.setdefault("read_timeout", 60)
        key, secret, token = (
            opts.pop("key", None),
            opts.pop("secret", None),
            opts.pop("token", None),
        )
        if key is None and from_env.get("key"):  # the environment's keys, unless given
            key, secret = from_env["key"], from_env.get("secret")
            token = from_env.get("token") or token
        return cls(
            endpoint_url=endpoint,
            region=region,
            key=key,
            secret=secret,
            token=token,
            client=frozen_options(client),
            config=frozen_options(config),
            extra=frozen_options(opts),
            given=(client, config, opts),
        )

    def s3fs_kwargs(self) -> dict[str, Any]:
        """The keywords of ``s3fs.S3FileSystem`` for these options."""
        out: dict[str, Any] = dict(self.given[2])  # shallow: a session stays itself
        if self.key is not None:
            out.update(key=self.key, secret=self.secret)
        if self.token is not None:
            out["token"] = self.token
        out["client_kwargs"] = self.client_kwargs()
        out["config_kwargs"] = self.config_kwargs()
        return out

    def client_kwargs(self) -> dict[str, Any]:
        """Keywords of a botocore client with these options (endpoint, region, the rest)."""
        out = copy.deepcopy(self.given[0])
        if self.endpoint_url:
            out["endpoint_url"] = self.endpoint_url
        out["region_name"] = self.region
        return out

    def config_kwargs(self) -> dict[str, Any]:
        """Keywords of botocore's ``Config`` for these options."""
        return copy.deepcopy(self.given[1])

    @property
    def plain_gets(self) -> bool:
        """Whether a plain ranged GET fetches what s3fs would with these options: none that
        changes a request (anonymous access, requester pays, versions, extra request
        arguments, a session of the caller's), only client keywords for the endpoint's TLS."""
        extra = dict(self.given[2])
        for changes in ("anon", "requester_pays", "version_aware", "s3_additional_kwargs"):
            if extra.pop(changes, None):
                return False
        if set(extra) - _GET_NEUTRAL:
            return False
        return not set(self.given[0]) - {"verify", "use_ssl"}


def frozen_options(obj: Any) -> Any:
    """Storage options as a hashable value (dicts and lists to sorted tuples): a cache key
    for clients made from them."""
    if isinstance(obj, dict):
        return tuple(sorted((k, frozen_options(v)) for k, v in obj.items()))
    if isinstance(obj, list | tuple):
        return tuple(frozen_options(v) for v in obj)
    return obj

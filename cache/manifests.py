"""A node's copy of dataset manifests: the header and the shard table reach a node once,
and every opening asks the store which version it holds now.

Every rank of a job opens the dataset's manifest before it reads a shard. On 8,192 ranks
that is 8,192 GETs of the header and of a shard table of a million rows, all at the same
moment. Through the node cache the first rank of a node fetches both (under a file lock) and
the others read the local copy, memory-mapped.

A dataset's version is its committed manifest's identity: the digest of its shard table
(what the cache keys shards by). An opening checks the header's ETag with one HEAD request;
the same ETag means the node's copy is the store's version, another one fetches the header
(and the table when its checksum changed), so a dataset committed anew under the same
prefix is read by the very next opening, never a cached older one. When the store does not
answer (down, unreachable, credentials refused) a node that holds a copy reads that version
from it, warning once: a warmed node trains through a storage outage.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import xxhash

from flashfeed import storage
from flashfeed.errors import ManifestError, StorageError
from flashfeed.format.manifest import MANIFEST_NAME, Manifest, manifest_url, read_manifest
from flashfeed.format.shardtable import check_relative_path
from flashfeed.s3.retry import RetryPolicy

from .layout import (
    atomic_write_json,
    check_private_root,
    list_dataset_dirs,
    make_private_dir,
    read_json,
)
from .locks import locked

__all__ = ["VERSION_CHECK_RETRY", "cached_versions", "node_manifest", "store_version_tag"]

log = logging.getLogger("flashfeed.cache")

#: the version check when the node holds a copy to fall back on: a few quick tries, then
#: the copy (a job should not idle for the whole retry budget of a fill to learn the store
#: is away)
VERSION_CHECK_RETRY = RetryPolicy(attempts=3, base_delay=0.2, max_delay=1.0, deadline=3.0)

_VERSION_FILE = "version.json"
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _write_atomic(path: str, data: bytes | memoryview) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def store_version_tag(
    url: str, *, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
) -> str | None:
    """The ETag of the dataset's committed header at the store: one HEAD request. None when
    the store gives none. ``FileNotFoundError`` when nothing is committed at ``url``;
    ``StorageError`` when the store does not answer or refuses the credentials."""
    murl = manifest_url(url)
    info = storage.head(
        murl, storage_options=storage_options, retry=retry, what="check the version of"
    )
    tag = info.get("ETag") or info.get("etag")
    return str(tag) if tag else None


def node_manifest(
    root: str,
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    version: str | None = None,
) -> Manifest:
    """The manifest of the dataset at ``url``, read through the node cache at ``root``.

    The store's current version unless ``version`` (a digest, ``Manifest.digest``) names
    another: that one is read from the node cache (a copy kept by an earlier read or warm)
    or from the store if it still holds it; ``ManifestError`` naming both versions if
    neither has it. A store that does not answer leaves the node's copy, with one warning
    ("object store unreachable: reading version V from the node cache"); without a copy
    the store's error is raised. Local datasets are read in place.
    """
    if storage.is_local(url):
        manifest = read_manifest(url, storage_options=storage_options)
        if version is not None and manifest.digest != version:
            raise ManifestError(_no_version(url, version, manifest.digest))
        return manifest
    root = os.path.abspath(root)
    make_private_dir(root)
    check_private_root(root)
    here = os.path.join(root, "manifests", xxhash.xxh3_64_hexdigest(url.rstrip("/").encode()))
    os.makedirs(here, mode=0o700, exist_ok=True)
    with locked(os.path.join(here, ".lock")):
        current = _current(here, url, storage_options)
    if version is None or current.digest == version:
        return current
    for m in cached_versions(root, url):
        if m.digest == version:
            return m
    raise ManifestError(_no_version(url, version, current.digest))


def _no_version(url: str, version: str, current: str) -> str:
    return (
        f"version {version} of {url} is neither at the store (which holds version {current}) "
        "nor in the node cache: continue on the current version, or restore the old one"
    )


def _current(here: str, url: str, storage_options: dict[str, Any] | None) -> Manifest:
    """The store's current version (checked by ETag), or the node's copy when the store is
    away. Runs under the copy's lock."""
    local = _read_local(here)
    try:
        tag = store_version_tag(
            url,
            storage_options=storage_options,
            retry=VERSION_CHECK_RETRY if local is not None else None,
        )
    except FileNotFoundError:
        read_manifest(url, storage_options=storage_options)  # raises its clear error
        raise
    except StorageError as exc:
        if local is None:
            raise
        _warn_offline(url, local.digest, exc)
        return local
    saved = read_json(os.path.join(here, _VERSION_FILE)) or {}
    if local is not None and tag is not None and saved.get("etag") == tag:
        return local
    _fetch(here, url, storage_options)
    fetched = _read_local(here)
    if fetched is None:  # a header that fails its checks at the store: its clear error
        return read_manifest(here)
    atomic_write_json(
        os.path.join(here, _VERSION_FILE), {"etag": tag, "digest": fetched.digest, "url": url}
    )
    return fetched


def _warn_offline(url: str, digest: str, exc: BaseException) -> None:
    with _warned_lock:
        first = (url, digest) not in _warned
        _warned.add((url, digest))
    if first:
        log.warning(
            "object store unreachable: reading version %s from the node cache (%s; %s)",
            digest,
            url,
            str(exc).splitlines()[0][:300],
        )


def cached_versions(root: str, url: str) -> list[Manifest]:
    """Every version of the dataset at ``url`` whose manifest the cache at ``root`` keeps
    (one per cached dataset directory), newest first."""
    found = [d for d in list_dataset_dirs(root) if d.url == url.rstrip("/")]
    found.sort(key=lambda d: os.stat(d.manifest_path).st_mtime, reverse=True)
    out = []
    for d in found:
        try:
            out.append(d.manifest)
        except ManifestError:
            continue  # a damaged copy is no version to offer
    return out


def _fetch(here: str, url: str, storage_options: dict[str, Any] | None) -> None:
    """The header, then the table it names unless that is here already (same checksum)."""
    try:
        data = storage.read_bytes(manifest_url(url), storage_options=storage_options)
    except FileNotFoundError:
        read_manifest(url, storage_options=storage_options)  # raises its clear error
        raise
    ref = _table_ref(data)
    if ref is not None:
        path = check_relative_path(ref.get("path"), what="shard_table.path", source=url)
        local = os.path.join(here, path)
        if not os.path.exists(local) or os.path.getsize(local) != ref.get("bytes"):
            os.makedirs(os.path.dirname(local), mode=0o700, exist_ok=True)
            table = storage.read_bytes(storage.join(url, path), storage_options=storage_options)
            _write_atomic(local, table)
        for name in os.listdir(here):  # tables of earlier versions
            if name.endswith(".arrow") and name != path:
                os.unlink(os.path.join(here, name))
    _write_atomic(os.path.join(here, MANIFEST_NAME), data)


def _table_ref(header: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(header)
    except ValueError:
        return None  # read_manifest names the problem
    ref = d.get("shard_table") if isinstance(d, dict) else None
    return ref if isinstance(ref, dict) else None


def _read_local(here: str) -> Manifest | None:
    """The node's complete, checked copy; None when there is none or it fails its checks
    (no storage access from here)."""
    if not os.path.exists(os.path.join(here, MANIFEST_NAME)):
        return None
    try:
        return read_manifest(here)
    except (ManifestError, OSError):
        return None

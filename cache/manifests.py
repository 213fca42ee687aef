"""A node's copy of dataset manifests: the header and the shard table reach a node once.

Every rank of a job opens the dataset's manifest before it reads a shard. On 8,192 ranks
that is 8,192 GETs of the header and of a shard table of a million rows, all at the same
moment. Through the node cache the first rank of a node fetches both (under a file lock) and
the others read the local copy, memory-mapped.

The shard table is named by its checksum in the header, so a cached table is never stale.
The header is the dataset's commit: a copy younger than ``max_age`` seconds is used as is
(ranks of one launch start within seconds of each other); an older one is fetched again,
so a dataset committed anew under the same prefix is seen by the next launch.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import xxhash

from flashfeed import storage
from flashfeed.errors import ManifestError
from flashfeed.manifest import MANIFEST_NAME, Manifest, manifest_url, read_manifest
from flashfeed.shardtable import check_relative_path

from .layout import check_private_root, make_private_dir
from .locks import locked

__all__ = ["MANIFEST_MAX_AGE_S", "node_manifest"]

#: seconds a node's copy of a manifest header is used before it is fetched again
MANIFEST_MAX_AGE_S = 300.0


def _write_atomic(path: str, data: bytes | memoryview) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def node_manifest(
    root: str,
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    max_age: float = MANIFEST_MAX_AGE_S,
) -> Manifest:
    """The manifest of the dataset at ``url``, read through the node cache at ``root``.

    Local datasets are read in place. Errors are those of ``read_manifest`` (a missing or
    malformed manifest names the dataset); a copy that fails its checks is fetched again.
    """
    if storage.is_local(url):
        return read_manifest(url, storage_options=storage_options)
    root = os.path.abspath(root)
    make_private_dir(root)
    check_private_root(root)
    here = os.path.join(root, "manifests", xxhash.xxh3_64_hexdigest(url.rstrip("/").encode()))
    os.makedirs(here, mode=0o700, exist_ok=True)
    with locked(os.path.join(here, ".lock")):
        header = os.path.join(here, MANIFEST_NAME)
        try:
            fresh = time.time() - os.path.getmtime(header) < max_age
        except FileNotFoundError:
            fresh = False
        try:
            if fresh:
                return _read_local(here, url, storage_options)
        except ManifestError:
            pass  # a damaged copy: fetched again below
        _fetch(here, url, storage_options)
        return _read_local(here, url, storage_options)


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


def _read_local(here: str, url: str, storage_options: dict[str, Any] | None) -> Manifest:
    del url, storage_options  # the copy is complete: no storage access from here
    return read_manifest(here)

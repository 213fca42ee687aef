"""Shared fixtures: one real SeaweedFS server and one real Ray per test session.

Both start once (Ray alone takes seconds and ~1 GiB), listen on 127.0.0.1 only, and stop in
``finally`` even when the session fails. Tests get unique prefixes, never shared names.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Set before anything imports Ray: no usage stats, no token auth files, loopback only.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("FLASHFEED_RETRY_DEADLINE", "20")

from flashfeed.cli.devstore import EmbeddedStore, StoreInfo
from flashfeed.ingest.raysetup import RAY_PREFIX, worker_malloc
from flashfeed.runtime.scratch import make_owned_dir, remove_owned

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


@pytest.fixture(scope="session", autouse=True)
def verified_records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Records of hashed local shards (``flashfeed.loader.verified``) go to the session's
    own folder, not the user's cache directory; child processes inherit it."""
    path = tmp_path_factory.mktemp("verified")
    saved = os.environ.get("FLASHFEED_VERIFIED_DIR")
    os.environ["FLASHFEED_VERIFIED_DIR"] = str(path)
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("FLASHFEED_VERIFIED_DIR", None)
        else:
            os.environ["FLASHFEED_VERIFIED_DIR"] = saved


@pytest.fixture(scope="session")
def s3_store() -> Iterator[EmbeddedStore]:
    """The real S3 server. Its AWS_* variables are exported for the whole session, so every
    client (fsspec, DALI, Ray workers) finds it as a user's shell would."""
    root = make_owned_dir("ffs3-", "/tmp")  # swept by a later run if this one is killed
    store = EmbeddedStore(root, port=0)  # any free port: never races another store for 8333
    saved = {k: os.environ.get(k) for k in store.info.env()}
    try:
        store.start()
        store.make_bucket("flashfeed")
        os.environ.update(store.info.env())
        yield store
    finally:
        store.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        remove_owned(root, "ffs3-")


@pytest.fixture(scope="session")
def s3_info(s3_store: EmbeddedStore) -> StoreInfo:
    return s3_store.info


@pytest.fixture
def s3_prefix(s3_store: EmbeddedStore, request: pytest.FixtureRequest) -> str:
    """A fresh ``s3://flashfeed/<test>-<uuid>`` prefix for one test."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"s3://flashfeed/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["local", "s3"])
def any_prefix(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Conformance: the same test on a local directory and on the real S3 server."""
    if request.param == "local":
        return str(tmp_path / "ds")
    return request.getfixturevalue("s3_prefix")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One embedded Ray for the session: 2 CPUs, capped object store, short temp dir."""
    import ray

    # named for this process, so a later run sweeps it if this one is killed
    temp = make_owned_dir(RAY_PREFIX, "/tmp")
    with worker_malloc():  # as ingest's embedded Ray starts
        ray.init(
            num_cpus=2,
            object_store_memory=300 * 1024 * 1024,
            include_dashboard=False,
            _temp_dir=temp,
            log_to_driver=False,
            configure_logging=False,
        )
    try:
        yield
    finally:
        ray.shutdown()
        remove_owned(temp, RAY_PREFIX)


@pytest.fixture(scope="session")
def realdata() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"shared real data not found at {REALDATA}")
    return REALDATA

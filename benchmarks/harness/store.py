"""The one way a benchmark starts its private SeaweedFS: flashfeed's ``EmbeddedStore`` on a
free port, retried on a fresh directory, with a bucket made; a context manager, or
``start_store`` and ``stop`` around a stage's own ``try``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashfeed.cli.devstore import EmbeddedStore, StoreError

__all__ = ["BenchStore", "start_store", "upload_tree"]


@dataclass(frozen=True)
class BenchStore:
    """A started store, its bucket (``s3://<name>``), and the environment it replaced."""

    store: EmbeddedStore
    bucket: str
    saved_env: dict[str, str | None] = field(default_factory=dict)

    @property
    def opts(self) -> dict[str, Any]:
        """fsspec storage options that reach this store."""
        return self.store.info.storage_options()

    @property
    def env(self) -> dict[str, str]:
        """The AWS variables that point any S3 client (fsspec, boto3, DALI) here."""
        return self.store.info.env()

    def restart(self) -> None:
        """Stop and start the server on the same data and port: cold for the next round."""
        self.store.restart()

    def stop(self) -> None:
        """Stop the server and put back the environment variables ``export_env`` replaced."""
        for k, v in self.saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.store.stop()

    def __enter__(self) -> BenchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_store(
    root: str | os.PathLike[str],
    *,
    bucket: str = "flashfeed",
    export_env: bool = False,
    attempts: int = 4,
    identities: list[dict[str, Any]] | None = None,
) -> BenchStore:
    """A SeaweedFS under ``root`` with ``bucket`` made. ``export_env`` points this process's
    S3 clients (and its children's) at it until ``stop``; ``identities``: S3 users beside
    the admin (``EmbeddedStore``'s), e.g. tenants who may read one bucket each."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    why = ""
    for attempt in range(attempts):  # a port taken between its pick and the bind: try again
        store = EmbeddedStore(Path(root) / f"store-{attempt}", port=0, identities=identities)
        try:
            store.start()
        except StoreError as exc:
            store.stop()
            why = str(exc)
            continue
        try:
            made = store.make_bucket(bucket)
        except BaseException:
            store.stop()
            raise
        saved: dict[str, str | None] = {}
        if export_env:
            saved = {k: os.environ.get(k) for k in store.info.env()}
            os.environ.update(store.info.env())
        return BenchStore(store, made, saved)
    raise SystemExit(f"could not start SeaweedFS under {root} in {attempts} attempts: {why}")


def upload_tree(local: str | os.PathLike[str], url: str) -> None:
    """Every file under ``local`` to ``url``, a ``manifest.json`` last: a dataset is visible
    on the store only once all its shards are."""
    from flashfeed import storage

    root = Path(local)
    fs, path = storage.filesystem(url)
    files = sorted(f for f in root.rglob("*") if f.is_file())
    files.sort(key=lambda f: f == root / "manifest.json")  # stable: the rest keep their order
    for f in files:
        fs.put_file(str(f), f"{path}/{f.relative_to(root)}")

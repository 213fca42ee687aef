"""Dataset versions seen by the loader: a re-ingest with --overwrite under a node cache that
holds the old version is read at once (never the cached old one), and a saved state of the
old version is refused naming both versions unless the run asks to continue on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.loader import Loader

pytestmark = pytest.mark.usefixtures("ray_session")


def _ingest(src: Path, dest: str, *, classes: int, per_class: int, overwrite: bool) -> None:
    make_imagefolder(src, classes=classes, per_class=per_class, seed=classes)
    run(
        IngestConfig(
            source=str(src), dest=dest, shard_size="16KB", progress="none", overwrite=overwrite
        )
    )


def _epoch(loader: Loader, stop: int | None = None) -> tuple[int, set[int]]:
    samples, labels = 0, set()
    for n, batch in enumerate(loader):
        samples += len(batch["label"])
        labels |= set(batch["label"].reshape(-1).tolist())
        if stop is not None and n + 1 == stop:
            break
    return samples, labels


def _fetched(loader: Loader) -> int:
    return int(loader.stats()["cache"]["bytes_fetched"])


def test_a_reingest_is_read_at_once_and_an_old_state_is_refused_or_continued(
    tmp_path: Path, s3_prefix: str
) -> None:
    cache = str(tmp_path / "node-cache")
    kw = dict(batch_size=4, image_size=16, cache_dir=cache, py_workers=0, drop_last=False)
    _ingest(tmp_path / "a", s3_prefix, classes=4, per_class=30, overwrite=False)
    first = Loader(s3_prefix, **kw)
    old_version = first.dataset.manifest.digest
    assert _epoch(first) == (120, {0, 1, 2, 3})
    first.close()
    saver = Loader(s3_prefix, **kw)
    assert _epoch(saver, stop=3)[0] == 12
    state = saver.state_dict()
    assert state["dataset"] == old_version  # the state records the version it was saved on
    assert _fetched(saver) == 0  # the old version is all in the node cache
    saver.close()

    _ingest(tmp_path / "b", s3_prefix, classes=3, per_class=20, overwrite=True)
    second = Loader(s3_prefix, **kw)
    new_version = second.dataset.manifest.digest
    assert new_version != old_version
    assert _epoch(second) == (60, {0, 1, 2})  # the new corpus, within seconds of the old
    assert _fetched(second) > 0
    with pytest.raises(ValueError) as refused:
        second.load_state_dict(state)
    message = str(refused.value)
    assert old_version in message and new_version in message and s3_prefix in message
    assert "dataset_version=" in message
    second.close()

    resumed = Loader(s3_prefix, dataset_version=old_version, **kw)
    resumed.load_state_dict(state)
    samples, labels = _epoch(resumed)
    assert (samples, labels) == (108, {0, 1, 2, 3})  # the rest of the old epoch
    assert _fetched(resumed) == 0  # served from the node cache
    resumed.close()

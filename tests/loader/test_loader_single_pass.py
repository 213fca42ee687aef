"""One pass at a time: a second iteration of a loader while one is active is refused at
``iter()`` (it would read the same batches again), for every loader."""

from __future__ import annotations

import pytest

from flashfeed.loader import Loader, ShardDataset, TokenLoader

from support.loader_helpers import make_image_dataset, make_token_dataset

SIZES = [12, 12]  # 24 samples: 6 batches of 4

REFUSED = r"\('.*', rank 0\) is already being iterated: finish or close the first loop"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("pass-img") / "ds")
    make_image_dataset(prefix, SIZES, size=16)
    return prefix


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("pass-tok") / "ds")
    make_token_dataset(prefix, SIZES, seq_len=4)
    return prefix


def _loaders(images: str, tokens: str):
    return {
        "Loader": lambda: Loader(images, batch_size=4, image_size=16, py_workers=0),
        "TokenLoader": lambda: TokenLoader(tokens, batch_size=4),
        "ShardDataset": lambda: ShardDataset(images),  # yields samples
        "ShardDataLoader": lambda: ShardDataset(images, batch_size=4).loader(),
    }


KINDS = ["Loader", "TokenLoader", "ShardDataset", "ShardDataLoader"]


def _count(loader) -> int:
    """Batches of one pass (samples, for a ShardDataset iterated directly)."""
    return sum(1 for _ in loader)


@pytest.mark.parametrize("kind", KINDS)
def test_zip_of_a_loader_with_itself_is_refused_at_iter(images, tokens, kind):
    loader = _loaders(images, tokens)[kind]()
    name = "ShardDataset" if kind == "ShardDataLoader" else kind
    with pytest.raises(RuntimeError, match=name + REFUSED):
        for _ in zip(loader, loader, strict=True):
            pass
    # the refused pass consumed nothing, and the first iterator, dropped, frees the loader
    assert loader.state_dict()["samples_consumed"] == 0
    assert _count(loader) == (24 if kind == "ShardDataset" else 6)


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_loop_inside_the_first_is_refused_until_it_is_closed(images, tokens, kind):
    loader = _loaders(images, tokens)[kind]()
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="close the first loop"):
        for _ in loader:
            pass
    with pytest.raises(RuntimeError, match="already being iterated"):
        iter(loader)
    it.close()
    # closed after one batch (one sample, iterating a ShardDataset): the rest follows
    assert _count(loader) == (23 if kind == "ShardDataset" else 5)
    assert loader.state_dict()["samples_consumed"] == 24


@pytest.mark.parametrize("kind", KINDS)
def test_leaving_a_loop_early_or_dropping_an_unstarted_iterator_frees_the_loader(
    images, tokens, kind
):
    loader = _loaders(images, tokens)[kind]()
    for _ in loader:
        break
    unstarted = iter(loader)
    del unstarted
    assert _count(loader) == (23 if kind == "ShardDataset" else 5)
    assert _count(loader) == (24 if kind == "ShardDataset" else 6)  # the next epoch


def test_a_failed_pass_frees_the_loader(tmp_path):
    import os
    import shutil

    from flashfeed.errors import CorruptShardError

    prefix = str(tmp_path / "ds")
    make_image_dataset(prefix, SIZES, size=16)
    ds = ShardDataset(prefix, batch_size=4, shuffle=False)
    moved = os.path.join(str(tmp_path), "moved.tar")
    shard = os.path.join(prefix, "shards", "000000.tar")
    shutil.move(shard, moved)
    with pytest.raises(CorruptShardError, match=r"shards/000000\.tar.*missing"):
        for _ in ds:
            pass
    shutil.move(moved, shard)
    assert _count(ds) == 24

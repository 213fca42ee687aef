"""The shared parts of every loader: one set of keywords, built and checked in one place."""

from __future__ import annotations

import inspect

import pytest

from flashfeed.loader import Loader, ShardDataset, SharedKeywords, TokenLoader
from flashfeed.loader.image.pipeline import batch_device, check_device
from flashfeed.loader.parts import _build, loader_parts

from support.loader_helpers import make_image_dataset, make_token_dataset


def test_shared_keywords_are_the_builders_keywords():
    params = inspect.signature(_build).parameters
    built = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}
    assert built == set(SharedKeywords.__optional_keys__)


@pytest.mark.parametrize("cls", [Loader, TokenLoader, ShardDataset])
def test_an_unknown_keyword_is_named_for_each_loader(tmp_path, cls):
    with pytest.raises(TypeError, match=rf"{cls.__name__}\(\) got .*'sede'"):
        cls(str(tmp_path / "none"), batch_size=2, sede=3)


def test_each_loader_gets_the_same_parts_from_the_same_keywords(tmp_path):
    images, tokens = str(tmp_path / "img"), str(tmp_path / "tok")
    make_image_dataset(images, [6, 6], size=8)
    make_token_dataset(tokens, [6, 6], seq_len=4)
    kw = {"seed": 7, "shuffle": False, "window": 2, "rank": 1, "world_size": 2}
    loaders = [
        Loader(images, batch_size=2, py_workers=0, **kw),
        ShardDataset(images, batch_size=2, **kw),
        TokenLoader(tokens, batch_size=2, **kw),
    ]
    for loader in loaders:
        assert loader.parts.options == loaders[0].parts.options
        assert loader.parts.ctx == loaders[0].parts.ctx
        assert (loader.ctx.rank, loader.ctx.world_size) == (1, 2)
    loaders[0].close()
    with pytest.raises(ValueError, match="TokenLoader reads arrow shards"):
        loader_parts("TokenLoader", images, shard_format="arrow", keywords={})
    with pytest.raises(ValueError, match=r"window must be"):
        ShardDataset(images, window=0)


def test_device_is_checked_one_way():
    for good, kind in [("auto", "auto"), ("cpu", "cpu"), ("gpu", "gpu"), ("cuda", "gpu")]:
        assert check_device(good) == kind
    with pytest.raises(ValueError, match="device must be"):
        check_device("tpu")
    assert batch_device("auto", torch_cuda=False) is None
    assert batch_device("cpu", torch_cuda=True) is None
    with pytest.raises(ValueError, match=r"no CUDA device.*install a CUDA build"):
        batch_device("cuda", torch_cuda=False)

"""DALI CPU outputs -> torch: one copy into pooled memory, never into a buffer still held."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nvidia.dali import fn, pipeline_def, types

from flashfeed.loader.convert import HostPool, to_torch


@pipeline_def(batch_size=4, num_threads=1, device_id=None, exec_dynamic=True, seed=7)
def _random_batches():
    image = fn.random.uniform(range=(0, 1), shape=(3, 8, 8), dtype=types.FLOAT)
    label = fn.random.uniform(range=(0, 9), shape=(1,), dtype=types.INT64)
    return image, label


@pytest.fixture
def pipe():
    p = _random_batches()
    p.build()
    return p


def test_cpu_outputs_are_copied_exactly_into_pooled_buffers(pipe):
    pool = HostPool()
    image, label = pipe.run()
    t_image, t_label = to_torch(image, None, pool=pool), to_torch(label, None, pool=pool)
    assert t_image.dtype == torch.float32 and tuple(t_image.shape) == (4, 3, 8, 8)
    assert t_label.dtype == torch.int64 and tuple(t_label.shape) == (4, 1)
    np.testing.assert_array_equal(t_image.numpy(), np.array(image.as_tensor()))
    np.testing.assert_array_equal(t_label.numpy(), np.array(label.as_tensor()))
    assert pool.allocated == 2 and pool.reused == 0


def test_a_dropped_batch_gives_its_buffer_back_and_a_held_one_keeps_it(pipe):
    pool = HostPool()
    first = to_torch(pipe.run()[0], None, pool=pool)
    address = first.data_ptr()
    del first  # the consumer is done with batch 0
    second = to_torch(pipe.run()[0], None, pool=pool)
    assert second.data_ptr() == address and pool.reused == 1
    kept = second[1:3]  # a view of batch 1 outlives the batch
    saved = kept.clone()
    del second
    third = to_torch(pipe.run()[0], None, pool=pool)
    assert third.data_ptr() != address  # a new buffer: the held one is not overwritten
    assert torch.equal(kept, saved)
    as_numpy = third.numpy()
    del third
    fourth = to_torch(pipe.run()[0], None, pool=pool)
    assert fourth.data_ptr() != as_numpy.ctypes.data  # a .numpy() view holds it too


def test_a_consumer_that_keeps_every_batch_sees_each_unchanged(pipe):
    pool = HostPool(per_shape=2)
    kept, copies = [], []
    for _ in range(6):
        t = to_torch(pipe.run()[0], None, pool=pool)
        kept.append(t)
        copies.append(t.clone())
    for t, c in zip(kept, copies, strict=True):
        assert torch.equal(t, c)
    assert pool.allocated == 6 and pool.reused == 0


def test_pool_options_are_checked():
    with pytest.raises(ValueError, match="per_shape must be >= 1"):
        HostPool(per_shape=0)


def test_loader_batches_kept_stay_intact_and_dropped_ones_are_reused(tmp_path):
    from flashfeed.loader import Loader

    from support.loader_helpers import make_image_dataset

    root = str(tmp_path / "ds")
    make_image_dataset(root, [16, 16])
    loader = Loader(root, batch_size=4, image_size=16, device="cpu", py_workers=0, seed=3)
    kept, copies = [], []
    for batch in loader:  # a consumer that keeps every batch
        kept.append(batch["image"])
        copies.append(batch["image"].clone())
    assert all(torch.equal(k, c) for k, c in zip(kept, copies, strict=True))
    assert len({k.data_ptr() for k in kept}) == len(kept)
    del kept, copies, batch
    before = loader.host_pool.reused
    for batch in loader:  # a training loop: each batch dropped before the next
        assert batch["image"].shape == (4, 3, 16, 16)
    assert loader.host_pool.reused - before >= 7  # 8 batches of images, labels too
    loader.close()


def test_token_loader_cpu_batches_come_from_the_pool(tmp_path):
    from flashfeed.loader import TokenLoader

    from support.loader_helpers import make_token_dataset

    root = str(tmp_path / "tok")
    make_token_dataset(root, [32, 32])
    loader = TokenLoader(root, batch_size=8, seed=1)
    for _epoch in range(2):
        ids = []
        for batch in loader:
            tokens = batch["tokens"].numpy()
            assert (np.diff(tokens, axis=1) == 1).all()  # each row is its own sequence
            ids += (tokens[:, 0] // 7).tolist()  # row n starts at 7 n
        assert sorted(ids) == list(range(64))  # every row once, none overwritten
    assert loader.host_pool.reused > 0
    loader.close()

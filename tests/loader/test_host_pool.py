"""DALI CPU outputs -> torch: DALI's own buffers, handed out in place and never reused while
a batch or a view of it is held; the host pool the token loader's batches come from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nvidia.dali import fn, pipeline_def, types

from flashfeed.loader.image.convert import HostPool, to_torch


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


def test_cpu_outputs_are_handed_out_in_place_and_exact(pipe):
    image, label = pipe.run()
    t_image, t_label = to_torch(image, None), to_torch(label, None)
    assert t_image.dtype == torch.float32 and tuple(t_image.shape) == (4, 3, 8, 8)
    assert t_label.dtype == torch.int64 and tuple(t_label.shape) == (4, 1)
    np.testing.assert_array_equal(t_image.numpy(), np.array(image.as_tensor()))
    np.testing.assert_array_equal(t_label.numpy(), np.array(label.as_tensor()))
    assert t_image.data_ptr() == image.as_tensor().data_ptr()  # DALI's buffer, no copy


def test_dali_never_takes_back_a_held_batch_or_a_view_of_it(pipe):
    for _ in range(4):  # a training loop: each batch dropped before the next
        assert to_torch(pipe.run()[0], None).shape == (4, 3, 8, 8)
    held = to_torch(pipe.run()[0], None)
    kept = held[1:3]  # a view of it outlives the batch
    saved, as_numpy = kept.clone(), held.numpy()
    del held
    later = [to_torch(pipe.run()[0], None) for _ in range(8)]
    assert torch.equal(kept, saved)
    assert all(t.data_ptr() != as_numpy.ctypes.data for t in later)


def test_a_consumer_that_keeps_every_batch_sees_each_unchanged(pipe):
    kept, copies = [], []
    for _ in range(6):
        t = to_torch(pipe.run()[0], None)
        kept.append(t)
        copies.append(t.clone())
    for t, c in zip(kept, copies, strict=True):
        assert torch.equal(t, c)
    assert len({t.data_ptr() for t in kept}) == 6


def test_a_pooled_buffer_is_reused_once_dropped_and_never_while_held():
    pool = HostPool(per_shape=2)
    first = pool.take((4, 3), np.dtype(np.float32))
    address = first.data_ptr()
    del first
    second = pool.take((4, 3), np.dtype(np.float32))
    assert second.data_ptr() == address and pool.reused == 1
    as_numpy = second.numpy()  # a view of the buffer holds it
    del second
    third = pool.take((4, 3), np.dtype(np.float32))
    assert third.data_ptr() != as_numpy.ctypes.data
    fourth = pool.take((4, 3), np.dtype(np.float32))  # both kept are held: a new one
    assert fourth.data_ptr() not in (third.data_ptr(), as_numpy.ctypes.data)
    assert pool.allocated == 3


def test_pool_options_are_checked():
    with pytest.raises(ValueError, match="per_shape must be >= 1"):
        HostPool(per_shape=0)


def test_loader_batches_kept_stay_intact(tmp_path):
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
    for batch in loader:  # a training loop: each batch dropped before the next
        assert batch["image"].shape == (4, 3, 16, 16)
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


def test_loader_labels_are_dalis_own_memory_not_the_sources_arrays(tmp_path, monkeypatch):
    """The callback's label arrays are read by DALI in place and let go of a few batches
    later: a label handed out in place must be DALI's copy, never that array."""
    from flashfeed.loader import Loader
    from flashfeed.loader import reader as reader_module

    from support.loader_helpers import image_samples, make_image_dataset

    handed: set[int] = set()
    columns = reader_module.BatchSource._columns

    def recording(self, *args, **kwargs):
        out = columns(self, *args, **kwargs)
        handed.update(c.ctypes.data for c in out if isinstance(c, np.ndarray))
        return out

    monkeypatch.setattr(reader_module.BatchSource, "_columns", recording)
    root = str(tmp_path / "ds")
    make_image_dataset(root, [20, 20])
    loader = Loader(root, batch_size=4, image_size=16, device="cpu", seed=5)
    kept = [(batch["label"], batch["__key__"]) for batch in loader]
    for _ in range(2):  # the source's arrays of the first pass are long gone
        for _batch in loader:
            pass
    loader.close()
    assert handed and not {label.data_ptr() for label, _ in kept} & handed
    want = {k: label for _, label, k in image_samples(root).values()}
    assert [int(v) for label, _ in kept for v in label] == [
        want[k] for _, keys in kept for k in keys
    ]

"""The GPU path, as far as a CPU can run it: the no-CUDA error, the device ordinal, how reader
processes start, the spawn path end to end, and the stream/event/pinned-pool code behind a
fake CUDA that records every call."""

from __future__ import annotations

import gc
import importlib
import json
import os
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flashfeed.loader import Loader, TokenLoader
from flashfeed.loader.distributed import cuda_device_index
from flashfeed.loader.image.convert import DeviceCopier, to_torch
from flashfeed.loader.image.dali_runner import py_start_method
from flashfeed.loader.image.pipeline import decode_device
from flashfeed.loader.telemetry.ledger import check_exactly_once
from flashfeed.runtime.lifeline import descendants

from support.loader_helpers import (
    image_keys,
    label_of,
    make_image_dataset,
    make_token_dataset,
    token_keys,
)

SIZES = [12, 12, 12]  # 36 samples: 9 batches of 4
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("gpu-img") / "ds")
    make_image_dataset(prefix, SIZES, size=16)
    return prefix


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("gpu-tok") / "ds")
    make_token_dataset(prefix, SIZES, seq_len=8)
    return prefix


# -- 1. a GPU without a CUDA torch: one clear error at construction ---------------------------


@pytest.mark.parametrize("device", ["gpu", "cuda", "auto"])
def test_gpu_decode_without_a_cuda_torch_says_what_to_install(device):
    with pytest.raises(
        ValueError, match=r"no usable CUDA.*CUDA build of PyTorch.*flashfeed\[gpu\]"
    ):
        decode_device(device, dali_gpus=1, torch_cuda=False)
    assert decode_device(device, dali_gpus=2, torch_cuda=True) == "gpu"


def test_no_gpu_means_cpu_for_auto_and_an_error_for_gpu():
    assert decode_device("auto", dali_gpus=0, torch_cuda=False) == "cpu"
    assert decode_device("cpu", dali_gpus=4, torch_cuda=False) == "cpu"
    with pytest.raises(ValueError, match="DALI sees no CUDA device"):
        decode_device("gpu", dali_gpus=0, torch_cuda=True)
    with pytest.raises(ValueError, match="device must be"):
        decode_device("tpu")


@CPU_ONLY
def test_loaders_refuse_a_gpu_they_cannot_use_at_construction(images, tokens):
    with pytest.raises(ValueError, match="no CUDA device"):
        Loader(images, batch_size=4, device="gpu")
    with pytest.raises(ValueError, match=r"CUDA build of PyTorch.*flashfeed\[gpu\]"):
        TokenLoader(tokens, batch_size=4, device="gpu")


# -- 3. the device ordinal --------------------------------------------------------------------


def test_device_ordinal_is_local_rank_modulo_the_devices_this_process_sees():
    # every rank sees all 8 GPUs: rank r takes GPU r
    assert cuda_device_index({"LOCAL_RANK": "5"}, device_count=8) == 5
    # SLURM-style: each rank sees its one GPU through CUDA_VISIBLE_DEVICES, as ordinal 0
    env = {"LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "3"}
    assert cuda_device_index(env, device_count=1) == 0
    # two GPUs visible to four ranks per node: ranks share them round-robin
    assert cuda_device_index({"LOCAL_RANK": "3"}, device_count=2) == 1
    with pytest.raises(ValueError, match=r"sees no CUDA device.*CUDA_VISIBLE_DEVICES='7'"):
        cuda_device_index({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "7"}, device_count=0)
    with pytest.raises(ValueError, match="LOCAL_RANK must be >= 0"):
        cuda_device_index({"LOCAL_RANK": "-1"}, device_count=1)


# -- 4. how the reader processes start --------------------------------------------------------


def test_reader_start_spawns_when_cuda_is_initialised_or_decode_runs_on_the_gpu():
    def start(mode: str, gpu: bool, init: bool) -> str:
        return py_start_method(mode, decode_on_gpu=gpu, cuda_initialized=init)

    assert start("auto", False, False) == "fork"
    assert start("auto", False, True) == "spawn"  # a training script touched CUDA first
    assert start("auto", True, False) == "spawn"
    assert start("fork", True, True) == "fork"  # what the caller asked for
    assert start("spawn", False, False) == "spawn"
    with pytest.raises(ValueError, match="reader_start must be one of"):
        start("forkserver", False, False)


def test_loader_checks_reader_start_and_forks_on_a_cpu_process(images):
    with pytest.raises(ValueError, match="reader_start must be one of"):
        Loader(images, batch_size=4, device="cpu", reader_start="thread")
    if not torch.cuda.is_initialized():
        loader = Loader(images, batch_size=4, device="cpu")
        assert loader.py_start_method == "fork"
        loader.close()


# -- 8. the spawn path, end to end on the CPU -------------------------------------------------


def _children() -> set[int]:
    """This process's descendants, less multiprocessing's resource tracker (one per process,
    started with the first spawned child, it lives as long as its parent by design)."""
    out = set()
    for pid in set(descendants([os.getpid()])) - {os.getpid()}:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"resource_tracker" in f.read():
                    continue
        except OSError:  # gone already
            continue
        out.add(pid)
    return out


def test_spawned_readers_deliver_every_epoch_exactly_once_and_die_with_close(images, tmp_path):
    ledger = str(tmp_path / "ledger")
    before = _children()
    loader = Loader(
        images,
        batch_size=4,
        image_size=16,
        device="cpu",
        py_workers=2,
        num_threads=1,
        reader_start="spawn",
        seed=5,
        ledger_dir=ledger,
    )
    assert loader.py_start_method == "spawn"
    for batch in loader:  # epoch 0, whole
        assert batch["label"].tolist() == [label_of(k, 10) for k in batch["__key__"]]
    spawned = _children() - before
    assert len(spawned) >= 2, spawned  # the reader processes, started by spawn

    it = iter(loader)  # epoch 1, left after two batches, then finished by a new pass
    next(it), next(it)
    it.close()
    assert loader.runner.abandoned == 1
    for _ in loader:
        pass
    assert loader.runner.builds == 1  # leaving early did not re-spawn the readers
    assert _children() - before == spawned

    checks = check_exactly_once(ledger, image_keys(images), epochs=[0, 1])
    assert all(c.ok for c in checks.values()), checks
    loader.close()
    assert not (_children() - before), "reader processes outlived close()"


# -- 5-7. streams, events and the pinned pool, behind a fake CUDA ------------------------------


class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.done = False
        self.stream: Any = None

    def record(self, stream: Any) -> None:
        self.stream = stream
        self.cuda.calls.append(("record", stream))

    def query(self) -> bool:
        return self.done or self.cuda.complete

    def synchronize(self) -> None:
        self.cuda.calls.append(("synchronize", self))
        self.done = True

    def elapsed_time(self, end: FakeEvent) -> float:
        return self.cuda.copy_ms


class FakeCuda:
    """Records the CUDA calls of the copy paths; copies stay on the CPU. Events complete when
    ``complete`` is set or when synchronised."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.stream = object()
        self.complete = True
        self.copy_ms = 2.0
        self.events: list[FakeEvent] = []

    def current_stream(self, device: torch.device) -> Any:
        return self.stream

    def event(self) -> FakeEvent:
        self.events.append(FakeEvent(self))
        return self.events[-1]

    def empty(self, shape, dtype, device) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def empty_pinned(self, shape, dtype) -> torch.Tensor:
        self.calls.append(("pin", tuple(shape), dtype))
        return torch.empty(shape, dtype=dtype)

    def copy_from_dali(self, tensor, out, stream) -> None:
        self.calls.append(("dali_copy", stream))
        out.copy_(torch.from_numpy(np.array(tensor)))

    def to_device(self, cpu: torch.Tensor, device, stream) -> torch.Tensor:
        self.calls.append(("h2d", stream, cpu.data_ptr()))
        return cpu.clone()

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]


CUDA0 = torch.device("cuda", 0)


def _fake_token_loader(tokens: str, cuda: FakeCuda, **kw: Any) -> TokenLoader:
    loader = TokenLoader(tokens, batch_size=4, device="cpu", seed=1, **kw)
    loader.device = CUDA0  # what a GPU machine sets, with the fake doing the copies
    loader.copier = DeviceCopier(CUDA0, ops=cuda, max_in_flight=2)
    return loader


def test_token_batches_are_copied_on_the_current_stream_from_a_reused_pinned_pool(tokens):
    cuda = FakeCuda()
    loader = _fake_token_loader(tokens, cuda)
    expected = [b["tokens"] for b in TokenLoader(tokens, batch_size=4, device="cpu", seed=1)]
    got = list(loader)
    assert all(torch.equal(g["tokens"], e) for g, e in zip(got, expected, strict=True))
    assert len(got) == 9
    kinds = cuda.kinds()
    assert kinds.count("pin") == 1  # one pinned buffer, reused by all 9 batches
    assert loader.copier.pool.reused == 8
    # per batch: start event, the copy, end event, all on torch's current stream
    assert kinds == ["record", "pin", "h2d", "record"] + ["record", "h2d", "record"] * 8
    assert all(c[1] is cuda.stream for c in cuda.calls if c[0] in ("record", "h2d"))
    # h2d comes from the events (2 ms a batch), not from a CPU clock
    assert loader.stats()["wait_s"]["h2d"] == pytest.approx(9 * 0.002)
    loader.close()


def test_a_pinned_buffer_is_not_reused_before_its_copy_is_done(tokens):
    cuda = FakeCuda()
    cuda.complete = False  # copies finish only when waited for
    loader = _fake_token_loader(tokens, cuda)
    ptrs: list[int] = []
    for _ in loader:
        ptrs = [c[2] for c in cuda.calls if c[0] == "h2d"]
        in_flight = ptrs[-loader.copier.in_flight :]
        assert len(set(in_flight)) == len(in_flight)  # no buffer shared by two live copies
    kinds = cuda.kinds()
    assert kinds.count("pin") == 2  # max_in_flight buffers, then each waits for the oldest
    assert kinds.count("synchronize") == 9 - 2
    assert len(set(ptrs)) == 2
    loader.close()
    assert loader.copier.in_flight == 0


class TensorListGPU:
    """A stand-in for DALI's GPU TensorList (the copy path checks the type's name)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def is_dense_tensor(self) -> bool:
        return True

    def as_tensor(self) -> Any:
        return _GpuTensor(self.array)


class _GpuTensor:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        from nvidia.dali.types import DALIDataType

        self.dtype = DALIDataType.FLOAT

    def shape(self) -> list[int]:
        return list(self.array.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.array


def test_dali_gpu_outputs_are_kept_until_the_event_after_their_copy_completes():
    cuda = FakeCuda()
    cuda.complete = False
    copier = DeviceCopier(CUDA0, ops=cuda)
    tl = TensorListGPU(np.arange(6, dtype=np.float32).reshape(2, 3))
    copier.begin()
    out = to_torch(tl, CUDA0, copier)
    copier.end(keep=[tl])
    assert torch.equal(out, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert cuda.kinds() == ["record", "dali_copy", "record"]
    assert cuda.calls[1][1] is cuda.stream  # the copy is ordered on torch's stream
    alive = weakref.ref(tl)
    del tl
    gc.collect()
    assert alive() is not None  # DALI's buffer stays ours while the copy may run
    assert copier.take_h2d() == 0.0  # not finished: no time known yet
    cuda.events[-1].done = True
    assert copier.take_h2d() == pytest.approx(0.002)
    gc.collect()
    assert alive() is None


def test_a_gpu_output_with_no_cuda_device_to_go_to_is_refused():
    tl = TensorListGPU(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="needs a CUDA device"):
        to_torch(tl, None)


def test_image_loader_stages_dali_cpu_outputs_through_the_pool_on_the_stream(images):
    cuda = FakeCuda()
    loader = Loader(images, batch_size=4, image_size=16, device="cpu", py_workers=0, seed=2)
    loader.torch_device = CUDA0
    loader.copier = DeviceCopier(CUDA0, ops=cuda)
    keys = []
    for batch in loader:
        assert batch["image"].shape == (4, 3, 16, 16)
        assert batch["label"].tolist() == [label_of(k, 10) for k in batch["__key__"]]
        keys += batch["__key__"]
    assert sorted(keys) == sorted(image_keys(images))
    kinds = cuda.kinds()
    assert kinds.count("h2d") == 2 * 9  # image and label, each batch
    assert kinds.count("pin") == 2  # one buffer each, reused
    assert all(c[1] is cuda.stream for c in cuda.calls if c[0] in ("record", "h2d"))
    assert loader.stats()["wait_s"]["h2d"] == pytest.approx(9 * 0.002)
    loader.close()


def test_token_keys_are_unchanged_by_the_gpu_copy_path(tokens):
    loader = _fake_token_loader(tokens, FakeCuda())
    keys = [k for b in loader for k in b["__key__"]]
    assert sorted(keys) == sorted(token_keys(tokens))
    loader.close()


# -- 9. benchmarks/gpu.sh's Python parts ----------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_bench():
    return importlib.import_module("benchmarks.gpu_bench")  # as ``python -m`` runs it


def test_the_bench_corpus_is_a_dataset_the_loader_reads_exactly_once(gpu_bench, tmp_path):
    prefix = tmp_path / "photos"
    made = gpu_bench.build_jpeg_corpus(prefix, images=20, per_shard=8, size=(40, 56), workers=2)
    assert made["images"] == 20 and len(made["keys"]) == 20 and made["bytes"] > 0
    again = gpu_bench.build_jpeg_corpus(
        tmp_path / "again", images=20, per_shard=8, size=(40, 56), workers=1
    )
    assert again["bytes"] == made["bytes"]  # the same images however the encoding is split
    assert len(gpu_bench.read_jpegs(prefix)) == 20
    ledger = str(tmp_path / "ledger")
    loader = Loader(str(prefix), batch_size=4, image_size=16, device="cpu", ledger_dir=ledger)
    labels = {k: int(k.rsplit("-", 1)[1]) % 1000 for k in made["keys"]}
    for batch in loader:
        assert batch["label"].tolist() == [labels[k] for k in batch["__key__"]]
    loader.close()
    assert check_exactly_once(ledger, made["keys"])[0].ok


def test_each_stage_leaves_its_own_result_file_and_the_summary_names_what_is_missing(
    gpu_bench, tmp_path
):
    results = tmp_path / "results"
    data = gpu_bench.run_stage("env", gpu_bench.Run(tmp_path / "work", results, cpu=True))
    assert data["status"] == "ok" and data["torch"] == torch.__version__
    assert (
        gpu_bench.main(["mark", "ceiling", "--results", str(results), "--status", "timeout"]) == 0
    )
    # a mark never replaces a result the stage wrote itself
    gpu_bench.main(["mark", "env", "--results", str(results), "--status", "failed (exit 1)"])
    assert json.loads((results / "env.json").read_text())["status"] == "ok"
    assert sorted(p.name for p in results.iterdir()) == ["ceiling.json", "env.json", "summary.md"]
    summary = (results / "summary.md").read_text()
    assert "| ceiling | timeout: |" in summary and "| loader | not run |" in summary
    assert "CPU smoke run" in summary


def _wheel(folder: Path, dist: str, module: str) -> Path:
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "VALUE = 42\n")
        z.writestr(
            f"{dist}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n"
        )
        z.writestr(f"{dist}-1.0.dist-info/RECORD", "")
    return path


def test_only_the_wheels_a_machine_lacks_are_installed_from_the_wheelhouse(gpu_bench, tmp_path):
    house, target = tmp_path / "wheels", tmp_path / "site"
    house.mkdir()
    new = _wheel(house, "ff_gpu_probe", "ff_gpu_probe")
    _wheel(house, "numpy", "numpy_not_really")  # installed here already: left alone
    assert gpu_bench.missing_wheels(house, target) == [new]
    assert gpu_bench.install_wheels([new], target, use_pip=False) == "unzip"
    assert (target / "ff_gpu_probe" / "__init__.py").exists()
    assert gpu_bench.missing_wheels(house, target) == []

"""DALI outputs -> torch tensors, on the GPU when there is one.

On the CPU a dense output is handed out in place: the tensor is DALI's own output buffer
(``torch.from_dlpack``, as DALI's PyTorch iterator does under its dynamic executor, which
every pipeline flashfeed builds runs). That executor gives a buffer back to its pool only
once nothing refers to the batch any more: not the tensor, not a view or slice of it, not a
``.numpy()`` of it. So a yielded batch never changes under its holder, a consumer that keeps
batches (a list of them) keeps their memory while DALI takes new buffers, and a training
loop that drops each batch before the next gives each buffer back to DALI's pool (batches
of 64 float images of 224 x 224 cycled through four), without a copy per batch (that copy
cost 5% of the CPU per image).

On a CUDA device every copy is issued on torch's current stream, so the training step that
runs next on that stream is ordered after it. What the copies read must outlive them: a
``DeviceCopier`` records a CUDA event after each batch's copies and keeps the DALI outputs
and the pinned staging buffers until that event has completed; only then do DALI's buffers
go back to DALI (which reuses them under ``exec_dynamic``) and the pinned buffers back to
its pool. The same events time the copies on the GPU (``take_h2d``): a CPU clock around a
non-blocking copy reads about zero.

``HostPool`` keeps host buffers that batches made outside DALI (the token loader's) come
from on the same rule. The CUDA calls go through ``CudaOps``; tests pass a fake that
records them.
"""

from __future__ import annotations

import ctypes
import sys
from collections import deque
from typing import Any

import numpy as np
import torch

from .fields import key_strings

__all__ = ["CudaOps", "DeviceCopier", "HostPool", "PinnedPool", "to_keys", "to_torch"]


class CudaOps:
    """The CUDA calls of the copy paths, in one place."""

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def event(self) -> Any:
        """An event that can time (``elapsed_time``) and be polled (``query``)."""
        return torch.cuda.Event(enable_timing=True)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Any:
        return torch.empty(shape, dtype=dtype, device=device)

    def empty_pinned(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def copy_from_dali(self, tensor: Any, out: Any, stream: Any) -> None:
        """Copy a dense DALI GPU tensor into ``out``, ordered on ``stream``."""
        from nvidia.dali.plugin.pytorch import feed_ndarray

        feed_ndarray(tensor, out, cuda_stream=stream.cuda_stream)

    def to_device(self, cpu: torch.Tensor, device: torch.device, stream: Any) -> Any:
        """A non-blocking copy of pinned ``cpu`` to ``device``, ordered on ``stream``."""
        with torch.cuda.stream(stream):
            return cpu.to(device, non_blocking=True)


class PinnedPool:
    """Pinned host buffers by (shape, dtype), reused instead of pinning memory per batch
    (``pin_memory()`` allocates page-locked memory each time, a slow system call)."""

    def __init__(self, ops: CudaOps) -> None:
        self.ops = ops
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self.allocated = 0
        self.reused = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        free = self._free.get((tuple(shape), dtype))
        if free:
            self.reused += 1
            return free.pop()
        self.allocated += 1
        return self.ops.empty_pinned(tuple(shape), dtype)

    def give(self, buf: torch.Tensor) -> None:
        self._free.setdefault((tuple(buf.shape), buf.dtype), []).append(buf)


class HostPool:
    """Host buffers for CPU batches, reused once their batch is no longer referenced.

    Each buffer is a numpy array the pool holds; the batch gets ``torch.from_numpy`` of it,
    whose storage refers to the array for as long as the tensor, or any view of it, lives.
    So "nobody holds the batch" reads as the array's reference count being back to the
    pool's own: no rule for the caller to follow, and no way to see a buffer change.
    ``per_shape`` buffers are kept for each (shape, dtype); beyond that, while all are in
    use, a new one is made and not kept.
    """

    def __init__(self, *, per_shape: int = 4) -> None:
        if per_shape < 1:
            raise ValueError(f"per_shape must be >= 1, got {per_shape}")
        self.per_shape = per_shape
        self._buffers: dict[tuple[tuple[int, ...], np.dtype], list[np.ndarray]] = {}
        self.allocated = 0
        self.reused = 0
        self._free_refs = _refs_when_free()

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
        return torch.from_numpy(self.array(shape, dtype))

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """``take``'s buffer as the array the pool holds (no tensor made to be dropped)."""
        key = (tuple(shape), np.dtype(dtype))
        kept = self._buffers.setdefault(key, [])
        for arr in kept:
            if sys.getrefcount(arr) <= self._free_refs:
                self.reused += 1
                return arr
        arr = np.empty(shape, dtype)
        self.allocated += 1
        if len(kept) < self.per_shape:
            kept.append(arr)
        return arr


def _refs_when_free() -> int:
    """The reference count ``HostPool.take`` sees for a buffer nobody else holds: the
    pool's list, the loop's name and ``getrefcount``'s own argument."""
    kept = [np.empty(0)]
    for arr in kept:
        return sys.getrefcount(arr)
    raise AssertionError("unreachable")


def copy_host(tl: Any, out: torch.Tensor) -> None:
    """Copy a dense DALI CPU ``TensorList`` into ``out`` (contiguous, same size): one copy,
    straight from DALI's buffers, contiguous or not."""
    if type(tl).__name__ == "TensorListCPU":
        tl.copy_to_external(ctypes.c_void_p(out.data_ptr()))
    else:  # any other dense array-like batch
        np.copyto(out.numpy(), np.asarray(tl.as_tensor()))


class DeviceCopier:
    """Copies batches to ``device`` on torch's current stream and keeps what the copies read
    alive until they are done (see the module docstring). One per loader.

    Per batch: ``begin()``, any number of ``dali()`` / ``host()`` copies, ``end(keep)``.
    ``max_in_flight`` batches may be copying at once; one more waits for the oldest.
    """

    def __init__(
        self, device: torch.device, *, ops: CudaOps | None = None, max_in_flight: int = 4
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.device = device
        self.ops = ops or CudaOps()
        self.pool = PinnedPool(self.ops)
        self.max_in_flight = max_in_flight
        # (start event, end event, objects the copies read, pinned buffers to give back)
        self._in_flight: deque[tuple[Any, Any, list[Any], list[torch.Tensor]]] = deque()
        self._start: Any = None
        self._staged: list[torch.Tensor] = []
        self._h2d_ms = 0.0

    def begin(self) -> None:
        """Start a batch: an event marks where its copies begin on the stream."""
        self._reclaim()
        while len(self._in_flight) >= self.max_in_flight:
            self._in_flight[0][1].synchronize()
            self._reclaim()
        self._start = self.ops.event()
        self._start.record(self.ops.current_stream(self.device))

    def dali(self, tensor: Any, dtype: torch.dtype) -> Any:
        """A dense DALI GPU tensor, copied into a new torch tensor on the device."""
        stream = self.ops.current_stream(self.device)
        out = self.ops.empty(tuple(tensor.shape()), dtype, self.device)
        self.ops.copy_from_dali(tensor, out, stream)
        return out

    def host(self, array: np.ndarray | torch.Tensor) -> Any:
        """A host array, staged in a pooled pinned buffer and copied without blocking."""
        cpu = torch.from_numpy(array) if isinstance(array, np.ndarray) else array
        pinned = self.pool.take(tuple(cpu.shape), cpu.dtype)
        pinned.copy_(cpu)
        self._staged.append(pinned)
        return self.ops.to_device(pinned, self.device, self.ops.current_stream(self.device))

    def staging(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A pooled pinned buffer to fill in place, then pass to ``send``: no extra copy."""
        buf = self.pool.take(shape, dtype)
        self._staged.append(buf)
        return buf

    def send(self, pinned: torch.Tensor) -> Any:
        """Copy a buffer from ``staging`` (or a view of one over its whole memory, such as
        ``torch.from_numpy`` of its ``.numpy()``) to the device without blocking."""
        for buf in self._staged:  # copy from the pinned tensor itself, not a view's storage
            if buf.data_ptr() == pinned.data_ptr() and buf.shape == pinned.shape:
                pinned = buf
                break
        return self.ops.to_device(pinned, self.device, self.ops.current_stream(self.device))

    def end(self, keep: list[Any] | None = None) -> None:
        """End a batch: an event after its copies; ``keep`` (DALI outputs) and the staged
        buffers stay referenced until it completes."""
        if self._start is None:
            raise RuntimeError("DeviceCopier.end() without begin()")
        done = self.ops.event()
        done.record(self.ops.current_stream(self.device))
        self._in_flight.append((self._start, done, list(keep or ()), self._staged))
        self._start, self._staged = None, []

    def _reclaim(self) -> None:
        while self._in_flight and self._in_flight[0][1].query():
            start, done, _keep, staged = self._in_flight.popleft()
            self._h2d_ms += float(start.elapsed_time(done))
            for buf in staged:
                self.pool.give(buf)

    def take_h2d(self) -> float:
        """Seconds the GPU spent on the copies of batches finished since the last call (a
        batch's copy time is known once it has run, so it may be reported a batch late)."""
        self._reclaim()
        ms, self._h2d_ms = self._h2d_ms, 0.0
        return ms / 1000.0

    def flush(self) -> float:
        """Wait for every copy in flight; returns ``take_h2d()``."""
        for _, done, _, _ in self._in_flight:
            done.synchronize()
        return self.take_h2d()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


def is_gpu(tl: Any) -> bool:
    return type(tl).__name__ == "TensorListGPU"


def to_torch(
    tl: Any, device: torch.device | None, copier: DeviceCopier | None = None
) -> torch.Tensor | list[torch.Tensor]:
    """A DALI ``TensorList`` as a torch tensor.

    On the CPU a dense batch is DALI's own buffer, handed out in place (see the module
    docstring: the pipeline must run DALI's dynamic executor, as ``build_pipeline``'s do).
    With a CUDA ``device``, GPU outputs are copied device-to-device and CPU outputs once
    into a pooled pinned buffer and from there to the device, both without blocking on
    torch's current stream; pass the loader's ``copier`` (between its ``begin()`` and
    ``end(keep=[tl, ...])``) so the buffers outlive the copies, else the copy is waited for
    here. Samples of different shapes (raw bytes of a passed-through field) come back as a
    list of CPU tensors, one per sample.
    """
    if not tl.is_dense_tensor():
        cpu_list = tl.as_cpu() if hasattr(tl, "as_cpu") else tl
        return [torch.from_numpy(np.array(cpu_list.at(i))) for i in range(len(cpu_list))]
    if device is None or device.type != "cuda":
        if is_gpu(tl):
            raise ValueError("a DALI GPU output needs a CUDA device to copy to")
        return torch.from_dlpack(tl.as_tensor())
    own = copier is None
    c = DeviceCopier(device) if copier is None else copier
    if own:
        c.begin()
    if is_gpu(tl):
        t = tl.as_tensor()
        out = c.dali(t, _torch_dtype(t))
    else:
        shape, dtype = _host_layout(tl)
        staged = c.staging(shape, _torch_dtype_of(dtype))
        copy_host(tl, staged)
        out = c.send(staged)
    if own:
        c.end(keep=[tl])
        c.flush()
    return out


def _host_layout(tl: Any) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and numpy dtype of a dense CPU batch, read without copying it."""
    if type(tl).__name__ == "TensorListCPU" and len(tl):
        first = np.asarray(tl[0])  # a view of sample 0
        return (len(tl), *first.shape), first.dtype
    whole = np.asarray(tl.as_tensor())
    return tuple(whole.shape), whole.dtype


def _torch_dtype_of(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _torch_dtype(t: Any) -> torch.dtype:
    from nvidia.dali.plugin.pytorch import to_torch_type

    return to_torch_type[t.dtype]


def to_keys(tl: Any) -> list[str]:
    """The ``__key__`` output (``key_bytes`` per sample, on the CPU) as strings: a dense
    batch (a ``key_column``, or keys of one length) as rows of one array, else each
    sample's bytes read through its buffer (``tl.at(i)`` makes a numpy array per sample,
    about 6x the cost per batch)."""
    if type(tl).__name__ == "TensorListCPU" and tl.is_dense_tensor():
        return key_strings(np.asarray(tl.as_tensor()))
    try:
        return [bytes(memoryview(t)).decode("utf-8", "surrogateescape") for t in tl]
    except TypeError:  # a list of arrays, or a tensor list without the buffer protocol
        return key_strings([tl.at(i) for i in range(len(tl))])

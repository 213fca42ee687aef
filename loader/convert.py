"""DALI outputs -> torch tensors, on the GPU when there is one."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .fields import key_strings

__all__ = ["to_keys", "to_torch"]


def to_torch(tl: Any, device: torch.device | None) -> torch.Tensor | list[torch.Tensor]:
    """A DALI ``TensorList`` as a torch tensor (a copy: DALI reuses its buffers).

    GPU outputs are copied device-to-device; CPU outputs go through pinned memory with a
    non-blocking copy when ``device`` is a CUDA device. Samples of different shapes (raw
    bytes of a passed-through field) come back as a list of CPU tensors, one per sample.
    """
    if not tl.is_dense_tensor():
        cpu_list = tl.as_cpu() if hasattr(tl, "as_cpu") else tl
        return [torch.from_numpy(np.array(cpu_list.at(i))) for i in range(len(cpu_list))]
    if type(tl).__name__ == "TensorListGPU":
        from nvidia.dali.plugin.pytorch import feed_ndarray

        t = tl.as_tensor()
        out = torch.empty(t.shape(), dtype=_torch_dtype(t), device=device)
        feed_ndarray(t, out, cuda_stream=torch.cuda.current_stream(device))
        return out
    arr = np.array(tl.as_tensor())
    cpu = torch.from_numpy(arr)
    if device is not None and device.type == "cuda":
        return cpu.pin_memory().to(device, non_blocking=True)
    return cpu


def _torch_dtype(t: Any) -> torch.dtype:
    from nvidia.dali.plugin.pytorch import to_torch_type

    return to_torch_type[t.dtype]


def to_keys(tl: Any) -> list[str]:
    """The ``__key__`` output (``key_bytes`` per sample, on the CPU) as strings."""
    return key_strings([tl.at(i) for i in range(len(tl))])

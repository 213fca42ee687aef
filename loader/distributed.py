"""Who am I in the job: rank, world size and ranks per node, injectable for tests.

Explicit arguments win; then an initialised ``torch.distributed``; then the launcher's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``); then a single process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from flashfeed.plan.plan import Topology

__all__ = ["DistContext", "cuda_device_index", "resolve_context"]


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        self.topology.check_rank(self.rank)  # also checks world_size and ranks_per_node

    @property
    def topology(self) -> Topology:
        """The job's shape, normalised: no ranks_per_node means one node."""
        return Topology(self.world_size, self.ranks_per_node)

    @property
    def node_rank(self) -> int:
        return self.rank // self.topology.rpn

    @property
    def local_rank(self) -> int:
        return self.rank % self.topology.rpn


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def _torch_dist() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def resolve_context(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    ranks_per_node: int | None = None,
    env: Mapping[str, str] | None = None,
) -> DistContext:
    """Fill what was not given from torch.distributed, then the environment, then 0/1."""
    env = os.environ if env is None else env
    if rank is None or world_size is None:
        found = _torch_dist()
        if found is None:
            env_rank, env_world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
            found = (env_rank or 0, env_world or 1)
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    if ranks_per_node is None:
        local = _env_int(env, "LOCAL_WORLD_SIZE")
        if local is not None and local >= 1 and world_size % local == 0:
            ranks_per_node = local
    return DistContext(rank=rank, world_size=world_size, ranks_per_node=ranks_per_node)


def cuda_device_index(env: Mapping[str, str] | None = None, device_count: int | None = None) -> int:
    """The GPU of this process, as an ordinal among the devices it sees.

    ``LOCAL_RANK % device_count`` when the launcher set ``LOCAL_RANK`` (torchrun and SLURM
    wrappers do): a node whose ranks each see every GPU maps rank ``r`` to GPU ``r``, and one
    where each rank sees a single GPU through ``CUDA_VISIBLE_DEVICES`` maps every rank to its
    ordinal 0. Without ``LOCAL_RANK``, torch's current device. ``env`` and ``device_count``
    default to this process's environment and ``torch.cuda.device_count()``.
    """
    env = os.environ if env is None else env
    local = _env_int(env, "LOCAL_RANK")
    if local is None:
        import torch

        return int(torch.cuda.current_device())
    if local < 0:
        raise ValueError(f"environment variable LOCAL_RANK must be >= 0, got {local}")
    if device_count is None:
        import torch

        device_count = int(torch.cuda.device_count())
    if device_count < 1:
        raise ValueError(
            f"LOCAL_RANK={local} but this process sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    return local % device_count

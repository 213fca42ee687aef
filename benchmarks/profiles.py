"""How big each stage of a suite run is: the quick smoke profile and the full one."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "QUICK", "Profile"]


@dataclass(frozen=True)
class Profile:
    """Sizes of one suite run. ``scales`` multiply each stage's base size."""

    name: str
    scales: tuple[int, ...]
    rounds: int
    ingest_base_mb: int
    ingest_shard: str
    cache_base_shards: int
    cache_shard: str
    loader_base_images: int
    token_rows: int
    peer_images: int
    stall_images: int
    coldstart_images: int
    read_mb: int
    s3_objects: int
    crypto_args: tuple[str, ...]
    stage_timeout_s: int
    worker_variants: bool = True


QUICK = Profile(
    name="quick",
    scales=(1, 4),
    rounds=1,
    ingest_base_mb=4,
    ingest_shard="4MiB",
    cache_base_shards=2,
    cache_shard="4MiB",
    loader_base_images=512,
    token_rows=2048,
    peer_images=512,
    stall_images=512,
    coldstart_images=512,
    read_mb=64,
    s3_objects=4,
    crypto_args=(
        "--cipher-mib",
        "32",
        "--rounds",
        "2",
        "--shards",
        "2",
        "--per-shard",
        "64",
        "--loader-rounds",
        "1",
    ),
    stage_timeout_s=150,
    worker_variants=False,
)
FULL = Profile(
    name="full",
    scales=(1, 4, 16),
    rounds=2,
    ingest_base_mb=24,
    ingest_shard="16MiB",
    cache_base_shards=3,
    cache_shard="16MiB",
    loader_base_images=512,
    token_rows=16384,
    peer_images=2048,
    stall_images=2048,
    coldstart_images=5000,
    read_mb=512,
    s3_objects=8,
    crypto_args=("--loader-rounds", "2"),
    stage_timeout_s=900,
)

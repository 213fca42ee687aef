"""How big each stage of a suite run is: the quick smoke profile and the full one.

The full profile is sized to finish in about 35 minutes on 2 shared cores: every stage runs
at least 5 interleaved rounds whose order rotates, and each loader row is timed over a
window of at least ``min_seconds``, construction included.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "QUICK", "Profile"]


@dataclass(frozen=True)
class Profile:
    """Sizes of one suite run. ``scales`` multiply the base size of ingest and cache;
    ``loader_scales`` that of the loader stage."""

    name: str
    scales: tuple[int, ...]
    loader_scales: tuple[int, ...]
    rounds: int
    min_seconds: float
    ingest_base_mb: int
    ingest_shard: str
    cache_base_shards: int
    cache_shard: str
    loader_base_images: int
    token_rows: int
    peer_images: int
    stall_images: int
    coldstart_images: int
    targets_mb: int
    targets_shard_mib: str
    targets_rounds: int
    fillcpu_shards: int
    fillcpu_shard: str
    read_mb: int
    s3_objects: int
    crypto_args: tuple[str, ...]
    tokens_args: tuple[str, ...]
    stage_timeout_s: int
    #: image-text pairs and buckets (benchmarks/stages/multimodal.py)
    multimodal_args: tuple[str, ...] = ("--images", "2048", "--rounds", "5")
    worker_variants: bool = True
    #: GETs in flight besides the default 8, in the cache stage (with ``worker_variants``)
    cache_get_variants: tuple[int, ...] = ()
    #: arguments of the near-duplicate stage (neardup.py)
    neardup_args: tuple[str, ...] = ("--bases", "300", "--rounds", "1", "--kernel-rounds", "1")
    #: arguments of the near-dup accuracy and speed stage (neardupcurve.py)
    neardupcurve_args: tuple[str, ...] = ("--bases", "300", "--seeds", "0", "--rounds", "1")


QUICK = Profile(
    name="quick",
    scales=(1, 4),
    loader_scales=(1,),
    rounds=1,
    min_seconds=2.0,
    ingest_base_mb=4,
    ingest_shard="4MiB",
    cache_base_shards=2,
    cache_shard="4MiB",
    loader_base_images=512,
    token_rows=2048,
    peer_images=512,
    stall_images=512,
    coldstart_images=512,
    targets_mb=16,
    targets_shard_mib="8",
    targets_rounds=1,
    fillcpu_shards=2,
    fillcpu_shard="16MiB",
    read_mb=64,
    s3_objects=4,
    tokens_args=(
        "--mb",
        "0.5",
        "--rounds",
        "1",
        "--token-rows",
        "512",
        "--seq-len",
        "512",
        "--shard-size",
        "128KB",
        "--batch-size",
        "16",
        "--percpu-mb",
        "0.5",
        "--ray-cpus",
        "1",
    ),
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
    multimodal_args=("--images", "512", "--rounds", "1", "--min-seconds", "2"),
)
FULL = Profile(
    name="full",
    scales=(1, 4),
    loader_scales=(4,),
    rounds=5,
    min_seconds=5.0,
    ingest_base_mb=24,
    ingest_shard="16MiB",
    cache_base_shards=3,
    cache_shard="16MiB",
    loader_base_images=512,
    token_rows=16384,
    peer_images=2048,
    stall_images=2048,
    coldstart_images=1280,
    targets_mb=450,
    targets_shard_mib="100",
    targets_rounds=5,
    fillcpu_shards=4,
    fillcpu_shard="64MiB",
    read_mb=512,
    s3_objects=8,
    tokens_args=("--mb", "8", "--rounds", "3", "--token-rows", "8192", "--batch-size", "64"),
    crypto_args=("--loader-rounds", "5"),
    neardup_args=("--bases", "10000", "--rounds", "3"),
    neardupcurve_args=("--bases", "2000", "--seeds", "0,1", "--rounds", "3"),
    stage_timeout_s=900,
)

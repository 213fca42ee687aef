"""``CacheOptions``: the validated, frozen configuration of a ``ShardCache``."""

from __future__ import annotations

from dataclasses import dataclass

from flashfeed.s3.retry import RetryPolicy, env_retry
from flashfeed.units import parse_size

__all__ = ["VERIFY_MODES", "CacheOptions", "default_retry"]

VERIFY_MODES = ("once", "always", "never")


def default_retry() -> RetryPolicy:
    """Backoff with jitter, 10 attempts a part; ``FLASHFEED_RETRY_DEADLINE`` shortens the
    total budget (read by ``flashfeed.s3.retry.env_retry``, as for every storage call)."""
    return env_retry(RetryPolicy(attempts=10))


@dataclass(frozen=True)
class CacheOptions:
    """What a cache may hold and how it fetches.

    ``verify``: ``"once"`` checks a cached shard's checksum the first time each process uses
    it (and after every fill), ``"always"`` on every ``get``, ``"never"`` only after fills.
    ``space_timeout``: seconds a fill waits for pinned or in-use shards to free room before
    it fails with ``CacheFullError``.
    """

    capacity: int
    part_size: int = 16 << 20
    concurrency: int = 8
    min_concurrency: int = 1
    fetch_ahead_workers: int = 4
    verify: str = "once"
    space_timeout: float = 10.0
    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {self.capacity}")
        if self.part_size < 4096:
            raise ValueError(f"part_size must be >= 4096 bytes, got {self.part_size}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not 1 <= self.min_concurrency <= self.concurrency:
            raise ValueError(
                f"min_concurrency must be in [1, concurrency={self.concurrency}], "
                f"got {self.min_concurrency}"
            )
        if self.fetch_ahead_workers < 1:
            raise ValueError(f"fetch_ahead_workers must be >= 1, got {self.fetch_ahead_workers}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        if self.space_timeout < 0:
            raise ValueError(f"space_timeout must be >= 0, got {self.space_timeout}")

    @classmethod
    def build(
        cls, *, capacity: int | str, part_size: int | str = "16MiB", **kwargs: object
    ) -> CacheOptions:
        """Options from user values: sizes may be strings like ``"500GiB"``."""
        return cls(
            capacity=parse_size(capacity, name="capacity"),
            part_size=parse_size(part_size, name="part_size"),
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def retry_policy(self) -> RetryPolicy:
        return self.retry or default_retry()

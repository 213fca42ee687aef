"""Human-readable byte sizes: ``parse_size("256MiB")`` and ``format_size(n)``."""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, *, name: str = "size") -> int:
    """Bytes from an int or a string like ``"500GiB"``, ``"64 MB"``, ``"1024"``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a byte count or a string like '256MiB', got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.match(str(value))
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ValueError(
                f"{name} must be a byte count or a string like '256MiB' or '10GB', got {value!r}"
            )
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return n


def format_size(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} TiB"

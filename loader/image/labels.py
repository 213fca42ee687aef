"""Labels as int64 whatever their encoding: ``.cls``/``.txt`` text, ``.json``, raw ints."""

from __future__ import annotations

import json

import numpy as np

__all__ = ["LABEL_EXTS", "parse_label"]

LABEL_EXTS = ("cls", "label", "txt", "json", "index")
_JSON_KEYS = ("label", "cls", "class", "target")


def parse_label(data: bytes | memoryview, ext: str, *, where: str = "sample") -> np.int64:
    """One label as ``np.int64``; anything unparsable is a ``ValueError`` naming ``where``."""
    raw = bytes(data)
    try:
        if ext.endswith("json"):
            value = json.loads(raw)
            if isinstance(value, dict):
                for k in _JSON_KEYS:
                    if k in value:
                        value = value[k]
                        break
                else:
                    raise ValueError(f"no {'/'.join(_JSON_KEYS)} key")
        else:
            value = raw.decode("utf-8").strip()
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"not an integer: {value!r}")
        return np.int64(int(value))
    except (ValueError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: label .{ext} is not an integer ({exc})") from None

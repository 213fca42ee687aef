"""Text that cannot leave Python as UTF-8: a lone surrogate (``"\\ud800"`` is valid JSON,
common in scraped text) fails every encoder downstream (the tokenizer, the hashers, Arrow,
tar members), so readers and transforms skip it as a counted ``lone_surrogate``."""

from __future__ import annotations

__all__ = ["LONE_SURROGATE", "lone_surrogate"]

LONE_SURROGATE = "lone_surrogate"


def lone_surrogate(text: str) -> str | None:
    """Where ``text`` holds a code point UTF-8 cannot encode (``U+D800 at character 12``),
    or None when it encodes. ASCII text is answered without a scan."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"U+{ord(text[exc.start]):04X} at character {exc.start}"
    return None

"""Image members: the one table of their extensions and media types.

Ingest recognises an image field by its extension, the manifest schema names its media
type, and a loader's default ``image`` field reads the ones its decoder takes.
"""

from __future__ import annotations

__all__ = ["IMAGE_EXTS", "IMAGE_MEDIA_TYPES", "LOADER_IMAGE_EXTS"]

#: extension -> (media type, read by a loader's default ``image`` field); in the order a
#: loader prefers them when a sample holds more than one
_IMAGES: dict[str, tuple[str, bool]] = {
    "jpg": ("image/jpeg", True),
    "jpeg": ("image/jpeg", True),
    "png": ("image/png", True),
    "webp": ("image/webp", True),
    "bmp": ("image/bmp", True),
    "gif": ("image/gif", False),
    "tif": ("image/tiff", False),
    "tiff": ("image/tiff", False),
}

#: an image member's media type by its extension
IMAGE_MEDIA_TYPES: dict[str, str] = {ext: media for ext, (media, _) in _IMAGES.items()}
#: every extension that marks an image member
IMAGE_EXTS: frozenset[str] = frozenset(_IMAGES)
#: what a loader's default ``image`` field looks for, first found wins
LOADER_IMAGE_EXTS: tuple[str, ...] = tuple(ext for ext, (_, read) in _IMAGES.items() if read)

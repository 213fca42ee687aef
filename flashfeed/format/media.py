"""Image members: the one table of their extensions and media types.

Ingest recognises an image field by its extension, the manifest schema names its media
type, and a loader's default ``image`` field reads the ones its decoder takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = [
    "IMAGE_EXTS",
    "IMAGE_MEDIA_TYPES",
    "LOADER_IMAGE_EXTS",
    "image_size",
    "member_image_sizes",
]

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


def image_size(data: bytes | memoryview) -> tuple[int, int]:
    """``(width, height)`` of an encoded image, read from its header only (no decode);
    ``(0, 0)`` when the bytes are no image Pillow can read."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return 0, 0
    return int(width), int(height)


def member_image_sizes(
    members: Sequence[Mapping[str, bytes | memoryview]],
) -> tuple[list[int], list[int]]:
    """Widths and heights of each sample's image member (the first of ``LOADER_IMAGE_EXTS``
    it has; 0 and 0 without one): the shard table's ``widths``/``heights`` of one shard."""
    widths, heights = [], []
    for m in members:
        ext = next((e for e in LOADER_IMAGE_EXTS if e in m), None)
        w, h = image_size(m[ext]) if ext is not None else (0, 0)
        widths.append(w)
        heights.append(h)
    return widths, heights

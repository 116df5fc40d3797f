"""Image sources: base64 data URLs only.

A source is accepted as ``data:image/png|jpeg|webp;base64,<payload>``. Remote
URLs are never fetched; other media types (GIF, video, ...) are rejected. The
payload's decoded size is known from its length, so the encoded-byte limit is
checked before base64 decoding allocates anything.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass

from .errors import ImageError
from .limits import ImageLimits

SUPPORTED_MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp")
# Common aliases clients send; normalised to the canonical type.
_MEDIA_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}
_REMOTE_SCHEMES = ("http:", "https:", "file:", "ftp:", "s3:", "gs:")


@dataclass(frozen=True, eq=False)
class EncodedImage:
    """A declared media type and the encoded bytes it names."""

    media_type: str
    data: bytes


def _decoded_len(payload: str) -> int:
    stripped = payload.rstrip("=")
    return len(stripped) * 3 // 4


def parse_data_url(url: str, limits: ImageLimits, *, param: str | None = None) -> EncodedImage:
    """Parse a base64 data URL into an EncodedImage, or raise ImageError."""
    if not isinstance(url, str):
        raise ImageError("image_data_url", "image source must be a string data URL", param=param)
    head = url[:16].lstrip().lower()
    if head.startswith(_REMOTE_SCHEMES):
        raise ImageError("image_remote_url",
                         "remote image URLs are not fetched; send a base64 data URL "
                         "(data:image/png;base64,...)", param=param)
    if not head.startswith("data:"):
        raise ImageError("image_data_url", "image source must be a data: URL", param=param)
    comma = url.find(",")
    if comma < 0:
        raise ImageError("image_data_url", "data URL has no ',' before its payload", param=param)
    header = url[url.index(":") + 1:comma].strip()
    parts = [p.strip() for p in header.split(";")]
    media_type = parts[0].lower()
    media_type = _MEDIA_ALIASES.get(media_type, media_type)
    params = [p.lower() for p in parts[1:] if p]
    if media_type.startswith("video/"):
        raise ImageError("image_media_type", f"video input ({media_type}) is not supported",
                         param=param)
    if media_type not in SUPPORTED_MEDIA_TYPES:
        raise ImageError("image_media_type",
                         f"unsupported image media type {media_type or '(none)'!r}; "
                         f"expected one of {', '.join(SUPPORTED_MEDIA_TYPES)}", param=param)
    if "base64" not in params:
        raise ImageError("image_data_url", "image data URL must be base64 encoded (;base64,)",
                         param=param)
    payload = url[comma + 1:]
    if _decoded_len(payload) > limits.max_encoded_bytes:
        raise ImageError("image_too_large",
                         f"image payload of about {_decoded_len(payload)} bytes exceeds the "
                         f"limit of {limits.max_encoded_bytes} bytes", param=param)
    try:
        data = binascii.a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError("image_base64", f"image payload is not valid base64: {exc}",
                         param=param) from None
    if not data:
        raise ImageError("image_truncated", "image payload is empty", param=param)
    return EncodedImage(media_type, data)


def check_encoded(image: EncodedImage, limits: ImageLimits, *, param: str | None = None) -> None:
    """Validate an EncodedImage built without a data URL (media type and size)."""
    if image.media_type not in SUPPORTED_MEDIA_TYPES:
        raise ImageError("image_media_type",
                         f"unsupported image media type {image.media_type!r}", param=param)
    if len(image.data) > limits.max_encoded_bytes:
        raise ImageError("image_too_large",
                         f"image of {len(image.data)} bytes exceeds the limit of "
                         f"{limits.max_encoded_bytes} bytes", param=param)
    if not image.data:
        raise ImageError("image_truncated", "image payload is empty", param=param)

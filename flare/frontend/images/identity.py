"""32-byte image identities for PrefixHistory conditioning events.

- The semantic identity names what the model will see: the decoded, upright
  pixels, the channels the profile keeps and the resize mode. Two encodings
  of the same pixels (a PNG and a lossless WebP) share it.
- The encoded-source key names the request input: the declared media type,
  the exact source bytes and the processor settings, so a cached preparation
  is reused only for identical input under identical settings.

BLAKE2b-256 with a distinct personalisation string per kind keeps the two
domains apart; every variable-length field is length-prefixed.
"""

from __future__ import annotations

import hashlib
import struct

from .rgb_image import RgbImage
from .source import EncodedImage

IDENTITY_BYTES = 32


def _field(h, value: bytes) -> None:
    h.update(struct.pack("<Q", len(value)))
    h.update(value)


def semantic_identity(image: RgbImage, resize_mode: str) -> bytes:
    """Identity of decoded content: size, kept channels, resize mode and pixel bytes."""
    h = hashlib.blake2b(digest_size=IDENTITY_BYTES, person=b"flare-img-sem-v1")
    h.update(struct.pack("<QQ", image.height, image.width))
    _field(h, image.channels.encode())
    _field(h, resize_mode.encode())
    h.update(image.pixels.data)
    if image.alpha is not None:
        h.update(image.alpha.data)
    if image.cmyk is not None:
        h.update(image.cmyk.data)
    return h.digest()


def source_key(image: EncodedImage, settings: bytes) -> bytes:
    """Identity of an encoded input under processor ``settings`` (canonical bytes)."""
    h = hashlib.blake2b(digest_size=IDENTITY_BYTES, person=b"flare-img-src-v1")
    _field(h, image.media_type.encode())
    _field(h, settings)
    _field(h, image.data)
    return h.digest()

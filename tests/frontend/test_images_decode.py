"""Decoder rules: CMYK conversion, orientation, kept channels, identities, sources."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from flare.frontend.images import (
    EncodedImage,
    ImageLimits,
    ImageProcessor,
    QwenImageProfile,
    parse_data_url,
)
from flare.frontend.images.decode import cmyk_to_rgb
from flare.frontend.images.exif import apply_orientation

PROCESSOR = ImageProcessor()


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def scene(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 7 % 256, y * 3 % 256, (x * y) % 256], -1).astype(np.uint8)


def test_cmyk_rule_equals_pillow_for_every_ink_pair():
    c, k = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    ink = np.stack([c, 255 - c, (c + k) % 256, k], -1).astype(np.uint8)  # true ink amounts
    expected = np.asarray(Image.fromarray(ink, "CMYK").convert("RGB"))
    assert np.array_equal(cmyk_to_rgb(255 - ink), expected)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_matches_pillow_exif_transpose(orientation):
    pixels = scene(5, 7)
    image = Image.fromarray(pixels)
    exif = Image.Exif()
    exif[0x0112] = orientation
    image.info["exif"] = exif.tobytes()
    expected = np.asarray(ImageOps.exif_transpose(image))
    assert np.array_equal(apply_orientation(pixels, orientation), expected)


def test_png_orientation_applied_before_resize():
    exif = Image.Exif()
    exif[0x0112] = 8
    data = encode(Image.fromarray(scene(40, 90)), "PNG", exif=exif.tobytes())
    image = PROCESSOR.decode(EncodedImage("image/png", data))
    assert (image.height, image.width, image.orientation) == (90, 40, 8)
    assert PROCESSOR.geometry(image).resized_height > PROCESSOR.geometry(image).resized_width


def test_alpha_discarded_or_kept_by_profile():
    rgba = np.dstack([scene(32, 48), np.arange(32 * 48, dtype=np.uint8).reshape(32, 48)])
    data = encode(Image.fromarray(rgba, "RGBA"), "PNG")
    plain = PROCESSOR.decode(EncodedImage("image/png", data))
    assert plain.alpha is None and plain.channels == "rgb8"
    assert np.array_equal(plain.pixels, rgba[..., :3])  # discarded, not composited
    keeping = ImageProcessor(QwenImageProfile(keep_alpha=True))
    kept = keeping.decode(EncodedImage("image/png", data))
    assert np.array_equal(kept.alpha, rgba[..., 3]) and kept.channels == "rgb8+alpha8"
    assert keeping.semantic_identity(kept) != PROCESSOR.semantic_identity(plain)


def test_cmyk_kept_by_profile():
    ink = np.dstack([scene(16, 24), scene(16, 24)[..., :1]])
    data = encode(Image.fromarray(ink, "CMYK"), "JPEG", quality=95)
    kept = ImageProcessor(QwenImageProfile(keep_cmyk=True)).decode(EncodedImage("image/jpeg", data))
    assert kept.color == "cmyk" and kept.cmyk.shape == (16, 24, 4)
    assert np.array_equal(kept.cmyk, np.asarray(Image.open(io.BytesIO(data))))


def test_pixels_are_read_only():
    image = PROCESSOR.decode(EncodedImage("image/png", encode(Image.fromarray(scene(8, 8)), "PNG")))
    with pytest.raises(ValueError):
        image.pixels[0, 0, 0] = 1


def test_semantic_identity_follows_pixels_not_encoding():
    pixels = scene(30, 50)
    png = PROCESSOR.decode(EncodedImage("image/png", encode(Image.fromarray(pixels), "PNG")))
    webp = PROCESSOR.decode(EncodedImage("image/webp", encode(Image.fromarray(pixels), "WEBP",
                                                              lossless=True)))
    other = pixels.copy()
    other[0, 0, 0] ^= 1
    changed = PROCESSOR.decode(EncodedImage("image/png", encode(Image.fromarray(other), "PNG")))
    ids = [PROCESSOR.semantic_identity(i) for i in (png, webp, changed)]
    assert all(len(i) == 32 for i in ids)
    assert ids[0] == ids[1] != ids[2]


def test_source_key_covers_media_type_bytes_and_settings():
    data = encode(Image.fromarray(scene(8, 8)), "PNG")
    key = PROCESSOR.source_key(EncodedImage("image/png", data))
    assert len(key) == 32
    assert key == PROCESSOR.source_key(EncodedImage("image/png", bytes(data)))
    assert key != PROCESSOR.source_key(EncodedImage("image/webp", data))
    assert key != PROCESSOR.source_key(EncodedImage("image/png", data + b"\x00"))
    smaller = ImageProcessor(QwenImageProfile(max_pixels=1 << 20))
    assert key != smaller.source_key(EncodedImage("image/png", data))


def test_data_url_round_trip_and_aliases():
    data = encode(Image.fromarray(scene(8, 8)), "JPEG")
    url = "data:image/JPG;base64," + base64.b64encode(data).decode()
    encoded = parse_data_url(url, ImageLimits())
    assert encoded.media_type == "image/jpeg" and encoded.data == data
    assert PROCESSOR.decode(url).width == 8


def test_sixteen_bit_gray_keeps_high_byte():
    samples = (np.arange(64 * 4, dtype=np.uint32) * 257).reshape(16, 16).astype(np.uint16)
    data = encode(Image.fromarray(samples), "PNG")
    image = PROCESSOR.decode(EncodedImage("image/png", data))
    assert np.array_equal(image.pixels[..., 0], (samples >> 8).astype(np.uint8))
    assert np.array_equal(image.pixels[..., 0], image.pixels[..., 2])

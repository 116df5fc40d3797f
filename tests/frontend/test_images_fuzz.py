"""Fuzz: thousands of mutated images, no crash, no hang, only typed errors.

Seeds cover every decoder path (PNG modes incl. 16-bit and interlaced, baseline,
progressive and CMYK JPEG, lossy and lossless WebP, EXIF). Mutations flip bits,
overwrite bytes and 16/32-bit fields, truncate, splice and duplicate. Each
mutant must decode to a well-formed RgbImage or raise ImageError; a tight
pixel limit keeps mutated headers from asking for large (if legal) buffers.
"""

from __future__ import annotations

import io
import random
import struct
import time

import numpy as np
from PIL import Image

from flare.frontend.images import EncodedImage, ImageError, ImageLimits, ImageProcessor

NUM_MUTANTS = 6000
LIMITS = ImageLimits(max_pixels=512 * 512, max_encoded_bytes=1 << 20)
PROCESSOR = ImageProcessor(limits=LIMITS)


def _encode(image: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def _seeds() -> list[tuple[str, bytes]]:
    y, x = np.mgrid[0:40, 0:56]
    rgb = np.stack([x * 4, y * 6, (x ^ y) * 3], -1).astype(np.uint8)
    image = Image.fromarray(rgb)
    exif = Image.Exif()
    exif[0x0112] = 6
    gray16 = (x * 1000 + y * 37).astype(np.uint16)
    return [
        ("image/png", _encode(image, "PNG")),
        ("image/png", _encode(image.convert("RGBA"), "PNG")),
        ("image/png", _encode(image.quantize(16), "PNG", transparency=2)),
        ("image/png", _encode(image.convert("LA"), "PNG")),
        ("image/png", _encode(Image.fromarray(gray16), "PNG")),
        ("image/png", _encode(image, "PNG", interlace=1, exif=exif.tobytes())),
        ("image/jpeg", _encode(image, "JPEG", quality=80)),
        ("image/jpeg", _encode(image, "JPEG", quality=80, progressive=True, exif=exif.tobytes())),
        ("image/jpeg", _encode(image.convert("CMYK"), "JPEG", quality=80)),
        ("image/jpeg", _encode(image.convert("L"), "JPEG", quality=80, subsampling=0)),
        ("image/webp", _encode(image, "WEBP", quality=70)),
        ("image/webp", _encode(image.convert("RGBA"), "WEBP", lossless=True)),
    ]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        kind = rng.randrange(7)
        at = rng.randrange(len(out)) if out else 0
        if kind == 0 and out:
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1 and out:
            out[at] = rng.randrange(256)
        elif kind == 2 and len(out) > at + 4:
            value = rng.choice((0, 1, 0xFFFF, 0x7FFF, 0xFFFFFFFF, 0x80000000, rng.randrange(1 << 32)))
            out[at:at + 4] = struct.pack(">I", value & 0xFFFFFFFF)
        elif kind == 3 and len(out) > at + 2:
            out[at:at + 2] = struct.pack(">H", rng.choice((0, 1, 0xFFFF, rng.randrange(1 << 16))))
        elif kind == 4:
            del out[rng.randrange(len(out) + 1):]
        elif kind == 5 and out:
            start = rng.randrange(len(out))
            chunk = out[start:start + rng.randrange(1, 64)]
            out[at:at] = chunk
        elif kind == 6 and out:
            del out[at:at + rng.randrange(1, 32)]
    return bytes(out)


def test_mutated_images_never_crash_or_hang():
    rng = random.Random(20261130)
    seeds = _seeds()
    outcomes = {"decoded": 0, "rejected": 0}
    codes = set()
    slowest = 0.0
    started = time.perf_counter()
    for index in range(NUM_MUTANTS):
        media_type, data = seeds[index % len(seeds)]
        mutant = _mutate(rng, data)
        begin = time.perf_counter()
        try:
            image = PROCESSOR.decode(EncodedImage(media_type, mutant))
        except ImageError as error:
            outcomes["rejected"] += 1
            codes.add(error.code)
        else:
            outcomes["decoded"] += 1
            assert image.pixels.dtype == np.uint8 and image.pixels.ndim == 3
            assert image.pixels.shape[2] == 3 and image.height * image.width <= LIMITS.max_pixels
            if index % 25 == 0:
                try:
                    processed = PROCESSOR.process([image])
                except ImageError as error:  # e.g. a mutated aspect ratio
                    codes.add(error.code)
                else:
                    assert np.isfinite(processed.pixel_values).all()
        slowest = max(slowest, time.perf_counter() - begin)
    elapsed = time.perf_counter() - started
    assert outcomes["decoded"] > 100 and outcomes["rejected"] > 100, outcomes
    assert {"image_truncated", "image_corrupt"} <= codes
    assert slowest < 2.0, f"one mutant took {slowest:.2f}s"
    assert elapsed < 60.0, f"fuzzing took {elapsed:.1f}s"

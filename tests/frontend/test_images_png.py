"""Native PNG reconstruction (flare._fast.image_png) against Pillow's decoder.

PNGs are built here with a chosen filter on every row (Pillow's encoder picks
its own), for each natively decoded colour type and bit depth; the native
pixels and alpha must equal what Pillow decodes, byte for byte. Mutated PNGs
must either decode to Pillow's pixels or be rejected with a typed error.
"""

from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from flare._fast.image_png import reconstruct
from flare.frontend.images import EncodedImage, ImageError, ImageLimits, probe_header
from flare.frontend.images.decode import _decode_pillow, _decode_png, _is_native_png

LIMITS = ImageLimits()
# IHDR colour type -> samples per pixel.
SAMPLES = {0: 1, 2: 3, 4: 2, 6: 4}


def _predict(filter_type: int, left: np.ndarray, up: np.ndarray, up_left: np.ndarray) -> np.ndarray:
    a, b, c = (v.astype(np.int32) for v in (left, up, up_left))
    if filter_type == 0:
        return np.zeros_like(a)
    if filter_type == 1:
        return a
    if filter_type == 2:
        return b
    if filter_type == 3:
        return (a + b) >> 1
    pa, pb, pc = np.abs(b - c), np.abs(a - c), np.abs(a + b - 2 * c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def filtered_scanlines(rows: np.ndarray, bpp: int, filters: list[int]) -> bytes:
    """PNG filtering (ISO/IEC 15948 9.2) of raw rows [H, stride] with one filter per row."""
    out = bytearray()
    zero = np.zeros(rows.shape[1], dtype=np.uint8)
    for y, filter_type in enumerate(filters):
        row = rows[y]
        up = rows[y - 1] if y else zero
        left = np.concatenate([np.zeros(bpp, np.uint8), row[:-bpp]])
        up_left = np.concatenate([np.zeros(bpp, np.uint8), up[:-bpp]])
        residual = (row.astype(np.int32) - _predict(filter_type, left, up, up_left)) & 0xFF
        out.append(filter_type)
        out += residual.astype(np.uint8).tobytes()
    return bytes(out)


def chunk(ctype: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def build_png(samples: np.ndarray, color_type: int, bit_depth: int, filters: list[int],
              *, idat_size: int = 1 << 30, extra: list[bytes] = (), interlace: int = 0) -> bytes:
    """A PNG of ``samples`` [H, W, channels] (uint8 or big-endian uint16) with the given row filters."""
    height, width = samples.shape[:2]
    raw = samples.astype(">u2" if bit_depth == 16 else np.uint8).reshape(height, -1)
    raw = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(height, -1)
    bpp = SAMPLES[color_type] * bit_depth // 8
    data = zlib.compress(filtered_scanlines(raw, bpp, filters), 6)
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, interlace)
    idats = b"".join(chunk(b"IDAT", data[i:i + idat_size]) for i in range(0, len(data), idat_size))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + b"".join(extra) + idats
            + chunk(b"IEND", b""))


def decode_both(data: bytes, keep_alpha: bool = False):
    header = probe_header(EncodedImage("image/png", data), LIMITS)
    assert _is_native_png(header, keep_alpha)
    native_rgb, native_alpha, _ = _decode_png(data, header, keep_alpha)
    pillow_rgb, pillow_alpha, _ = _decode_pillow(data, header, keep_alpha)
    return (native_rgb, native_alpha), (pillow_rgb, pillow_alpha)


@pytest.mark.parametrize("color_type", sorted(SAMPLES))
@pytest.mark.parametrize("bit_depth", [8, 16])
@pytest.mark.parametrize("width", [1, 2, 3, 7, 64])
def test_every_filter_matches_pillow(color_type, bit_depth, width):
    rng = np.random.default_rng(color_type * 100 + bit_depth + width)
    height = 15
    top = 65535 if bit_depth == 16 else 255
    samples = rng.integers(0, top + 1, (height, width, SAMPLES[color_type]))
    # Smooth regions make Paeth and Average choose every neighbour; noise covers wrap-around.
    samples[: height // 2] = (samples[: height // 2] // 64) * 64
    filters = [y % 5 for y in range(height)]
    data = build_png(samples, color_type, bit_depth, filters, idat_size=97)
    for keep_alpha in (False, True):
        (rgb, alpha), (expected_rgb, expected_alpha) = decode_both(data, keep_alpha)
        assert rgb.shape == (height, width, 3) and rgb.dtype == np.uint8
        assert np.array_equal(rgb, expected_rgb)
        if expected_alpha is None:
            assert alpha is None
        else:
            assert np.array_equal(alpha, expected_alpha)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "I;16"])
def test_pillow_encoded_pngs_match_pillow(mode):
    y, x = np.mgrid[0:61, 0:83]
    rgb = np.stack([x * 3, y * 4, (x * y) % 251], -1).astype(np.uint8)
    image = Image.fromarray(rgb)
    if mode == "I;16":
        image = Image.fromarray((x * 700 + y * 13).astype(np.uint16))
    elif mode != "RGB":
        image = image.convert(mode)
    for optimize in (False, True):
        out = io.BytesIO()
        image.save(out, "PNG", optimize=optimize)
        (rgb_native, _), (rgb_pillow, _) = decode_both(out.getvalue())
        assert np.array_equal(rgb_native, rgb_pillow)


def test_transparency_and_palette_pngs_go_to_pillow():
    rgb = np.zeros((4, 4, 3), np.uint8)
    trns = build_png(rgb, 2, 8, [0] * 4, extra=[chunk(b"tRNS", b"\x00\x00\x00\x00\x00\x00")])
    header = probe_header(EncodedImage("image/png", trns), LIMITS)
    assert header.transparency and _is_native_png(header, False) and not _is_native_png(header, True)
    out = io.BytesIO()
    Image.fromarray(rgb).quantize(4).save(out, "PNG")
    assert not _is_native_png(probe_header(EncodedImage("image/png", out.getvalue()), LIMITS), False)
    adam7 = build_png(rgb, 2, 8, [0] * 4, interlace=1)  # header only: Pillow writes no Adam7
    assert not _is_native_png(probe_header(EncodedImage("image/png", adam7), LIMITS), False)


def test_short_and_corrupt_image_data_are_typed_errors():
    samples = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    good = filtered_scanlines(samples.reshape(8, -1), 3, [1] * 8)
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0))

    def png(scanlines_zlib: bytes) -> bytes:
        return b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"IDAT", scanlines_zlib) + chunk(b"IEND", b"")

    def code(data: bytes) -> str:
        with pytest.raises(ImageError) as info:
            _decode_png(data, probe_header(EncodedImage("image/png", data), LIMITS), False)
        return info.value.code

    assert code(png(zlib.compress(good[:-5]))) == "image_truncated"
    assert code(png(zlib.compress(good)[:-12])) == "image_truncated"
    assert code(png(b"\x78\x9c\xff\xff\xff\xff")) == "image_corrupt"
    bad_filter = bytearray(good)
    bad_filter[3 * 25] = 5  # the filter byte of row 3
    assert code(png(zlib.compress(bytes(bad_filter)))) == "image_corrupt"
    # Data past the last row is ignored, as Pillow ignores it.
    rgb, _, _ = _decode_png(png(zlib.compress(good + b"\x00" * 50)),
                            probe_header(EncodedImage("image/png", png(zlib.compress(good))), LIMITS),
                            False)
    assert np.array_equal(rgb, samples)


def test_reconstruct_rejects_bad_arguments():
    with pytest.raises(ValueError):
        reconstruct(b"\x00" * 10, 2, 2, 3, 8)  # palette is Pillow's
    with pytest.raises(ValueError):
        reconstruct(b"\x00" * 10, 2, 2, 2, 4)
    with pytest.raises(ValueError):
        reconstruct(b"\x00" * 12, 2, 2, 2, 8)  # 14 bytes needed


def _decode_or_none(decoder, data: bytes):
    try:
        return decoder(data, probe_header(EncodedImage("image/png", data), LIMITS), False)[0]
    except ImageError:
        return None


def test_mutated_scanlines_agree_with_pillow():
    # Mutations of the filtered scanlines (filter bytes included), recompressed:
    # both decoders must accept or reject alike, and agree on every pixel. The
    # one difference: Pillow quietly zero-fills the rows of a stream that ends
    # early, where the native path reports image_truncated.
    rng = random.Random(7)
    nprng = np.random.default_rng(7)
    seeds = []
    for color_type in SAMPLES:
        for bit_depth in (8, 16):
            samples = nprng.integers(0, 256 if bit_depth == 8 else 65536, (9, 11, SAMPLES[color_type]))
            seeds.append((samples, color_type, bit_depth))
    outcomes = {"decoded": 0, "rejected": 0}
    for index in range(600):
        samples, color_type, bit_depth = seeds[index % len(seeds)]
        png = build_png(samples, color_type, bit_depth, [rng.randrange(5) for _ in range(9)])
        header = probe_header(EncodedImage("image/png", png), LIMITS)
        start, end = header.payload[0]
        scanlines = bytearray(zlib.decompress(png[start:end]))
        for _ in range(rng.choice((1, 2, 5))):
            scanlines[rng.randrange(len(scanlines))] = rng.choice((rng.randrange(256), 5, 255))
        is_short = rng.random() < 0.2
        if is_short:
            del scanlines[rng.randrange(len(scanlines)):]
        body = zlib.compress(bytes(scanlines))
        mutant = png[:start - 8] + chunk(b"IDAT", body) + chunk(b"IEND", b"")
        native = _decode_or_none(_decode_png, mutant)
        pillow = _decode_or_none(_decode_pillow, mutant)
        # Pillow zero-fills rows missing from a stream that ends early; we reject it.
        assert (native is None) == (pillow is None or is_short)
        if native is not None:
            assert np.array_equal(native, pillow)
        outcomes["decoded" if native is not None else "rejected"] += 1
    assert outcomes["decoded"] > 100 and outcomes["rejected"] > 100, outcomes


def test_mutated_png_bytes_decode_like_pillow_or_fail_typed():
    rng = random.Random(11)
    samples = np.random.default_rng(11).integers(0, 256, (9, 11, 3))
    seed = build_png(samples, 2, 8, [y % 5 for y in range(9)], idat_size=40)
    for _ in range(1000):
        data = bytearray(seed)
        for _ in range(rng.choice((1, 2, 4))):
            data[rng.randrange(33, len(data))] = rng.randrange(256)  # past IHDR
        native = _decode_or_none(_decode_png, bytes(data))
        if native is not None:
            pillow = _decode_or_none(_decode_pillow, bytes(data))
            assert pillow is not None and np.array_equal(native, pillow)

"""Bad inputs: each problem gets its own ImageError code, before any pixel allocation."""

from __future__ import annotations

import base64
import io
import resource
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import flare.frontend.images.decode as decode_module
from flare.errors import FrontendError
from flare.frontend.images import (
    IMAGE_ERROR_CODES,
    EncodedImage,
    ImageError,
    ImageLimits,
    ImageProcessor,
    parse_data_url,
)

LIMITS = ImageLimits()
PROCESSOR = ImageProcessor()


def scene(height: int = 48, width: int = 64) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 4 % 256, y * 5 % 256, (x + y) * 3 % 256], -1).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


PNG = encode(Image.fromarray(scene()), "PNG")
JPEG = encode(Image.fromarray(scene()), "JPEG", quality=90)
PROGRESSIVE = encode(Image.fromarray(scene(96, 128)), "JPEG", quality=90, progressive=True)
WEBP = encode(Image.fromarray(scene()), "WEBP", quality=80)


def png_chunk(ctype: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def png_declaring(width: int, height: int) -> bytes:
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + png_chunk(b"IEND", b""))


def jpeg_with_marker(data: bytes, old: int, new: int) -> bytes:
    at = data.index(bytes([0xFF, old]))
    return data[:at + 1] + bytes([new]) + data[at + 2:]


def jpeg_declaring(width: int, height: int) -> bytes:
    at = JPEG.index(b"\xff\xc0")
    return JPEG[:at + 5] + struct.pack(">HH", height, width) + JPEG[at + 9:]


def jpeg_with_scans(count: int) -> bytes:
    """A progressive JPEG whose last scan is repeated until it has ``count`` scans."""
    scans = [i for i in range(len(PROGRESSIVE) - 1)
             if PROGRESSIVE[i] == 0xFF and PROGRESSIVE[i + 1] == 0xDA]
    head, last = PROGRESSIVE[:scans[-1]], PROGRESSIVE[scans[-1]:-2]
    repeat = count - (len(scans) - 1)
    assert repeat >= 1
    return head + last * repeat + b"\xff\xd9"


def jpeg_with_exif(tiff: bytes) -> bytes:
    segment = b"Exif\x00\x00" + tiff
    return JPEG[:2] + b"\xff\xe1" + struct.pack(">H", len(segment) + 2) + segment + JPEG[2:]


def tiff_with_orientation(value: int, *, field_type: int = 3, count: int = 1) -> bytes:
    entry = struct.pack("<HHIHH", 0x0112, field_type, count, value, 0)
    return b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + entry + struct.pack("<I", 0)


def animated(fmt: str) -> bytes:
    frames = [Image.fromarray(scene()), Image.fromarray(255 - scene())]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def rejects(code: str, media_type: str, data: bytes, limits: ImageLimits = LIMITS) -> ImageError:
    with pytest.raises(ImageError) as info:
        ImageProcessor(limits=limits).decode(EncodedImage(media_type, data))
    assert info.value.code == code, info.value.message
    assert isinstance(info.value, FrontendError) and info.value.status == 400
    return info.value


@pytest.fixture
def no_decoder(monkeypatch):
    """Fail the test if a pixel decoder is reached."""
    def refuse(*args, **kwargs):
        raise AssertionError("a decoder ran for an input that headers should have rejected")
    monkeypatch.setattr(decode_module.simplejpeg, "decode_jpeg", refuse)
    monkeypatch.setattr(decode_module.Image, "open", refuse)


# (case, expected code, media type, bytes); all rejected from headers alone.
HEADER_CASES = [
    ("truncated_png", "image_truncated", "image/png", PNG[:len(PNG) // 2]),
    ("truncated_jpeg", "image_truncated", "image/jpeg", JPEG[:len(JPEG) // 2]),
    ("truncated_webp", "image_truncated", "image/webp", WEBP[:len(WEBP) // 2]),
    ("wrong_media_type", "image_media_type_mismatch", "image/jpeg", PNG),
    ("bomb_png", "image_too_many_pixels", "image/png", png_declaring(100_000, 100_000)),
    ("bomb_jpeg", "image_too_many_pixels", "image/jpeg", jpeg_declaring(60_000, 60_000)),
    ("arithmetic_jpeg", "image_jpeg_arithmetic", "image/jpeg", jpeg_with_marker(JPEG, 0xC0, 0xC9)),
    ("lossless_jpeg", "image_jpeg_lossless", "image/jpeg", jpeg_with_marker(JPEG, 0xC0, 0xC3)),
    ("scans_101", "image_jpeg_scans", "image/jpeg", jpeg_with_scans(101)),
    ("animated_png", "image_animated", "image/png", animated("PNG")),
    ("animated_webp", "image_animated", "image/webp", animated("WEBP")),
    ("corrupt_exif", "image_exif", "image/jpeg", jpeg_with_exif(b"XX*\x00garbage")),
    ("zero_size", "image_dimensions", "image/png", png_declaring(0, 10)),
]


@pytest.mark.parametrize("case,code,media_type,data", HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
def test_bad_input_rejected_before_decoding(no_decoder, case, code, media_type, data):
    rejects(code, media_type, data)


def test_bad_input_codes_are_distinct():
    codes = [code for _, code, _, _ in HEADER_CASES]
    categories = {"truncated": "image_truncated", "wrong type": "image_media_type_mismatch",
                  "bomb": "image_too_many_pixels", "arithmetic": "image_jpeg_arithmetic",
                  "lossless": "image_jpeg_lossless", "scans": "image_jpeg_scans",
                  "animated": "image_animated", "exif": "image_exif"}
    assert len(set(categories.values())) == len(categories)
    assert set(categories.values()) <= set(codes) <= set(IMAGE_ERROR_CODES)


def test_bomb_allocates_nothing():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(20):
        rejects("image_too_many_pixels", "image/png", png_declaring(100_000, 100_000))
        rejects("image_too_many_pixels", "image/jpeg", jpeg_declaring(60_000, 60_000))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024  # a decoded bomb would need tens of GB


def test_webp_canvas_bomb(no_decoder):
    body = bytes([0x10, 0, 0, 0]) + (16382).to_bytes(3, "little") + (16382).to_bytes(3, "little")
    riff = b"WEBP" + b"VP8X" + struct.pack("<I", len(body)) + body
    rejects("image_too_many_pixels", "image/webp", b"RIFF" + struct.pack("<I", len(riff)) + riff)


def test_scan_limit_counts_exactly(no_decoder):
    # 100 scans pass the header check (the repeated scan then fails to decode, later).
    from flare.frontend.images import probe_header
    header = probe_header(EncodedImage("image/jpeg", jpeg_with_scans(100)), LIMITS)
    assert header.progressive and header.num_scans == 100
    rejects("image_jpeg_scans", "image/jpeg", jpeg_with_scans(20), ImageLimits(max_jpeg_scans=19))


@pytest.mark.parametrize("tiff", [
    tiff_with_orientation(9), tiff_with_orientation(0), tiff_with_orientation(6, field_type=4),
    tiff_with_orientation(6, count=2), b"II*\x00" + struct.pack("<I", 4000),
    b"MM\x00*\x00\x00\x00\x08\x00\x40", b"II+\x00\x08\x00\x00\x00",
], ids=["value_9", "value_0", "long_type", "two_values", "ifd_outside", "ifd_overrun", "bad_magic"])
def test_invalid_orientation_metadata_rejected(tiff):
    rejects("image_exif", "image/jpeg", jpeg_with_exif(tiff))


def test_valid_orientation_metadata_accepted():
    image = PROCESSOR.decode(EncodedImage("image/jpeg", jpeg_with_exif(tiff_with_orientation(6))))
    assert (image.height, image.width, image.orientation) == (64, 48, 6)


def test_decoder_failures_are_typed():
    corrupt = bytearray(JPEG)
    scan = corrupt.index(b"\xff\xda")
    corrupt[scan + 20:scan + 200] = bytes(range(180))  # garbage entropy data, markers intact
    with pytest.raises(ImageError) as info:
        PROCESSOR.decode(EncodedImage("image/jpeg", bytes(corrupt)))
    assert info.value.code in ("image_corrupt", "image_truncated")
    broken_png = bytearray(PNG)
    idat = broken_png.index(b"IDAT")
    broken_png[idat + 10:idat + 30] = b"\x00" * 20
    rejects("image_corrupt", "image/png", bytes(broken_png))


@pytest.mark.parametrize("url,code", [
    ("https://example.com/cat.png", "image_remote_url"),
    ("http://127.0.0.1/cat.png", "image_remote_url"),
    ("file:///etc/passwd", "image_remote_url"),
    ("data:image/gif;base64,R0lGODlhAQABAAAAACw=", "image_media_type"),
    ("data:video/mp4;base64,AAAA", "image_media_type"),
    ("data:image/png,rawbytes", "image_data_url"),
    ("data:image/png;base64", "image_data_url"),
    ("data:image/png;base64,@@@@", "image_base64"),
    ("not a url", "image_data_url"),
    ("data:image/png;base64,", "image_truncated"),
])
def test_bad_sources(url, code):
    with pytest.raises(ImageError) as info:
        parse_data_url(url, LIMITS)
    assert info.value.code == code


def test_encoded_limit_checked_before_base64_decoding():
    url = data_url("image/png", PNG)
    with pytest.raises(ImageError) as info:
        parse_data_url(url, ImageLimits(max_encoded_bytes=len(PNG) - 10))
    assert info.value.code == "image_too_large"
    assert parse_data_url(url, ImageLimits(max_encoded_bytes=len(PNG))).data == PNG


def test_too_many_images_and_placeholder_mismatch():
    image = PROCESSOR.decode(EncodedImage("image/png", PNG))
    with pytest.raises(ImageError) as info:
        ImageProcessor(limits=ImageLimits(max_images=2)).process([image] * 3)
    assert info.value.code == "image_too_many_images"
    from tokenizers import Tokenizer, models
    tokenizer = Tokenizer(models.WordLevel({"<|image_pad|>": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(ImageError) as info:
        PROCESSOR.expand_prompt("<|image_pad|><|image_pad|>", [PROCESSOR.geometry(image)], tokenizer)
    assert info.value.code == "image_placeholders"


def test_aspect_ratio_rejected():
    image = PROCESSOR.decode(EncodedImage("image/png", encode(Image.fromarray(scene(2, 500)), "PNG")))
    with pytest.raises(ImageError) as info:
        PROCESSOR.process([image])
    assert info.value.code == "image_dimensions"

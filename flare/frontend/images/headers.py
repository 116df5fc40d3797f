"""Header probing: format, dimensions and risk flags, read before any decode.

Each parser walks the container structure itself (PNG chunks, JPEG markers,
WebP RIFF chunks) so that dimensions, animation, unsupported JPEG coding and
the progressive scan count are known while nothing has been allocated for
pixels. The declared media type must match the bytes' signature.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass

from .errors import ImageError
from .limits import ImageLimits
from .source import EncodedImage

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"
_FORMAT_OF_MEDIA_TYPE = {"image/png": "png", "image/jpeg": "jpeg", "image/webp": "webp"}

# PNG colour type -> (colour model, allowed bit depths).
_PNG_COLOR_TYPES = {
    0: ("gray", (1, 2, 4, 8, 16)),
    2: ("rgb", (8, 16)),
    3: ("palette", (1, 2, 4, 8)),
    4: ("gray_alpha", (8, 16)),
    6: ("rgba", (8, 16)),
}

# JPEG start-of-frame markers by what they code.
_SOF_SUPPORTED = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}
_SOF_LOSSLESS = {0xC3, 0xC7}
_SOF_HIERARCHICAL = {0xC5, 0xC6}
_SOF_ARITHMETIC = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_JPEG_DAC = 0xCC  # arithmetic conditioning table
_JPEG_SOS = 0xDA
_JPEG_EOI = 0xD9
# Next marker after entropy-coded data: 0xFF followed by anything but a
# stuffed zero, a restart marker or another fill byte.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


@dataclass(frozen=True)
class ImageHeader:
    """What the container declares, before decoding."""

    format: str          # "png", "jpeg" or "webp"
    width: int
    height: int
    color: str           # png: gray/gray_alpha/palette/rgb/rgba; jpeg: gray/ycbcr/rgb/cmyk/ycck; webp: rgb/rgba
    bit_depth: int = 8
    exif: bytes | None = None   # TIFF-structured EXIF (after any "Exif\0\0" prefix)
    progressive: bool = False
    num_scans: int = 0
    interlaced: bool = False     # png: Adam7
    transparency: bool = False   # png: has a tRNS chunk
    payload: tuple[tuple[int, int], ...] = ()  # png: [start, end) byte ranges of the IDAT data

    @property
    def num_pixels(self) -> int:
        return self.width * self.height


def sniff_format(data: bytes) -> str | None:
    """The format the bytes' signature names, or None."""
    if data.startswith(PNG_SIGNATURE):
        return "png"
    if data.startswith(JPEG_SIGNATURE):
        return "jpeg"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def _is_signature_prefix(fmt: str, data: bytes) -> bool:
    if fmt == "png":
        return len(data) < len(PNG_SIGNATURE) and PNG_SIGNATURE.startswith(data)
    if fmt == "jpeg":
        return len(data) < len(JPEG_SIGNATURE) and JPEG_SIGNATURE.startswith(data)
    return len(data) < 12 and b"RIFF".startswith(data[:4]) and b"WEBP".startswith(data[8:12])


def probe_header(image: EncodedImage, limits: ImageLimits) -> ImageHeader:
    """Parse and validate the header of ``image``; raise ImageError on any problem."""
    declared = _FORMAT_OF_MEDIA_TYPE.get(image.media_type)
    if declared is None:
        raise ImageError("image_media_type", f"unsupported image media type {image.media_type!r}")
    actual = sniff_format(image.data)
    if actual is None:
        if _is_signature_prefix(declared, image.data):
            raise ImageError("image_truncated", f"{image.media_type} data ends inside its signature")
        raise ImageError("image_media_type_mismatch",
                         f"data declared as {image.media_type} is not a PNG, JPEG or WebP file")
    if actual != declared:
        raise ImageError("image_media_type_mismatch",
                         f"data declared as {image.media_type} is a {actual.upper()} file")
    parse = {"png": _probe_png, "jpeg": _probe_jpeg, "webp": _probe_webp}[actual]
    header = parse(image.data, limits)
    if header.width < 1 or header.height < 1:
        raise ImageError("image_dimensions",
                         f"{actual.upper()} declares {header.width}x{header.height} pixels")
    if header.num_pixels > limits.max_pixels:
        raise ImageError("image_too_many_pixels",
                         f"{actual.upper()} declares {header.width}x{header.height} = "
                         f"{header.num_pixels} pixels, over the limit of {limits.max_pixels}")
    return header


def _probe_png(data: bytes, limits: ImageLimits) -> ImageHeader:
    n = len(data)
    pos = len(PNG_SIGNATURE)
    ihdr = None
    exif = None
    payload = []
    transparency = False
    while True:
        if pos + 8 > n:
            raise ImageError("image_truncated", "PNG ends before its IEND chunk")
        length, ctype = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if length > 0x7FFFFFFF or not ctype.isalpha():
            raise ImageError("image_corrupt", f"PNG chunk at byte {pos} is malformed")
        if end > n:
            raise ImageError("image_truncated", f"PNG chunk {ctype.decode()} runs past the end")
        if ihdr is None and ctype != b"IHDR":
            raise ImageError("image_corrupt", "PNG does not start with an IHDR chunk")
        if ctype != b"IDAT":
            # IDAT integrity is zlib's job (adler32); other chunks carry their own CRC.
            (crc,) = struct.unpack_from(">I", data, end - 4)
            if zlib.crc32(data[pos + 4:end - 4]) != crc:
                raise ImageError("image_corrupt", f"PNG chunk {ctype.decode()} fails its CRC")
        body = data[pos + 8:end - 4] if ctype != b"IDAT" else b""
        if ctype == b"IHDR":
            if ihdr is not None or length != 13:
                raise ImageError("image_corrupt", "PNG has a malformed or repeated IHDR")
            ihdr = struct.unpack(">IIBBBBB", body)
        elif ctype == b"acTL":
            (num_frames,) = struct.unpack_from(">I", body) if length >= 4 else (0,)
            if num_frames != 1:
                raise ImageError("image_animated", f"animated PNG ({num_frames} frames) is not supported")
        elif ctype == b"eXIf" and exif is None:
            exif = body[6:] if body.startswith(b"Exif\x00\x00") else body
        elif ctype == b"IDAT":
            # Decoders read the first run of consecutive IDAT chunks only.
            if not payload or payload[-1][1] + 4 == pos:
                payload.append((pos + 8, end - 4))
        elif ctype == b"tRNS":
            transparency = True
        elif ctype == b"IEND":
            break
        pos = end
    if not payload:
        raise ImageError("image_corrupt", "PNG has no IDAT image data")
    width, height, bit_depth, color_type, compression, filter_method, interlace = ihdr
    if color_type not in _PNG_COLOR_TYPES:
        raise ImageError("image_corrupt", f"PNG colour type {color_type} is invalid")
    color, depths = _PNG_COLOR_TYPES[color_type]
    if bit_depth not in depths:
        raise ImageError("image_corrupt", f"PNG bit depth {bit_depth} is invalid for {color}")
    if compression != 0 or filter_method != 0 or interlace > 1:
        raise ImageError("image_corrupt", "PNG IHDR names an unknown compression, filter or interlace")
    if width > 0x7FFFFFFF or height > 0x7FFFFFFF:
        raise ImageError("image_dimensions", f"PNG declares {width}x{height} pixels")
    return ImageHeader("png", width, height, color, bit_depth, exif, interlaced=interlace == 1,
                       transparency=transparency, payload=tuple(payload))


def _probe_jpeg(data: bytes, limits: ImageLimits) -> ImageHeader:
    n = len(data)
    pos = 2
    frame = None
    num_scans = 0
    exif = None
    adobe_transform = None
    while True:
        if pos >= n:
            raise ImageError("image_truncated", "JPEG ends before its EOI marker")
        if data[pos] != 0xFF:
            raise ImageError("image_corrupt", f"JPEG has no marker at byte {pos}")
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise ImageError("image_truncated", "JPEG ends inside a marker")
        marker = data[pos]
        pos += 1
        if marker == _JPEG_EOI:
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue  # parameterless markers
        if marker == 0xD8 or marker == 0x00:
            raise ImageError("image_corrupt", f"JPEG has a stray 0x{marker:02X} marker")
        if pos + 2 > n:
            raise ImageError("image_truncated", "JPEG ends inside a segment length")
        length = (data[pos] << 8) | data[pos + 1]
        seg_end = pos + length
        if length < 2:
            raise ImageError("image_corrupt", f"JPEG segment 0x{marker:02X} has length {length}")
        if seg_end > n:
            raise ImageError("image_truncated", f"JPEG segment 0x{marker:02X} runs past the end")
        body = data[pos + 2:seg_end]
        if marker in _SOF_ARITHMETIC or marker == _JPEG_DAC:
            raise ImageError("image_jpeg_arithmetic", "arithmetic-coded JPEG is not supported")
        if marker in _SOF_LOSSLESS:
            raise ImageError("image_jpeg_lossless", "lossless JPEG is not supported")
        if marker in _SOF_HIERARCHICAL:
            raise ImageError("image_jpeg_unsupported", "hierarchical JPEG is not supported")
        if marker in _SOF_SUPPORTED:
            if frame is not None:
                raise ImageError("image_corrupt", "JPEG has more than one frame header")
            frame = _parse_sof(marker, body)
        elif marker == _JPEG_SOS:
            if frame is None:
                raise ImageError("image_corrupt", "JPEG scan comes before its frame header")
            num_scans += 1
            if num_scans > limits.max_jpeg_scans:
                raise ImageError("image_jpeg_scans",
                                 f"JPEG has more than {limits.max_jpeg_scans} scans")
            found = _NEXT_MARKER.search(data, seg_end)
            if found is None:
                raise ImageError("image_truncated", "JPEG ends inside scan data")
            pos = found.start()
            continue
        elif marker == 0xE1 and exif is None and body.startswith(b"Exif\x00\x00"):
            exif = body[6:]
        elif marker == 0xEE and body.startswith(b"Adobe") and len(body) >= 12:
            adobe_transform = body[11]
        pos = seg_end
    if frame is None:
        raise ImageError("image_corrupt", "JPEG has no frame header")
    if num_scans == 0:
        raise ImageError("image_corrupt", "JPEG has no scan")
    kind, width, height, components = frame
    if components == 1:
        color = "gray"
    elif components == 3:
        color = "rgb" if adobe_transform == 0 else "ycbcr"
    else:
        color = "ycck" if adobe_transform == 2 else "cmyk"
    return ImageHeader("jpeg", width, height, color, 8, exif,
                       progressive=kind == "progressive", num_scans=num_scans)


def _parse_sof(marker: int, body: bytes) -> tuple[str, int, int, int]:
    if len(body) < 6:
        raise ImageError("image_corrupt", "JPEG frame header is too short")
    precision, height, width, components = struct.unpack_from(">BHHB", body)
    if precision != 8:
        raise ImageError("image_jpeg_unsupported", f"{precision}-bit JPEG is not supported")
    if components not in (1, 3, 4):
        raise ImageError("image_jpeg_unsupported", f"JPEG with {components} components is not supported")
    if len(body) < 6 + 3 * components:
        raise ImageError("image_corrupt", "JPEG frame header is too short for its components")
    if height == 0:
        raise ImageError("image_dimensions", "JPEG leaves its height to a DNL marker (unsupported)")
    if width == 0:
        raise ImageError("image_dimensions", "JPEG declares zero width")
    return _SOF_SUPPORTED[marker], width, height, components


def _probe_webp(data: bytes, limits: ImageLimits) -> ImageHeader:
    n = len(data)
    (riff_size,) = struct.unpack_from("<I", data, 4)
    riff_end = 8 + riff_size
    if riff_end > n:
        raise ImageError("image_truncated", f"WebP declares {riff_end} bytes but has {n}")
    pos = 12
    canvas = None
    bitstream = None
    has_alpha = False
    while pos + 8 <= riff_end:
        fourcc, size = struct.unpack_from("<4sI", data, pos)
        body_end = pos + 8 + size
        if body_end > riff_end:
            raise ImageError("image_truncated", f"WebP chunk {fourcc!r} runs past the end")
        body = data[pos + 8:pos + 8 + min(size, 32)]
        if fourcc in (b"ANIM", b"ANMF"):
            raise ImageError("image_animated", "animated WebP is not supported")
        if fourcc == b"VP8X":
            if size < 10 or pos != 12:
                raise ImageError("image_corrupt", "WebP VP8X chunk is malformed or misplaced")
            flags = body[0]
            if flags & 0x02:
                raise ImageError("image_animated", "animated WebP is not supported")
            has_alpha = bool(flags & 0x10)
            canvas = (1 + int.from_bytes(body[4:7], "little"), 1 + int.from_bytes(body[7:10], "little"))
            if canvas[0] * canvas[1] > limits.max_pixels:
                raise ImageError("image_too_many_pixels",
                                 f"WEBP declares a {canvas[0]}x{canvas[1]} canvas, over the limit "
                                 f"of {limits.max_pixels} pixels")
        elif fourcc in (b"VP8 ", b"VP8L"):
            if bitstream is not None:
                raise ImageError("image_corrupt", "WebP has more than one image bitstream")
            bitstream = _parse_webp_bitstream(fourcc, body, size)
            has_alpha = has_alpha or bitstream[2]
        elif fourcc == b"ALPH":
            has_alpha = True
        pos = body_end + (size & 1)
    if bitstream is None:
        raise ImageError("image_truncated" if pos + 8 > riff_end and canvas is None else "image_corrupt",
                         "WebP has no VP8/VP8L image bitstream")
    width, height, _ = bitstream
    if canvas is not None and canvas != (width, height):
        raise ImageError("image_dimensions",
                         f"WebP canvas {canvas[0]}x{canvas[1]} differs from its image {width}x{height}")
    return ImageHeader("webp", width, height, "rgba" if has_alpha else "rgb")


def _parse_webp_bitstream(fourcc: bytes, body: bytes, size: int) -> tuple[int, int, bool]:
    if fourcc == b"VP8 ":
        if size < 10 or len(body) < 10:
            raise ImageError("image_truncated", "WebP VP8 frame header is cut short")
        if body[0] & 1:
            raise ImageError("image_corrupt", "WebP VP8 data does not start with a key frame")
        if body[3:6] != b"\x9d\x01\x2a":
            raise ImageError("image_corrupt", "WebP VP8 frame has no start code")
        width, height = struct.unpack_from("<HH", body, 6)
        return width & 0x3FFF, height & 0x3FFF, False
    if size < 5 or len(body) < 5:
        raise ImageError("image_truncated", "WebP VP8L header is cut short")
    if body[0] != 0x2F:
        raise ImageError("image_corrupt", "WebP VP8L data has no signature byte")
    (bits,) = struct.unpack_from("<I", body, 1)
    return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF), bool((bits >> 28) & 1)

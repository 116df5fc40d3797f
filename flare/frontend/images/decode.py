"""Decoding: JPEG through simplejpeg, PNG and static WebP through Pillow.

Every decode starts from a probed header, so the pixel limit, animation and
unsupported JPEG codings are rejected before a decoder allocates anything.

- JPEG: libjpeg-turbo (simplejpeg) with the accurate integer IDCT and smooth
  ("fancy") chroma upsampling; strict mode turns decoder warnings (premature
  end, corrupt data) into errors. CMYK and YCCK JPEGs are decoded to ink
  values and converted with Pillow's CMYK->RGB rule (Adobe polarity, as
  Photoshop writes them and Pillow assumes).
- PNG, grey/RGB with or without alpha at 8 or 16 bits, non-interlaced (what
  nearly every PNG is): the IDAT data inflated by zlib in one call and the
  scanlines rebuilt by flare._fast.image_png, which yields Pillow's pixels
  (tests compare the two for every filter, colour type and depth). Pillow
  inflates row by row and keeps RGB as 4-byte pixels, which costs it about
  1.5x the time on small images (1.8 vs 1.15 ms for a 320x240 photo). Image data that ends before the last row
  is image_truncated (Pillow would zero-fill the missing rows).
- Other PNGs (palette, 1/2/4-bit grey, Adam7) and WebP: Pillow.
- Alpha is dropped, palettes expanded, 16-bit samples keep their high byte
  (as Pillow itself does for 16-bit RGB/RGBA/LA); no embedded colour profile
  or gamma is applied.
- EXIF orientation (PNG eXIf, JPEG APP1) is applied before anything else sees
  the pixels.
"""

from __future__ import annotations

import io
import zlib

import numpy as np
import simplejpeg
from PIL import Image

from flare._fast.image_png import reconstruct as reconstruct_png

from .errors import ImageError
from .exif import apply_orientation, read_orientation
from .headers import ImageHeader, probe_header
from .limits import ImageLimits
from .rgb_image import RgbImage
from .source import EncodedImage, check_encoded

_PIL_FORMAT = {"png": "PNG", "webp": "WEBP"}
_SIXTEEN_BIT_GRAY_MODES = ("I;16", "I;16B", "I;16L", "I")


def decode_image(image: EncodedImage, limits: ImageLimits, *, keep_alpha: bool = False,
                 keep_cmyk: bool = False) -> RgbImage:
    """Decode ``image`` to an upright RgbImage, or raise ImageError."""
    check_encoded(image, limits)
    header = probe_header(image, limits)
    orientation = 1
    if header.exif is not None and header.format in ("png", "jpeg"):
        orientation = read_orientation(header.exif)
    if header.format == "jpeg":
        rgb, alpha, cmyk = _decode_jpeg(image.data, header, keep_cmyk)
    elif header.format == "png" and _is_native_png(header, keep_alpha):
        rgb, alpha, cmyk = _decode_png(image.data, header, keep_alpha)
    else:
        rgb, alpha, cmyk = _decode_pillow(image.data, header, keep_alpha)
    if rgb.shape[:2] != (header.height, header.width):
        raise ImageError("image_corrupt",
                         f"decoder produced {rgb.shape[1]}x{rgb.shape[0]} pixels for a "
                         f"{header.width}x{header.height} header")
    rgb = apply_orientation(rgb, orientation)
    if alpha is not None:
        alpha = apply_orientation(alpha, orientation)
    if cmyk is not None:
        cmyk = apply_orientation(cmyk, orientation)
    return RgbImage(_frozen(rgb), header.color, orientation,
                    None if alpha is None else _frozen(alpha),
                    None if cmyk is None else _frozen(cmyk))


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.flags.writeable = False
    return array


def cmyk_to_rgb(ink_inverted: np.ndarray) -> np.ndarray:
    """RGB from Adobe-polarity CMYK samples [H, W, 4] (255 = no ink).

    Pillow's rule: R = (255 - C) * (255 - K) / 255 rounded, i.e. with the
    stored (inverted) samples c, k: (c * k + 127) // 255 exactly for all
    65,536 pairs (checked in tests/frontend/test_images_decode.py).
    """
    samples = ink_inverted.astype(np.uint16)
    k = samples[..., 3:4]
    return ((samples[..., :3] * k + 127) // 255).astype(np.uint8)


def _decode_jpeg(data: bytes, header: ImageHeader, keep_cmyk: bool):
    try:
        if header.color in ("cmyk", "ycck"):
            stored = simplejpeg.decode_jpeg(data, colorspace="CMYK", fastdct=False,
                                            fastupsample=False, strict=True)
            cmyk = (255 - stored) if keep_cmyk else None
            return cmyk_to_rgb(stored), None, cmyk
        rgb = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False,
                                     fastupsample=False, strict=True)
        return rgb, None, None
    except MemoryError:
        raise
    except Exception as exc:  # libjpeg-turbo reports every failure as ValueError
        raise _decoder_error("JPEG", exc) from exc


# PNG colour models rebuilt natively: (IHDR colour type, samples per pixel).
_NATIVE_PNG = {"gray": (0, 1), "rgb": (2, 3), "gray_alpha": (4, 2), "rgba": (6, 4)}


def _is_native_png(header: ImageHeader, keep_alpha: bool) -> bool:
    # A tRNS chunk only matters when alpha is kept; Pillow then builds it.
    return (header.color in _NATIVE_PNG and header.bit_depth in (8, 16)
            and not header.interlaced and not (keep_alpha and header.transparency))


def _decode_png(data: bytes, header: ImageHeader, keep_alpha: bool):
    color_type, samples = _NATIVE_PNG[header.color]
    needed = header.height * (1 + header.width * samples * header.bit_depth // 8)
    view = memoryview(data)
    compressed = (view[header.payload[0][0]:header.payload[0][1]] if len(header.payload) == 1
                  else b"".join(view[start:end] for start, end in header.payload))
    try:
        # max_length bounds the output to the image's size: no bomb can inflate
        # past it, and data after the last row is ignored (as Pillow does).
        scanlines = zlib.decompressobj().decompress(compressed, needed)
    except zlib.error as exc:
        raise ImageError("image_corrupt", f"PNG image data cannot be inflated: {exc}") from None
    if len(scanlines) < needed:
        raise ImageError("image_truncated",
                         f"PNG image data inflates to {len(scanlines)} of {needed} bytes")
    try:
        rgb, alpha = reconstruct_png(scanlines, header.height, header.width, color_type,
                                     header.bit_depth, keep_alpha)
    except ValueError as exc:
        raise ImageError("image_corrupt", f"PNG data cannot be decoded: {exc}") from None
    return rgb, alpha, None


def _decoder_error(kind: str, exc: Exception) -> ImageError:
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    if "truncat" in lowered or "premature end" in lowered or "unexpected end" in lowered:
        return ImageError("image_truncated", f"{kind} data is truncated: {text}")
    return ImageError("image_corrupt", f"{kind} data cannot be decoded: {text}")


def _decode_pillow(data: bytes, header: ImageHeader, keep_alpha: bool):
    try:
        with Image.open(io.BytesIO(data), formats=[_PIL_FORMAT[header.format]]) as im:
            if getattr(im, "n_frames", 1) != 1:
                raise ImageError("image_animated", f"animated {header.format.upper()} is not supported")
            im.load()
            mode = im.mode
            alpha = None
            if keep_alpha and mode in ("RGBA", "LA", "PA"):
                alpha = np.asarray(im.getchannel("A"))
            elif keep_alpha and "transparency" in im.info:
                alpha = np.asarray(im.convert("RGBA").getchannel("A"))
            if mode in _SIXTEEN_BIT_GRAY_MODES:
                gray = (np.asarray(im).astype(np.uint32) >> 8).astype(np.uint8)
                rgb = np.repeat(gray[:, :, None], 3, axis=2)
            elif mode == "RGB":
                rgb = np.asarray(im)
            else:
                rgb = np.asarray(im.convert("RGB"))
            return rgb, alpha, None
    except ImageError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError, EOFError, ...
        raise _decoder_error(header.format.upper(), exc) from exc


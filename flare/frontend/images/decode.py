"""Decoding: JPEG through simplejpeg, PNG and static WebP through Pillow.

Every decode starts from a probed header, so the pixel limit, animation and
unsupported JPEG codings are rejected before a decoder allocates anything.

- JPEG: libjpeg-turbo (simplejpeg) with the accurate integer IDCT and smooth
  ("fancy") chroma upsampling; strict mode turns decoder warnings (premature
  end, corrupt data) into errors. CMYK and YCCK JPEGs are decoded to ink
  values and converted with Pillow's CMYK->RGB rule (Adobe polarity, as
  Photoshop writes them and Pillow assumes).
- PNG/WebP: Pillow. Alpha is dropped, palettes expanded, 16-bit samples keep
  their high byte (as Pillow itself does for 16-bit RGB/RGBA/LA); no embedded
  colour profile or gamma is applied.
- EXIF orientation (PNG eXIf, JPEG APP1) is applied before anything else sees
  the pixels.
"""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from PIL import Image

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


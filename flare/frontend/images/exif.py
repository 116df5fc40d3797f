"""EXIF orientation: read tag 0x0112 from IFD0 and apply it to decoded pixels.

Orientation values 1-8 follow the TIFF/EXIF definition (Pillow's
``ImageOps.exif_transpose`` applies the same eight transforms). EXIF that
cannot be walked to the orientation tag, an orientation of the wrong type or
count, or a value outside 1-8 is rejected rather than guessed.
"""

from __future__ import annotations

import struct

import numpy as np

from .errors import ImageError

ORIENTATION_TAG = 0x0112
_SHORT = 3  # TIFF field type of the orientation value


def read_orientation(tiff: bytes) -> int:
    """The EXIF orientation (1-8) in TIFF-structured EXIF bytes; 1 when absent."""
    if len(tiff) < 8:
        raise ImageError("image_exif", "EXIF block is shorter than its TIFF header")
    order = tiff[:2]
    if order == b"II":
        endian = "<"
    elif order == b"MM":
        endian = ">"
    else:
        raise ImageError("image_exif", "EXIF block has no TIFF byte-order mark")
    magic, ifd = struct.unpack_from(endian + "HI", tiff, 2)
    if magic != 42:
        raise ImageError("image_exif", "EXIF block has a bad TIFF magic number")
    if ifd < 8 or ifd + 2 > len(tiff):
        raise ImageError("image_exif", f"EXIF IFD0 offset {ifd} lies outside the block")
    (count,) = struct.unpack_from(endian + "H", tiff, ifd)
    if ifd + 2 + 12 * count > len(tiff):
        raise ImageError("image_exif", f"EXIF IFD0 with {count} entries runs past the block")
    for i in range(count):
        tag, field_type, num_values = struct.unpack_from(endian + "HHI", tiff, ifd + 2 + 12 * i)
        if tag != ORIENTATION_TAG:
            continue
        if field_type != _SHORT or num_values != 1:
            raise ImageError("image_exif", "EXIF orientation is not a single SHORT value")
        (value,) = struct.unpack_from(endian + "H", tiff, ifd + 2 + 12 * i + 8)
        if not 1 <= value <= 8:
            raise ImageError("image_exif", f"EXIF orientation {value} is outside 1-8")
        return value
    return 1


def apply_orientation(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """Return ``pixels`` [H, W, ...] displayed upright for an EXIF orientation, C-contiguous."""
    if orientation == 1:
        return pixels
    if orientation == 2:      # mirrored left-right
        view = pixels[:, ::-1]
    elif orientation == 3:    # rotated 180
        view = pixels[::-1, ::-1]
    elif orientation == 4:    # mirrored top-bottom
        view = pixels[::-1]
    else:
        swapped = pixels.swapaxes(0, 1)
        if orientation == 5:    # transposed (mirror across the main diagonal)
            view = swapped
        elif orientation == 6:  # needs a 90 degree clockwise turn
            view = swapped[:, ::-1]
        elif orientation == 7:  # transversed (mirror across the anti-diagonal)
            view = swapped[::-1, ::-1]
        elif orientation == 8:  # needs a 90 degree counter-clockwise turn
            view = swapped[::-1]
        else:
            raise ImageError("image_exif", f"EXIF orientation {orientation} is outside 1-8")
    return np.ascontiguousarray(view)

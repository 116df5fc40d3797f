"""Smart-resize geometry: the resized size, patch grid and token count of an image.

Qwen's rule: round each side to the nearest multiple of ``factor`` (Python's
round, so halves go to even: 48 -> 64 for factor 32 but 80 -> 64), then, if
the area leaves [min_pixels, max_pixels], rescale both sides by one
square-root factor and floor (too large) or ceil (too small) to the factor.
Sides whose aspect ratio exceeds max_aspect_ratio are rejected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ImageError
from .profile import QwenImageProfile


@dataclass(frozen=True)
class ImageGeometry:
    """Where an image of a given size lands in the vision tower and prompt."""

    height: int          # source height (after EXIF orientation)
    width: int
    resized_height: int
    resized_width: int
    grid_h: int          # patches down
    grid_w: int          # patches across
    merge_size: int

    @property
    def num_patches(self) -> int:
        """Rows of pixel_values for this image (one temporal group)."""
        return self.grid_h * self.grid_w

    @property
    def num_tokens(self) -> int:
        """Image placeholder tokens in the prompt: one per merged 2x2 block."""
        return self.num_patches // (self.merge_size * self.merge_size)

    @property
    def grid_thw(self) -> tuple[int, int, int]:
        return (1, self.grid_h, self.grid_w)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                 max_aspect_ratio: float = 200.0) -> tuple[int, int]:
    """(resized_height, resized_width) under Qwen's smart-resize rule."""
    if height < 1 or width < 1:
        raise ImageError("image_dimensions", f"image of {width}x{height} pixels has no area")
    if max(height, width) / min(height, width) > max_aspect_ratio:
        raise ImageError("image_dimensions",
                         f"image aspect ratio {max(height, width) / min(height, width):.1f} "
                         f"exceeds {max_aspect_ratio:g}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_geometry(height: int, width: int, profile: QwenImageProfile) -> ImageGeometry:
    """The geometry of a height x width image under ``profile``."""
    resized_h, resized_w = smart_resize(height, width, profile.factor, profile.min_pixels,
                                        profile.max_pixels, profile.max_aspect_ratio)
    return ImageGeometry(height, width, resized_h, resized_w,
                         resized_h // profile.patch_size, resized_w // profile.patch_size,
                         profile.merge_size)

"""RgbImage: a decoded, upright image in the representation its profile needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class RgbImage:
    """Decoded pixels, EXIF orientation already applied.

    ``pixels`` is [H, W, 3] uint8 RGB, C-contiguous: alpha discarded and no
    colour profile applied. ``alpha`` ([H, W] uint8) and ``cmyk`` ([H, W, 4]
    uint8 ink amounts) are kept only when the preparation profile consumes
    them; the semantic identity covers whatever is kept.
    """

    pixels: np.ndarray
    color: str            # the source's colour model, e.g. "rgba", "cmyk", "palette"
    orientation: int = 1  # the EXIF orientation that was applied
    alpha: np.ndarray | None = None
    cmyk: np.ndarray | None = None

    @property
    def height(self) -> int:
        return self.pixels.shape[0]

    @property
    def width(self) -> int:
        return self.pixels.shape[1]

    @property
    def channels(self) -> str:
        """The kept channels, as they enter the semantic identity."""
        tag = "rgb8"
        if self.alpha is not None:
            tag += "+alpha8"
        if self.cmyk is not None:
            tag += "+cmyk8"
        return tag

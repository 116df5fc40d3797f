"""PNG scanline reconstruction: filtered rows -> RGB8 (+ alpha8), for 8/16-bit samples."""

import numpy as np
import numpy.typing as npt

def reconstruct(data: bytes | npt.NDArray[np.uint8], height: int, width: int, color_type: int,
                bit_depth: int, keep_alpha: bool = False,
                ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8] | None]:
    """(rgb [H, W, 3], alpha [H, W] or None) from inflated, filtered PNG scanlines."""

"""Resize, normalise and pack an image into merge-ordered patch rows in one pass."""

import numpy as np
import numpy.typing as npt

def resize_pack(image: npt.NDArray[np.uint8], out_h: int, out_w: int, patch: int, merge: int,
                temporal: int, offset: npt.NDArray[np.float32], divisor: npt.NDArray[np.float32],
                out: npt.NDArray[np.float32], *, isa: str = "auto", stream: bool = False) -> None:
    """Write image [H, W, C] resized to out_h x out_w as (out_h/patch)*(out_w/patch) rows of
    C*temporal*patch^2 float32 ``(x - offset[c]) / divisor[c]`` into ``out``."""

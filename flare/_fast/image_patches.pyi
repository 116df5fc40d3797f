"""Fused normalisation, temporal duplication and merge-ordered patch packing."""

import numpy as np
import numpy.typing as npt

def pack_patches(image: npt.NDArray[np.uint8], patch: int, merge: int, temporal: int,
                 table: npt.NDArray[np.float32], out: npt.NDArray[np.float32]) -> None:
    """Write [(H/patch)*(W/patch), C*temporal*patch^2] rows of ``image`` [H, W, C] into ``out``."""

"""Per-patch vision positions and bilinear position-table taps, in merge order."""

import numpy as np
import numpy.typing as npt

def fill_positions(grid_h: int, grid_w: int, merge: int, side: int,
                   positions: npt.NDArray[np.int64], indices: npt.NDArray[np.int64],
                   weights: npt.NDArray[np.float32]) -> None:
    """Write positions [N, 2], taps [N, 4] and weights [N, 4] of one grid_h x grid_w image."""

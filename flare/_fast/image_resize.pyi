"""uint8 bicubic antialiased resize, bit-exact with PyTorch's CPU uint8 kernel."""

import numpy as np
import numpy.typing as npt

HAVE_SIMD: bool

def axis_filter(in_size: int, out_size: int) -> tuple[
    npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int16], int]:
    """(starts [out], counts [out], int16 weights [out, max_taps], precision) of one axis."""

def resize_bicubic_aa(src: npt.NDArray[np.uint8], out_h: int, out_w: int, *,
                      use_simd: bool = True) -> npt.NDArray[np.uint8]:
    """Resize [H, W, C] uint8 (C in 1..4) to [out_h, out_w, C], width pass first."""

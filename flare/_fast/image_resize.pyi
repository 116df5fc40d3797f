"""uint8 bicubic antialiased resize, bit-exact with PyTorch's CPU uint8 kernel."""

import numpy as np
import numpy.typing as npt

ISAS: tuple[str, ...]  # kernel sets this CPU runs, best last: ("scalar",) or ("scalar", "avx2")
BEST_ISA: str          # what "auto" selects

def kernel_isa(isa: str) -> int:
    """The kernel-set code for "auto", "avx2" or "scalar"; ValueError if this CPU lacks it."""

def axis_filter(in_size: int, out_size: int) -> tuple[
    npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int16], int]:
    """(starts [out], counts [out], int16 weights [out, max_taps], precision) of one axis."""

class ResizeAxis:
    """One axis's filter (axis_filter plus the weight pairs the SIMD kernels read)."""

    def __init__(self, in_size: int, out_size: int) -> None: ...

def resize_bicubic_aa(src: npt.NDArray[np.uint8], out_h: int, out_w: int, *,
                      isa: str = "auto") -> npt.NDArray[np.uint8]:
    """Resize [H, W, C] uint8 (C in 1..4) to [out_h, out_w, C], width pass first."""

"""Copy proposals by n-gram lookup (see ngram.pyx)."""

import numpy as np
import numpy.typing as npt

def propose_copy(prompt: npt.NDArray[np.int32], out: npt.NDArray[np.int32], num_out: int, min_ngram: int,
                 max_ngram: int, dest: npt.NDArray[np.int64]) -> int:
    """Continue the latest earlier occurrence of the history's longest suffix n-gram; writes up
    to len(dest) tokens into dest and returns how many (GIL released)."""

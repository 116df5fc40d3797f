"""OutputArena: reuse the last pixel_values block once nothing refers to it.

A fresh multi-megabyte array costs a page fault, and the kernel's zeroing of
the page, for every 4 KiB the packer first writes: for the 100 MB of
pixel_values of a 4-megapixel image that is as much time as packing them.
glibc returns blocks above its mmap threshold (at most 32 MiB) to the kernel
on free, so every batch would pay it again. The arena keeps its most recent
block and hands it out again once every array viewing the previous result has
been dropped: all numpy views, and anything holding one (a torch tensor from
``torch.from_numpy``, a memoryview), keep a reference to the block, so a block
only the arena refers to can be reused as safely as freed memory.
"""

from __future__ import annotations

import sys

import numpy as np

# Data alignment of handed-out rows: streaming stores need 32 bytes; 64 keeps
# every 16-float patch row on its own cache line.
ALIGNMENT = 64


def _reference_count(block: np.ndarray) -> int:
    return sys.getrefcount(block)


class OutputArena:
    """Hands out aligned float32 [rows, row_len] arrays, recycling one block of at most max_bytes."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError("OutputArena.max_bytes must not be negative")
        self.max_bytes = max_bytes
        self._block: np.ndarray | None = np.empty(0, dtype=np.float32)
        # The count an unshared block shows through the same path rows() takes:
        # the arena's own reference, the caller's local and the call's argument
        # (measured, not assumed, since interpreters count borrowed references
        # differently).
        block = self._block
        self._unshared_count = _reference_count(block)
        self._block = None

    def rows(self, num_rows: int, row_len: int) -> np.ndarray:
        """An uninitialised [num_rows, row_len] float32 array, ALIGNMENT-byte aligned."""
        needed = num_rows * row_len + ALIGNMENT // 4
        block = self._block
        if block is None or block.size < needed or _reference_count(block) > self._unshared_count:
            block = np.empty(needed, dtype=np.float32)
            if block.nbytes <= self.max_bytes:
                self._block = block
        skip = (-block.ctypes.data % ALIGNMENT) // 4
        return block[skip:skip + num_rows * row_len].reshape(num_rows, row_len)

    @property
    def retained_bytes(self) -> int:
        """Bytes the arena keeps between calls."""
        return 0 if self._block is None else self._block.nbytes

"""Vision and prompt positions for Qwen3-VL.

- patch_positions: each patch's (row, column) in its image grid, patches in
  2x2 merge-block order, as the vision tower's rotary embedding reads them
  (transformers ``get_vision_position_ids``), and the four bilinear taps
  (align_corners=True) of each patch into the side x side learned position
  table with their float32 weights (transformers
  ``get_vision_interpolation_indices_and_weights``, bilinear), computed by
  flare._fast.image_positions with the same float32 operations so the
  weights are bit-identical.
- rope_positions: the four prompt position rows [text, T, H, W] and the mRoPE
  delta of one sequence (transformers ``Qwen3VLModel.get_rope_index`` plus the
  plain text row generation prepends).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from flare._fast.image_positions import fill_positions


def patch_positions(grids: Sequence[tuple[int, int]], merge: int,
                    side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-patch rows of a batch, images in order, patches in merge-block order.

    Returns (vision positions [N, 2] int64 (row, column), interpolation
    indices [N, 4] int64, weights [N, 4] float32); tap k = 2 * dy + dx is the
    (row + dy, column + dx) corner of the side x side table, clamped to it.
    """
    total = sum(grid_h * grid_w for grid_h, grid_w in grids)
    positions = np.empty((total, 2), dtype=np.int64)
    indices = np.empty((total, 4), dtype=np.int64)
    weights = np.empty((total, 4), dtype=np.float32)
    start = 0
    for grid_h, grid_w in grids:
        end = start + grid_h * grid_w
        fill_positions(grid_h, grid_w, merge, side, positions[start:end], indices[start:end],
                       weights[start:end])
        start = end
    return positions, indices, weights


def rope_positions(num_tokens: int, image_spans: list[tuple[int, int]],
                   llm_grids: list[tuple[int, int]]) -> tuple[np.ndarray, int]:
    """[4, L] int64 rows [text, T, H, W] and the mRoPE delta for one sequence.

    ``image_spans`` are the [start, end) token ranges of each image's
    placeholders, in order; ``llm_grids`` their merged (rows, columns). Text
    tokens advance all three rope rows together; an image places its tokens on
    a T/H/W lattice starting at the current position and then advances it by
    max(rows, columns).
    """
    positions = np.empty((4, num_tokens), dtype=np.int64)
    positions[0] = np.arange(num_tokens, dtype=np.int64)
    current = 0
    cursor = 0
    for (start, end), (rows, cols) in zip(image_spans, llm_grids):
        text_len = start - cursor
        positions[1:, cursor:start] = current + np.arange(text_len, dtype=np.int64)
        current += text_len
        positions[1, start:end] = current
        positions[2, start:end] = current + np.repeat(np.arange(rows, dtype=np.int64), cols)
        positions[3, start:end] = current + np.tile(np.arange(cols, dtype=np.int64), rows)
        current += max(rows, cols)
        cursor = end
    positions[1:, cursor:] = current + np.arange(num_tokens - cursor, dtype=np.int64)
    delta = int(positions[1:].max()) + 1 - num_tokens if num_tokens else 0
    return positions, delta

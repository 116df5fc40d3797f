"""Vision and prompt positions for Qwen3-VL.

- vision_positions: each patch's (row, column) in its image grid, patches in
  2x2 merge-block order, as the vision tower's rotary embedding reads them
  (transformers ``get_vision_position_ids``).
- position_interpolation: the four bilinear taps (align_corners=True) of each
  patch into the side x side learned position table and their float32 weights
  (transformers ``get_vision_interpolation_indices_and_weights``, bilinear),
  computed with the same float32 operations so the weights are bit-identical.
- rope_positions: the four prompt position rows [text, T, H, W] and the mRoPE
  delta of one sequence (transformers ``Qwen3VLModel.get_rope_index`` plus the
  plain text row generation prepends).
"""

from __future__ import annotations

import numpy as np


def _merge_order_rows_cols(grid_h: int, grid_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    # [gh/m, gw/m, m, m] block-major enumeration of (row, column).
    block_r = np.arange(grid_h // merge)[:, None, None, None]
    block_c = np.arange(grid_w // merge)[None, :, None, None]
    in_r = np.arange(merge)[None, None, :, None]
    in_c = np.arange(merge)[None, None, None, :]
    shape = (grid_h // merge, grid_w // merge, merge, merge)
    rows = np.broadcast_to(block_r * merge + in_r, shape).reshape(-1)
    cols = np.broadcast_to(block_c * merge + in_c, shape).reshape(-1)
    return rows, cols


def vision_positions(grids: list[tuple[int, int]], merge: int) -> np.ndarray:
    """[N, 2] int64 (row, column) of every patch of every image, merge-block order."""
    parts = []
    for grid_h, grid_w in grids:
        rows, cols = _merge_order_rows_cols(grid_h, grid_w, merge)
        parts.append(np.stack([rows, cols], axis=1).astype(np.int64))
    if not parts:
        return np.zeros((0, 2), dtype=np.int64)
    return np.ascontiguousarray(np.concatenate(parts, axis=0))


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    # align_corners=True: src = index * (side - 1) / max(size - 1, 1), all float32.
    src = (index.astype(np.float32) * np.float32(side - 1)) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    taps = floor.astype(np.int64)[:, None] + np.arange(2)[None, :]
    np.clip(taps, 0, side - 1, out=taps)
    frac = src - floor
    distance = np.abs(frac[:, None] - np.arange(2, dtype=np.float32)[None, :])
    weights = np.maximum(np.float32(1) - distance, np.float32(0)).astype(np.float32)
    return taps, weights


def position_interpolation(grids: list[tuple[int, int]], merge: int,
                           side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps into the side x side table: (indices [N, 4] int64, weights [N, 4] float32).

    Tap k = 2 * dy + dx for the (row + dy, column + dx) corner, clamped to the table.
    """
    indices, weights = [], []
    for grid_h, grid_w in grids:
        rows, cols = _merge_order_rows_cols(grid_h, grid_w, merge)
        h_taps, h_weights = _axis_taps(rows, grid_h, side)
        w_taps, w_weights = _axis_taps(cols, grid_w, side)
        indices.append((h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4))
        weights.append((h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4))
    if not indices:
        return np.zeros((0, 4), dtype=np.int64), np.zeros((0, 4), dtype=np.float32)
    return (np.ascontiguousarray(np.concatenate(indices).astype(np.int64)),
            np.ascontiguousarray(np.concatenate(weights).astype(np.float32)))


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

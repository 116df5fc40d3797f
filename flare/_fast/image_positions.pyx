# cython: language_level=3
"""Per-patch vision positions and bilinear position-table taps, in merge order.

For patch row r of a grid_h x grid_w image (rows ordered by 2 x 2 merge blocks,
as flare._fast.image_patches packs them) this writes:

- its (row, column) in the grid (transformers ``get_vision_position_ids``);
- the four taps into the side x side learned position table and their float32
  weights (transformers ``get_vision_interpolation_indices_and_weights``,
  bilinear, align_corners=True): ``src = (i * (side - 1)) / max(n - 1, 1)``,
  ``f = src - floor(src)``, weights ``max(1 - |f - k|, 0)`` for k = 0, 1, each a
  separate float32 operation; tap ``2 * dy + dx`` is corner (row + dy, column +
  dx), clamped to the table, with weight ``w_row[dy] * w_col[dx]``.
"""

cimport cython
from libc.math cimport fabsf, floorf
from libc.stdint cimport int64_t

cdef extern from *:
    """
    /* Separate IEEE float32 operations, as the reference computes them. */
    #if defined(__GNUC__) && !defined(__clang__)
    #pragma GCC optimize ("fp-contract=off")
    #endif
    """


cdef inline void _axis_taps(Py_ssize_t index, Py_ssize_t size, Py_ssize_t side,
                            int64_t* taps, float* weights) noexcept nogil:
    cdef float src = (<float>index * <float>(side - 1)) / <float>(size - 1 if size > 1 else 1)
    cdef float floor_src = floorf(src)
    cdef float frac = src - floor_src
    cdef float w0 = <float>1.0 - fabsf(frac - <float>0.0)
    cdef float w1 = <float>1.0 - fabsf(frac - <float>1.0)
    cdef int64_t first = <int64_t>floor_src
    taps[0] = min(max(first, 0), side - 1)
    taps[1] = min(max(first + 1, 0), side - 1)
    weights[0] = w0 if w0 > 0.0 else <float>0.0
    weights[1] = w1 if w1 > 0.0 else <float>0.0


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cdivision(True)
def fill_positions(Py_ssize_t grid_h, Py_ssize_t grid_w, Py_ssize_t merge, Py_ssize_t side,
                   int64_t[:, ::1] positions, int64_t[:, ::1] indices, float[:, ::1] weights):
    """Write one image's rows: positions [N, 2], indices [N, 4] int64 and weights [N, 4] float32.

    N = grid_h * grid_w; both sides must be multiples of ``merge``.
    """
    if merge < 1 or side < 1 or grid_h < 1 or grid_w < 1 or grid_h % merge or grid_w % merge:
        raise ValueError(f"grid {grid_h}x{grid_w} is not a positive multiple of merge {merge}")
    cdef Py_ssize_t rows = grid_h * grid_w
    if positions.shape[0] != rows or positions.shape[1] != 2:
        raise ValueError(f"positions must be [{rows}, 2]")
    if indices.shape[0] != rows or indices.shape[1] != 4 or weights.shape[0] != rows or weights.shape[1] != 4:
        raise ValueError(f"indices and weights must be [{rows}, 4]")
    cdef:
        Py_ssize_t by, bx, iy, ix, r, c, patch = 0
        int64_t row_taps[2]
        int64_t col_taps[2]
        float row_weights[2]
        float col_weights[2]
    with nogil:
        for by in range(grid_h // merge):
            for bx in range(grid_w // merge):
                for iy in range(merge):
                    r = by * merge + iy
                    _axis_taps(r, grid_h, side, row_taps, row_weights)
                    for ix in range(merge):
                        c = bx * merge + ix
                        _axis_taps(c, grid_w, side, col_taps, col_weights)
                        positions[patch, 0] = r
                        positions[patch, 1] = c
                        indices[patch, 0] = row_taps[0] * side + col_taps[0]
                        indices[patch, 1] = row_taps[0] * side + col_taps[1]
                        indices[patch, 2] = row_taps[1] * side + col_taps[0]
                        indices[patch, 3] = row_taps[1] * side + col_taps[1]
                        weights[patch, 0] = row_weights[0] * col_weights[0]
                        weights[patch, 1] = row_weights[0] * col_weights[1]
                        weights[patch, 2] = row_weights[1] * col_weights[0]
                        weights[patch, 3] = row_weights[1] * col_weights[1]
                        patch += 1

# cython: language_level=3
"""Fused normalisation, temporal duplication and merge-ordered patch packing.

The Qwen vision processor's layout (transformers ``Qwen2VLImageProcessor.patchify``)
in one pass over the resized image: for patch (gy, gx) of a grid_h x grid_w
grid, its row is ``((gy // m) * (grid_w // m) + gx // m) * m * m + (gy % m) * m
+ gx % m`` and feature ``((c * T + t) * P + py) * P + px`` holds
``table[c, image[gy * P + py, gx * P + px, c]]`` for every temporal copy t.
"""

cimport cython
from libc.string cimport memcpy
from libc.stdint cimport uint8_t

import numpy as np


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void pack_patch_rows(const uint8_t* image, Py_ssize_t height, Py_ssize_t width,
                          Py_ssize_t channels, Py_ssize_t patch, Py_ssize_t merge,
                          Py_ssize_t temporal, const float* table, float* out) noexcept nogil:
    cdef:
        Py_ssize_t grid_w = width // patch
        Py_ssize_t grid_h = height // patch
        Py_ssize_t blocks_w = grid_w // merge
        Py_ssize_t plane = patch * patch
        Py_ssize_t row_len = channels * temporal * plane
        Py_ssize_t gy, gx, py, px, c, t, patch_row
        const uint8_t* src
        const float* lut
        float* dst
        float* first
    for gy in range(grid_h):
        for gx in range(grid_w):
            patch_row = (((gy // merge) * blocks_w + gx // merge) * merge + gy % merge) * merge + gx % merge
            dst = out + patch_row * row_len
            for c in range(channels):
                lut = table + c * 256
                first = dst + c * temporal * plane
                for py in range(patch):
                    src = image + ((gy * patch + py) * width + gx * patch) * channels + c
                    for px in range(patch):
                        first[py * patch + px] = lut[src[px * channels]]
                # The temporal copies repeat the first plane (a still image).
                for t in range(1, temporal):
                    memcpy(first + t * plane, first, plane * sizeof(float))


def pack_patches(const uint8_t[:, :, ::1] image, Py_ssize_t patch, Py_ssize_t merge,
                 Py_ssize_t temporal, const float[:, ::1] table, float[:, ::1] out):
    """Pack ``image`` [H, W, C] into ``out`` [(H/patch) * (W/patch), C * temporal * patch^2].

    ``table`` [C, 256] maps each uint8 value of channel c to its normalised float32.
    H and W must be multiples of ``patch * merge``.
    """
    cdef Py_ssize_t height = image.shape[0], width = image.shape[1], channels = image.shape[2]
    if patch < 1 or merge < 1 or temporal < 1:
        raise ValueError("patch, merge and temporal sizes must be positive")
    if height % (patch * merge) or width % (patch * merge):
        raise ValueError(f"image {height}x{width} is not a multiple of {patch * merge}")
    if table.shape[0] != channels or table.shape[1] != 256:
        raise ValueError(f"table must be [{channels}, 256], got [{table.shape[0]}, {table.shape[1]}]")
    cdef Py_ssize_t rows = (height // patch) * (width // patch)
    if out.shape[0] != rows or out.shape[1] != channels * temporal * patch * patch:
        raise ValueError(f"out must be [{rows}, {channels * temporal * patch * patch}], "
                         f"got [{out.shape[0]}, {out.shape[1]}]")
    if rows == 0:
        return
    with nogil:
        pack_patch_rows(&image[0, 0, 0], height, width, channels, patch, merge, temporal,
                        &table[0, 0], &out[0, 0])

# Contract of flare._fast.image_patches: fused normalisation and patch packing.
#
# A resized HWC uint8 image becomes rows of a packed feature matrix: one row per
# patch, patches ordered by merge blocks (block row, block column, row in block,
# column in block), features ordered by channel, temporal copy, pixel row and
# pixel column. Each uint8 value maps through a per-channel float32 table, so the
# normalisation is exactly the float32 arithmetic the table was built with.

from libc.stdint cimport uint8_t


# Writes grid_h * grid_w rows of channels * temporal * patch * patch float32 values.
cdef void pack_patch_rows(const uint8_t* image, Py_ssize_t height, Py_ssize_t width,
                          Py_ssize_t channels, Py_ssize_t patch, Py_ssize_t merge,
                          Py_ssize_t temporal, const float* table, float* out) noexcept nogil

# Contract of flare._fast.image_patches: resize, normalisation and patch packing.
#
# A resized HWC uint8 image becomes rows of a packed feature matrix: one row per
# patch, patches ordered by merge blocks (block row, block column, row in block,
# column in block), features ordered by channel, temporal copy, pixel row and
# pixel column. Each uint8 value x of channel c becomes (x - offset[c]) /
# divisor[c] in float32. One merge-block row of patches (a "band" of
# patch * merge pixel rows) fills one contiguous run of output rows.


cdef struct PatchLayout:
    Py_ssize_t patch      # patch side in pixels (P)
    Py_ssize_t merge      # spatial merge side in patches (m)
    Py_ssize_t temporal   # temporal copies of each patch (T)
    Py_ssize_t channels   # colour channels (C)
    Py_ssize_t grid_h     # patches down (resized height / P)
    Py_ssize_t grid_w     # patches across (resized width / P)


# Packs one band (P * m rows of grid_w * P * C bytes, row i at band + i * band_stride)
# into grid_w * m rows of C * T * P * P floats at `out`. `table` is [C, 256], the
# normalised value of every uint8 (what offset/divisor compute); `stream` asks for
# non-temporal stores and needs `out` 32-byte aligned.
cdef void pack_band(const unsigned char* band, Py_ssize_t band_stride, const PatchLayout* layout,
                    const float* offset, const float* divisor, const float* table,
                    float* out, int isa, bint stream) noexcept nogil

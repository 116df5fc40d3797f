# Contract of flare._fast.image_resize: the uint8 bicubic antialiased resize.
#
# An axis filter holds, per output index, the first source index, the number of
# taps and the taps as int16 fixed-point weights at a precision shared by the
# whole axis (PyTorch's "adaptive coefficient precision"). The passes round to
# uint8 after each axis, width first, exactly like PyTorch's CPU uint8 kernel.

from libc.stdint cimport int16_t, int32_t, uint8_t


cdef struct AxisFilter:
    Py_ssize_t in_size     # source length along the axis
    Py_ssize_t out_size    # destination length along the axis
    Py_ssize_t max_taps    # row length of `weights` (PyTorch's max_interp_size)
    int precision          # fixed-point bits of every weight on this axis
    const int32_t* starts  # [out_size] first source index of each output
    const int32_t* counts  # [out_size] taps used by each output
    const int16_t* weights # [out_size, max_taps] int16 weights, zero padded
    Py_ssize_t max_pairs   # row length of `pairs`: ceil(max_taps / 2)
    const int32_t* pairs   # [out_size, max_pairs] weights 2j, 2j+1 packed as int16 pairs


# Width pass: rows x in_w x channels -> rows x out_w x channels (C-contiguous rows).
cdef void horizontal_pass(const uint8_t* src, Py_ssize_t src_row_len, Py_ssize_t rows,
                          Py_ssize_t channels, uint8_t* dst, Py_ssize_t dst_row_len,
                          const AxisFilter* axis, bint use_simd) noexcept nogil

# Height pass: in rows of `row_len` bytes -> axis.out_size rows of `row_len` bytes.
cdef void vertical_pass(const uint8_t* src, Py_ssize_t row_len, uint8_t* dst,
                        const AxisFilter* axis, bint use_simd) noexcept nogil

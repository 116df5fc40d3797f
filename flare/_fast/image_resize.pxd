# Contract of flare._fast.image_resize: the uint8 bicubic antialiased resize.
#
# An axis filter holds, per output index, the first source index, the number of
# taps and the taps as int16 fixed-point weights at a precision shared by the
# whole axis (PyTorch's "adaptive coefficient precision"). The passes round to
# uint8 after each axis, width first, exactly like PyTorch's CPU uint8 kernel.
# Every kernel set (KernelIsa) computes the same bytes.

from libc.stdint cimport int16_t, int32_t, uint8_t


cdef enum KernelIsa:
    ISA_SCALAR = 0  # portable C, any CPU
    ISA_AVX2 = 1    # x86-64 AVX2, chosen at run time when the CPU has it


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


cdef class ResizeAxis:
    cdef AxisFilter view               # valid while this object lives
    cdef object starts, counts, weights, pairs


# The KernelIsa named by "auto", "avx2" or "scalar" (ValueError if unavailable).
cpdef int kernel_isa(str isa) except -1

# Width pass: `rows` rows of in_size * channels bytes (row i at src + i * src_stride)
# -> rows of out_size * channels bytes. `src_end` bounds every read of the source
# buffer (one past its last readable byte); rows may be a window of that buffer.
cdef void horizontal_pass(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t rows,
                          Py_ssize_t channels, const uint8_t* src_end, uint8_t* dst,
                          Py_ssize_t dst_stride, const AxisFilter* axis, int isa) noexcept nogil

# Height pass for output rows [y_begin, y_end): source row r lives at
# src + (r - first_row) * src_stride and holds row_len bytes; output row y goes to
# dst + (y - y_begin) * dst_stride. Every source row the outputs read must be present.
cdef void vertical_pass(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t first_row,
                        Py_ssize_t row_len, uint8_t* dst, Py_ssize_t dst_stride,
                        Py_ssize_t y_begin, Py_ssize_t y_end, const AxisFilter* axis,
                        int isa) noexcept nogil

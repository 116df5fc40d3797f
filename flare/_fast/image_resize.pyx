# cython: language_level=3
"""uint8 bicubic antialiased resize, bit-exact with PyTorch's CPU uint8 kernel.

What torchvision's ``resize(uint8 tensor, BICUBIC, antialias=True)`` computes on
the CPU (PyTorch aten/src/ATen/native/cpu/UpSampleKernel.cpp and its AVX
variant, the uint8 antialias path):

- Per axis, weights come from the Keys cubic with a = -0.5 over a support of
  2 * max(scale, 1) source pixels around ``center = scale * (i + 0.5)``, with
  ``scale = in / out``; they are computed and normalised in double precision.
- The weights of an axis are then rounded to int16 at the largest precision
  (below 22 bits) for which twice the axis's largest weight still fits in 15
  bits: the "adaptive coefficient precision".
- Each output sample is the integer dot product plus half an LSB, shifted
  down by that precision and clamped to [0, 255].
- The width is resized first and rounded to uint8; the height pass reads that
  rounded intermediate. An axis whose size does not change is not touched.

Two kernels compute the same integers: SSE2 (pairs of taps through
``pmaddwd``, as PyTorch's AVX code does) and a portable scalar one. The scalar
kernel runs where SSE2 is absent; tests run both.
"""

cimport cython
from libc.math cimport ceil, fabs
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

import numpy as np

cdef extern from *:
    """
    /* Keep the weight arithmetic in separate IEEE operations, as PyTorch's
       reference build computes it; a fused multiply-add would change ulps. */
    #if defined(__GNUC__) && !defined(__clang__)
    #pragma GCC optimize ("fp-contract=off")
    #endif
    #if defined(__SSE2__) || defined(_M_X64)
    #include <emmintrin.h>
    #define FLARE_HAVE_SSE2 1
    #else
    /* No SSE2: the SIMD entry points exist but are never selected. */
    #include <stdlib.h>
    #define FLARE_HAVE_SSE2 0
    typedef struct { int lanes[4]; } __m128i;
    static inline __m128i flare_no_sse2(void) { __m128i v; abort(); return v; }
    #define _mm_setzero_si128() flare_no_sse2()
    #define _mm_set1_epi32(a) flare_no_sse2()
    #define _mm_cvtsi32_si128(a) flare_no_sse2()
    #define _mm_cvtsi128_si32(a) ((int)0)
    #define _mm_loadu_si128(p) flare_no_sse2()
    #define _mm_loadl_epi64(p) flare_no_sse2()
    #define _mm_srli_si128(a, imm) flare_no_sse2()
    #define _mm_storeu_si128(p, a) ((void)0)
    #define _mm_unpacklo_epi8(a, b) flare_no_sse2()
    #define _mm_unpackhi_epi8(a, b) flare_no_sse2()
    #define _mm_unpacklo_epi16(a, b) flare_no_sse2()
    #define _mm_madd_epi16(a, b) flare_no_sse2()
    #define _mm_add_epi32(a, b) flare_no_sse2()
    #define _mm_sra_epi32(a, b) flare_no_sse2()
    #define _mm_packs_epi32(a, b) flare_no_sse2()
    #define _mm_packus_epi16(a, b) flare_no_sse2()
    #endif
    """
    const int FLARE_HAVE_SSE2

cdef extern from *:
    ctypedef struct __m128i:
        pass
    __m128i _mm_setzero_si128() noexcept nogil
    __m128i _mm_set1_epi32(int a) noexcept nogil
    __m128i _mm_cvtsi32_si128(int a) noexcept nogil
    int _mm_cvtsi128_si32(__m128i a) noexcept nogil
    __m128i _mm_loadu_si128(const __m128i* p) noexcept nogil
    __m128i _mm_loadl_epi64(const __m128i* p) noexcept nogil
    __m128i _mm_srli_si128(__m128i a, int imm) noexcept nogil
    void _mm_storeu_si128(__m128i* p, __m128i a) noexcept nogil
    __m128i _mm_unpacklo_epi8(__m128i a, __m128i b) noexcept nogil
    __m128i _mm_unpackhi_epi8(__m128i a, __m128i b) noexcept nogil
    __m128i _mm_unpacklo_epi16(__m128i a, __m128i b) noexcept nogil
    __m128i _mm_madd_epi16(__m128i a, __m128i b) noexcept nogil
    __m128i _mm_add_epi32(__m128i a, __m128i b) noexcept nogil
    __m128i _mm_sra_epi32(__m128i a, __m128i count) noexcept nogil
    __m128i _mm_packs_epi32(__m128i a, __m128i b) noexcept nogil
    __m128i _mm_packus_epi16(__m128i a, __m128i b) noexcept nogil

HAVE_SIMD = bool(FLARE_HAVE_SSE2)

# Keys cubic coefficient for the antialiased path (Pillow compatible).
cdef double CUBIC_A = -0.5
# Taps of the cubic kernel before antialias widening (PyTorch interp_size).
cdef int CUBIC_INTERP_SIZE = 4
# Precision search bound of PyTorch's int16 weight conversion.
cdef int MAX_PRECISION = 22


cdef inline double _cubic(double x) noexcept nogil:
    x = fabs(x)
    if x < 1.0:
        return ((CUBIC_A + 2.0) * x - (CUBIC_A + 3.0)) * x * x + 1.0
    if x < 2.0:
        return ((CUBIC_A * x - 5.0 * CUBIC_A) * x + 8.0 * CUBIC_A) * x - 4.0 * CUBIC_A
    return 0.0


cdef inline uint8_t _clamp_u8(int32_t v) noexcept nogil:
    if v < 0:
        return 0
    if v > 255:
        return 255
    return <uint8_t>v


@cython.boundscheck(False)
@cython.wraparound(False)
def axis_filter(Py_ssize_t in_size, Py_ssize_t out_size):
    """PyTorch's uint8 antialiased bicubic filter for one axis.

    Returns ``(starts int32[out], counts int32[out], weights int16[out, max_taps],
    precision)``. Raises ValueError for sizes below 1.
    """
    if in_size < 1 or out_size < 1:
        raise ValueError(f"axis sizes must be positive, got {in_size} -> {out_size}")
    cdef:
        double scale = <double>in_size / <double>out_size
        double support = (CUBIC_INTERP_SIZE * 0.5) * scale if scale >= 1.0 else CUBIC_INTERP_SIZE * 0.5
        double invscale = 1.0 / scale if scale >= 1.0 else 1.0
        Py_ssize_t max_taps = <Py_ssize_t>ceil(support) * 2 + 1
        double center, total, w, wt_max = 0.0, v
        int64_t xmin, xsize, i, j
        int precision
    starts_arr = np.zeros(out_size, dtype=np.int32)
    counts_arr = np.zeros(out_size, dtype=np.int32)
    wf_arr = np.zeros((out_size, max_taps), dtype=np.float64)
    weights_arr = np.zeros((out_size, max_taps), dtype=np.int16)
    cdef int32_t[::1] starts = starts_arr
    cdef int32_t[::1] counts = counts_arr
    cdef double[:, ::1] wf = wf_arr
    cdef int16_t[:, ::1] weights = weights_arr
    with nogil:
        for i in range(out_size):
            center = scale * (i + 0.5)
            xmin = <int64_t>(center - support + 0.5)
            if xmin < 0:
                xmin = 0
            xsize = <int64_t>(center + support + 0.5)
            if xsize > in_size:
                xsize = in_size
            xsize -= xmin
            # NOTE: rounding can make a window one tap wider than max_taps; PyTorch clips it.
            if xsize < 0:
                xsize = 0
            if xsize > max_taps:
                xsize = max_taps
            total = 0.0
            for j in range(xsize):
                w = _cubic((<double>(j + xmin) - center + 0.5) * invscale)
                wf[i, j] = w
                total += w
            if total != 0.0:
                for j in range(xsize):
                    wf[i, j] /= total
                    if wf[i, j] > wt_max:
                        wt_max = wf[i, j]
            starts[i] = <int32_t>xmin
            counts[i] = <int32_t>xsize
        precision = 0
        while precision < MAX_PRECISION:
            if <int>(0.5 + wt_max * (1 << (precision + 1))) >= (1 << 15):
                break
            precision += 1
        for i in range(out_size):
            for j in range(max_taps):
                v = wf[i, j] * (1 << precision)
                weights[i, j] = <int16_t>(<int>(-0.5 + v) if v < 0 else <int>(0.5 + v))
    return starts_arr, counts_arr, weights_arr, precision


cdef class _Axis:
    """Keeps an axis filter's arrays alive behind the AxisFilter view."""

    cdef AxisFilter view
    cdef object starts, counts, weights, pairs

    def __cinit__(self, Py_ssize_t in_size, Py_ssize_t out_size):
        self.starts, self.counts, self.weights, precision = axis_filter(in_size, out_size)
        max_taps = self.weights.shape[1]
        padded = np.zeros((out_size, max_taps + (max_taps & 1)), dtype=np.int16)
        padded[:, :max_taps] = self.weights
        # Little-endian int16 pairs read as one int32: [w_2j, w_2j+1] for pmaddwd.
        self.pairs = np.ascontiguousarray(padded).view(np.int32)
        cdef int32_t[::1] starts = self.starts
        cdef int32_t[::1] counts = self.counts
        cdef int16_t[:, ::1] weights = self.weights
        cdef int32_t[:, ::1] pairs = self.pairs
        self.view.max_pairs = pairs.shape[1]
        self.view.pairs = &pairs[0, 0]
        self.view.in_size = in_size
        self.view.out_size = out_size
        self.view.max_taps = weights.shape[1]
        self.view.precision = precision
        self.view.starts = &starts[0]
        self.view.counts = &counts[0]
        self.view.weights = &weights[0, 0]


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline __m128i _load_pixel_pair(const uint8_t* p, bint is_tail) noexcept nogil:
    # [R0 R1 G0 G1 B0 B1 . .] as int16 lanes, from the two pixels at p. Away
    # from the buffer's end one 8-byte load covers both (the two spare bytes
    # belong to the next pixel or row); at the end each byte is read alone.
    cdef uint32_t v0 = 0, v1 = 0
    cdef __m128i both
    if is_tail:
        v0 = p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
        v1 = p[3] | (<uint32_t>p[4] << 8) | (<uint32_t>p[5] << 16)
        both = _mm_unpacklo_epi8(_mm_cvtsi32_si128(<int>v0), _mm_cvtsi32_si128(<int>v1))
    else:
        both = _mm_loadl_epi64(<const __m128i*>p)
        both = _mm_unpacklo_epi8(both, _mm_srli_si128(both, 3))
    return _mm_unpacklo_epi8(both, _mm_setzero_si128())


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline __m128i _load_pixel_single(const uint8_t* p, bint is_tail) noexcept nogil:
    # [R 0 G 0 B 0 . .] as int16 lanes, for a lone tap paired with a zero weight.
    cdef uint32_t v = 0
    if is_tail:
        v = p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
    else:
        memcpy(&v, p, 4)
    cdef __m128i zero = _mm_setzero_si128()
    return _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(<int>v), zero), zero)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _horizontal_rgb_sse2(const uint8_t* src, Py_ssize_t src_row_len, Py_ssize_t rows,
                               uint8_t* dst, Py_ssize_t dst_row_len,
                               const AxisFilter* axis) noexcept nogil:
    cdef:
        const uint8_t* row
        const uint8_t* p
        const int32_t* pairs = axis.pairs
        const int32_t* starts = axis.starts
        const int32_t* counts = axis.counts
        Py_ssize_t max_pairs = axis.max_pairs
        Py_ssize_t out_w = axis.out_size
        const int32_t* wp
        uint8_t* out
        Py_ssize_t y, x, j, n
        bint is_tail
        __m128i shift = _mm_cvtsi32_si128(axis.precision)
        __m128i half = _mm_set1_epi32(1 << (axis.precision - 1))
        __m128i acc
        uint32_t packed
    for y in range(rows):
        row = src + y * src_row_len
        out = dst + y * dst_row_len
        # NOTE: only the last row may not over-read past its end.
        is_tail = y == rows - 1
        for x in range(out_w):
            acc = half
            p = row + starts[x] * 3
            wp = pairs + x * max_pairs
            n = counts[x]
            j = 0
            while 2 * j + 1 < n:
                acc = _mm_add_epi32(acc, _mm_madd_epi16(_load_pixel_pair(p, is_tail), _mm_set1_epi32(wp[j])))
                p += 6
                j += 1
            if 2 * j < n:
                acc = _mm_add_epi32(acc, _mm_madd_epi16(_load_pixel_single(p, is_tail), _mm_set1_epi32(wp[j])))
            acc = _mm_sra_epi32(acc, shift)
            acc = _mm_packs_epi32(acc, acc)
            packed = <uint32_t>_mm_cvtsi128_si32(_mm_packus_epi16(acc, acc))
            if x + 1 < out_w:
                # The fourth byte lands on the next pixel, which is written next.
                memcpy(out + 3 * x, &packed, 4)
            else:
                out[3 * x] = <uint8_t>packed
                out[3 * x + 1] = <uint8_t>(packed >> 8)
                out[3 * x + 2] = <uint8_t>(packed >> 16)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _horizontal_scalar(const uint8_t* src, Py_ssize_t src_row_len, Py_ssize_t rows,
                             Py_ssize_t channels, uint8_t* dst, Py_ssize_t dst_row_len,
                             const AxisFilter* axis) noexcept nogil:
    cdef:
        const uint8_t* row
        const uint8_t* p
        const int16_t* w
        uint8_t* out
        Py_ssize_t y, x, k, c, n
        int32_t half = 1 << (axis.precision - 1)
        int32_t acc
    for y in range(rows):
        row = src + y * src_row_len
        out = dst + y * dst_row_len
        for x in range(axis.out_size):
            p = row + axis.starts[x] * channels
            w = axis.weights + x * axis.max_taps
            n = axis.counts[x]
            for c in range(channels):
                acc = half
                for k in range(n):
                    acc += <int32_t>w[k] * <int32_t>p[k * channels + c]
                out[x * channels + c] = _clamp_u8(acc >> axis.precision)


cdef void horizontal_pass(const uint8_t* src, Py_ssize_t src_row_len, Py_ssize_t rows,
                          Py_ssize_t channels, uint8_t* dst, Py_ssize_t dst_row_len,
                          const AxisFilter* axis, bint use_simd) noexcept nogil:
    if use_simd and FLARE_HAVE_SSE2 and channels == 3:
        _horizontal_rgb_sse2(src, src_row_len, rows, dst, dst_row_len, axis)
    else:
        _horizontal_scalar(src, src_row_len, rows, channels, dst, dst_row_len, axis)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _vertical_sse2(const uint8_t* src, Py_ssize_t row_len, uint8_t* dst,
                         const AxisFilter* axis) noexcept nogil:
    cdef:
        const uint8_t* first
        const int16_t* w
        const int32_t* wp
        uint8_t* out
        Py_ssize_t y, x, k, n
        __m128i zero = _mm_setzero_si128()
        __m128i shift = _mm_cvtsi32_si128(axis.precision)
        __m128i a0, a1, a2, a3, r0, r1, lo, hi, wpair
        int32_t half = 1 << (axis.precision - 1)
        int32_t acc
    for y in range(axis.out_size):
        first = src + axis.starts[y] * row_len
        w = axis.weights + y * axis.max_taps
        wp = axis.pairs + y * axis.max_pairs
        n = axis.counts[y]
        out = dst + y * row_len
        x = 0
        while x + 16 <= row_len:
            a0 = _mm_set1_epi32(half)
            a1 = a0
            a2 = a0
            a3 = a0
            k = 0
            while k < n:
                # Interleave two source rows byte by byte so each int16 pair
                # meets its [w_k w_k+1] pair in pmaddwd; an odd tail pairs with zeros.
                r0 = _mm_loadu_si128(<const __m128i*>(first + k * row_len + x))
                if k + 1 < n:
                    r1 = _mm_loadu_si128(<const __m128i*>(first + (k + 1) * row_len + x))
                else:
                    r1 = zero
                wpair = _mm_set1_epi32(wp[k >> 1])
                lo = _mm_unpacklo_epi8(r0, r1)
                hi = _mm_unpackhi_epi8(r0, r1)
                a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), wpair))
                a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), wpair))
                a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), wpair))
                a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), wpair))
                k += 2
            a0 = _mm_packs_epi32(_mm_sra_epi32(a0, shift), _mm_sra_epi32(a1, shift))
            a2 = _mm_packs_epi32(_mm_sra_epi32(a2, shift), _mm_sra_epi32(a3, shift))
            _mm_storeu_si128(<__m128i*>(out + x), _mm_packus_epi16(a0, a2))
            x += 16
        while x < row_len:
            acc = half
            for k in range(n):
                acc += <int32_t>w[k] * <int32_t>first[k * row_len + x]
            out[x] = _clamp_u8(acc >> axis.precision)
            x += 1


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _vertical_scalar(const uint8_t* src, Py_ssize_t row_len, uint8_t* dst,
                           const AxisFilter* axis) noexcept nogil:
    cdef:
        const uint8_t* first
        const int16_t* w
        uint8_t* out
        Py_ssize_t y, x, k, n
        int32_t half = 1 << (axis.precision - 1)
        int32_t acc
    for y in range(axis.out_size):
        first = src + axis.starts[y] * row_len
        w = axis.weights + y * axis.max_taps
        n = axis.counts[y]
        out = dst + y * row_len
        for x in range(row_len):
            acc = half
            for k in range(n):
                acc += <int32_t>w[k] * <int32_t>first[k * row_len + x]
            out[x] = _clamp_u8(acc >> axis.precision)


cdef void vertical_pass(const uint8_t* src, Py_ssize_t row_len, uint8_t* dst,
                        const AxisFilter* axis, bint use_simd) noexcept nogil:
    if use_simd and FLARE_HAVE_SSE2:
        _vertical_sse2(src, row_len, dst, axis)
    else:
        _vertical_scalar(src, row_len, dst, axis)


def resize_bicubic_aa(const uint8_t[:, :, ::1] src, Py_ssize_t out_h, Py_ssize_t out_w,
                      *, bint use_simd=True):
    """Resize ``src`` [H, W, C] uint8 to [out_h, out_w, C] like PyTorch's uint8 bicubic antialias.

    ``use_simd=False`` selects the portable scalar kernels (same integers).
    """
    cdef Py_ssize_t in_h = src.shape[0], in_w = src.shape[1], channels = src.shape[2]
    if in_h < 1 or in_w < 1 or out_h < 1 or out_w < 1:
        raise ValueError(f"cannot resize {in_h}x{in_w} to {out_h}x{out_w}")
    if channels < 1 or channels > 4:
        raise ValueError(f"expected 1 to 4 channels, got {channels}")
    out_arr = np.empty((out_h, out_w, channels), dtype=np.uint8)
    cdef uint8_t[:, :, ::1] out = out_arr
    cdef _Axis width_axis, height_axis
    cdef uint8_t[:, :, ::1] mid
    if in_h == out_h and in_w == out_w:
        out[...] = src
        return out_arr
    if in_w == out_w:
        height_axis = _Axis(in_h, out_h)
        with nogil:
            vertical_pass(&src[0, 0, 0], in_w * channels, &out[0, 0, 0], &height_axis.view, use_simd)
        return out_arr
    width_axis = _Axis(in_w, out_w)
    if in_h == out_h:
        with nogil:
            horizontal_pass(&src[0, 0, 0], in_w * channels, in_h, channels,
                            &out[0, 0, 0], out_w * channels, &width_axis.view, use_simd)
        return out_arr
    height_axis = _Axis(in_h, out_h)
    # NOTE: the width pass covers every source row, not only those the height
    # pass reads; both give the same bytes, and the full pass keeps rows simple.
    mid = np.empty((in_h, out_w, channels), dtype=np.uint8)
    with nogil:
        horizontal_pass(&src[0, 0, 0], in_w * channels, in_h, channels,
                        &mid[0, 0, 0], out_w * channels, &width_axis.view, use_simd)
        vertical_pass(&mid[0, 0, 0], out_w * channels, &out[0, 0, 0], &height_axis.view, use_simd)
    return out_arr

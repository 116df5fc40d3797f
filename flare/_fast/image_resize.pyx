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

Two kernel sets compute the same integers: AVX2 (int16 weight pairs through
``vpmaddwd``, selected at run time when the CPU has it) and a portable scalar
one. Integer addition is associative, so the order of the taps' partial sums
cannot change a result; tests run both sets against the torchvision fixtures.
"""

cimport cython
from libc.math cimport ceil, fabs
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t
from libc.stdlib cimport abort, free, malloc

import numpy as np

cdef extern from *:
    """
    /* Keep the weight arithmetic in separate IEEE operations, as PyTorch's
       reference build computes it; a fused multiply-add would change ulps. */
    #if defined(__GNUC__) && !defined(__clang__)
    #pragma GCC optimize ("fp-contract=off")
    #endif
    #include <stdint.h>
    #include <stddef.h>
    #include <string.h>

    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    #include <immintrin.h>
    #define FLARE_RESIZE_X86 1
    #define FLARE_AVX2_FN static __attribute__((target("avx2"))) inline
    static int flare_resize_cpu_has_avx2(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");  /* also checks the OS saves YMM state */
    }
    #else
    #define FLARE_RESIZE_X86 0
    static int flare_resize_cpu_has_avx2(void) { return 0; }
    #endif

    #if FLARE_RESIZE_X86
    /* 16 source bytes at p. When `checked`, the bytes at or past `end` (one
       past the last readable byte) read as zero; only taps of weight zero
       ever look there. Callers pass `checked` as a constant. */
    FLARE_AVX2_FN __m128i flare_load16(const uint8_t* p, const uint8_t* end, int checked) {
        if (!checked || p + 16 <= end)
            return _mm_loadu_si128((const __m128i*)p);
        uint8_t tmp[16] = {0};
        memcpy(tmp, p, (size_t)(end - p));
        return _mm_loadu_si128((const __m128i*)tmp);
    }

    FLARE_AVX2_FN __m256i flare_load_rows(const uint8_t* p0, const uint8_t* p1, const uint8_t* end,
                                          int checked) {
        return _mm256_inserti128_si256(_mm256_castsi128_si256(flare_load16(p0, end, checked)),
                                       flare_load16(p1, end, checked), 1);
    }

    /* One output pixel of four rows (rows 0-1 in acc[0], rows 2-3 in acc[1],
       one row per 128-bit lane): q[r] points at the pixel's first tap in row r.
       A 16-byte load holds the next five taps; byte shuffles widen them to
       int16 pairs [R_j R_j+1 G_j G_j+1 B_j B_j+1 0 0] for vpmaddwd against the
       packed weight pair [w_j w_j+1], broadcast once for all four rows. Taps
       past the window's count have weight zero (the pairs are zero padded),
       and a lone fifth tap is paired with zero samples. */
    FLARE_AVX2_FN void flare_h_taps(const uint8_t* q0, const uint8_t* q1, const uint8_t* q2,
                                    const uint8_t* q3, const uint8_t* end, int checked, int n,
                                    const int32_t* wp, __m256i half, __m256i acc[2]) {
        const __m256i taps01 = _mm256_setr_epi8(
            0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
            0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
        const __m256i taps23 = _mm256_setr_epi8(
            6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,
            6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
        const __m256i taps4 = _mm256_setr_epi8(
            12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, -1, -1, -1, -1,
            12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, -1, -1, -1, -1);
        __m256i a = half, b = half;
        int j = 0;
        for (; n - j > 5; j += 4, wp += 2) {
            const __m256i pa = flare_load_rows(q0 + 3 * j, q1 + 3 * j, end, checked);
            const __m256i pb = flare_load_rows(q2 + 3 * j, q3 + 3 * j, end, checked);
            const __m256i w01 = _mm256_set1_epi32(wp[0]), w23 = _mm256_set1_epi32(wp[1]);
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(pa, taps01), w01));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_shuffle_epi8(pb, taps01), w01));
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(pa, taps23), w23));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_shuffle_epi8(pb, taps23), w23));
        }
        const __m256i pa = flare_load_rows(q0 + 3 * j, q1 + 3 * j, end, checked);
        const __m256i pb = flare_load_rows(q2 + 3 * j, q3 + 3 * j, end, checked);
        const __m256i w01 = _mm256_set1_epi32(wp[0]);
        a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(pa, taps01), w01));
        b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_shuffle_epi8(pb, taps01), w01));
        if (n - j > 2) {
            const __m256i w23 = _mm256_set1_epi32(wp[1]);
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(pa, taps23), w23));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_shuffle_epi8(pb, taps23), w23));
        }
        if (n - j > 4) {
            const __m256i w45 = _mm256_set1_epi32(wp[2]);
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(pa, taps4), w45));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_shuffle_epi8(pb, taps4), w45));
        }
        acc[0] = a;
        acc[1] = b;
    }

    /* Stores the six bytes [R G B R' G' B'] of lane `lane` of v (one row's two
       pixels), or the first three when `single`; `wide` lets the store spill
       two bytes onto the next pixel, which is written afterwards. */
    FLARE_AVX2_FN void flare_store_pixels(uint8_t* out, __m256i v, int lane, int single, int wide) {
        const __m128i half_v = lane ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
        const uint64_t bytes = (uint64_t)_mm_cvtsi128_si64(half_v);
        if (single)
            memcpy(out, &bytes, 3);
        else if (wide)
            memcpy(out, &bytes, 8);
        else
            memcpy(out, &bytes, 6);
    }

    /* Width pass over one group of up to four rows (`group`; missing rows
       repeat the last one and are not stored), two output pixels per step:
       both pixels' accumulators narrow together to [R G B R' G' B'] per row. */
    FLARE_AVX2_FN void flare_h_group(const uint8_t* r0, const uint8_t* r1, const uint8_t* r2,
                                     const uint8_t* r3, uint8_t* out, ptrdiff_t dst_stride,
                                     int group, const uint8_t* end, int checked, ptrdiff_t out_w,
                                     const int32_t* starts, const int32_t* counts,
                                     const int32_t* pairs, ptrdiff_t max_pairs, int precision) {
        const __m128i shift = _mm_cvtsi32_si128(precision);
        const __m256i half = _mm256_set1_epi32(1 << (precision - 1));
        /* [R G B . R' G' B' .] -> [R G B R' G' B' . .] within each lane. */
        const __m256i gather6 = _mm256_setr_epi8(
            0, 1, 2, 4, 5, 6, 3, 7, 8, 9, 10, 11, 12, 13, 14, 15,
            0, 1, 2, 4, 5, 6, 3, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m256i acc_a[2], acc_b[2];
        for (ptrdiff_t x = 0; x < out_w; x += 2) {
            const int single = x + 1 == out_w;
            const int wide = x + 2 < out_w;
            const ptrdiff_t fa = (ptrdiff_t)starts[x] * 3;
            flare_h_taps(r0 + fa, r1 + fa, r2 + fa, r3 + fa, end, checked, counts[x],
                         pairs + x * max_pairs, half, acc_a);
            if (!single) {
                const ptrdiff_t fb = (ptrdiff_t)starts[x + 1] * 3;
                flare_h_taps(r0 + fb, r1 + fb, r2 + fb, r3 + fb, end, checked, counts[x + 1],
                             pairs + (x + 1) * max_pairs, half, acc_b);
            } else {
                acc_b[0] = acc_b[1] = half;
            }
            for (int k = 0; k < 2; k++) {
                __m256i v = _mm256_packs_epi32(_mm256_sra_epi32(acc_a[k], shift),
                                               _mm256_sra_epi32(acc_b[k], shift));
                v = _mm256_shuffle_epi8(_mm256_packus_epi16(v, v), gather6);
                if (2 * k < group)
                    flare_store_pixels(out + 2 * k * dst_stride + 3 * x, v, 0, single, wide);
                if (2 * k + 1 < group)
                    flare_store_pixels(out + (2 * k + 1) * dst_stride + 3 * x, v, 1, single, wide);
            }
        }
    }

    FLARE_AVX2_FN void flare_horizontal_rgb_avx2(
            const uint8_t* src, ptrdiff_t src_stride, ptrdiff_t rows, const uint8_t* src_end,
            uint8_t* dst, ptrdiff_t dst_stride, ptrdiff_t out_w, const int32_t* starts,
            const int32_t* counts, const int32_t* pairs, ptrdiff_t max_pairs, int precision) {
        for (ptrdiff_t y = 0; y < rows; y += 4) {
            const int group = rows - y >= 4 ? 4 : (int)(rows - y);
            const uint8_t* r0 = src + y * src_stride;
            const uint8_t* r1 = group > 1 ? r0 + src_stride : r0;
            const uint8_t* r2 = group > 2 ? r1 + src_stride : r1;
            const uint8_t* r3 = group > 3 ? r2 + src_stride : r2;
            uint8_t* out = dst + y * dst_stride;
            /* A load starts inside a row and reads 16 bytes: only groups near
               the end of the buffer need the checked loads. */
            if (r3 + src_stride + 16 <= src_end)
                flare_h_group(r0, r1, r2, r3, out, dst_stride, group, src_end, 0, out_w, starts,
                              counts, pairs, max_pairs, precision);
            else
                flare_h_group(r0, r1, r2, r3, out, dst_stride, group, src_end, 1, out_w, starts,
                              counts, pairs, max_pairs, precision);
        }
    }

    /* Height pass: out row y (y_begin <= y < y_end) combines source rows
       starts[y] .. starts[y] + counts[y] - 1, 32 bytes at a time. Two source
       rows are interleaved byte by byte so each int16 pair meets its packed
       weight pair in vpmaddwd; an odd last tap pairs with a zero row. The
       unpacks work within 128-bit lanes and the packs undo that order. A row
       tail shorter than 32 bytes is recomputed by an overlapping last block. */
    FLARE_AVX2_FN void flare_vertical_avx2(
            const uint8_t* src, ptrdiff_t src_stride, ptrdiff_t first_row, ptrdiff_t row_len,
            uint8_t* dst, ptrdiff_t dst_stride, ptrdiff_t y_begin, ptrdiff_t y_end,
            const int32_t* starts, const int32_t* counts, const int32_t* pairs,
            ptrdiff_t max_pairs, int precision) {
        const __m256i zero = _mm256_setzero_si256();
        const __m128i shift = _mm_cvtsi32_si128(precision);
        const __m256i half = _mm256_set1_epi32(1 << (precision - 1));
        for (ptrdiff_t y = y_begin; y < y_end; y++) {
            const uint8_t* top = src + ((ptrdiff_t)starts[y] - first_row) * src_stride;
            const int n = counts[y];
            const int32_t* wp = pairs + y * max_pairs;
            uint8_t* out = dst + (y - y_begin) * dst_stride;
            ptrdiff_t x = 0;
            for (;;) {
                if (x + 32 > row_len)
                    x = row_len - 32;
                __m256i a0 = half, a1 = half, a2 = half, a3 = half;
                for (int k = 0; k < n; k += 2) {
                    const __m256i r0 = _mm256_loadu_si256((const __m256i*)(top + k * src_stride + x));
                    const __m256i r1 = k + 1 < n
                        ? _mm256_loadu_si256((const __m256i*)(top + (k + 1) * src_stride + x)) : zero;
                    const __m256i w = _mm256_set1_epi32(wp[k >> 1]);
                    const __m256i lo = _mm256_unpacklo_epi8(r0, r1);
                    const __m256i hi = _mm256_unpackhi_epi8(r0, r1);
                    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), w));
                    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), w));
                    a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), w));
                    a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), w));
                }
                a0 = _mm256_packs_epi32(_mm256_sra_epi32(a0, shift), _mm256_sra_epi32(a1, shift));
                a2 = _mm256_packs_epi32(_mm256_sra_epi32(a2, shift), _mm256_sra_epi32(a3, shift));
                _mm256_storeu_si256((__m256i*)(out + x), _mm256_packus_epi16(a0, a2));
                if (x + 32 >= row_len)
                    break;
                x += 32;
            }
        }
    }
    #else
    /* Never selected: flare_resize_cpu_has_avx2() is 0 off x86. */
    static void flare_horizontal_rgb_avx2(
            const uint8_t* src, ptrdiff_t src_stride, ptrdiff_t rows, const uint8_t* src_end,
            uint8_t* dst, ptrdiff_t dst_stride, ptrdiff_t out_w, const int32_t* starts,
            const int32_t* counts, const int32_t* pairs, ptrdiff_t max_pairs, int precision) {}
    static void flare_vertical_avx2(
            const uint8_t* src, ptrdiff_t src_stride, ptrdiff_t first_row, ptrdiff_t row_len,
            uint8_t* dst, ptrdiff_t dst_stride, ptrdiff_t y_begin, ptrdiff_t y_end,
            const int32_t* starts, const int32_t* counts, const int32_t* pairs,
            ptrdiff_t max_pairs, int precision) {}
    #endif
    """
    int flare_resize_cpu_has_avx2() noexcept nogil
    void flare_horizontal_rgb_avx2(
        const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t rows, const uint8_t* src_end,
        uint8_t* dst, Py_ssize_t dst_stride, Py_ssize_t out_w, const int32_t* starts,
        const int32_t* counts, const int32_t* pairs, Py_ssize_t max_pairs,
        int precision) noexcept nogil
    void flare_vertical_avx2(
        const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t first_row, Py_ssize_t row_len,
        uint8_t* dst, Py_ssize_t dst_stride, Py_ssize_t y_begin, Py_ssize_t y_end,
        const int32_t* starts, const int32_t* counts, const int32_t* pairs,
        Py_ssize_t max_pairs, int precision) noexcept nogil

cdef bint _CPU_HAS_AVX2 = flare_resize_cpu_has_avx2() != 0

# Kernel sets this CPU can run, best last; "auto" picks the best.
ISAS = ("scalar", "avx2") if _CPU_HAS_AVX2 else ("scalar",)
BEST_ISA = ISAS[-1]

# Keys cubic coefficient for the antialiased path (Pillow compatible).
cdef double CUBIC_A = -0.5
# Taps of the cubic kernel before antialias widening (PyTorch interp_size).
cdef int CUBIC_INTERP_SIZE = 4
# Precision search bound of PyTorch's int16 weight conversion.
cdef int MAX_PRECISION = 22


cpdef int kernel_isa(str isa) except -1:
    """The KernelIsa for ``isa`` ("auto", "avx2" or "scalar"); ValueError if this CPU lacks it."""
    if isa == "auto":
        return ISA_AVX2 if _CPU_HAS_AVX2 else ISA_SCALAR
    if isa == "scalar":
        return ISA_SCALAR
    if isa == "avx2":
        if not _CPU_HAS_AVX2:
            raise ValueError("this CPU has no AVX2")
        return ISA_AVX2
    raise ValueError(f"unknown kernel set {isa!r}; expected 'auto' or one of {ISAS}")


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


cdef class ResizeAxis:
    """One axis's filter, owning the arrays behind its AxisFilter view."""

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
cdef void _horizontal_scalar(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t rows,
                             Py_ssize_t channels, uint8_t* dst, Py_ssize_t dst_stride,
                             const AxisFilter* axis) noexcept nogil:
    cdef:
        const uint8_t* row
        const uint8_t* p
        const int16_t* w
        uint8_t* out
        Py_ssize_t y, x, k, c, n
        int32_t half = 1 << (axis.precision - 1)
        int32_t acc, acc_r, acc_g, acc_b
    for y in range(rows):
        row = src + y * src_stride
        out = dst + y * dst_stride
        for x in range(axis.out_size):
            p = row + axis.starts[x] * channels
            w = axis.weights + x * axis.max_taps
            n = axis.counts[x]
            if channels == 3:
                # RGB: the three sums share one pass over the taps.
                acc_r = half
                acc_g = half
                acc_b = half
                for k in range(n):
                    acc_r += <int32_t>w[k] * <int32_t>p[3 * k]
                    acc_g += <int32_t>w[k] * <int32_t>p[3 * k + 1]
                    acc_b += <int32_t>w[k] * <int32_t>p[3 * k + 2]
                out[3 * x] = _clamp_u8(acc_r >> axis.precision)
                out[3 * x + 1] = _clamp_u8(acc_g >> axis.precision)
                out[3 * x + 2] = _clamp_u8(acc_b >> axis.precision)
                continue
            for c in range(channels):
                acc = half
                for k in range(n):
                    acc += <int32_t>w[k] * <int32_t>p[k * channels + c]
                out[x * channels + c] = _clamp_u8(acc >> axis.precision)


cdef void horizontal_pass(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t rows,
                          Py_ssize_t channels, const uint8_t* src_end, uint8_t* dst,
                          Py_ssize_t dst_stride, const AxisFilter* axis, int isa) noexcept nogil:
    if isa == ISA_AVX2 and channels == 3:
        flare_horizontal_rgb_avx2(src, src_stride, rows, src_end, dst, dst_stride, axis.out_size,
                                  axis.starts, axis.counts, axis.pairs, axis.max_pairs,
                                  axis.precision)
    else:
        _horizontal_scalar(src, src_stride, rows, channels, dst, dst_stride, axis)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _vertical_scalar(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t first_row,
                           Py_ssize_t row_len, uint8_t* dst, Py_ssize_t dst_stride,
                           Py_ssize_t y_begin, Py_ssize_t y_end,
                           const AxisFilter* axis) noexcept nogil:
    # Tap-major over a row of int32 sums, so the compiler can vectorise the
    # inner loops with whatever SIMD the baseline target has.
    cdef:
        const uint8_t* top
        const uint8_t* row
        const int16_t* w
        uint8_t* out
        Py_ssize_t y, x, k, n
        int32_t half = 1 << (axis.precision - 1)
        int32_t weight
        int32_t* sums = <int32_t*>malloc(row_len * sizeof(int32_t))
    if sums == NULL:
        abort()  # a few KiB; nothing sensible remains if even that fails
    for y in range(y_begin, y_end):
        top = src + (axis.starts[y] - first_row) * src_stride
        w = axis.weights + y * axis.max_taps
        n = axis.counts[y]
        out = dst + (y - y_begin) * dst_stride
        for x in range(row_len):
            sums[x] = half
        for k in range(n):
            weight = w[k]
            row = top + k * src_stride
            for x in range(row_len):
                sums[x] += weight * <int32_t>row[x]
        for x in range(row_len):
            out[x] = _clamp_u8(sums[x] >> axis.precision)
    free(sums)


cdef void vertical_pass(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t first_row,
                        Py_ssize_t row_len, uint8_t* dst, Py_ssize_t dst_stride,
                        Py_ssize_t y_begin, Py_ssize_t y_end, const AxisFilter* axis,
                        int isa) noexcept nogil:
    if isa == ISA_AVX2 and row_len >= 32:
        flare_vertical_avx2(src, src_stride, first_row, row_len, dst, dst_stride, y_begin, y_end,
                            axis.starts, axis.counts, axis.pairs, axis.max_pairs, axis.precision)
    else:
        _vertical_scalar(src, src_stride, first_row, row_len, dst, dst_stride, y_begin, y_end,
                         axis)


def resize_bicubic_aa(const uint8_t[:, :, ::1] src, Py_ssize_t out_h, Py_ssize_t out_w,
                      *, str isa="auto"):
    """Resize ``src`` [H, W, C] uint8 to [out_h, out_w, C] like PyTorch's uint8 bicubic antialias.

    ``isa`` selects the kernel set: "auto" (the best this CPU runs), "avx2"
    or "scalar"; every set gives the same bytes.
    """
    cdef int kernels = kernel_isa(isa)
    cdef Py_ssize_t in_h = src.shape[0], in_w = src.shape[1], channels = src.shape[2]
    if in_h < 1 or in_w < 1 or out_h < 1 or out_w < 1:
        raise ValueError(f"cannot resize {in_h}x{in_w} to {out_h}x{out_w}")
    if channels < 1 or channels > 4:
        raise ValueError(f"expected 1 to 4 channels, got {channels}")
    out_arr = np.empty((out_h, out_w, channels), dtype=np.uint8)
    cdef uint8_t[:, :, ::1] out = out_arr
    cdef ResizeAxis width_axis, height_axis
    cdef uint8_t[:, :, ::1] mid
    cdef const uint8_t* src_end = &src[0, 0, 0] + in_h * in_w * channels
    if in_h == out_h and in_w == out_w:
        out[...] = src
        return out_arr
    if in_w == out_w:
        height_axis = ResizeAxis(in_h, out_h)
        with nogil:
            vertical_pass(&src[0, 0, 0], in_w * channels, 0, in_w * channels, &out[0, 0, 0],
                          out_w * channels, 0, out_h, &height_axis.view, kernels)
        return out_arr
    width_axis = ResizeAxis(in_w, out_w)
    if in_h == out_h:
        with nogil:
            horizontal_pass(&src[0, 0, 0], in_w * channels, in_h, channels, src_end,
                            &out[0, 0, 0], out_w * channels, &width_axis.view, kernels)
        return out_arr
    height_axis = ResizeAxis(in_h, out_h)
    # NOTE: the width pass covers every source row, not only those the height
    # pass reads; both give the same bytes, and the full pass keeps rows simple.
    mid = np.empty((in_h, out_w, channels), dtype=np.uint8)
    with nogil:
        horizontal_pass(&src[0, 0, 0], in_w * channels, in_h, channels, src_end,
                        &mid[0, 0, 0], out_w * channels, &width_axis.view, kernels)
        vertical_pass(&mid[0, 0, 0], out_w * channels, 0, out_w * channels, &out[0, 0, 0],
                      out_w * channels, 0, out_h, &height_axis.view, kernels)
    return out_arr

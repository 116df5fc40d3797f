# cython: language_level=3
"""Resize, normalise and pack an image into merge-ordered patch rows in one pass.

The Qwen vision processor's layout (transformers ``Qwen2VLImageProcessor.patchify``):
for patch (gy, gx) of a grid_h x grid_w grid, its row is
``((gy // m) * (grid_w // m) + gx // m) * m * m + (gy % m) * m + gx % m`` and
feature ``((c * T + t) * P + py) * P + px`` holds the normalised value of
``resized[gy * P + py, gx * P + px, c]`` for every temporal copy t.

The patches of one merge-block row (P * m pixel rows) fill one contiguous run
of rows, so the image is produced band by band: the resize writes a band of
P * m resized rows into a small buffer that stays in cache, and the band is
packed at once. The resized image is never materialised; the width pass
keeps the few source rows that neighbouring bands share. Normalisation is
``(x - offset[c]) / divisor[c]`` in float32, the two IEEE operations
transformers runs (mean and std already divided by the rescale factor).

Two kernel sets give the same bytes: AVX2 (bands of 16-pixel patch rows, RGB)
and portable scalar code (a 256-entry table per channel computed with the
same float32 operations).
"""

cimport cython
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memcpy, memmove

from flare._fast.image_resize cimport (
    ISA_AVX2, AxisFilter, ResizeAxis, horizontal_pass, kernel_isa, vertical_pass,
)

import numpy as np

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    #include <immintrin.h>
    #define FLARE_PACK_AVX2_FN static __attribute__((target("avx2"))) inline

    FLARE_PACK_AVX2_FN void flare_pack_store8(float* p, __m256 v, int stream) {
        if (stream)
            _mm256_stream_ps(p, v);
        else
            _mm256_storeu_ps(p, v);
    }

    /* 16 uint8 samples of one channel -> 2 x 8 normalised float32, stored at
       dst and repeated for every temporal copy (`plane` floats apart). */
    FLARE_PACK_AVX2_FN void flare_pack_channel16(__m128i v, __m256 offset, __m256 divisor,
                                                 float* dst, ptrdiff_t plane, ptrdiff_t temporal,
                                                 int stream) {
        const __m256 lo = _mm256_div_ps(_mm256_sub_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), offset), divisor);
        const __m256 hi = _mm256_div_ps(_mm256_sub_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), offset), divisor);
        for (ptrdiff_t t = 0; t < temporal; t++) {
            flare_pack_store8(dst + t * plane, lo, stream);
            flare_pack_store8(dst + t * plane + 8, hi, stream);
        }
    }

    /* Pack one band of 16 * merge RGB rows (row stride `band_stride`) into
       grid_w * merge patch rows of 3 * temporal * 256 floats at `out`. Each
       16-pixel patch row (48 bytes) is split into R, G and B with byte
       shuffles; every 16 floats written fill one 64-byte line, so streaming
       stores (out 32-byte aligned) write whole lines without reading them. */
    FLARE_PACK_AVX2_FN void flare_pack_band16_rgb_avx2(
            const uint8_t* band, ptrdiff_t band_stride, ptrdiff_t grid_w, ptrdiff_t merge,
            ptrdiff_t temporal, const float* offset, const float* divisor, float* out, int stream) {
        const ptrdiff_t plane = 256;
        const ptrdiff_t row_len = 3 * temporal * plane;
        const __m128i r_a = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m128i r_b = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
        const __m128i r_c = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
        const __m128i g_a = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m128i g_b = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
        const __m128i g_c = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
        const __m128i b_a = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m128i b_b = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
        const __m128i b_c = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
        const __m256 off_r = _mm256_set1_ps(offset[0]), div_r = _mm256_set1_ps(divisor[0]);
        const __m256 off_g = _mm256_set1_ps(offset[1]), div_g = _mm256_set1_ps(divisor[1]);
        const __m256 off_b = _mm256_set1_ps(offset[2]), div_b = _mm256_set1_ps(divisor[2]);
        for (ptrdiff_t iy = 0; iy < merge; iy++) {
            for (ptrdiff_t gx = 0; gx < grid_w; gx++) {
                float* dst = out + (((gx / merge) * merge + iy) * merge + gx % merge) * row_len;
                const uint8_t* src = band + iy * 16 * band_stride + gx * 48;
                for (ptrdiff_t py = 0; py < 16; py++, src += band_stride) {
                    const __m128i a = _mm_loadu_si128((const __m128i*)src);
                    const __m128i b = _mm_loadu_si128((const __m128i*)(src + 16));
                    const __m128i c = _mm_loadu_si128((const __m128i*)(src + 32));
                    const __m128i r = _mm_or_si128(_mm_or_si128(
                        _mm_shuffle_epi8(a, r_a), _mm_shuffle_epi8(b, r_b)), _mm_shuffle_epi8(c, r_c));
                    const __m128i g = _mm_or_si128(_mm_or_si128(
                        _mm_shuffle_epi8(a, g_a), _mm_shuffle_epi8(b, g_b)), _mm_shuffle_epi8(c, g_c));
                    const __m128i bl = _mm_or_si128(_mm_or_si128(
                        _mm_shuffle_epi8(a, b_a), _mm_shuffle_epi8(b, b_b)), _mm_shuffle_epi8(c, b_c));
                    float* row = dst + py * 16;
                    flare_pack_channel16(r, off_r, div_r, row, plane, temporal, stream);
                    flare_pack_channel16(g, off_g, div_g, row + temporal * plane, plane, temporal, stream);
                    flare_pack_channel16(bl, off_b, div_b, row + 2 * temporal * plane, plane, temporal,
                                         stream);
                }
            }
        }
    }

    static void flare_pack_fence(void) { _mm_sfence(); }
    #else
    /* Never selected off x86 (the AVX2 kernel set is unavailable there). */
    static void flare_pack_band16_rgb_avx2(
            const uint8_t* band, ptrdiff_t band_stride, ptrdiff_t grid_w, ptrdiff_t merge,
            ptrdiff_t temporal, const float* offset, const float* divisor, float* out, int stream) {}
    static void flare_pack_fence(void) {}
    #endif
    """
    void flare_pack_band16_rgb_avx2(
        const uint8_t* band, Py_ssize_t band_stride, Py_ssize_t grid_w, Py_ssize_t merge,
        Py_ssize_t temporal, const float* offset, const float* divisor, float* out,
        int stream) noexcept nogil
    void flare_pack_fence() noexcept nogil


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _pack_band_scalar(const uint8_t* band, Py_ssize_t band_stride,
                            const PatchLayout* layout, const float* table,
                            float* out) noexcept nogil:
    cdef:
        Py_ssize_t patch = layout.patch, merge = layout.merge, channels = layout.channels
        Py_ssize_t temporal = layout.temporal, plane = patch * patch
        Py_ssize_t row_len = channels * temporal * plane
        Py_ssize_t iy, gx, py, px, c, t
        const uint8_t* src
        const float* lut
        float* dst
        float* first
    for iy in range(merge):
        for gx in range(layout.grid_w):
            dst = out + (((gx // merge) * merge + iy) * merge + gx % merge) * row_len
            for c in range(channels):
                lut = table + c * 256
                first = dst + c * temporal * plane
                for py in range(patch):
                    src = band + (iy * patch + py) * band_stride + gx * patch * channels + c
                    for px in range(patch):
                        first[py * patch + px] = lut[src[px * channels]]
                # The temporal copies repeat the first plane (a still image).
                for t in range(1, temporal):
                    memcpy(first + t * plane, first, plane * sizeof(float))


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void pack_band(const unsigned char* band, Py_ssize_t band_stride, const PatchLayout* layout,
                    const float* offset, const float* divisor, const float* table,
                    float* out, int isa, bint stream) noexcept nogil:
    if isa == ISA_AVX2 and layout.patch == 16 and layout.channels == 3:
        flare_pack_band16_rgb_avx2(band, band_stride, layout.grid_w, layout.merge,
                                   layout.temporal, offset, divisor, out, stream)
    else:
        _pack_band_scalar(band, band_stride, layout, table, out)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef Py_ssize_t _max_band_span(const AxisFilter* axis, Py_ssize_t band_h) noexcept nogil:
    # Source rows one band's height pass reads at most (windows only move forward).
    cdef Py_ssize_t y, y0, band_index, first, stop, span = 0
    for band_index in range(axis.out_size // band_h):
        y0 = band_index * band_h
        first = axis.starts[y0]
        stop = 0
        for y in range(y0, y0 + band_h):
            if axis.starts[y] < first:
                first = axis.starts[y]
            if axis.starts[y] + axis.counts[y] > stop:
                stop = axis.starts[y] + axis.counts[y]
        if stop - first > span:
            span = stop - first
    return span


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _resize_pack(const uint8_t* src, Py_ssize_t in_h, Py_ssize_t in_w,
                       const AxisFilter* width_axis, const AxisFilter* height_axis,
                       uint8_t* mid, uint8_t* band, const PatchLayout* layout,
                       const float* offset, const float* divisor, const float* table,
                       float* out, int isa, bint stream) noexcept nogil:
    cdef:
        Py_ssize_t channels = layout.channels
        Py_ssize_t band_h = layout.patch * layout.merge
        Py_ssize_t out_h = layout.grid_h * layout.patch
        Py_ssize_t out_w = layout.grid_w * layout.patch
        Py_ssize_t src_row = in_w * channels, out_row = out_w * channels
        Py_ssize_t band_rows_out = layout.grid_w * layout.merge * channels * layout.temporal * layout.patch * layout.patch
        const uint8_t* src_end = src + in_h * src_row
        const uint8_t* band_src
        Py_ssize_t y0, y, first, stop, mid_first = 0, mid_stop = 0
    cdef Py_ssize_t band_index
    for band_index in range(out_h // band_h):
        y0 = band_index * band_h
        if height_axis != NULL:
            first = height_axis.starts[y0]
            stop = 0
            for y in range(y0, y0 + band_h):
                if height_axis.starts[y] < first:
                    first = height_axis.starts[y]
                if height_axis.starts[y] + height_axis.counts[y] > stop:
                    stop = height_axis.starts[y] + height_axis.counts[y]
            if width_axis != NULL:
                # `mid` holds width-resized source rows [mid_first, mid_stop); keep
                # the ones this band shares with the previous band, add the rest.
                if first >= mid_stop or first < mid_first:
                    mid_first = first
                    mid_stop = first
                elif first > mid_first:
                    memmove(mid, mid + (first - mid_first) * out_row, (mid_stop - first) * out_row)
                    mid_first = first
                if stop > mid_stop:
                    horizontal_pass(src + mid_stop * src_row, src_row, stop - mid_stop, channels,
                                    src_end, mid + (mid_stop - mid_first) * out_row, out_row,
                                    width_axis, isa)
                    mid_stop = stop
                vertical_pass(mid, out_row, mid_first, out_row, band, out_row, y0, y0 + band_h,
                              height_axis, isa)
            else:
                vertical_pass(src, src_row, 0, src_row, band, out_row, y0, y0 + band_h,
                              height_axis, isa)
            band_src = band
        elif width_axis != NULL:
            horizontal_pass(src + y0 * src_row, src_row, band_h, channels, src_end, band, out_row,
                            width_axis, isa)
            band_src = band
        else:
            band_src = src + y0 * src_row
        pack_band(band_src, out_row, layout, offset, divisor, table,
                  out + band_index * band_rows_out, isa, stream)
    if stream:
        flare_pack_fence()


@cython.boundscheck(False)
@cython.wraparound(False)
def resize_pack(const uint8_t[:, :, ::1] image, Py_ssize_t out_h, Py_ssize_t out_w,
                Py_ssize_t patch, Py_ssize_t merge, Py_ssize_t temporal,
                const float[::1] offset, const float[::1] divisor, float[:, ::1] out,
                *, str isa="auto", bint stream=False):
    """Resize ``image`` [H, W, C] to out_h x out_w and pack it into ``out``.

    ``out`` is [(out_h/patch) * (out_w/patch), C * temporal * patch^2] float32;
    out_h and out_w must be multiples of ``patch * merge``. The resize is
    PyTorch's uint8 bicubic antialias (flare._fast.image_resize), each value
    becomes ``(x - offset[c]) / divisor[c]`` in float32. ``isa`` picks the
    kernel set ("auto", "avx2", "scalar"; all give the same bytes); ``stream``
    writes ``out`` with non-temporal stores (for outputs larger than the cache).
    """
    cdef int kernels = kernel_isa(isa)
    cdef Py_ssize_t in_h = image.shape[0], in_w = image.shape[1], channels = image.shape[2]
    if patch < 1 or merge < 1 or temporal < 1:
        raise ValueError("patch, merge and temporal sizes must be positive")
    if in_h < 1 or in_w < 1 or channels < 1:
        raise ValueError(f"cannot pack an image of shape ({in_h}, {in_w}, {channels})")
    if out_h < 1 or out_w < 1 or out_h % (patch * merge) or out_w % (patch * merge):
        raise ValueError(f"resized size {out_h}x{out_w} is not a positive multiple of {patch * merge}")
    if offset.shape[0] != channels or divisor.shape[0] != channels:
        raise ValueError(f"offset and divisor need {channels} values, got "
                         f"{offset.shape[0]} and {divisor.shape[0]}")
    cdef PatchLayout layout
    layout.patch = patch
    layout.merge = merge
    layout.temporal = temporal
    layout.channels = channels
    layout.grid_h = out_h // patch
    layout.grid_w = out_w // patch
    cdef Py_ssize_t rows = layout.grid_h * layout.grid_w
    if out.shape[0] != rows or out.shape[1] != channels * temporal * patch * patch:
        raise ValueError(f"out must be [{rows}, {channels * temporal * patch * patch}], "
                         f"got [{out.shape[0]}, {out.shape[1]}]")
    table_arr = np.empty((channels, 256), dtype=np.float32)
    cdef float[:, ::1] table = table_arr
    cdef Py_ssize_t c, v
    cdef ResizeAxis width_axis = ResizeAxis(in_w, out_w) if in_w != out_w else None
    cdef ResizeAxis height_axis = ResizeAxis(in_h, out_h) if in_h != out_h else None
    cdef const AxisFilter* width_view = &width_axis.view if width_axis is not None else NULL
    cdef const AxisFilter* height_view = &height_axis.view if height_axis is not None else NULL
    cdef Py_ssize_t band_h = patch * merge, mid_rows = 1
    if width_view != NULL and height_view != NULL:
        mid_rows = _max_band_span(height_view, band_h)
    band_arr = np.empty(band_h * out_w * channels, dtype=np.uint8)
    mid_arr = np.empty(mid_rows * out_w * channels, dtype=np.uint8)
    cdef uint8_t[::1] band = band_arr
    cdef uint8_t[::1] mid = mid_arr
    cdef bint use_stream = stream and (<size_t>&out[0, 0]) % 32 == 0
    with nogil:
        # The scalar kernels look values up in a per-channel table built with
        # the same two float32 operations.
        for c in range(channels):
            for v in range(256):
                table[c, v] = (<float>v - offset[c]) / divisor[c]
        _resize_pack(&image[0, 0, 0], in_h, in_w, width_view, height_view, &mid[0], &band[0],
                     &layout, &offset[0], &divisor[0], &table[0, 0], &out[0, 0], kernels,
                     use_stream)

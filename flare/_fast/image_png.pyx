# cython: language_level=3
"""PNG scanline reconstruction: filtered rows -> RGB8 (+ alpha8), for 8/16-bit samples.

The inflated PNG image data (zlib is the caller's: one call, not one per row)
is ``height`` scanlines of one filter-type byte and ``stride`` filtered bytes.
Each row is rebuilt with the PNG filters of ISO/IEC 15948 section 9 (None,
Sub, Up, Average, Paeth; ``bpp`` = bytes per complete pixel, the row above
is zero for the first row) and then reduced to what RgbImage keeps: grey
replicated into R, G and B, alpha split off (or dropped), and 16-bit samples
reduced to their high (first, big-endian) byte, exactly what Pillow's
unpackers do for these modes. Rows of 8-bit RGB are rebuilt in place in the
output, with no separate conversion pass.
"""

cimport cython
from libc.stdint cimport uint8_t
from libc.string cimport memcpy

import numpy as np

# PNG colour types this module reconstructs, with their samples per pixel.
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #include <string.h>
    #if defined(__SSE2__)
    #include <emmintrin.h>
    #endif

    /* The Paeth predictor of ISO/IEC 15948 9.4: the neighbour (a left, b above,
       c above-left) nearest to a + b - c, ties going to a, then b. */
    static inline int flare_paeth(int a, int b, int c) {
        const int pa = abs(b - c), pb = abs(a - c), pc = abs(a + b - 2 * c);
        return (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
    }

    /* Byte-wise filters. Each byte depends on the rebuilt byte bpp to its
       left, so the bpp interleaved chains run through `cur` in order. */
    static inline void flare_png_sub_bytes(const uint8_t* src, uint8_t* cur, ptrdiff_t stride,
                                           ptrdiff_t bpp) {
        for (ptrdiff_t i = 0; i < bpp; i++) cur[i] = src[i];
        for (ptrdiff_t i = bpp; i < stride; i++) cur[i] = (uint8_t)(src[i] + cur[i - bpp]);
    }
    static inline void flare_png_avg_bytes(const uint8_t* src, const uint8_t* prev, uint8_t* cur,
                                           ptrdiff_t stride, ptrdiff_t bpp) {
        for (ptrdiff_t i = 0; i < bpp; i++) cur[i] = (uint8_t)(src[i] + (prev[i] >> 1));
        for (ptrdiff_t i = bpp; i < stride; i++)
            cur[i] = (uint8_t)(src[i] + ((cur[i - bpp] + prev[i]) >> 1));
    }
    static inline void flare_png_paeth_bytes(const uint8_t* src, const uint8_t* prev, uint8_t* cur,
                                             ptrdiff_t stride, ptrdiff_t bpp) {
        for (ptrdiff_t i = 0; i < bpp; i++) cur[i] = (uint8_t)(src[i] + prev[i]);
        for (ptrdiff_t i = bpp; i < stride; i++)
            cur[i] = (uint8_t)(src[i] + flare_paeth(cur[i - bpp], prev[i], prev[i - bpp]));
    }

    #if defined(__SSE2__)
    /* 3- and 4-byte pixels (RGB8, RGBA8, grey+alpha 16): one pixel per step in
       16-bit lanes, the left neighbour carried in a register. Pixels move in
       and out through memcpy, so no access leaves the row; callers pass bpp
       as a constant so each copy compiles to plain loads and stores. */
    static inline __m128i flare_px_load(const uint8_t* p, ptrdiff_t bpp, int whole) {
        /* `whole`: 4 bytes may be read at p (true except for a row's last
           3-byte pixel), which keeps this one 32-bit load. */
        uint32_t v = 0;
        if (whole) memcpy(&v, p, 4); else memcpy(&v, p, (size_t)bpp);
        return _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)v), _mm_setzero_si128());
    }
    static inline void flare_px_store(uint8_t* p, __m128i v, ptrdiff_t bpp, int whole) {
        /* `whole`: the byte after a 3-byte pixel may be overwritten (it is the
           next pixel of the row, rebuilt afterwards). */
        const uint32_t packed = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(v, v));
        if (whole || bpp == 4) {
            memcpy(p, &packed, 4);
        } else {
            const uint16_t low = (uint16_t)packed;
            memcpy(p, &low, 2);
            p[2] = (uint8_t)(packed >> 16);
        }
    }
    static inline __m128i flare_abs16(__m128i v) {
        return _mm_max_epi16(v, _mm_sub_epi16(_mm_setzero_si128(), v));
    }
    static inline __m128i flare_select(__m128i mask, __m128i yes, __m128i no) {
        return _mm_or_si128(_mm_and_si128(mask, yes), _mm_andnot_si128(mask, no));
    }
    static inline void flare_png_sub_px(const uint8_t* src, uint8_t* cur, ptrdiff_t stride,
                                        ptrdiff_t bpp) {
        /* Byte lanes: paddb wraps modulo 256 as the filter does. */
        __m128i a = _mm_setzero_si128();
        for (ptrdiff_t i = 0; i < stride; i += bpp) {
            const int whole = i + 4 <= stride;
            uint32_t v = 0, packed;
            if (whole) memcpy(&v, src + i, 4); else memcpy(&v, src + i, (size_t)bpp);
            a = _mm_add_epi8(a, _mm_cvtsi32_si128((int)v));
            packed = (uint32_t)_mm_cvtsi128_si32(a);
            if (whole || bpp == 4) {
                memcpy(cur + i, &packed, 4);
            } else {
                const uint16_t low = (uint16_t)packed;
                memcpy(cur + i, &low, 2);
                cur[i + 2] = (uint8_t)(packed >> 16);
            }
        }
    }
    static inline void flare_png_avg_px(const uint8_t* src, const uint8_t* prev, uint8_t* cur,
                                        ptrdiff_t stride, ptrdiff_t bpp) {
        __m128i a = _mm_setzero_si128();
        const __m128i mask = _mm_set1_epi16(0xFF);
        for (ptrdiff_t i = 0; i < stride; i += bpp) {
            const __m128i b = flare_px_load(prev + i, bpp, i + 4 <= stride);
            a = _mm_and_si128(_mm_add_epi16(flare_px_load(src + i, bpp, i + 4 <= stride),
                                            _mm_srli_epi16(_mm_add_epi16(a, b), 1)), mask);
            flare_px_store(cur + i, a, bpp, i + 4 <= stride);
        }
    }
    static inline void flare_png_paeth_px(const uint8_t* src, const uint8_t* prev, uint8_t* cur,
                                          ptrdiff_t stride, ptrdiff_t bpp) {
        __m128i a = _mm_setzero_si128(), c = _mm_setzero_si128();
        const __m128i mask = _mm_set1_epi16(0xFF);
        for (ptrdiff_t i = 0; i < stride; i += bpp) {
            const __m128i b = flare_px_load(prev + i, bpp, i + 4 <= stride);
            const __m128i bc = _mm_sub_epi16(b, c), ac = _mm_sub_epi16(a, c);
            const __m128i pa = flare_abs16(bc), pb = flare_abs16(ac);
            const __m128i pc = flare_abs16(_mm_add_epi16(ac, bc));
            const __m128i smallest = _mm_min_epi16(pc, _mm_min_epi16(pa, pb));
            /* Ties go to a, then b. */
            const __m128i nearest = flare_select(_mm_cmpeq_epi16(smallest, pa), a,
                                    flare_select(_mm_cmpeq_epi16(smallest, pb), b, c));
            a = _mm_and_si128(_mm_add_epi16(flare_px_load(src + i, bpp, i + 4 <= stride), nearest), mask);
            flare_px_store(cur + i, a, bpp, i + 4 <= stride);
            c = b;
        }
    }
    #define FLARE_PNG_PIXEL_FILTERS 1
    #else
    #define FLARE_PNG_PIXEL_FILTERS 0
    #endif

    /* Rebuild one row into `cur`; -1 for an unknown filter type. */
    static int flare_png_unfilter(int filter_type, const uint8_t* src, const uint8_t* prev,
                                  uint8_t* cur, ptrdiff_t stride, ptrdiff_t bpp) {
        switch (filter_type) {
        case 0:
            memcpy(cur, src, (size_t)stride);
            return 0;
        case 1:
    #if FLARE_PNG_PIXEL_FILTERS
            if (bpp == 3) { flare_png_sub_px(src, cur, stride, 3); return 0; }
            if (bpp == 4) { flare_png_sub_px(src, cur, stride, 4); return 0; }
    #endif
            flare_png_sub_bytes(src, cur, stride, bpp);
            return 0;
        case 2:
            for (ptrdiff_t i = 0; i < stride; i++) cur[i] = (uint8_t)(src[i] + prev[i]);
            return 0;
        case 3:
    #if FLARE_PNG_PIXEL_FILTERS
            if (bpp == 3) { flare_png_avg_px(src, prev, cur, stride, 3); return 0; }
            if (bpp == 4) { flare_png_avg_px(src, prev, cur, stride, 4); return 0; }
    #endif
            flare_png_avg_bytes(src, prev, cur, stride, bpp);
            return 0;
        case 4:
    #if FLARE_PNG_PIXEL_FILTERS
            if (bpp == 3) { flare_png_paeth_px(src, prev, cur, stride, 3); return 0; }
            if (bpp == 4) { flare_png_paeth_px(src, prev, cur, stride, 4); return 0; }
    #endif
            flare_png_paeth_bytes(src, prev, cur, stride, bpp);
            return 0;
        default:
            return -1;
        }
    }
    """
    int flare_png_unfilter(int filter_type, const uint8_t* src, const uint8_t* prev, uint8_t* cur,
                           Py_ssize_t stride, Py_ssize_t bpp) noexcept nogil


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _reduce_row(const uint8_t* row, Py_ssize_t width, Py_ssize_t channels,
                      Py_ssize_t sample_bytes, uint8_t* rgb, uint8_t* alpha) noexcept nogil:
    # One rebuilt row -> RGB8 (and alpha8 when `alpha` is not NULL).
    cdef Py_ssize_t x, pixel_bytes = channels * sample_bytes
    cdef const uint8_t* p
    cdef uint8_t grey
    for x in range(width):
        p = row + x * pixel_bytes
        if channels <= 2:
            grey = p[0]
            rgb[3 * x] = grey
            rgb[3 * x + 1] = grey
            rgb[3 * x + 2] = grey
        else:
            rgb[3 * x] = p[0]
            rgb[3 * x + 1] = p[sample_bytes]
            rgb[3 * x + 2] = p[2 * sample_bytes]
        if alpha != NULL and (channels == 2 or channels == 4):
            alpha[x] = p[(channels - 1) * sample_bytes]


@cython.boundscheck(False)
@cython.wraparound(False)
def reconstruct(const uint8_t[::1] data, Py_ssize_t height, Py_ssize_t width, int color_type,
                int bit_depth, bint keep_alpha=False):
    """Rebuild inflated PNG scanlines into ``(rgb [H, W, 3] uint8, alpha [H, W] uint8 or None)``.

    ``data`` holds at least ``height * (1 + stride)`` bytes (any more are
    ignored, as decoders ignore data past the last row). Colour types 0, 2, 4
    and 6 at bit depth 8 or 16, non-interlaced. Raises ValueError for an
    unknown filter type or too little data.
    """
    if color_type not in _CHANNELS or bit_depth not in (8, 16):
        raise ValueError(f"unsupported PNG colour type {color_type} at bit depth {bit_depth}")
    if height < 1 or width < 1:
        raise ValueError(f"PNG of {width}x{height} pixels has no area")
    cdef:
        Py_ssize_t channels = _CHANNELS[color_type]
        Py_ssize_t sample_bytes = bit_depth // 8
        Py_ssize_t bpp = channels * sample_bytes
        Py_ssize_t stride = width * bpp
        Py_ssize_t y, line = stride + 1
        bint has_alpha = keep_alpha and (channels == 2 or channels == 4)
        bint in_place = channels == 3 and sample_bytes == 1
        int failed_row = -1
    if data.shape[0] < height * line:
        raise ValueError(f"PNG image data holds {data.shape[0]} bytes, {height * line} needed")
    rgb_arr = np.empty((height, width, 3), dtype=np.uint8)
    alpha_arr = np.empty((height, width), dtype=np.uint8) if has_alpha else None
    # The all-zero "row above" the first row, then two alternating rebuilt rows
    # (8-bit RGB rows are rebuilt in the output itself).
    rows_arr = np.zeros(stride if in_place else 3 * stride, dtype=np.uint8)
    cdef uint8_t[:, :, ::1] rgb = rgb_arr
    cdef uint8_t[:, ::1] alpha
    cdef uint8_t[::1] rows = rows_arr
    cdef const uint8_t* src = &data[0]
    cdef uint8_t* prev
    cdef uint8_t* cur
    cdef uint8_t* alpha_row = NULL
    if has_alpha:
        alpha = alpha_arr
    with nogil:
        prev = &rows[0]  # zeros
        for y in range(height):
            if in_place:
                cur = &rgb[y, 0, 0]
            else:
                cur = &rows[stride * (1 + (y & 1))]
            if flare_png_unfilter(src[y * line], src + y * line + 1, prev, cur, stride, bpp) < 0:
                failed_row = <int>y
                break
            if not in_place:
                if has_alpha:
                    alpha_row = &alpha[y, 0]
                _reduce_row(cur, width, channels, sample_bytes, &rgb[y, 0, 0], alpha_row)
            prev = cur
    if failed_row >= 0:
        raise ValueError(f"PNG row {failed_row} has unknown filter type {data[failed_row * line]}")
    return rgb_arr, alpha_arr

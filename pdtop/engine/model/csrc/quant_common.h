/* Helpers shared by quant.c and quant_k.c, included after their HAVE_AVX2 / HAVE_VNNI512: fp16 scales,
   unaligned reads, which fast path was built, and (with AVX2) the horizontal sum of 8 floats. */
#ifndef PDTOP_QUANT_COMMON_H
#define PDTOP_QUANT_COMMON_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return (sign ? -1.f : 1.f) * ldexpf((float)m, -24);
    uint32_t bits = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline uint16_t read_u16(const uint8_t* p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* the fast path the includer built: 0 none (portable only), 1 AVX2, 2 AVX-512 VNNI */
static inline int32_t fast_path_built(void) {
#if defined(HAVE_VNNI512)
    return 2;
#elif defined(HAVE_AVX2)
    return 1;
#else
    return 0;
#endif
}

#ifdef HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif
#endif

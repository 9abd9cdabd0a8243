/* Matmuls on a GGUF's quantized blocks, as stored in the file: y[n, out] = x[n, in] @ W^T for W of
   type Q4_0, Q4_1 or Q8_0 (rows of in/32 blocks), and dequantizing chosen rows (the embedding).

   Batch-1 decode is memory-bound: reading the 20-byte Q4_1 blocks instead of 128 bytes of float32
   per 32 weights is most of the speed. As llama.cpp's vec_dot does, each activation row is first
   quantized per block of 32 to int8 (scale d = amax / 127, and s = d * sum(q) for the types with an
   offset), then every weight block meets it in an integer dot product:
     Q8_0: d_w * d_x * sum(qw * qx)
     Q4_1: d_w * d_x * sum(nib * qx) + m_w * s_x          (w = d * nib + m)
     Q4_0: the same with m_w = -8 d_w                      (w = d * (nib - 8))
   Each dot has an AVX2 path (`maddubs`: unsigned x signed bytes to int16 pairs, `madd` to int32,
   one FMA per block) and a portable one; `portable` forces the latter (tests, comparisons).

   Work is split over the calling thread's OpenMP team by tiles of TILE weight rows, so each block
   is read once for all n activation rows; a small matmul runs on the calling thread alone (waking
   the team costs more). Built and checked by pdtop/engine/model/quant_kernels.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define HAVE_VNNI512 1 /* two blocks per dpbusd on 512-bit registers */
#endif
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 }; /* GGMLQuantizationType values */
#define QK 32
#define TILE 16
#define PARALLEL_MIN (1 << 13) /* block dots below which one thread does it all */

typedef struct {
    float d, s;      /* scale, d * sum(q) */
    int8_t q[QK];
} XBlock;

static inline float half_to_float(uint16_t h) {
#ifdef HAVE_AVX2
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

int64_t pdtop_quant_block_bytes(int32_t type) {
    return type == Q8_0 ? 34 : type == Q4_1 ? 20 : type == Q4_0 ? 18 : 0;
}

/* the fast path built here: 0 none (portable only), 1 AVX2, 2 AVX-512 VNNI */
int32_t pdtop_quant_fast_path(void) {
#if defined(HAVE_VNNI512)
    return 2;
#elif defined(HAVE_AVX2)
    return 1;
#else
    return 0;
#endif
}

static void quantize_row(const float* x, int64_t nb, XBlock* out) {
    for (int64_t b = 0; b < nb; ++b) {
        const float* v = x + b * QK;
        float amax = 0.f;
        for (int j = 0; j < QK; ++j) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < QK; ++j) {
            const int q = (int)nearbyintf(v[j] * id);
            out[b].q[j] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].s = d * (float)sum;
    }
}

/* One weight row against one quantized activation row (nb blocks), portable. */
static float dot_portable(int32_t type, const uint8_t* w, const XBlock* x, int64_t nb) {
    float acc = 0.f;
    if (type == Q8_0) {
        for (int64_t b = 0; b < nb; ++b, w += 34) {
            const int8_t* q = (const int8_t*)(w + 2);
            int sum = 0;
            for (int j = 0; j < QK; ++j) sum += q[j] * x[b].q[j];
            acc += half_to_float(read_u16(w)) * x[b].d * (float)sum;
        }
        return acc;
    }
    const int64_t size = pdtop_quant_block_bytes(type), qoff = type == Q4_1 ? 4 : 2;
    for (int64_t b = 0; b < nb; ++b, w += size) {
        const float d = half_to_float(read_u16(w));
        const float m = type == Q4_1 ? half_to_float(read_u16(w + 2)) : -8.f * d;
        const uint8_t* q = w + qoff;
        int sum = 0;
        for (int j = 0; j < QK / 2; ++j) sum += (q[j] & 15) * x[b].q[j] + (q[j] >> 4) * x[b].q[j + QK / 2];
        acc += d * x[b].d * (float)sum + m * x[b].s;
    }
    return acc;
}

#ifdef HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float dot_avx2(int32_t type, const uint8_t* w, const XBlock* x, int64_t nb) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    if (type == Q8_0) {
        for (int64_t b = 0; b < nb; ++b, w += 34) {
            const __m256i qw = _mm256_loadu_si256((const __m256i*)(w + 2));
            const __m256i qx = _mm256_loadu_si256((const __m256i*)x[b].q);
            /* |w| (unsigned) times x with w's sign: maddubs' operand types */
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
            const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(read_u16(w)) * x[b].d), s, acc);
        }
        return hsum8(acc);
    }
    const __m256i low4 = _mm256_set1_epi8(15);
    const int64_t size = pdtop_quant_block_bytes(type), qoff = type == Q4_1 ? 4 : 2;
    float offset = 0.f;
    for (int64_t b = 0; b < nb; ++b, w += size) {
        const float d = _cvtsh_ss(read_u16(w));
        const float m = type == Q4_1 ? _cvtsh_ss(read_u16(w + 2)) : -8.f * d;
        const __m128i q = _mm_loadu_si128((const __m128i*)(w + qoff));
        const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
        const __m256i qx = _mm256_loadu_si256((const __m256i*)x[b].q);
        const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(nib, qx), ones));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x[b].d), s, acc);
        offset += m * x[b].s;
    }
    return hsum8(acc) + offset;
}

/* int32 sums of the 8 lanes' byte products u8 (w) x s8 (x): one VNNI instruction where the CPU has it */
static inline __m256 dot_bytes(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#else
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* One weight row against XR activation rows (x, x + nb, ...): each weight block is unpacked once. */
#define XR 4
static void dot_avx2_rows(int32_t type, const uint8_t* w, const XBlock* x, int64_t nb, float* out) {
    __m256 acc[XR];
    float offset[XR] = {0};
    for (int c = 0; c < XR; ++c) acc[c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15);
    const int64_t size = pdtop_quant_block_bytes(type), qoff = type == Q4_1 ? 4 : 2;
    for (int64_t b = 0; b < nb; ++b, w += size) {
        const float d = _cvtsh_ss(read_u16(w));
        if (type == Q8_0) {
            const __m256i qw = _mm256_loadu_si256((const __m256i*)(w + 2));
            const __m256i aw = _mm256_sign_epi8(qw, qw);
            for (int c = 0; c < XR; ++c) {
                const XBlock* xb = x + c * nb + b;
                const __m256i qx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)xb->q), qw);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), dot_bytes(aw, qx), acc[c]);
            }
            continue;
        }
        const float m = type == Q4_1 ? _cvtsh_ss(read_u16(w + 2)) : -8.f * d;
        const __m128i q = _mm_loadu_si128((const __m128i*)(w + qoff));
        const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
        for (int c = 0; c < XR; ++c) {
            const XBlock* xb = x + c * nb + b;
            const __m256i qx = _mm256_loadu_si256((const __m256i*)xb->q);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), dot_bytes(nib, qx), acc[c]);
            offset[c] += m * xb->s;
        }
    }
    for (int c = 0; c < XR; ++c) out[c] = hsum8(acc[c]) + offset[c];
}
#endif

#ifdef HAVE_VNNI512
/* Two weight blocks (b, b + 1) as 64 unsigned bytes in element order, and their scale pair and
   offsets: Q4 nibbles 0..15 | 16..31 per block, or Q8_0's |w| (its signs go onto x, `signs`). */
typedef struct {
    __m512i u;
    __mmask64 signs;
    float d0, d1, m0, m1;
} WPair;

static inline WPair wpair(int32_t type, const uint8_t* w, int64_t size, int64_t qoff) {
    WPair p;
    p.d0 = _cvtsh_ss(read_u16(w));
    p.d1 = _cvtsh_ss(read_u16(w + size));
    p.signs = 0;
    p.m0 = p.m1 = 0.f;
    if (type == Q8_0) {
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(w + 2))),
                                             _mm256_loadu_si256((const __m256i*)(w + size + 2)), 1);
        p.signs = _mm512_movepi8_mask(q);
        p.u = _mm512_abs_epi8(q);
        return p;
    }
    p.m0 = type == Q4_1 ? _cvtsh_ss(read_u16(w + 2)) : -8.f * p.d0;
    p.m1 = type == Q4_1 ? _cvtsh_ss(read_u16(w + size + 2)) : -8.f * p.d1;
    const __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)(w + size + qoff)),
                                       _mm_loadu_si128((const __m128i*)(w + qoff)));
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    /* [lo0, lo1, hi0, hi1] -> [lo0, hi0, lo1, hi1] */
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    p.u = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));
    return p;
}

/* An activation row's blocks b, b + 1 as one 512-bit load each: values, d per lane, s / 8 per lane
   (so the 8 lanes of a block add up to the offset term m * s). */
typedef struct {
    int8_t q[2 * QK];
    float d[16], s[16];
} XPair;

static void pair_row(const XBlock* xb, int64_t nb, XPair* out) {
    for (int64_t b = 0; b + 2 <= nb; b += 2, ++out) {
        memcpy(out->q, xb[b].q, QK);
        memcpy(out->q + QK, xb[b + 1].q, QK);
        for (int j = 0; j < 8; ++j) {
            out->d[j] = xb[b].d, out->d[8 + j] = xb[b + 1].d;
            out->s[j] = xb[b].s / 8.f, out->s[8 + j] = xb[b + 1].s / 8.f;
        }
    }
}

/* One weight row against nx <= XR activation rows (pairs x + c * np, blocks xb + c * nb for an odd
   last block), two blocks per dpbusd. */
static void dot_vnni_rows(int32_t type, const uint8_t* w, const XPair* x, const XBlock* xb, int64_t nb, int nx,
                          float* out) {
    const int64_t size = pdtop_quant_block_bytes(type), qoff = type == Q4_1 ? 4 : 2, np = nb / 2;
    __m512 acc[XR];
    for (int c = 0; c < XR; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; ++p) {
        const WPair wp = wpair(type, w + 2 * p * size, size, qoff);
        const __m512 wd = _mm512_insertf32x8(_mm512_set1_ps(wp.d0), _mm256_set1_ps(wp.d1), 1);
        const __m512 wm = _mm512_insertf32x8(_mm512_set1_ps(wp.m0), _mm256_set1_ps(wp.m1), 1);
        for (int c = 0; c < nx; ++c) {
            const XPair* xp = x + c * np + p;
            __m512i xv = _mm512_loadu_si512(xp->q);
            if (type == Q8_0) xv = _mm512_mask_sub_epi8(xv, wp.signs, _mm512_setzero_si512(), xv);
            const __m512 sv = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wp.u, xv));
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(sv, _mm512_loadu_ps(xp->d)), wd, acc[c]);
            if (type != Q8_0) acc[c] = _mm512_fmadd_ps(wm, _mm512_loadu_ps(xp->s), acc[c]);
        }
    }
    for (int c = 0; c < nx; ++c) {
        out[c] = _mm512_reduce_add_ps(acc[c]);
        if (nb & 1) out[c] += dot_avx2(type, w + (nb - 1) * size, xb + c * nb + nb - 1, 1); /* an odd last block */
    }
}
#endif

/* y[i * out_f + r] = row r of w . x[i * in_f ...] for i < n, r < out_f; x rows contiguous, in_f a
   multiple of 32. Returns 0, or -1 for an unknown type or no memory. */
int32_t pdtop_quant_matmul(int32_t type, const uint8_t* w, int64_t out_f, int64_t in_f, const float* x, int64_t n,
                           float* y, int32_t portable) {
    const int64_t size = pdtop_quant_block_bytes(type), nb = in_f / QK, row_bytes = nb * size;
    if (!size || in_f % QK) return -1;
    XBlock* xq = malloc(sizeof(XBlock) * (size_t)(n * nb));
    if (!xq) return -1;
    float (*dot)(int32_t, const uint8_t*, const XBlock*, int64_t) = dot_portable;
#ifdef HAVE_AVX2
    if (!portable) dot = dot_avx2;
#endif
    XPair* xp = NULL;
#ifdef HAVE_VNNI512
    const int64_t np = nb / 2;
    if (!portable && np && !(xp = malloc(sizeof(XPair) * (size_t)(n * np)))) {
        free(xq);
        return -1;
    }
#endif
    const int parallel = out_f * nb * n >= PARALLEL_MIN;
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            quantize_row(x + i * in_f, nb, xq + i * nb);
#ifdef HAVE_VNNI512
            if (xp) pair_row(xq + i * nb, nb, xp + i * np);
#endif
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < out_f; t += TILE) {
            const int64_t end = t + TILE < out_f ? t + TILE : out_f;
            int64_t i = 0;
#ifdef HAVE_VNNI512
            if (xp)
                for (; i < n; i += XR) {
                    const int nx = n - i < XR ? (int)(n - i) : XR;
                    for (int64_t r = t; r < end; ++r) {
                        float o[XR];
                        dot_vnni_rows(type, w + r * row_bytes, xp + i * np, xq + i * nb, nb, nx, o);
                        for (int c = 0; c < nx; ++c) y[(i + c) * out_f + r] = o[c];
                    }
                }
#endif
#ifdef HAVE_AVX2
            if (!portable)
                for (; i + XR <= n; i += XR)
                    for (int64_t r = t; r < end; ++r) {
                        float o[XR];
                        dot_avx2_rows(type, w + r * row_bytes, xq + i * nb, nb, o);
                        for (int c = 0; c < XR; ++c) y[(i + c) * out_f + r] = o[c];
                    }
#endif
            for (; i < n; ++i)
                for (int64_t r = t; r < end; ++r) y[i * out_f + r] = dot(type, w + r * row_bytes, xq + i * nb, nb);
        }
    }
    free(xp);
    free(xq);
    return 0;
}

/* out[k, :] = row ids[k] of w, dequantized (in_f floats each). Returns 0, or -1 for an unknown type. */
int32_t pdtop_quant_rows(int32_t type, const uint8_t* w, int64_t in_f, const int64_t* ids, int64_t n, float* out) {
    const int64_t size = pdtop_quant_block_bytes(type), nb = in_f / QK;
    if (!size || in_f % QK) return -1;
#pragma omp parallel for schedule(static) if (n * in_f >= (1 << 18))
    for (int64_t k = 0; k < n; ++k) {
        const uint8_t* blk = w + ids[k] * nb * size;
        float* o = out + k * in_f;
        for (int64_t b = 0; b < nb; ++b, blk += size, o += QK) {
            const float d = half_to_float(read_u16(blk));
            if (type == Q8_0) {
                for (int j = 0; j < QK; ++j) o[j] = d * (float)((const int8_t*)(blk + 2))[j];
                continue;
            }
            const float m = type == Q4_1 ? half_to_float(read_u16(blk + 2)) : -8.f * d;
            const uint8_t* q = blk + (type == Q4_1 ? 4 : 2);
            for (int j = 0; j < QK / 2; ++j) {
                o[j] = d * (float)(q[j] & 15) + m;
                o[j + QK / 2] = d * (float)(q[j] >> 4) + m;
            }
        }
    }
    return 0;
}

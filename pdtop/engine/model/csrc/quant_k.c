/* Matmuls on more of a GGUF's block types, as stored: y[n, out] = x[n, in] @ W^T for W of type Q5_0 or
   Q5_1 (blocks of 32) or Q4_K, Q5_K, Q6_K (super-blocks of 256), and dequantizing chosen rows. The
   block-32 types Q4_0 / Q4_1 / Q8_0 are csrc/quant.c's; this file has the same entry points.

   Layouts (gguf-py's quants.py is the reference dequantization; the tests hold these to it):
     Q5_0  22 B: d f16, qh u32 (bit j: element j's 5th bit), qs[16] (low nibble j, high j + 16)
                 w = d * (q - 16)
     Q5_1  24 B: d, m f16, qh, qs as Q5_0                  w = d * q + m
     Q4_K 144 B: d, dmin f16, 12 bytes of eight 6-bit scales and mins, qs[128] (32-byte chunk c: low
                 nibbles sub-block 2c, high 2c + 1)        w = d * sc[s] * q - dmin * mn[s]
     Q5_K 176 B: as Q4_K, then qh[32] before qs (bit s of qh[l]: element 32 s + l's 5th bit)
     Q6_K 210 B: ql[128], qh[64], int8 scales[16] (one per 16), d f16; each half h of 128 has
                 ql[64h..] low nibbles for 0..63, high for 64..127, qh[32h + l] bits 2k..2k+1 for
                 element 32k + l                          w = d * sc[g] * (q - 32)

   Activations, as llama.cpp's vec_dot: per block of 32 to int8 for the Q5 types (d = amax / 127,
   s = d * sum(q): Q8_0 / Q8_1), per 256 for the K types with int16 sums per 16 (Q8_K), so a K
   super-block is one integer dot: sum over 16-groups of sc * sum(q_w * q_x), the mins (or Q6_K's -32)
   from the per-16 sums. Each type has an AVX2 path (weights unpacked to unsigned bytes in registers,
   `maddubs` + `madd` by the scales), an AVX-512 VNNI one where the CPU has it (K: 64 bytes per
   `maddubs`, the scales by `dpwssd`; Q5: two blocks per `dpbusd`) and a portable one
   (`portable` forces it; an AVX2-only build runs the AVX2 path on any AVX-512 CPU); each weight block is
   unpacked once for up to XR activation rows, and work is split over the OpenMP team by tiles of
   TILE weight rows. Built and checked by pdtop/engine/model/quant_kernels.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define HAVE_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define HAVE_VNNI256 1 /* a Q5 block's dot in one 256-bit dpbusd (an odd last block) */
#define HAVE_VNNI512 1 /* Q5: two blocks per 512-bit dpbusd; K: 64 bytes per maddubs, the scales by dpwssd */
#endif
#endif

enum { Q5_0 = 6, Q5_1 = 7, Q4_K = 12, Q5_K = 13, Q6_K = 14 }; /* GGMLQuantizationType values */
#define TILE 16
#define XR 4
#define PARALLEL_MIN (1 << 13) /* 32-weight dots below which one thread does it all */

typedef struct { /* an activation block of 32 (Q8_0 / Q8_1) */
    float d, s;
    int8_t q[32];
} X32;

typedef struct { /* an activation super-block of 256 (Q8_K) */
    float d;
    int16_t bsum[16];
    int8_t q[256];
} X256;

typedef struct { /* a weight block unpacked: unsigned quants in element order and integer scales */
    uint8_t u[256];
    int16_t sc[16]; /* K types: scale of each 16 elements */
    int16_t mn[16]; /* Q4_K / Q5_K: min of each 16 (its 32's) */
    float d, m;     /* Q5: d and the offset per unit of q (Q5_0: -16 d, Q5_1: m); K: d and dmin */
} WBlock;

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

int64_t pdtop_quant_k_block_bytes(int32_t type) {
    switch (type) {
        case Q5_0: return 22;
        case Q5_1: return 24;
        case Q4_K: return 144;
        case Q5_K: return 176;
        case Q6_K: return 210;
        default: return 0;
    }
}

static inline int is_k(int32_t type) { return type >= Q4_K; }
static inline int64_t block_len(int32_t type) { return is_k(type) ? 256 : 32; }

/* the fast path built here: 0 none (portable only), 1 AVX2, 2 AVX-512 VNNI */
int32_t pdtop_quant_k_fast_path(void) {
#if defined(HAVE_VNNI512)
    return 2;
#elif defined(HAVE_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* Q4_K / Q5_K's 12 bytes of packed 6-bit scales and mins (gguf's Q4_K.get_scale_min) as 8 scale bytes
   then 8 min bytes. Bytes 0-3: scales 0-3 (low 6 bits), 4-7: mins 0-3, 8-11: the low nibbles of scales
   4-7 and, high, of mins 4-7; the top 2 bits of bytes 0-3 and 4-7 are those of scales and mins 4-7. */
static inline void scales_mins(const uint8_t* s, uint8_t out[16]) {
    uint32_t a, b, c;
    memcpy(&a, s, 4), memcpy(&b, s + 4, 4), memcpy(&c, s + 8, 4);
    const uint32_t six = 0x3f3f3f3fu, nib = 0x0f0f0f0fu, two = 0x03030303u;
    const uint32_t w[4] = {a & six, (c & nib) | (((a >> 6) & two) << 4), b & six, ((c >> 4) & nib) | (((b >> 6) & two) << 4)};
    memcpy(out, w, 16);
}

#define INLINE static inline __attribute__((always_inline)) /* instantiated per constant type and row count */

/* The scales of a block into w (all types); the quants too unless `scales_only`. */
INLINE void unpack(int32_t type, const uint8_t* b, WBlock* w, int scales_only) {
    if (!is_k(type)) {
        const int q5_1 = type == Q5_1;
        w->d = half_to_float(read_u16(b));
        w->m = q5_1 ? half_to_float(read_u16(b + 2)) : -16.f * w->d;
        if (scales_only) return;
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * q5_1, 4);
        const uint8_t* qs = b + 6 + 2 * q5_1;
        for (int j = 0; j < 32; ++j)
            w->u[j] = (uint8_t)(((qs[j & 15] >> (j < 16 ? 0 : 4)) & 15) | (((qh >> j) & 1) << 4));
        return;
    }
    if (type == Q6_K) {
        w->d = half_to_float(read_u16(b + 208));
        w->m = 0.f;
        for (int g = 0; g < 16; ++g) w->sc[g] = ((const int8_t*)(b + 192))[g], w->mn[g] = 0;
        if (scales_only) return;
        for (int h = 0; h < 2; ++h) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            uint8_t* u = w->u + 128 * h;
            for (int l = 0; l < 32; ++l) {
                u[l] = (uint8_t)((ql[l] & 15) | ((qh[l] & 3) << 4));
                u[l + 32] = (uint8_t)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
                u[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                u[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
        return;
    }
    w->d = half_to_float(read_u16(b));
    w->m = half_to_float(read_u16(b + 2));
    uint8_t sm[16];
    scales_mins(b + 4, sm);
    for (int s = 0; s < 8; ++s) {
        w->sc[2 * s] = w->sc[2 * s + 1] = sm[s];
        w->mn[2 * s] = w->mn[2 * s + 1] = sm[8 + s];
    }
    if (scales_only) return;
    const uint8_t *qh = b + 16, *qs = type == Q5_K ? b + 48 : b + 16;
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            const uint8_t q = qs[32 * c + l];
            w->u[64 * c + l] = q & 15;
            w->u[64 * c + 32 + l] = q >> 4;
            if (type == Q5_K) {
                w->u[64 * c + l] |= (uint8_t)(((qh[l] >> (2 * c)) & 1) << 4);
                w->u[64 * c + 32 + l] |= (uint8_t)(((qh[l] >> (2 * c + 1)) & 1) << 4);
            }
        }
}

static void quantize_32(const float* x, int64_t nb, X32* out) {
    for (int64_t b = 0; b < nb; ++b) {
        const float* v = x + b * 32;
        float amax = 0.f;
        for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            const int q = (int)nearbyintf(v[j] * id);
            out[b].q[j] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].s = d * (float)sum;
    }
}

static void quantize_256(const float* x, int64_t nb, X256* out) {
    for (int64_t b = 0; b < nb; ++b) {
        const float* v = x + b * 256;
        float amax = 0.f;
        for (int j = 0; j < 256; ++j) amax = fmaxf(amax, fabsf(v[j]));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        for (int g = 0; g < 16; ++g) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; ++j) {
                const int q = (int)nearbyintf(v[j] * id);
                out[b].q[j] = (int8_t)q;
                sum += q;
            }
            out[b].bsum[g] = (int16_t)sum;
        }
        out[b].d = d;
    }
}

/* One weight row (nb blocks) against nx <= XR activation rows (x rows nb blocks apart), portable. */
static void rows_portable(int32_t type, const uint8_t* w, const void* x, int64_t nb, int nx, float* out) {
    const int64_t size = pdtop_quant_k_block_bytes(type);
    float acc[XR] = {0};
    WBlock wb;
    for (int64_t b = 0; b < nb; ++b, w += size) {
        unpack(type, w, &wb, 0);
        for (int c = 0; c < nx; ++c) {
            if (!is_k(type)) {
                const X32* xb = (const X32*)x + c * nb + b;
                int sum = 0;
                for (int j = 0; j < 32; ++j) sum += wb.u[j] * xb->q[j];
                acc[c] += wb.d * xb->d * (float)sum + wb.m * xb->s;
                continue;
            }
            const X256* xb = (const X256*)x + c * nb + b;
            int isum = 0, off = 0;
            for (int g = 0; g < 16; ++g) {
                int sum = 0;
                for (int j = 16 * g; j < 16 * g + 16; ++j) sum += wb.u[j] * xb->q[j];
                isum += wb.sc[g] * sum;
                off += (type == Q6_K ? 32 * wb.sc[g] : wb.mn[g]) * xb->bsum[g];
            }
            acc[c] += type == Q6_K ? wb.d * xb->d * (float)(isum - off)
                                   : xb->d * (wb.d * (float)isum - wb.m * (float)off);
        }
    }
    for (int c = 0; c < nx; ++c) out[c] = acc[c];
}

#ifdef HAVE_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* int32 sums of the 8 lanes' byte products u8 (w) x s8 (x): one VNNI instruction where the CPU has it */
static inline __m256 dot_bytes(__m256i u, __m256i s) {
#ifdef HAVE_VNNI256
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#else
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* A Q5 block's 32 quants (0..31) in element order. */
static inline __m256i unpack_q5(const uint8_t* qh_p, const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128((const __m128i*)qs);
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
    uint32_t qh;
    memcpy(&qh, qh_p, 4);
    /* byte j takes byte j / 8 of qh, then its bit j % 8 */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

/* A K super-block in registers: 8 x 32 unsigned quants, the int16 scale of each 16 per 32-chunk, and
   the per-16 scales or mins that meet the activation's per-16 sums. */
typedef struct {
#ifdef HAVE_VNNI512
    __m512i u[4], sc[4]; /* 4 x 64 quants and their int16 scales */
#else
    __m256i u[8], sc[8];
#endif
    __m256i off16;
    float d, dmin;
} KRegs;

#ifdef HAVE_VNNI512
static inline __m512i join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* the quants and scales of unpack_k, 64 elements per register */
INLINE void unpack_k512(const int32_t type, const uint8_t* b, const uint8_t* sm, KRegs* r) {
    const __m512i low4 = _mm512_set1_epi8(15);
    if (type == Q6_K) {
        const __m256i s2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(b + 192)));
        const long long rep = 0x0101010101010101LL;
        for (int k = 0; k < 4; ++k) /* groups 4k .. 4k + 3 of 16, 8 int16 lanes each */
            r->sc[k] = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(
                s2, _mm256_set_epi64x(rep * (4 * k + 3), rep * (4 * k + 2), rep * (4 * k + 1), rep * (4 * k))));
        const __m512i three = _mm512_set1_epi8(3);
        for (int h = 0; h < 2; ++h) {
            const __m512i l = _mm512_loadu_si512(b + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
            const __m512i h01 = join(qh, _mm256_srli_epi16(qh, 2));
            const __m512i h23 = join(_mm256_srli_epi16(qh, 4), _mm256_srli_epi16(qh, 6));
            r->u[2 * h] = _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_slli_epi16(_mm512_and_si512(h01, three), 4));
            r->u[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                              _mm512_slli_epi16(_mm512_and_si512(h23, three), 4));
        }
        return;
    }
    const uint8_t* qs = type == Q5_K ? b + 48 : b + 16;
    const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 16));
    for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        __m512i v = _mm512_and_si512(join(q, _mm256_srli_epi16(q, 4)), low4);
        if (type == Q5_K) {
            const __m512i hv = join(_mm256_srli_epi16(qh, 2 * c), _mm256_srli_epi16(qh, 2 * c + 1));
            v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(hv, _mm512_set1_epi8(1)), 4));
        }
        r->u[c] = v;
        r->sc[c] = join(_mm256_set1_epi16(sm[2 * c]), _mm256_set1_epi16(sm[2 * c + 1]));
    }
}
#endif

/* A K super-block's quants, scales and d / dmin into registers (64 or 32 quants per register). */
INLINE void unpack_k(const int32_t type, const uint8_t* b, KRegs* r) {
#ifndef HAVE_VNNI512
    const __m256i low4 = _mm256_set1_epi8(15);
#endif
    if (type == Q6_K) {
        r->d = half_to_float(read_u16(b + 208)), r->dmin = 0.f;
        const __m128i s8 = _mm_loadu_si128((const __m128i*)(b + 192));
        r->off16 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5); /* 32 * sc */
#ifdef HAVE_VNNI512
        unpack_k512(type, b, NULL, r);
#else
        for (int k = 0; k < 8; ++k) /* int16 scales: 8 lanes of sc[2k], 8 of sc[2k + 1] */
            r->sc[k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, _mm_set_epi64x(0x0101010101010101LL * (2 * k + 1),
                                                                                0x0101010101010101LL * (2 * k))));
        const __m256i three = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; ++h) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i*)(b + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
#define HI2(k) _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * (k)), three), 4)
            r->u[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, low4), HI2(0));
            r->u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low4), HI2(1));
            r->u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), HI2(2));
            r->u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), HI2(3));
#undef HI2
        }
#endif
        return;
    }
    r->d = half_to_float(read_u16(b)), r->dmin = half_to_float(read_u16(b + 2));
    uint8_t sm[16];
    scales_mins(b + 4, sm);
    const __m128i mn = _mm_loadl_epi64((const __m128i*)(sm + 8));
    r->off16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn)); /* each 32's min for both its 16s */
#ifdef HAVE_VNNI512
    unpack_k512(type, b, sm, r);
#else
    for (int k = 0; k < 8; ++k) r->sc[k] = _mm256_set1_epi16(sm[k]);
    const uint8_t* qs = type == Q5_K ? b + 48 : b + 16;
    const __m256i qh = _mm256_loadu_si256((const __m256i*)(b + 16)), sixteen = _mm256_set1_epi8(16);
    for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
        r->u[2 * c] = _mm256_and_si256(q, low4);
        r->u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        if (type == Q5_K)
            for (int k = 0; k < 2; ++k) {
                const __m256i bit = _mm256_set1_epi8((char)(1 << (2 * c + k)));
                const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                r->u[2 * c + k] = _mm256_or_si256(r->u[2 * c + k], _mm256_and_si256(set, sixteen));
            }
    }
#endif
}

INLINE void rows_avx2_t(const int32_t type, const uint8_t* w, const void* x, int64_t nb, const int nx, float* out) {
    const int64_t size = pdtop_quant_k_block_bytes(type);
    __m256 acc[XR];
    float offset[XR] = {0};
    for (int c = 0; c < XR; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, w += size) {
        if (!is_k(type)) {
            WBlock s;
            unpack(type, w, &s, 1);
            const int q5_1 = type == Q5_1;
            const __m256i u = unpack_q5(w + 2 + 2 * q5_1, w + 6 + 2 * q5_1);
            for (int c = 0; c < nx; ++c) {
                const X32* xb = (const X32*)x + c * nb + b;
                const __m256 sv = dot_bytes(u, _mm256_loadu_si256((const __m256i*)xb->q));
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(s.d * xb->d), sv, acc[c]);
                offset[c] += s.m * xb->s;
            }
            continue;
        }
        KRegs r;
        unpack_k(type, w, &r);
        for (int c = 0; c < nx; ++c) {
            const X256* xb = (const X256*)x + c * nb + b;
#ifdef HAVE_VNNI512
            __m512i acc5 = _mm512_setzero_si512();
            for (int k = 0; k < 4; ++k)
                acc5 = _mm512_dpwssd_epi32(acc5, _mm512_maddubs_epi16(r.u[k], _mm512_loadu_si512(xb->q + 64 * k)), r.sc[k]);
            const __m256i isum = _mm256_add_epi32(_mm512_castsi512_si256(acc5), _mm512_extracti64x4_epi64(acc5, 1));
#else
            __m256i isum = _mm256_setzero_si256();
            for (int k = 0; k < 8; ++k) {
                const __m256i p = _mm256_maddubs_epi16(r.u[k], _mm256_loadu_si256((const __m256i*)(xb->q + 32 * k)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, r.sc[k]));
            }
#endif
            const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)xb->bsum), r.off16);
            if (type == Q6_K) {
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(r.d * xb->d), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, off)),
                                         acc[c]);
            } else {
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(r.d * xb->d), _mm256_cvtepi32_ps(isum), acc[c]);
                acc[c] = _mm256_fnmadd_ps(_mm256_set1_ps(r.dmin * xb->d), _mm256_cvtepi32_ps(off), acc[c]);
            }
        }
    }
    for (int c = 0; c < nx; ++c) out[c] = hsum8(acc[c]) + offset[c];
}

/* rows_avx2_t for each type and row count as constants (its loops unrolled, accumulators in registers) */
static void rows_avx2(int32_t type, const uint8_t* w, const void* x, int64_t nb, int nx, float* out) {
#define ROWS(T)                                                              \
    switch (nx) {                                                            \
        case 1: rows_avx2_t(T, w, x, nb, 1, out); return;                   \
        case 2: rows_avx2_t(T, w, x, nb, 2, out); return;                   \
        case 3: rows_avx2_t(T, w, x, nb, 3, out); return;                   \
        default: rows_avx2_t(T, w, x, nb, XR, out); return;                 \
    }
    switch (type) {
        case Q5_0: ROWS(Q5_0)
        case Q5_1: ROWS(Q5_1)
        case Q4_K: ROWS(Q4_K)
        case Q5_K: ROWS(Q5_K)
        default: ROWS(Q6_K)
    }
#undef ROWS
}
#endif

#ifdef HAVE_VNNI512
/* An activation row's Q5 blocks b, b + 1 as one 512-bit load each: values, d per lane, s / 8 per lane
   (the 8 lanes of a block add up to the offset term m * s). */
typedef struct {
    int8_t q[64];
    float d[16], s[16];
} XPair;

static void pair_row(const X32* xb, int64_t nb, XPair* out) {
    for (int64_t b = 0; b + 2 <= nb; b += 2, ++out) {
        memcpy(out->q, xb[b].q, 32);
        memcpy(out->q + 32, xb[b + 1].q, 32);
        for (int j = 0; j < 8; ++j) {
            out->d[j] = xb[b].d, out->d[8 + j] = xb[b + 1].d;
            out->s[j] = xb[b].s / 8.f, out->s[8 + j] = xb[b + 1].s / 8.f;
        }
    }
}

static inline __m512 join_ps(float lo, float hi) {
    return _mm512_castsi512_ps(join(_mm256_castps_si256(_mm256_set1_ps(lo)), _mm256_castps_si256(_mm256_set1_ps(hi))));
}

/* A Q5 weight row against nx activation rows, two blocks per 512-bit dpbusd (pairs xp + c * np), an odd
   last block on 256 bits (x + c * nb). */
INLINE void rows_q5_512_t(const int32_t type, const uint8_t* w, const XPair* xp, const X32* x, int64_t nb, const int nx,
                          float* out) {
    const int q5_1 = type == Q5_1;
    const int64_t size = q5_1 ? 24 : 22, np = nb / 2;
    __m512 acc[XR];
    for (int c = 0; c < XR; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; ++p) {
        const uint8_t *b0 = w + 2 * p * size, *b1 = b0 + size;
        const __m512i u = join(unpack_q5(b0 + 2 + 2 * q5_1, b0 + 6 + 2 * q5_1), unpack_q5(b1 + 2 + 2 * q5_1, b1 + 6 + 2 * q5_1));
        const float d0 = half_to_float(read_u16(b0)), d1 = half_to_float(read_u16(b1));
        const __m512 wd = join_ps(d0, d1);
        const __m512 wm = q5_1 ? join_ps(half_to_float(read_u16(b0 + 2)), half_to_float(read_u16(b1 + 2)))
                               : join_ps(-16.f * d0, -16.f * d1);
        for (int c = 0; c < nx; ++c) {
            const XPair* xq = xp + c * np + p;
            const __m512 sv = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(xq->q)));
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(sv, _mm512_loadu_ps(xq->d)), wd, acc[c]);
            acc[c] = _mm512_fmadd_ps(wm, _mm512_loadu_ps(xq->s), acc[c]);
        }
    }
    for (int c = 0; c < nx; ++c) out[c] = _mm512_reduce_add_ps(acc[c]);
    if (nb & 1) {
        const uint8_t* b = w + (nb - 1) * size;
        WBlock s;
        unpack(type, b, &s, 1);
        const __m256i u = unpack_q5(b + 2 + 2 * q5_1, b + 6 + 2 * q5_1);
        for (int c = 0; c < nx; ++c) {
            const X32* xb = x + c * nb + nb - 1;
            out[c] += s.d * xb->d * hsum8(dot_bytes(u, _mm256_loadu_si256((const __m256i*)xb->q))) + s.m * xb->s;
        }
    }
}

static void rows_q5_512(int32_t type, const uint8_t* w, const XPair* xp, const X32* x, int64_t nb, int nx, float* out) {
#define ROWS(T)                                                                  \
    switch (nx) {                                                                \
        case 1: rows_q5_512_t(T, w, xp, x, nb, 1, out); return;                 \
        case 2: rows_q5_512_t(T, w, xp, x, nb, 2, out); return;                 \
        case 3: rows_q5_512_t(T, w, xp, x, nb, 3, out); return;                 \
        default: rows_q5_512_t(T, w, xp, x, nb, XR, out); return;               \
    }
    if (type == Q5_0) ROWS(Q5_0)
    ROWS(Q5_1)
#undef ROWS
}
#endif

/* y[i * out_f + r] = row r of w . x[i * in_f ...] for i < n, r < out_f; x rows contiguous, in_f a
   multiple of the type's block (32 or 256). Returns 0, or -1 for an unknown type, a bad in_f or no memory. */
int32_t pdtop_quant_k_matmul(int32_t type, const uint8_t* w, int64_t out_f, int64_t in_f, const float* x,
                             int64_t n, float* y, int32_t portable) {
    const int64_t size = pdtop_quant_k_block_bytes(type), len = block_len(type), nb = in_f / len;
    if (!size || in_f % len) return -1;
    const size_t xsize = is_k(type) ? sizeof(X256) : sizeof(X32);
    char* xq = malloc(xsize * (size_t)(n * nb) + 1);
    if (!xq) return -1;
    void (*rows)(int32_t, const uint8_t*, const void*, int64_t, int, float*) = rows_portable;
#ifdef HAVE_AVX2
    if (!portable) rows = rows_avx2;
#else
    (void)portable;
#endif
#ifdef HAVE_VNNI512
    const int64_t np = nb / 2;
    XPair* xp = NULL; /* the Q5 pairs, where the 512-bit path runs */
    if (!portable && !is_k(type) && np && !(xp = malloc(sizeof(XPair) * (size_t)(n * np)))) {
        free(xq);
        return -1;
    }
#endif
    const int64_t row_bytes = nb * size;
    const int parallel = out_f * (in_f / 32) * n >= PARALLEL_MIN;
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            if (is_k(type))
                quantize_256(x + i * in_f, nb, (X256*)xq + i * nb);
            else
                quantize_32(x + i * in_f, nb, (X32*)xq + i * nb);
#ifdef HAVE_VNNI512
            if (xp) pair_row((X32*)xq + i * nb, nb, xp + i * np);
#endif
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < out_f; t += TILE) {
            const int64_t end = t + TILE < out_f ? t + TILE : out_f;
            for (int64_t i = 0; i < n; i += XR) {
                const int nx = n - i < XR ? (int)(n - i) : XR;
                const void* xi = xq + (size_t)(i * nb) * xsize;
                for (int64_t r = t; r < end; ++r) {
                    float o[XR];
#ifdef HAVE_VNNI512
                    if (xp) {
                        rows_q5_512(type, w + r * row_bytes, xp + i * np, (const X32*)xi, nb, nx, o);
                        for (int c = 0; c < nx; ++c) y[(i + c) * out_f + r] = o[c];
                        continue;
                    }
#endif
                    rows(type, w + r * row_bytes, xi, nb, nx, o);
                    for (int c = 0; c < nx; ++c) y[(i + c) * out_f + r] = o[c];
                }
            }
        }
    }
#ifdef HAVE_VNNI512
    free(xp);
#endif
    free(xq);
    return 0;
}

/* out[k, :] = row ids[k] of w, dequantized (in_f floats each) with gguf-py's float32 arithmetic.
   Returns 0, or -1 for an unknown type or a bad in_f. */
int32_t pdtop_quant_k_rows(int32_t type, const uint8_t* w, int64_t in_f, const int64_t* ids, int64_t n,
                           float* out) {
    const int64_t size = pdtop_quant_k_block_bytes(type), len = block_len(type), nb = in_f / len;
    if (!size || in_f % len) return -1;
#pragma omp parallel for schedule(static) if (n * in_f >= (1 << 18))
    for (int64_t k = 0; k < n; ++k) {
        const uint8_t* blk = w + ids[k] * nb * size;
        float* o = out + k * in_f;
        WBlock wb;
        for (int64_t b = 0; b < nb; ++b, blk += size, o += len) {
            unpack(type, blk, &wb, 0);
            if (type == Q5_0)
                for (int j = 0; j < 32; ++j) o[j] = wb.d * (float)((int)wb.u[j] - 16);
            else if (type == Q5_1)
                for (int j = 0; j < 32; ++j) o[j] = wb.d * (float)wb.u[j] + wb.m;
            else if (type == Q6_K)
                for (int j = 0; j < 256; ++j) o[j] = (wb.d * (float)wb.sc[j / 16]) * (float)((int)wb.u[j] - 32);
            else
                for (int j = 0; j < 256; ++j)
                    o[j] = (wb.d * (float)wb.sc[j / 16]) * (float)wb.u[j] - wb.m * (float)wb.mn[j / 16];
        }
    }
    return 0;
}

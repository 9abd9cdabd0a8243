/* Matmuls on a GGUF's quantized blocks, as stored in the file: y[n, out] = x[n, in] @ W^T for W of
   type Q4_0, Q4_1 or Q8_0 (rows of in/32 blocks), and dequantizing chosen rows (the embedding).

   Batch-1 decode is memory-bound: reading the 20-byte Q4_1 blocks instead of 128 bytes of float32
   per 32 weights is most of the speed. As llama.cpp's vec_dot does, each activation row is first
   quantized per block of 32 to int8 (scale d = amax / 127, and s = d * sum(q) for the types with an
   offset), then every weight block meets it in an integer dot product:
     Q8_0: d_w * d_x * sum(qw * qx)
     Q4_1: d_w * d_x * sum(nib * qx) + m_w * s_x          (w = d * nib + m)
     Q4_0: the same with m_w = -8 d_w                      (w = d * (nib - 8))
   Three paths, chosen per call (`path`, lowered to what was built): portable C; AVX2 (`maddubs`:
   unsigned x signed bytes to int16 pairs, `madd` to int32); AVX-512 VNNI (`dpbusd`). Two loop
   shapes: per-row dots (one or a few activation rows: memory-bound, each weight row streamed once)
   and, from TILED_MIN rows on, panels ("Panels" below: compute-bound, each weight block unpacked once
   per call and used by every row). Rounding the activations is the same on every path; the sums
   differ in float order only.

   Work is split by output columns, so each block is read by one thread, over the calling thread's
   team (pdmux gives prefill and decode threads their own cores, and each its own team): a decode
   step's few rows on its spin team (spin_team.h, Linux: helpers that spin between the step's
   matmuls instead of sleeping as PASSIVE OpenMP threads do), bigger ones on its OpenMP team; a
   small matmul runs on the calling thread alone (waking a team costs more). Built and checked by
   pdtop/engine/model/quant_kernels.py; bench/quant_bench.py times each path and loop shape. */
#define _GNU_SOURCE /* spin_team.h: sched_setaffinity, CPU_EQUAL */
#include <math.h>
#include <omp.h>
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
#include "quant_common.h"
#ifdef __linux__
#include "spin_team.h"
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 }; /* GGMLQuantizationType values */
#define QK 32
#define TILE 16
#define PARALLEL_MIN (1 << 13) /* block dots below which one thread does it all */
#define QUANTIZE_PARALLEL_MIN (1 << 16) /* activations below which one thread rounds them */
#define ROW_CHUNK 256 /* activation rows per sweep of the panels */
#define TILED_MIN 3 /* activation rows from which the panels beat the per-row dots (bench/quant_bench.py) */

typedef struct {
    float d, s;      /* scale, d * sum(q) */
    int8_t q[QK];
} XBlock;


int64_t pdtop_quant_block_bytes(int32_t type) {
    return type == Q8_0 ? 34 : type == Q4_1 ? 20 : type == Q4_0 ? 18 : 0;
}

/* the fast path built here: 0 none (portable only), 1 AVX2, 2 AVX-512 VNNI */
int32_t pdtop_quant_fast_path(void) { return fast_path_built(); }

static void quantize_row_portable(const float* x, int64_t nb, XBlock* out) {
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

#ifdef HAVE_AVX2
/* The same rounding (v * id to nearest even), eight floats at a time. */
static void quantize_row_avx2(const float* x, int64_t nb, XBlock* out) {
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < nb; ++b) {
        const float* v = x + b * QK;
        __m256 f[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; ++j) m = _mm256_max_ps(m, _mm256_and_ps(f[j] = _mm256_loadu_ps(v + 8 * j), nosign));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int j = 0; j < 4; ++j) {
            q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(f[j], _mm256_set1_ps(id)));
            sum = _mm256_add_epi32(sum, q[j]);
        }
        const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i*)out[b].q, _mm256_permutevar8x32_epi32(w, order));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        out[b].d = d;
        out[b].s = d * (float)_mm_cvtsi128_si32(s);
    }
}
#endif

static void quantize_row(const float* x, int64_t nb, XBlock* out, int32_t path) {
#ifdef HAVE_AVX2
    if (path) {
        quantize_row_avx2(x, nb, out);
        return;
    }
#endif
    (void)path;
    quantize_row_portable(x, nb, out);
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

/* int32 sums of the 8 lanes' byte products u8 (w) x s8 (x): one VNNI instruction where the CPU has it */
static inline __m256 dot_bytes(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#else
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* Weight block w against activation block x, times d_w * d_x, added to acc: Q8_0 as |w| . (x with
   w's signs), Q4 as nibbles . x with the offset m_w * s_x added to *offset. */
static inline __m256 block_avx2(int32_t type, const uint8_t* w, const XBlock* x, __m256 acc, float* offset) {
    const float d = _cvtsh_ss(read_u16(w));
    const __m256i qx = _mm256_loadu_si256((const __m256i*)x->q);
    if (type == Q8_0) {
        const __m256i qw = _mm256_loadu_si256((const __m256i*)(w + 2));
        const __m256 s = dot_bytes(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        return _mm256_fmadd_ps(_mm256_set1_ps(d * x->d), s, acc);
    }
    const __m128i q = _mm_loadu_si128((const __m128i*)(w + (type == Q4_1 ? 4 : 2)));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
    *offset += (type == Q4_1 ? _cvtsh_ss(read_u16(w + 2)) : -8.f * d) * x->s;
    return _mm256_fmadd_ps(_mm256_set1_ps(d * x->d), dot_bytes(nib, qx), acc);
}

/* One weight row against one activation row (batch-1 decode), two blocks a step on two chains (one
   chain waits on its FMA's latency every block). The row is read in order: interleaving several
   rows instead defeated the hardware prefetcher (3x slower from DRAM on the EPYC). */
static float dot_avx2(int32_t type, const uint8_t* w, const XBlock* x, int64_t nb) {
    const int64_t size = pdtop_quant_block_bytes(type);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float off0 = 0.f, off1 = 0.f;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 2 * size) {
        acc0 = block_avx2(type, w, x + b, acc0, &off0);
        acc1 = block_avx2(type, w + size, x + b + 1, acc1, &off1);
    }
    if (b < nb) acc0 = block_avx2(type, w, x + b, acc0, &off0);
    return hsum8(_mm256_add_ps(acc0, acc1)) + (off0 + off1);
}

/* One weight row against XR activation rows (x, x + nb, ...): each weight block is unpacked once.
   Each row sums as dot_avx2 does (even and odd blocks on their own chains), so a row's result does
   not depend on the rows beside it. */
#define XR 4
static void dot_avx2_rows(int32_t type, const uint8_t* w, const XBlock* x, int64_t nb, float* out) {
    __m256 acc[2][XR];
    float offset[2][XR] = {{0}};
    for (int c = 0; c < XR; ++c) acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15);
    const int64_t size = pdtop_quant_block_bytes(type), qoff = type == Q4_1 ? 4 : 2;
    for (int64_t b = 0; b < nb; ++b, w += size) {
        const float d = _cvtsh_ss(read_u16(w));
        __m256* a = acc[b & 1];
        if (type == Q8_0) {
            const __m256i qw = _mm256_loadu_si256((const __m256i*)(w + 2));
            const __m256i aw = _mm256_sign_epi8(qw, qw);
            for (int c = 0; c < XR; ++c) {
                const XBlock* xb = x + c * nb + b;
                const __m256i qx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)xb->q), qw);
                a[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), dot_bytes(aw, qx), a[c]);
            }
            continue;
        }
        const float m = type == Q4_1 ? _cvtsh_ss(read_u16(w + 2)) : -8.f * d;
        const __m128i q = _mm_loadu_si128((const __m128i*)(w + qoff));
        const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
        for (int c = 0; c < XR; ++c) {
            const XBlock* xb = x + c * nb + b;
            const __m256i qx = _mm256_loadu_si256((const __m256i*)xb->q);
            a[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), dot_bytes(nib, qx), a[c]);
            offset[b & 1][c] += m * xb->s;
        }
    }
    for (int c = 0; c < XR; ++c) out[c] = hsum8(_mm256_add_ps(acc[0][c], acc[1][c])) + (offset[0][c] + offset[1][c]);
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

/* Panels, for many activation rows: a panel's weight blocks (16 output columns with AVX-512, 8 with
   AVX2) are gathered once into a column-interleaved copy (lane c of u[k] = bytes 4k..4k+3 of column
   c's block, as unsigned bytes), and every row group then meets it with broadcast activation dwords:
   each product instruction does 4 multiply-adds per column, results land per column in int32 lanes,
   and one convert and two FMAs per block finish 16 (8) columns. Every type reads as w = d * u + m:
   Q4_1 as stored, Q4_0 with m = -8 d, Q8_0 (VNNI) as u = q + 128 with m = -128 d; the AVX2 Q8_0 keeps
   q's signs (`sg`) instead, as maddubs would overflow on u = q + 128. */
static inline int32_t load32(const int8_t* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define PANEL_ALIGN 64
#ifdef HAVE_VNNI512
#define MR16 8 /* activation rows per register tile: 8 accumulators of 16 columns */
typedef struct {
    __m512i u[8];
    __m512 d, m;
} Pack16;
_Static_assert(sizeof(Pack16) == 640, "pack_bytes in pdtop_quant_matmul");

/* 16 bytes at offset `off` of block b of each of the panel's columns, transposed: dword k of column
   c to lane c of out[k] (k < 4). Four columns per register, then two-source permutes and lane
   shuffles; no gathers (slow here). Columns from ncols on are zero. */
static inline void transpose16(const uint8_t* base, int64_t row_bytes, int ncols, __m512i out[4]) {
    __m512i z[4];
    for (int j = 0; j < 4; ++j) {
        __m128i v[4];
        for (int i = 0; i < 4; ++i) {
            const int c = 4 * j + i;
            v[i] = c < ncols ? _mm_loadu_si128((const __m128i*)(base + c * row_bytes)) : _mm_setzero_si128();
        }
        const __m256i lo = _mm256_set_m128i(v[1], v[0]), hi = _mm256_set_m128i(v[3], v[2]);
        z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    const __m512i ia = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i ib = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    const __m512i a = _mm512_permutex2var_epi32(z[0], ia, z[1]), b = _mm512_permutex2var_epi32(z[0], ib, z[1]);
    const __m512i c = _mm512_permutex2var_epi32(z[2], ia, z[3]), d = _mm512_permutex2var_epi32(z[2], ib, z[3]);
    out[0] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(1, 0, 1, 0));
    out[1] = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 2, 3, 2));
    out[2] = _mm512_shuffle_i64x2(b, d, _MM_SHUFFLE(1, 0, 1, 0));
    out[3] = _mm512_shuffle_i64x2(b, d, _MM_SHUFFLE(3, 2, 3, 2));
}

static void pack16(int32_t type, const uint8_t* w, int64_t row_bytes, int64_t nb, int ncols, Pack16* pk) {
    const int64_t size = pdtop_quant_block_bytes(type), qoff = type == Q4_1 ? 4 : 2;
    const __m512i low4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* base = w + b * size;
        /* the next panel's block b (strided reads defeat the hardware prefetcher; a hint never faults) */
        for (int c = 0; c < 16; ++c) {
            _mm_prefetch((const char*)(base + (16 + c) * row_bytes), _MM_HINT_T0);
            _mm_prefetch((const char*)(base + (16 + c) * row_bytes + size - 1), _MM_HINT_T0);
        }
        uint16_t d[16] = {0}, m[16] = {0};
        for (int c = 0; c < ncols; ++c) {
            d[c] = read_u16(base + c * row_bytes);
            if (type == Q4_1) m[c] = read_u16(base + c * row_bytes + 2);
        }
        pk[b].d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)d));
        pk[b].m = type == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)m))
                               : _mm512_mul_ps(pk[b].d, _mm512_set1_ps(type == Q8_0 ? -128.f : -8.f));
        __m512i v[4];
        transpose16(base + qoff, row_bytes, ncols, v);
        if (type == Q8_0) {
            for (int k = 0; k < 4; ++k) pk[b].u[k] = _mm512_xor_si512(v[k], flip);
            transpose16(base + qoff + 16, row_bytes, ncols, v);
            for (int k = 0; k < 4; ++k) pk[b].u[k + 4] = _mm512_xor_si512(v[k], flip);
            continue;
        }
        for (int k = 0; k < 4; ++k) {
            pk[b].u[k] = _mm512_and_si512(v[k], low4);
            pk[b].u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v[k], 4), low4);
        }
    }
}

/* y[r * ldy + c] for r < mr, the 16 (masked) columns of the panel */
static inline __attribute__((always_inline)) void tile16(const Pack16* pk, const XBlock* x, int64_t nb, int mr,
                                                         float* y, int64_t ldy, __mmask16 mask) {
    __m512 acc[MR16];
    for (int r = 0; r < MR16; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const Pack16* p = pk + b;
#pragma GCC unroll 8
        for (int r = 0; r < mr; ++r) {
            const XBlock* xb = x + r * nb + b;
            __m512i t = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k) t = _mm512_dpbusd_epi32(t, p->u[k], _mm512_set1_epi32(load32(xb->q + 4 * k)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(p->d, _mm512_set1_ps(xb->d)), acc[r]);
            acc[r] = _mm512_fmadd_ps(p->m, _mm512_set1_ps(xb->s), acc[r]);
        }
    }
    for (int r = 0; r < mr; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

static void panel16(const Pack16* pk, const XBlock* xq, int64_t nb, int64_t n, float* y, int64_t ldy, int ncols) {
    const __mmask16 mask = (__mmask16)((1u << ncols) - 1);
    int64_t i = 0;
    for (; i + MR16 <= n; i += MR16) tile16(pk, xq + i * nb, nb, MR16, y + i * ldy, ldy, mask);
    const XBlock* x = xq + i * nb;
    y += i * ldy;
    switch (n - i) {
        case 7: tile16(pk, x, nb, 7, y, ldy, mask); break;
        case 6: tile16(pk, x, nb, 6, y, ldy, mask); break;
        case 5: tile16(pk, x, nb, 5, y, ldy, mask); break;
        case 4: tile16(pk, x, nb, 4, y, ldy, mask); break;
        case 3: tile16(pk, x, nb, 3, y, ldy, mask); break;
        case 2: tile16(pk, x, nb, 2, y, ldy, mask); break;
        case 1: tile16(pk, x, nb, 1, y, ldy, mask); break;
        default: break;
    }
}
#endif

#ifdef HAVE_AVX2
#define MR8 4 /* 16 ymm registers: 8 weight dwords, 4 accumulators, the rest temporaries */
typedef struct {
    __m256i u[8], sg[8]; /* sg: Q8_0's signed bytes */
    __m256 d, m;
} Pack8;
_Static_assert(sizeof(Pack8) == 576, "pack_bytes in pdtop_quant_matmul");

/* transpose16's AVX2 twin for 8 columns: a 4x4 dword transpose in each 128-bit half */
static inline void transpose8(const uint8_t* base, int64_t row_bytes, int ncols, __m256i out[4]) {
    __m256i y[4];
    for (int j = 0; j < 4; ++j) {
        const __m128i lo = j < ncols ? _mm_loadu_si128((const __m128i*)(base + j * row_bytes)) : _mm_setzero_si128();
        const __m128i hi = j + 4 < ncols ? _mm_loadu_si128((const __m128i*)(base + (j + 4) * row_bytes))
                                         : _mm_setzero_si128();
        y[j] = _mm256_set_m128i(hi, lo);
    }
    const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

static void pack8(int32_t type, const uint8_t* w, int64_t row_bytes, int64_t nb, int ncols, Pack8* pk) {
    const int64_t size = pdtop_quant_block_bytes(type), qoff = type == Q4_1 ? 4 : 2;
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* base = w + b * size;
        for (int c = 0; c < 8; ++c) { /* as pack16 */
            _mm_prefetch((const char*)(base + (8 + c) * row_bytes), _MM_HINT_T0);
            _mm_prefetch((const char*)(base + (8 + c) * row_bytes + size - 1), _MM_HINT_T0);
        }
        float d[8] = {0}, m[8] = {0};
        for (int c = 0; c < ncols; ++c) {
            d[c] = _cvtsh_ss(read_u16(base + c * row_bytes));
            m[c] = type == Q8_0 ? 0.f : type == Q4_0 ? -8.f * d[c] : _cvtsh_ss(read_u16(base + c * row_bytes + 2));
        }
        pk[b].d = _mm256_loadu_ps(d);
        pk[b].m = _mm256_loadu_ps(m);
        __m256i v[4];
        if (type == Q8_0) {
            for (int h = 0; h < 2; ++h) {
                transpose8(base + qoff + 16 * h, row_bytes, ncols, v);
                for (int k = 0; k < 4; ++k) {
                    pk[b].u[4 * h + k] = _mm256_abs_epi8(v[k]);
                    pk[b].sg[4 * h + k] = v[k];
                }
            }
            continue;
        }
        transpose8(base + qoff, row_bytes, ncols, v);
        for (int k = 0; k < 4; ++k) {
            pk[b].u[k] = _mm256_and_si256(v[k], low4);
            pk[b].u[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), low4);
        }
    }
}

static inline __attribute__((always_inline)) void tile8(int q8, const Pack8* pk, const XBlock* x, int64_t nb, int mr,
                                                        float* y, int64_t ldy, __m256i mask) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MR8];
    for (int r = 0; r < MR8; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const Pack8* p = pk + b;
#pragma GCC unroll 4
        for (int r = 0; r < mr; ++r) {
            const XBlock* xb = x + r * nb + b;
            __m256i t = _mm256_setzero_si256();
            if (q8) { /* |w| x sign(x, w), each pair sum to int32 (int16 sums could overflow) */
#pragma GCC unroll 8
                for (int k = 0; k < 8; ++k) {
                    const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(load32(xb->q + 4 * k)), p->sg[k]);
                    t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(p->u[k], xs), ones));
                }
            } else { /* nibbles: 8 pair sums of at most 2 * 15 * 127 stay in int16 */
#pragma GCC unroll 8
                for (int k = 0; k < 8; ++k)
                    t = _mm256_add_epi16(t, _mm256_maddubs_epi16(p->u[k], _mm256_set1_epi32(load32(xb->q + 4 * k))));
                t = _mm256_madd_epi16(t, ones);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(p->d, _mm256_set1_ps(xb->d)), acc[r]);
            if (!q8) acc[r] = _mm256_fmadd_ps(p->m, _mm256_set1_ps(xb->s), acc[r]);
        }
    }
    for (int r = 0; r < mr; ++r) _mm256_maskstore_ps(y + r * ldy, mask, acc[r]);
}

static inline __attribute__((always_inline)) void panel8_t(int q8, const Pack8* pk, const XBlock* xq, int64_t nb,
                                                           int64_t n, float* y, int64_t ldy, int ncols) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(ncols), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    int64_t i = 0;
    for (; i + MR8 <= n; i += MR8) tile8(q8, pk, xq + i * nb, nb, MR8, y + i * ldy, ldy, mask);
    const XBlock* x = xq + i * nb;
    y += i * ldy;
    switch (n - i) {
        case 3: tile8(q8, pk, x, nb, 3, y, ldy, mask); break;
        case 2: tile8(q8, pk, x, nb, 2, y, ldy, mask); break;
        case 1: tile8(q8, pk, x, nb, 1, y, ldy, mask); break;
        default: break;
    }
}

static void panel8(int32_t type, const Pack8* pk, const XBlock* xq, int64_t nb, int64_t n, float* y, int64_t ldy,
                   int ncols) {
    if (type == Q8_0)
        panel8_t(1, pk, xq, nb, n, y, ldy, ncols);
    else
        panel8_t(0, pk, xq, nb, n, y, ldy, ncols);
}
#endif

/* Row i of x to int8 blocks (and, for the VNNI row dots, block pairs). */
static void round_row(const float* x, int64_t in_f, int64_t nb, int64_t i, XBlock* xq, void* xp, int32_t path) {
    quantize_row(x + i * in_f, nb, xq + i * nb, path);
#ifdef HAVE_VNNI512
    if (xp) pair_row(xq + i * nb, nb, (XPair*)xp + i * (nb / 2));
#else
    (void)xp;
#endif
}

/* Which loops run: `path` (0 portable, 1 AVX2, 2 AVX-512 VNNI, lowered to what was built) and `tiled`
   (1 the panels, 0 the per-row dots, -1 panels from TILED_MIN rows on, where they are faster). */
static int tiled_for(int32_t path, int32_t tiled, int64_t n) {
    if (!path) return 0;
    return tiled < 0 ? n >= TILED_MIN : tiled != 0;
}

static void rows_loop(int32_t type, int32_t path, const uint8_t* w, int64_t t, int64_t end, int64_t row_bytes,
                      const XBlock* xq, const void* xpairs, int64_t nb, int64_t n, float* y, int64_t out_f) {
    int64_t i = 0;
    (void)xpairs, (void)path;
#ifdef HAVE_VNNI512
    const XPair* xp = xpairs;
    if (path == 2 && xp)
        for (; i < n; i += XR) {
            const int nx = n - i < XR ? (int)(n - i) : XR;
            for (int64_t r = t; r < end; ++r) {
                float o[XR];
                dot_vnni_rows(type, w + r * row_bytes, xp + i * (nb / 2), xq + i * nb, nb, nx, o);
                for (int c = 0; c < nx; ++c) y[(i + c) * out_f + r] = o[c];
            }
        }
#endif
#ifdef HAVE_AVX2
    if (path)
        for (; i + XR <= n; i += XR)
            for (int64_t r = t; r < end; ++r) {
                float o[XR];
                dot_avx2_rows(type, w + r * row_bytes, xq + i * nb, nb, o);
                for (int c = 0; c < XR; ++c) y[(i + c) * out_f + r] = o[c];
            }
    for (; path && i < n; ++i)
        for (int64_t r = t; r < end; ++r) y[i * out_f + r] = dot_avx2(type, w + r * row_bytes, xq + i * nb, nb);
#endif
    for (; i < n; ++i)
        for (int64_t r = t; r < end; ++r) y[i * out_f + r] = dot_portable(type, w + r * row_bytes, xq + i * nb, nb);
}

#ifdef HAVE_AVX2
/* Output columns [c, c + ncols) of `rows` activation rows through one panel (packed into pk). */
static void panel_cols(int32_t type, int32_t path, const uint8_t* w, int64_t row_bytes, int64_t nb, int64_t c,
                       int ncols, void* pk, const XBlock* xq, int64_t rows, float* y, int64_t out_f) {
#ifdef HAVE_VNNI512
    if (path == 2) {
        pack16(type, w + c * row_bytes, row_bytes, nb, ncols, pk);
        panel16(pk, xq, nb, rows, y + c, out_f, ncols);
        return;
    }
#else
    (void)path;
#endif
    pack8(type, w + c * row_bytes, row_bytes, nb, ncols, pk);
    panel8(type, pk, xq, nb, rows, y + c, out_f, ncols);
}
#endif

#ifdef __linux__
/* One matmul of a few rows for spin_team's chunks: output tile `chunk` (TILE rows of per-row dots),
   or panel `chunk` (packed into the member's pack) */
typedef struct {
    int32_t type, path;
    const uint8_t* w;
    int64_t out_f, row_bytes, nb, n, panel;
    const XBlock* xq;
    const void* xp;
    uint8_t* packs;
    size_t pack_per;
    float* y;
} TeamJob;

static void rows_chunk(void* arg, int64_t chunk, int member) {
    (void)member;
    const TeamJob* j = arg;
    const int64_t t = chunk * TILE, end = t + TILE < j->out_f ? t + TILE : j->out_f;
    rows_loop(j->type, j->path, j->w, t, end, j->row_bytes, j->xq, j->xp, j->nb, j->n, j->y, j->out_f);
}

#ifdef HAVE_AVX2
static void panel_chunk(void* arg, int64_t chunk, int member) {
    const TeamJob* j = arg;
    const int64_t c = chunk * j->panel;
    const int ncols = (int)(j->out_f - c < j->panel ? j->out_f - c : j->panel);
    panel_cols(j->type, j->path, j->w, j->row_bytes, j->nb, c, ncols, j->packs + (size_t)member * j->pack_per, j->xq,
               j->n, j->y, j->out_f);
}
#endif
#endif

/* < 0: batch-1/2 decode's per-row dots run on OpenMP's team; else on the spin team (spin_team.h),
   whose idle helpers spin this many nanoseconds before they sleep. Returns the setting before. */
int64_t pdtop_quant_team_spin(int64_t ns) {
#ifdef __linux__
    return atomic_exchange(&team_spin_ns, ns);
#else
    (void)ns;
    return -1; /* no team here: OpenMP's runs them */
#endif
}

/* fn(arg, k, member) for k < chunks on the calling thread's spin team (up to `helpers` helpers): quant_k.c's
   matmuls run on the same team as these (quant_kernels.py hands it this function). Returns 0, or -1
   where there is no team (not Linux, or `pdtop_quant_team_spin(-1)`): then the caller runs them. */
int32_t pdtop_quant_team_run(void (*fn)(void*, int64_t, int), void* arg, int64_t chunks, int32_t helpers) {
#ifdef __linux__
    if (atomic_load(&team_spin_ns) >= 0) {
        team_run(fn, arg, chunks, helpers);
        return 0;
    }
#else
    (void)fn, (void)arg, (void)chunks, (void)helpers;
#endif
    return -1;
}

/* y[i * out_f + r] = row r of w . x[i * in_f ...] for i < n, r < out_f; x rows contiguous, in_f a
   multiple of 32. Returns 0, or -1 for an unknown type or no memory. */
int32_t pdtop_quant_matmul(int32_t type, const uint8_t* w, int64_t out_f, int64_t in_f, const float* x, int64_t n,
                           float* y, int32_t path, int32_t tiled) {
    const int64_t size = pdtop_quant_block_bytes(type), nb = in_f / QK, row_bytes = nb * size;
    if (!size || in_f % QK) return -1;
    path = path < 0 ? 0 : path > pdtop_quant_fast_path() ? pdtop_quant_fast_path() : path;
    tiled = tiled_for(path, tiled, n);
    const int parallel = out_f * nb * n >= PARALLEL_MIN;
    const int threads = parallel ? omp_get_max_threads() : 1;
    const int64_t panel = path == 2 ? 16 : 8, pack_bytes = path == 2 ? 640 : 576; /* sizeof Pack16 / Pack8 */
    const size_t pack_per = (size_t)((nb * pack_bytes + PANEL_ALIGN - 1) / PANEL_ALIGN * PANEL_ALIGN);
    (void)panel;
    XBlock* xq = malloc(sizeof(XBlock) * (size_t)(n * nb));
    void* xp = NULL;
    uint8_t* packs = NULL;
    int failed = !xq;
    if (!failed && tiled) failed = !(packs = aligned_alloc(PANEL_ALIGN, pack_per * (size_t)threads));
#ifdef HAVE_VNNI512
    /* paired blocks for the VNNI row dots; one row runs dot_avx2 instead (faster: no pairing) */
    if (!failed && path == 2 && !tiled && nb / 2 && n > 1) failed = !(xp = malloc(sizeof(XPair) * (size_t)(n * (nb / 2))));
#endif
    if (failed) {
        free(xq);
        free(xp);
        free(packs);
        return -1;
    }
    /* a few rows are rounded before the team wakes: one barrier fewer per matmul (on a busy machine
       a barrier can wait out a time slice) */
    const int serial_rounding = n * in_f < QUANTIZE_PARALLEL_MIN;
    for (int64_t i = 0; serial_rounding && i < n; ++i) round_row(x, in_f, nb, i, xq, xp, path);
#ifdef __linux__
    /* a decode step's few rows (rounded above, one sweep of panels): on the spin team */
    if (parallel && serial_rounding && n <= ROW_CHUNK && atomic_load(&team_spin_ns) >= 0) {
        TeamJob job = {type, path, w, out_f, row_bytes, nb, n, panel, xq, xp, packs, pack_per, y};
#ifdef HAVE_AVX2
        if (tiled)
            team_run(panel_chunk, &job, (out_f + panel - 1) / panel, threads - 1);
        else
#endif
            team_run(rows_chunk, &job, (out_f + TILE - 1) / TILE, threads - 1);
        free(packs);
        free(xp);
        free(xq);
        return 0;
    }
#endif
#pragma omp parallel num_threads(threads) if (parallel)
    {
        if (!serial_rounding) { /* the same for every thread: the construct (and its barrier) or not */
#pragma omp for schedule(static)
            for (int64_t i = 0; i < n; ++i) round_row(x, in_f, nb, i, xq, xp, path);
        }
#ifdef HAVE_AVX2
        if (tiled) { /* never without AVX2 (tiled_for) */
            void* pk = packs + (size_t)omp_get_thread_num() * pack_per;
            /* rows by chunks whose int8 copy stays in L2; each thread keeps its panels (static
               schedule, the same bounds), so no barrier between chunks */
            for (int64_t i0 = 0; i0 < n; i0 += ROW_CHUNK) {
                const int64_t rows = n - i0 < ROW_CHUNK ? n - i0 : ROW_CHUNK;
#pragma omp for schedule(static) nowait
                for (int64_t c = 0; c < out_f; c += panel)
                    panel_cols(type, path, w, row_bytes, nb, c, (int)(out_f - c < panel ? out_f - c : panel), pk,
                               xq + i0 * nb, rows, y + i0 * out_f, out_f);
            }
        } else
#endif
        {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < out_f; t += TILE)
                rows_loop(type, path, w, t, t + TILE < out_f ? t + TILE : out_f, row_bytes, xq, xp, nb, n, y, out_f);
        }
    }
    free(packs);
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

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
                 element 128h + 32k + l                   w = d * sc[g] * (q - 32)

   Activations, as llama.cpp's vec_dot: per block of 32 to int8 for the Q5 types (d = amax / 127,
   s = d * sum(q): Q8_0 / Q8_1), per 256 for the K types with int16 sums per 16 (Q8_K), so a K
   super-block is one integer dot: sum over 16-groups of sc * sum(q_w * q_x), the mins (or Q6_K's -32)
   from the per-16 sums. Each type has a portable path here (`portable` forces it) and, in
   quant_k_x86.h, an AVX2 one (weights unpacked to unsigned bytes in registers, `maddubs` + `madd` by
   the scales) and an AVX-512 VNNI one where the CPU has it (K: 64 bytes per `maddubs`, the scales by
   `dpwssd`; Q5: two blocks per `dpbusd`); an AVX2-only build runs the AVX2 path on any AVX-512 CPU.
   Each weight block is unpacked once for up to XR activation rows, and work is split over the OpenMP
   team by tiles of TILE weight rows. Built and checked by pdtop/engine/model/quant_kernels.py. */
#include <math.h>
#include <omp.h>
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
#include "quant_common.h"

enum { Q5_0 = 6, Q5_1 = 7, Q4_K = 12, Q5_K = 13, Q6_K = 14 }; /* GGMLQuantizationType values */
#define TILE 16
#define XR 4
#define PARALLEL_MIN (1 << 13) /* 32-weight dots below which one thread does it all */
#define QUANTIZE_PARALLEL_MIN (1 << 16) /* activations below which one thread rounds them (as quant.c) */

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
int32_t pdtop_quant_k_fast_path(void) { return fast_path_built(); }

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

#include "quant_k_x86.h"

/* Row i of x rounded: per 256 (Q8_K) for the K types, per 32 for Q5 (and paired for the 512-bit path). */
static void round_row_k(int32_t type, const float* x, int64_t in_f, int64_t nb, int64_t i, char* xq, void* xp) {
    if (is_k(type))
        quantize_256(x + i * in_f, nb, (X256*)xq + i * nb);
    else
        quantize_32(x + i * in_f, nb, (X32*)xq + i * nb);
#ifdef HAVE_VNNI512
    if (xp) pair_row((X32*)xq + i * nb, nb, (XPair*)xp + i * (nb / 2));
#else
    (void)xp;
#endif
}

/* One matmul's arguments, for its tiles (OpenMP's loop or quant.c's spin team) */
typedef struct {
    int32_t type;
    const uint8_t* w;
    int64_t out_f, nb, n, row_bytes;
    const char* xq;
    size_t xsize;
    const void* xp; /* XPair* where the 512-bit Q5 path runs, else NULL */
    void (*rows)(int32_t, const uint8_t*, const void*, int64_t, int, float*);
    float* y;
} KJob;

/* Output rows [t, t + TILE) of the job. */
static void tile_k(void* arg, int64_t tile, int member) {
    (void)member;
    const KJob* j = arg;
    const int64_t t = tile * TILE, end = t + TILE < j->out_f ? t + TILE : j->out_f, nb = j->nb;
    for (int64_t i = 0; i < j->n; i += XR) {
        const int nx = j->n - i < XR ? (int)(j->n - i) : XR;
        const void* xi = j->xq + (size_t)(i * nb) * j->xsize;
        for (int64_t r = t; r < end; ++r) {
            float o[XR];
#ifdef HAVE_VNNI512
            if (j->xp) {
                const int64_t np = nb / 2;
                rows_q5_512(j->type, j->w + r * j->row_bytes, (const XPair*)j->xp + i * np, (const X32*)xi, nb, nx, o);
                for (int c = 0; c < nx; ++c) j->y[(i + c) * j->out_f + r] = o[c];
                continue;
            }
#endif
            j->rows(j->type, j->w + r * j->row_bytes, xi, nb, nx, o);
            for (int c = 0; c < nx; ++c) j->y[(i + c) * j->out_f + r] = o[c];
        }
    }
}

/* quant.c's pdtop_quant_team_run (its spin team, shared so that a caller has one team for both
   files), set by quant_kernels.py; NULL: OpenMP's team runs every matmul */
typedef int32_t (*TeamRunner)(void (*)(void*, int64_t, int), void*, int64_t, int32_t);
static TeamRunner team_runner;
void pdtop_quant_k_set_team(TeamRunner run) { team_runner = run; }

/* y[i * out_f + r] = row r of w . x[i * in_f ...] for i < n, r < out_f; x rows contiguous, in_f a
   multiple of the type's block (32 or 256). Returns 0, or -1 for an unknown type, a bad in_f or no memory. */
int32_t pdtop_quant_k_matmul(int32_t type, const uint8_t* w, int64_t out_f, int64_t in_f, const float* x,
                             int64_t n, float* y, int32_t portable) {
    const int64_t size = pdtop_quant_k_block_bytes(type), len = block_len(type), nb = in_f / len;
    if (!size || in_f % len) return -1;
    const size_t xsize = is_k(type) ? sizeof(X256) : sizeof(X32);
    char* xq = malloc(xsize * (size_t)(n * nb) + 1);
    if (!xq) return -1;
    KJob job = {type, w, out_f, nb, n, nb * size, xq, xsize, NULL, rows_portable, y};
#ifdef HAVE_AVX2
    if (!portable) job.rows = rows_avx2;
#else
    (void)portable;
#endif
    void* xp = NULL;
#ifdef HAVE_VNNI512
    /* the Q5 pairs, where the 512-bit path runs */
    if (!portable && !is_k(type) && nb / 2 && !(xp = malloc(sizeof(XPair) * (size_t)(n * (nb / 2))))) {
        free(xq);
        return -1;
    }
    job.xp = xp;
#endif
    const int parallel = out_f * (in_f / 32) * n >= PARALLEL_MIN, tiles = (int)((out_f + TILE - 1) / TILE);
    /* a decode's row or two: rounded here, then the tiles on the spin team where it runs */
    if (parallel && team_runner && n * in_f < QUANTIZE_PARALLEL_MIN) {
        for (int64_t i = 0; i < n; ++i) round_row_k(type, x, in_f, nb, i, xq, xp);
        if (team_runner(tile_k, &job, tiles, omp_get_max_threads() - 1) == 0) {
            free(xp);
            free(xq);
            return 0;
        }
    }
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) round_row_k(type, x, in_f, nb, i, xq, xp);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) tile_k(&job, t, 0);
    }
    free(xp);
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

/* Decode attention on the CPU: one query token per row against its paged K/V, read in place.

   Built and loaded by pdtop/engine/model/cpu_kernels.py (gcc -O3 -march=native -fopenmp, linked
   to the OpenMP runtime torch already loaded, so the team size is the calling thread's torch
   thread count). Replaces gathering each row's context out of the cache and calling SDPA: the
   gather copies the whole context once per layer, and SDPA's flash kernel costs more than the
   arithmetic for one query row.

   The work is split into (row, KV head) tasks over the team, or done on the calling thread alone
   when it is small: waking a sleeping team costs tens of microseconds, more than a batch-1 layer's
   attention. Each task is done by `task_avx2` (AVX2 with FMA, head_dim a multiple of 32) or by the
   portable `task_v16`. float32 throughout. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#define MAXG 16
#define MAXC 8 /* d / 16 */
#define BLK 16
/* keys x heads x head_dim below which one thread does it all (about 20 microseconds of work) */
#define PARALLEL_MIN (256 * 1024)

typedef struct {
    const float* q;  /* row i, head a at q + i*q_stride + a*d */
    int64_t q_stride;
    const float* cache;  /* [2, kvh, S, d]: K then V */
    const int64_t* slots;  /* [n, L]: row i's context is its first lens[i] slots (lens[i] >= 1) */
    const int64_t* lens;
    float* out;  /* [n, h, d] */
    int64_t h, kvh, d, S, L;
    float scale;
} Args;

/* 16 vectors of partial sums -> one vector of their 16 sums (a transpose-add butterfly). Lane k of
   the result sums x[REV4[k]], so callers store key k's partial sums at x[REV4[k]]. */
static const int REV4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
static inline v16 sums16(const v16* x) {
    v16 a[8], b[4], c[2];
    for (int k = 0; k < 8; ++k)
        a[k] = SHUF(x[2 * k], x[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + SHUF(x[2 * k], x[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int k = 0; k < 4; ++k)
        b[k] = SHUF(a[2 * k], a[2 * k + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
             + SHUF(a[2 * k], a[2 * k + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int k = 0; k < 2; ++k)
        c[k] = SHUF(b[2 * k], b[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
             + SHUF(b[2 * k], b[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    return SHUF(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
         + SHUF(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}

/* One (row, KV head) task, portable (16-float vectors): the scores of the g query heads that share
   the KV head against 16 keys at a time (each K row loaded once for the g heads, the 16 sums formed by
   a transpose-add), softmax with a vectorized exp, then the weighted sum of V rows. d a multiple of 16,
   at most 128; g at most 16. p: scratch of g * (L + BLK) floats. */
static void task_v16(const Args* A, int64_t t, float* p) {
    const float* q = A->q;
    const int64_t q_stride = A->q_stride, h = A->h, kvh = A->kvh, d = A->d, S = A->S, L = A->L;
    const int64_t* slots = A->slots;
    const int64_t* lens = A->lens;
    const float* cache = A->cache;
    float* out = A->out;
    const float scale = A->scale;
    const int64_t g = h / kvh, dv = d / 16, pstride = L + BLK;
    const int64_t i = t / kvh, kv = t % kvh, len = lens[i];
    const float* K = cache + kv * S * d;
    const float* V = cache + (kvh + kv) * S * d;
    const int64_t* sl = slots + i * L;
    const float* qi = q + i * q_stride + kv * g * d;
    float* oi = out + (i * h + kv * g) * d;
    v16 mx[MAXG];
    for (int64_t a = 0; a < g; ++a) mx[a] = splat(-INFINITY);
    for (int64_t j0 = 0; j0 < len; j0 += BLK) {
        v16 part[MAXG][BLK];
        for (int64_t jj = 0; jj < BLK; ++jj) {
            const float* k = K + sl[j0 + jj < len ? j0 + jj : len - 1] * d;
            v16 kc[MAXC];
            for (int64_t c = 0; c < dv; ++c) kc[c] = load16(k + 16 * c);
            for (int64_t a = 0; a < g; ++a) {
                const float* qa = qi + a * d;
                v16 acc = load16(qa) * kc[0];
                for (int64_t c = 1; c < dv; ++c) acc += load16(qa + 16 * c) * kc[c];
                part[a][REV4[jj]] = acc;
            }
        }
        for (int64_t a = 0; a < g; ++a) {
            v16 s = sums16(part[a]) * scale;
            for (int64_t jj = len - j0; jj < BLK; ++jj) s[jj] = -INFINITY; /* past the context */
            mx[a] = vmax(s, mx[a]);
            store16(p + a * pstride + j0, s);
        }
    }
    float inv[MAXG];
    for (int64_t a = 0; a < g; ++a) {
        float m = -INFINITY;
        for (int k = 0; k < 16; ++k) m = mx[a][k] > m ? mx[a][k] : m;
        float* pa = p + a * pstride;
        v16 tot = {0};
        for (int64_t j0 = 0; j0 < len; j0 += BLK) {
            const v16 e = exp16(load16(pa + j0) - m);
            store16(pa + j0, e);
            tot += e;
        }
        float s = 0.f;
        for (int k = 0; k < 16; ++k) s += tot[k];
        inv[a] = 1.f / s;
    }
    v16 acc[MAXG][MAXC];
    for (int64_t a = 0; a < g; ++a)
        for (int64_t c = 0; c < dv; ++c) acc[a][c] = splat(0.f);
    for (int64_t j = 0; j < len; ++j) {
        const float* v = V + sl[j] * d;
        v16 vc[MAXC];
        for (int64_t c = 0; c < dv; ++c) vc[c] = load16(v + 16 * c);
        for (int64_t a = 0; a < g; ++a) {
            const v16 w = splat(p[a * pstride + j]);
            for (int64_t c = 0; c < dv; ++c) acc[a][c] += w * vc[c];
        }
    }
    for (int64_t a = 0; a < g; ++a)
        for (int64_t c = 0; c < dv; ++c) store16(oi + a * d + 16 * c, acc[a][c] * inv[a]);
}

#ifdef HAVE_AVX2
/* x[0..7] -> one vector whose lane k is the sum of x[k]'s lanes. */
static inline __m256 sums8(const __m256* x) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp16 of vec16.h, 8 lanes at a time. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f));
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-126.f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-126.f));
    const __m256 fl = _mm256_floor_ps(x), f = _mm256_sub_ps(x, fl);
    __m256 p = _mm256_set1_ps(1.5353362e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3398874e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6184197e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5503406e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fl), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* One (row, KV head) task, head by head. Scores: 8 keys at a time, each key's dot product with
   the query head in its own accumulator (8 independent FMA chains), summed by a transpose-add.
   Output: 32 dims at a time over the context, two keys per iteration in separate accumulators
   (again 8 chains). d a multiple of 32. p: scratch of g * (L + BLK) floats. */
static void task_avx2(const Args* A, int64_t t, float* p) {
    const int64_t kvh = A->kvh, d = A->d, g = A->h / kvh, pstride = A->L + BLK;
    const int64_t i = t / kvh, kv = t % kvh, len = A->lens[i];
    const float* K = A->cache + kv * A->S * d;
    const float* V = A->cache + (kvh + kv) * A->S * d;
    const int64_t* sl = A->slots + i * A->L;
    const float* qi = A->q + i * A->q_stride + kv * g * d;
    float* oi = A->out + (i * A->h + kv * g) * d;
    const __m256 scale = _mm256_set1_ps(A->scale), neg_inf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t a = 0; a < g; ++a) {
        const float* qa = qi + a * d;
        float* pa = p + a * pstride;
        __m256 mx = neg_inf;
        for (int64_t j0 = 0; j0 < len; j0 += 8) {
            const float* k[8];
            __m256 acc[8];
            for (int jj = 0; jj < 8; ++jj) {
                k[jj] = K + sl[j0 + jj < len ? j0 + jj : len - 1] * d;
                acc[jj] = _mm256_setzero_ps();
            }
            for (int64_t c = 0; c < d; c += 8) {
                const __m256 qc = _mm256_loadu_ps(qa + c);
                for (int jj = 0; jj < 8; ++jj) acc[jj] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k[jj] + c), acc[jj]);
            }
            __m256 s = _mm256_mul_ps(sums8(acc), scale);
            if (len - j0 < 8) {  /* past the context */
                const __m256i past = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32((int)(len - j0 - 1)));
                s = _mm256_blendv_ps(s, neg_inf, _mm256_castsi256_ps(past));
            }
            mx = _mm256_max_ps(mx, s);
            _mm256_storeu_ps(pa + j0, s);
        }
        float lanes[8], m = -INFINITY, sum = 0.f;
        _mm256_storeu_ps(lanes, mx);
        for (int k = 0; k < 8; ++k) m = lanes[k] > m ? lanes[k] : m;
        const __m256 mv = _mm256_set1_ps(m);
        __m256 tot = _mm256_setzero_ps();
        for (int64_t j0 = 0; j0 < len; j0 += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(pa + j0), mv));
            _mm256_storeu_ps(pa + j0, e);
            tot = _mm256_add_ps(tot, e);
        }
        _mm256_storeu_ps(lanes, tot);
        for (int k = 0; k < 8; ++k) sum += lanes[k];
        const __m256 inv = _mm256_set1_ps(1.f / sum);
        for (int64_t c0 = 0; c0 < d; c0 += 32) {
            __m256 o[8];
            for (int c = 0; c < 8; ++c) o[c] = _mm256_setzero_ps();
            int64_t j = 0;
            for (; j + 1 < len; j += 2) {
                const float* v0 = V + sl[j] * d + c0;
                const float* v1 = V + sl[j + 1] * d + c0;
                const __m256 w0 = _mm256_broadcast_ss(pa + j), w1 = _mm256_broadcast_ss(pa + j + 1);
                for (int c = 0; c < 4; ++c) {
                    o[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 8 * c), o[c]);
                    o[4 + c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(v1 + 8 * c), o[4 + c]);
                }
            }
            if (j < len) {
                const float* v0 = V + sl[j] * d + c0;
                const __m256 w0 = _mm256_broadcast_ss(pa + j);
                for (int c = 0; c < 4; ++c) o[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(v0 + 8 * c), o[c]);
            }
            for (int c = 0; c < 4; ++c)
                _mm256_storeu_ps(oi + a * d + c0 + 8 * c, _mm256_mul_ps(_mm256_add_ps(o[c], o[4 + c]), inv));
        }
    }
}
#endif

/* What this build compiled in, for the tests that build each instruction set: 1 = the AVX2/FMA task,
   2 = AVX-512 (16-float vectors in one register). */
int pdtop_decode_attention_isa(void) {
    int isa = 0;
#ifdef HAVE_AVX2
    isa |= 1;
#endif
#ifdef __AVX512F__
    isa |= 2;
#endif
    return isa;
}

void pdtop_decode_attention_f32(const float* q, int64_t q_stride, const float* cache, const int64_t* slots,
                                const int64_t* lens, float* out, int64_t n, int64_t h, int64_t kvh, int64_t d,
                                int64_t S, int64_t L, float scale) {
    const Args args = {q, q_stride, cache, slots, lens, out, h, kvh, d, S, L, scale};
    int fast = 0;
#ifdef HAVE_AVX2
    fast = d % 32 == 0;
#endif
    int64_t keys = 0;
    for (int64_t i = 0; i < n; ++i) keys += lens[i];
#pragma omp parallel if (keys * h * d >= PARALLEL_MIN)
    {
        float* p = (float*)malloc(sizeof(float) * (h / kvh) * (L + BLK));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n * kvh; ++t) {
#ifdef HAVE_AVX2
            if (fast) {
                task_avx2(&args, t, p);
                continue;
            }
#endif
            task_v16(&args, t, p);
        }
        free(p);
    }
}

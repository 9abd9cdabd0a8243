/* Decode attention on the CPU: one query token per row against its paged K/V, read in place.

   Built and loaded by pdtop/engine/model/cpu_kernels.py (gcc -O3 -march=native -fopenmp, linked
   to the OpenMP runtime torch already loaded, so the team size is the calling thread's torch
   thread count). Replaces gathering each row's context out of the cache and calling SDPA: the
   gather copies the whole context once per layer, and SDPA's flash kernel costs more than the
   arithmetic for one query row.

   Per (row, KV head) task: scores of the g query heads that share the KV head against 16 keys at
   a time (each K row loaded once for the g heads, the 16 sums formed by a transpose-add), softmax
   with a vectorized exp, then the weighted sum of V rows. float32 throughout; d a multiple of 16,
   at most 128; g at most 16. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec16.h"

#define MAXG 16
#define MAXC 8 /* d / 16 */
#define BLK 16

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

/* q: row i, head a at q + i*q_stride + a*d. cache: [2, kvh, S, d], K then V. slots: [n, L], row i's
   context is its first lens[i] slots (lens[i] >= 1). out: [n, h, d]. */
void pdtop_decode_attention_f32(const float* q, int64_t q_stride, const float* cache, const int64_t* slots,
                                const int64_t* lens, float* out, int64_t n, int64_t h, int64_t kvh, int64_t d,
                                int64_t S, int64_t L, float scale) {
    const int64_t g = h / kvh, dv = d / 16, pstride = L + BLK;
#pragma omp parallel
    {
        float* p = (float*)malloc(sizeof(float) * g * pstride);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n * kvh; ++t) {
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
        free(p);
    }
}

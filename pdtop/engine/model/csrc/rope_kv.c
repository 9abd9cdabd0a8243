/* RoPE on the q and k heads of each qkv row, in place, and the row's k and v written to its KV-cache
   slot, in one pass per row.

   torch does this as a complex multiply (five ops with the views around it) and an index_copy_ into
   the cache, which at decode sizes cost more in dispatch and in waking the OpenMP team than in
   arithmetic. x: rows of (h + 2*kvh) * d floats (q heads, k heads, v heads) at stride x_stride, the
   rotary pairs adjacent; rot: per row d/2 (cos, sin) pairs; cache: [2, kvh, S, d]. Below
   PARALLEL_MIN elements this runs on the calling thread alone, above it on its OpenMP team. */
#include <stdint.h>
#include <string.h>

#define PARALLEL_MIN (1 << 18)

void pdtop_rope_kv_f32(float* x, int64_t x_stride, const float* rot, float* cache, const int64_t* slots, int64_t t,
                       int64_t h, int64_t kvh, int64_t d, int64_t S) {
#pragma omp parallel for schedule(static) if (t * (h + 2 * kvh) * d >= PARALLEL_MIN)
    for (int64_t r = 0; r < t; ++r) {
        float* row = x + r * x_stride;
        const float* cs = rot + r * d;
        for (int64_t a = 0; a < h + kvh; ++a) {
            float* v = row + a * d;
            for (int64_t p = 0; p < d; p += 2) {
                const float x0 = v[p], x1 = v[p + 1], c = cs[p], s = cs[p + 1];
                v[p] = x0 * c - x1 * s;
                v[p + 1] = x0 * s + x1 * c;
            }
        }
        const int64_t slot = slots[r];
        for (int64_t a = 0; a < kvh; ++a) {
            memcpy(cache + (a * S + slot) * d, row + (h + a) * d, sizeof(float) * d);
            memcpy(cache + ((kvh + a) * S + slot) * d, row + (h + kvh + a) * d, sizeof(float) * d);
        }
    }
}

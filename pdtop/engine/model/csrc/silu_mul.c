/* SwiGLU's activation in one pass: out[i, j] = silu(x[i, j]) * x[i, f + j] for the [n, 2f] output of
   the fused gate|up projection (rows `stride` floats apart), f a multiple of 16.

   torch does it in two passes with an allocation between them, each a parallel region; at decode
   sizes (batch 32, f 1536) waking the second thread costs more than the arithmetic. So below
   PARALLEL_MIN elements this runs on the calling thread alone, above it on its OpenMP team.
   silu(x) = x / (1 + e^-x), with e = exp(-|x|) <= 1 so only exp of non-positive values is needed:
   sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below. */
#include <stdint.h>

#include "vec16.h"

#define PARALLEL_MIN (1 << 18)

void pdtop_silu_mul_f32(const float* x, int64_t stride, float* out, int64_t n, int64_t f) {
#pragma omp parallel for schedule(static) if (n * f >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) {
        const float* g = x + i * stride;
        const float* u = g + f;
        float* o = out + i * f;
        for (int64_t j = 0; j < f; j += 16) {
            const v16 a = load16(g + j);
            const i16 neg = a < 0.f;
            const v16 e = exp16(-vmax(a, -a));
            const v16 num = (v16)((neg & (i16)e) | (~neg & (i16)splat(1.f)));
            store16(o + j, a * num / (1.f + e) * load16(u + j));
        }
    }
}

/* RMSNorm, optionally after the residual add, in one pass over each row: for rows of `dim` floats
   (dim a multiple of 16, rows contiguous), sum = x (+ delta), written to `sum_out` when delta is
   given, and out = sum / sqrt(mean(sum^2) + eps) * w.

   torch runs the add and the norm as seven ops, each a dispatch and a pass over the rows; at
   decode sizes the dispatches cost more than the arithmetic. Below PARALLEL_MIN elements this runs
   on the calling thread alone, above it on its OpenMP team. */
#include <math.h>
#include <stdint.h>

#include "vec16.h"

#define PARALLEL_MIN (1 << 18)

void pdtop_add_rms_norm_f32(const float* x, const float* delta, float* sum_out, const float* w, float* out,
                            int64_t n, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (n * dim >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) {
        const float* xi = x + i * dim;
        const float* s = xi;
        if (delta) {
            const float* di = delta + i * dim;
            float* si = sum_out + i * dim;
            for (int64_t j = 0; j < dim; j += 16) store16(si + j, load16(xi + j) + load16(di + j));
            s = si;
        }
        v16 acc = splat(0.f);
        for (int64_t j = 0; j < dim; j += 16) {
            const v16 v = load16(s + j);
            acc += v * v;
        }
        float ss = 0.f;
        for (int k = 0; k < 16; ++k) ss += acc[k];
        const v16 r = splat(1.f / sqrtf(ss / (float)dim + eps));
        float* oi = out + i * dim;
        for (int64_t j = 0; j < dim; j += 16) store16(oi + j, load16(s + j) * r * load16(w + j));
    }
}

/* Greedy decoding's argmax over each row of [n, vocab] float32 logits, as torch's: the first index
   of the maximum, or of the first NaN where a row has one.

   At batch 1 torch's (a chunked amax, then argmaxes; `sampling.greedy_tokens`) took 0.1-0.2 ms of
   a ~4 ms step right after the LM head had streamed the weights through the caches. Here: one
   vectorized pass for the maximum (and whether a NaN is there), then a scan for its first index, 16
   at a time. On the calling thread (an OpenMP region would wake a sleeping team). */
#include <stdint.h>

#include "vec16.h"

static int64_t row_argmax(const float* x, int64_t vocab) {
    const int64_t body = vocab / 16 * 16;
    v16 m = splat(x[0]);
    i16 nan = (i16){0};
    for (int64_t j = 0; j < body; j += 16) {
        const v16 v = load16(x + j);
        nan |= v != v;
        m = vmax(v, m);
    }
    float best = x[0];
    int any_nan = 0;
    for (int k = 0; k < 16; ++k) {
        any_nan |= nan[k] != 0;
        if (m[k] > best) best = m[k];
    }
    for (int64_t j = body; j < vocab; ++j) {
        any_nan |= x[j] != x[j];
        if (x[j] > best) best = x[j];
    }
    for (int64_t j = 0; j < body; j += 16) { /* the first block holding it, then its first lane */
        const v16 v = load16(x + j);
        const i16 hit = any_nan ? v != v : v == splat(best);
        int found = 0;
        for (int k = 0; k < 16; ++k) found |= hit[k] != 0;
        if (found)
            for (int k = 0; k < 16; ++k)
                if (hit[k]) return j + k;
    }
    for (int64_t j = body; j < vocab; ++j)
        if (any_nan ? x[j] != x[j] : x[j] == best) return j;
    return 0;
}

void pdtop_argmax_f32(const float* x, int64_t stride, int64_t n, int64_t vocab, int64_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = row_argmax(x + i * stride, vocab);
}

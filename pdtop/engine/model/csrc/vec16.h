/* 16-float vectors (GCC/Clang vector extensions; AVX-512 registers with -march=native where the
   CPU has them, pairs of AVX2 registers or less elsewhere), shared by the kernels in this folder. */
#ifndef PDTOP_VEC16_H
#define PDTOP_VEC16_H
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
#if defined(__clang__)
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (i16){__VA_ARGS__})
#endif
static inline v16 load16(const float* p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float* p, v16 v) { memcpy(p, &v, sizeof v); }
static inline v16 splat(float x) { return (v16){0} + x; }
static inline v16 vmax(v16 a, v16 b) { i16 m = a > b; return (v16)((m & (i16)a) | (~m & (i16)b)); }

/* exp(x) for x <= 0: 2^(x log2 e), the integer part in the exponent bits, the fraction by a degree-6
   polynomial (relative error about 2e-7); 0 where it underflows. */
static inline v16 exp16(v16 x) {
    x = x * 1.4426950408889634f;
    const i16 under = x < -126.f;
    x = vmax(x, splat(-126.f));
    i16 n = __builtin_convertvector(x, i16); /* toward zero; one less where that rounded up (x < 0) */
    n += (i16)(__builtin_convertvector(n, v16) > x);
    const v16 f = x - __builtin_convertvector(n, v16);
    v16 p = splat(1.5353362e-4f);
    p = p * f + 1.3398874e-3f;
    p = p * f + 9.6184197e-3f;
    p = p * f + 5.5503406e-2f;
    p = p * f + 2.4022650e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    const i16 e = (n + 127) << 23;
    return (v16)(~under & (i16)(p * (v16)e));
}

#endif

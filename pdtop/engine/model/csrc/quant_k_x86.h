/* The x86 paths of csrc/quant_k.c, included there (its types, unpack() and the block layouts):
   AVX2/FMA (`rows_avx2`: weights unpacked to unsigned bytes in registers, `maddubs` + `madd` by the
   scales) and, where the CPU has AVX-512 VNNI, the K dots 64 bytes per `maddubs` with the scales by
   `dpwssd` and the Q5 dots two blocks per 512-bit `dpbusd` (`rows_q5_512`). */
#ifdef HAVE_AVX2

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

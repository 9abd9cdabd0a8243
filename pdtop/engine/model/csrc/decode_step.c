/* A decode-only step's layers on a GGUF's blocks, in one call from Python (cpu_decode.py).

   Per layer, nine kernels of the other files, called through the function pointers cpu_decode.py
   hands over (each checked at load by cpu_kernels.py / quant_kernels.py): add + RMSNorm, the
   q|k|v matmul, RoPE with the K/V write, decode attention, the o matmul, add + RMSNorm, the
   gate|up matmul, SwiGLU, the down matmul. The same calls in the same order as the layers' own
   forward, so the same results bit for bit; what this saves is ~270 ctypes calls a step (about
   1.5 us each, a tenth of a batch-1 step). Runs on the calling thread, so each matmul runs on that
   thread's spin team or OpenMP team as when Python calls it. */
#include <stdint.h>

typedef int32_t (*QuantMatmul)(int32_t type, const uint8_t* w, int64_t out_f, int64_t in_f, const float* x,
                               int64_t n, float* y, int32_t path, int32_t tiled);
typedef int32_t (*QuantKMatmul)(int32_t type, const uint8_t* w, int64_t out_f, int64_t in_f, const float* x,
                                int64_t n, float* y, int32_t portable);
typedef void (*AddRmsNorm)(const float* x, const float* delta, float* sum_out, const float* w, float* out, int64_t n,
                           int64_t dim, float eps);
typedef void (*RopeKV)(float* x, int64_t x_stride, const float* rot, float* cache, const int64_t* slots, int64_t t,
                       int64_t h, int64_t kvh, int64_t d, int64_t S);
typedef void (*DecodeAttention)(const float* q, int64_t q_stride, const float* cache, const int64_t* slots,
                                const int64_t* lens, float* out, int64_t n, int64_t h, int64_t kvh, int64_t d,
                                int64_t S, int64_t L, float scale);
typedef void (*SiluMul)(const float* x, int64_t stride, float* out, int64_t n, int64_t f);

typedef struct {
    void* fn;        /* pdtop_quant_matmul (tails 2) or pdtop_quant_k_matmul (tails 1) */
    int64_t tails;   /* how many trailing int arguments fn takes */
    int64_t type;
    const uint8_t* w;
    int64_t out_f, in_f, a, b; /* a, b: the trailing arguments (path, tiled; or portable) */
} Matmul;

typedef struct {
    Matmul qkv, o, gate_up, down;
    const float* attn_norm;
    const float* mlp_norm;
    float attn_eps, mlp_eps;
} Layer;

typedef struct {
    void *norm, *rope_kv, *attend, *act;
    int64_t dim, h, kvh, d, ffn;
    float scale;
} Model;

typedef struct {
    float *x, *qkv, *attn, *o, *gate_up, *act, *delta;
} Buffers;

static int32_t matmul(const Matmul* m, const float* x, int64_t n, float* y) {
    if (m->tails == 2)
        return ((QuantMatmul)m->fn)((int32_t)m->type, m->w, m->out_f, m->in_f, x, n, y, (int32_t)m->a, (int32_t)m->b);
    return ((QuantKMatmul)m->fn)((int32_t)m->type, m->w, m->out_f, m->in_f, x, n, y, (int32_t)m->a);
}

/* Layers [start, end) on h [n, dim] (the residual stream, summed into in place); the last MLP's
   output is left in b->delta, not added. cache0: layer 0's [2, kvh, S, d] cache, layer i's is
   layer_floats further. Returns 0, or 1 + 4 * layer + which matmul (0 qkv, 1 o, 2 gate_up, 3 down)
   failed (out of memory; nothing after it ran). */
int64_t pdtop_decode_layers(const Model* m, const Layer* layers, int64_t start, int64_t end, float* h, int64_t n,
                            const Buffers* b, const float* rot, float* cache0, int64_t layer_floats, int64_t S,
                            const int64_t* slots, const int64_t* gather, const int64_t* lens, int64_t L) {
    const AddRmsNorm norm = (AddRmsNorm)m->norm;
    const RopeKV rope_kv = (RopeKV)m->rope_kv;
    const DecodeAttention attend = (DecodeAttention)m->attend;
    const SiluMul act = (SiluMul)m->act;
    const int64_t width = (m->h + 2 * m->kvh) * m->d;
    for (int64_t i = start; i < end; ++i) {
        const Layer* l = layers + i;
        float* cache = cache0 + i * layer_floats;
        if (i == start)
            norm(h, 0, 0, l->attn_norm, b->x, n, m->dim, l->attn_eps);
        else
            norm(h, b->delta, h, l->attn_norm, b->x, n, m->dim, l->attn_eps); /* h += the last MLP's output */
        if (matmul(&l->qkv, b->x, n, b->qkv)) return 1 + 4 * i;
        rope_kv(b->qkv, width, rot, cache, slots, n, m->h, m->kvh, m->d, S);
        attend(b->qkv, width, cache, gather, lens, b->attn, n, m->h, m->kvh, m->d, S, L, m->scale);
        if (matmul(&l->o, b->attn, n, b->o)) return 2 + 4 * i;
        norm(h, b->o, h, l->mlp_norm, b->x, n, m->dim, l->mlp_eps);
        if (matmul(&l->gate_up, b->x, n, b->gate_up)) return 3 + 4 * i;
        act(b->gate_up, 2 * m->ffn, b->act, n, m->ffn);
        if (matmul(&l->down, b->act, n, b->delta)) return 4 + 4 * i;
    }
    return 0;
}

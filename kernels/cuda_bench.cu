/*
 * cuda_bench.cu - per-kernel bandwidth at the 1.7B shapes, against a
 * device-to-device copy measured in the same process (kda-cli bench calls
 * cuda_bench_kernels). Times are medians of CUDA-event timings after a
 * warm-up; inputs are random (never zeros) and rotated where they would fit
 * in the 60 MB L2.
 */
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

extern "C" {
#include "kc_bench.h"
}

__global__ void fill_kernel(uint32_t *p, size_t n, uint32_t seed, uint32_t mask, uint32_t add)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = (x & mask) + add;
    }
}
/* random bf16 pairs in about [-1, 1]: sign, exponent 120..127, mantissa */
static void fill_bf16(void *p, size_t bytes, uint32_t seed)
{
    fill_kernel<<<1024, 256>>>((uint32_t *)p, bytes / 4, seed, 0x83FF83FFu, 0x3C003C00u);
}
static void fill_f32(void *p, size_t bytes, uint32_t seed)
{
    fill_kernel<<<1024, 256>>>((uint32_t *)p, bytes / 4, seed, 0x807FFFFFu, 0x3E000000u);
}

typedef void (*bench_fn)(void *ctx, int rep);

static float median_ms(bench_fn fn, void *ctx, int reps)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float ts[64];
    fn(ctx, 0);
    fn(ctx, 1);
    cudaDeviceSynchronize();
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(a);
        fn(ctx, r);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&ts[r], a, b);
    }
    for (int i = 0; i < reps; i++)
        for (int j = i + 1; j < reps; j++)
            if (ts[j] < ts[i]) {
                float t = ts[i];
                ts[i] = ts[j];
                ts[j] = t;
            }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ts[reps / 2];
}

typedef struct {
    void *src, *dst;
    size_t bytes;
} copy_ctx;
static void run_copy(void *c, int r)
{
    (void)r;
    copy_ctx *x = (copy_ctx *)c;
    cudaMemcpyAsync(x->dst, x->src, x->bytes, cudaMemcpyDeviceToDevice, 0);
}

typedef struct {
    uint16_t *W[4];
    int nw;
    int N, K, T, mode_in, mode_out;
    void *x, *y;
    cublasHandle_t h;
    int use_cublas;
} gemv_ctx;
static void run_gemv(void *c, int r)
{
    gemv_ctx *g = (gemv_ctx *)c;
    const uint16_t *W = g->W[r % g->nw];
    if (g->use_cublas)
        kc_gemm(g->h, (float *)g->y, g->N, (const uint16_t *)g->x, g->K, W, g->T, g->N, g->K, 0.0f, 0);
    else if (g->mode_out == KC_OUT_SWIGLU) /* N weight rows = N/2 gate|up pairs, bf16 out */
        kc_gemv(g->y, g->N / 2, W, g->N / 2, g->K, g->x, g->K, NULL, 0.0f, g->T, g->mode_in, g->mode_out, 0);
    else
        kc_gemv(g->y, g->N, W, g->N, g->K, g->x, g->K, NULL, 0.0f, g->T, g->mode_in, g->mode_out, 0);
}

static void run_kda(void *c, int r)
{
    (void)r;
    kc_kda_step((const kc_kda_args *)c, 0);
}

typedef struct {
    kc_gqa_args a;
    float *opart, *ml;
    int nsplit, split;
    uint16_t *out;
} attn_ctx;
static void run_attn(void *c, int r)
{
    (void)r;
    attn_ctx *x = (attn_ctx *)c;
    kc_gqa_attn(&x->a, x->opart, x->ml, x->nsplit, x->split, x->out, x->a.Hq * x->a.hd, 0);
}

static void run_qkv(void *c, int r)
{
    (void)r;
    kc_gqa_qkv((const kc_gqa_args *)c, 0);
}

typedef struct {
    kc_bench_row *rows;
    int n, max;
    double copy_tbs;
} bench_out;

static void emit(bench_out *o, const char *name, double bytes, float ms)
{
    if (o->n >= o->max) return;
    kc_bench_row *r = &o->rows[o->n++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->ms = ms;
    r->bytes = bytes;
    r->tbps = bytes / (ms * 1e-3) / 1e12;
    r->of_copy = o->copy_tbs > 0 ? r->tbps / o->copy_tbs : 0;
}

extern "C" int kc_bench_kernels(kc_bench_row *rows, int max)
{
    bench_out bo = {rows, 0, max, 0.0};
    /* copy ceiling: 2 GiB each way, bytes read + written */
    copy_ctx cc;
    cc.bytes = (size_t)2 << 30;
    if (cudaMalloc(&cc.src, cc.bytes) != cudaSuccess || cudaMalloc(&cc.dst, cc.bytes) != cudaSuccess) return -7;
    fill_f32(cc.src, cc.bytes, 1);
    float ms = median_ms(run_copy, &cc, 10);
    bo.copy_tbs = 2.0 * cc.bytes / (ms * 1e-3) / 1e12;
    emit(&bo, "d2d copy 2 GiB (read+write)", 2.0 * cc.bytes, ms);
    cudaFree(cc.src);
    cudaFree(cc.dst);

    /* GEMV vs cuBLAS at the 1.7B decode shapes; 4 weight copies rotated (> L2).
     * Every row goes through kc_gemv, so it times the variant (warps per row)
     * that kc_gemv picks for the shape; the last two rows are the decode
     * epilogues (o-proj += residual, gate|up -> SwiGLU) and have no cuBLAS twin. */
    cublasHandle_t h;
    cublasCreate(&h);
    const struct { const char *name; int N, K, out; } shp[] = {
        {"KDA q|k|v|f0|g0|b 6416x2048", 6416, 2048, KC_OUT_STORE},
        {"MLP gate|up 16128x2048", 16128, 2048, KC_OUT_STORE},
        {"MLP down 2048x8064", 2048, 8064, KC_OUT_STORE},
        {"logits 32000x2048", 32000, 2048, KC_OUT_STORE},
        {"o-proj 2048x2048 (+= residual)", 2048, 2048, KC_OUT_ADD},
        {"MLP gate|up 16128x2048 (swiglu)", 16128, 2048, KC_OUT_SWIGLU}};
    for (int s = 0; s < 6; s++) {
        for (int T = 1; T <= 16; T *= 4) {
            if (shp[s].out != KC_OUT_STORE && T > KC_GEMV_MAX_T) continue;
            gemv_ctx g;
            memset(&g, 0, sizeof g);
            g.nw = 4;
            g.N = shp[s].N, g.K = shp[s].K, g.T = T, g.h = h;
            g.mode_in = KC_IN_BF16, g.mode_out = shp[s].out;
            for (int i = 0; i < 4; i++) {
                cudaMalloc((void **)&g.W[i], (size_t)g.N * g.K * 2);
                fill_bf16(g.W[i], (size_t)g.N * g.K * 2, 10 + i);
            }
            cudaMalloc(&g.x, (size_t)T * g.K * 2);
            fill_bf16(g.x, (size_t)T * g.K * 2, 99);
            cudaMalloc(&g.y, (size_t)T * g.N * 4);
            fill_f32(g.y, (size_t)T * g.N * 4, 98); /* the residual of KC_OUT_ADD */
            const double bytes = (double)g.N * g.K * 2;
            char name[128];
            if (T <= KC_GEMV_MAX_T) {
                ms = median_ms(run_gemv, &g, 20);
                snprintf(name, sizeof name, "gemv T=%d %s", T, shp[s].name);
                emit(&bo, name, bytes, ms);
            }
            if (shp[s].out == KC_OUT_STORE) {
                g.use_cublas = 1;
                ms = median_ms(run_gemv, &g, 20);
                snprintf(name, sizeof name, "cublas T=%d %s", T, shp[s].name);
                emit(&bo, name, bytes, ms);
            }
            for (int i = 0; i < 4; i++) cudaFree(g.W[i]);
            cudaFree(g.x);
            cudaFree(g.y);
        }
    }
    cublasDestroy(h);

    /* KDA step: 16 heads of 128x128 fp32 state, read + written once */
    for (int B = 16; B <= 256; B *= 4) {
        const int H = 16, K = 128, V = 128, R = 128, HK = H * K, HV = H * V, C = 2 * HK + HV;
        kc_kda_args a;
        memset(&a, 0, sizeof a);
        a.ldp = C + 2 * R + H + 8;
        a.off_f0 = C, a.off_g0 = C + R, a.off_beta = C + 2 * R;
        a.H = H, a.K = K, a.V = V, a.R = R, a.taps = 4, a.eps = 1e-6f, a.n_items = B, a.ldy = HV;
        a.slot_stride = (size_t)H * K * V + 3 * C;
        int32_t *meta = (int32_t *)malloc((size_t)3 * B * 4);
        for (int i = 0; i < B; i++) meta[i] = i, meta[B + i] = 1, meta[2 * B + i] = i;
        int32_t *dmeta;
        cudaMalloc((void **)&dmeta, (size_t)3 * B * 4);
        cudaMemcpy(dmeta, meta, (size_t)3 * B * 4, cudaMemcpyHostToDevice);
        a.item_row0 = dmeta, a.item_ntok = dmeta + B, a.item_slot = dmeta + 2 * B;
        float *proj, *state, *vecs;
        uint16_t *w, *y;
        cudaMalloc((void **)&proj, (size_t)B * a.ldp * 4);
        cudaMalloc((void **)&state, a.slot_stride * B * 4);
        cudaMalloc((void **)&vecs, (size_t)(C * 4 + HV + H + HK + V) * 4);
        cudaMalloc((void **)&w, (size_t)R * (HK + HV) * 2);
        cudaMalloc((void **)&y, (size_t)B * HV * 2);
        fill_f32(proj, (size_t)B * a.ldp * 4, 3);
        cudaMemset(state, 0, a.slot_stride * B * 4);
        fill_f32(vecs, (size_t)(C * 4 + HV + H + HK + V) * 4, 5);
        fill_bf16(w, (size_t)R * (HK + HV) * 2, 6);
        a.proj = proj, a.state = state, a.convw = vecs, a.g_bias = vecs + C * 4, a.A_log = a.g_bias + HV;
        a.dt_bias = a.A_log + H, a.onorm = a.dt_bias + HK, a.f1t = w, a.g1t = w + (size_t)R * HK, a.y = y;
        float *lr;
        cudaMalloc((void **)&lr, (size_t)B * (HK + HV) * 4);
        a.lowrank = lr, a.lowrank_rows = B;
        char name[128];
        /* the block-per-head kernel (the column-tiled variant is in kernels/lab/),
         * then the stream path of one-token items (kc_kda_args.stream; tuning
         * kda_stream); each with fp32 state and with the state stored as bf16
         * (--kda-state-dtype bf16: half the bytes; the slot stride stays) */
        for (int st = 0; st < 2; st++)
            for (int bf = 0; bf < 2; bf++) {
                a.stream = st, a.state_bf16 = bf;
                ms = median_ms(run_kda, &a, 20);
                snprintf(name, sizeof name, "kda lowrank+%s%s B=%d (state read+write)", st ? "prep+stream" : "step",
                         bf ? " [bf16 state]" : "", B);
                emit(&bo, name, 2.0 * B * H * K * V * (bf ? 2 : 4), ms);
            }
        a.state_bf16 = 0, a.stream = 0;
        cudaFree(lr);
        cudaFree(proj), cudaFree(state), cudaFree(vecs), cudaFree(w), cudaFree(y), cudaFree(dmeta);
        free(meta);
    }

    /* decode attention over a paged cache: B=64, ctx 4096, 16 q / 4 kv heads, hd 128 */
    {
        const int B = 64, ctx = 4096, Hq = 16, Hkv = 4, hd = 128, blk = 16, mb = ctx / blk;
        attn_ctx x;
        memset(&x, 0, sizeof x);
        x.a.T = B, x.a.Hq = Hq, x.a.Hkv = Hkv, x.a.hd = hd, x.a.blk = blk, x.a.max_blocks = mb;
        x.a.block_stride = (size_t)2 * Hkv * blk * hd, x.a.layer_off = 0, x.a.off_gate = -1;
        int32_t *meta = (int32_t *)malloc(((size_t)2 * B + (size_t)B * mb) * 4);
        for (int i = 0; i < B; i++) meta[i] = ctx - 1, meta[B + i] = i;
        for (int i = 0; i < B * mb; i++) meta[2 * B + i] = (i * 7919) % (B * mb); /* scattered blocks */
        int32_t *dm;
        cudaMalloc((void **)&dm, ((size_t)2 * B + (size_t)B * mb) * 4);
        cudaMemcpy(dm, meta, ((size_t)2 * B + (size_t)B * mb) * 4, cudaMemcpyHostToDevice);
        x.a.tok_pos = dm, x.a.tok_slot = dm + B, x.a.block_table = dm + 2 * B;
        const size_t kv_bytes = (size_t)B * mb * x.a.block_stride * 2;
        cudaMalloc((void **)&x.a.kv, kv_bytes);
        fill_bf16(x.a.kv, kv_bytes, 7);
        cudaMalloc((void **)&x.a.q, (size_t)B * Hq * hd * 4);
        fill_f32(x.a.q, (size_t)B * Hq * hd * 4, 8);
        x.split = 256, x.nsplit = ctx / 256;
        cudaMalloc((void **)&x.opart, (size_t)B * Hq * x.nsplit * hd * 4);
        cudaMalloc((void **)&x.ml, (size_t)B * Hq * x.nsplit * 2 * 4);
        cudaMalloc((void **)&x.out, (size_t)B * Hq * hd * 2);
        ms = median_ms(run_attn, &x, 20);
        emit(&bo, "gqa decode attn B=64 ctx=4096 (K+V read)", (double)kv_bytes, ms);
        cudaFree(x.a.kv), cudaFree(x.a.q), cudaFree(x.opart), cudaFree(x.ml), cudaFree(x.out), cudaFree(dm);
        free(meta);
    }
    /* the prompt pass's GQA front: q/k RMSNorm, partial RoPE, q out (fp32), k and v
     * appended to the paged cache (bf16), 8192 rows of one sequence at the 1.7B shape
     * (16 q / 4 kv heads, hd 128, rope_dim 64); bytes: proj q|k|v read, q, K, V written */
    {
        const int T = 8192, Hq = 16, Hkv = 4, hd = 128, blk = 16, mb = T / blk;
        const int QD = Hq * hd, KD = Hkv * hd, ldp = QD + 2 * KD;
        kc_gqa_args a;
        memset(&a, 0, sizeof a);
        a.T = T, a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.blk = blk, a.max_blocks = mb, a.rope_dim = 64;
        a.ldp = ldp, a.off_q = 0, a.off_k = QD, a.off_v = QD + KD, a.off_gate = -1, a.eps = 1e-6f, a.theta = 10000.0;
        a.block_stride = (size_t)2 * Hkv * blk * hd, a.layer_off = 0;
        int32_t *meta = (int32_t *)malloc(((size_t)2 * T + mb) * 4);
        for (int i = 0; i < T; i++) meta[i] = i, meta[T + i] = 0;
        for (int i = 0; i < mb; i++) meta[2 * T + i] = i;
        int32_t *dm;
        cudaMalloc((void **)&dm, ((size_t)2 * T + mb) * 4);
        cudaMemcpy(dm, meta, ((size_t)2 * T + mb) * 4, cudaMemcpyHostToDevice);
        a.tok_pos = dm, a.tok_slot = dm + T, a.block_table = dm + 2 * T;
        double inv[32];
        for (int i = 0; i < 32; i++) inv[i] = pow(10000.0, -2.0 * i / 64);
        float *proj, *q, *nrm;
        double *dinv;
        cudaMalloc((void **)&proj, (size_t)T * ldp * 4);
        cudaMalloc((void **)&q, (size_t)T * QD * 4);
        cudaMalloc((void **)&nrm, (size_t)2 * hd * 4);
        cudaMalloc((void **)&dinv, sizeof inv);
        cudaMalloc((void **)&a.kv, (size_t)mb * a.block_stride * 2);
        cudaMemcpy(dinv, inv, sizeof inv, cudaMemcpyHostToDevice);
        fill_f32(proj, (size_t)T * ldp * 4, 11);
        fill_f32(nrm, (size_t)2 * hd * 4, 12);
        a.proj = proj, a.q = q, a.q_norm = nrm, a.k_norm = nrm + hd, a.rope_inv_freq = dinv;
        ms = median_ms(run_qkv, &a, 20);
        emit(&bo, "gqa q/k norm+rope+append T=8192 (read+write)",
             (double)T * ldp * 4 + (double)T * QD * 4 + (double)T * 2 * KD * 2, ms);
        cudaFree(proj), cudaFree(q), cudaFree(nrm), cudaFree(dinv), cudaFree(a.kv), cudaFree(dm);
        free(meta);
    }
    return cudaGetLastError() == cudaSuccess ? bo.n : -7;
}

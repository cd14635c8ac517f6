/*
 * test_kernels.c - every CUDA kernel against the fp32 reference in
 * engine/cpu_ops.h (and engine/sampling.c), on fresh random inputs, several
 * shapes including non-multiples of the tile sizes, outputs poisoned with NaN
 * before each run. Tolerances (MODEL_SPEC 7): bf16 outputs rel L2 <= 1e-2,
 * fp32 paths from bf16 inputs rel L2 <= 2e-3, fp32 state <= 1e-4.
 * Skips (77) without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <cublas_v2.h>

#include "cuda_ops.h"
#include "kt_util.h"
#include "sampling.h"

static void test_rmsnorm_matches_reference(void **st)
{
    (void)st;
    /* D 64 / 136 / 1000 / 2048 / 3000: the 16-byte kernel with 1, 1, 1, 2 and 4 float4s a
     * thread; 130 and 4100: the scalar one (D % 4 != 0, D > 4096) */
    const int shapes[][2] = {{1, 64}, {5, 2048}, {33, 136}, {7, 1000}, {3, 3000}, {4, 130}, {2, 4100}};
    for (int s = 0; s < 7; s++) {
        const int T = shapes[s][0], D = shapes[s][1];
        float *x = malloc((size_t)T * D * 4), *w = malloc((size_t)D * 4), *ref = malloc((size_t)T * D * 4);
        kt_fill(x, (size_t)T * D, 2.0f);
        for (int i = 0; i < D; i++) w[i] = 1.0f + 0.1f * kt_randn();
        int32_t rows[64];
        for (int t = 0; t < T; t++) rows[t] = T - 1 - t; /* gathered in reverse */
        for (int t = 0; t < T; t++) rmsnorm_f32(ref + (size_t)t * D, x + (size_t)rows[t] * D, w, D, 1e-6f);
        float *dx = kt_dev(x, (size_t)T * D * 4), *dw = kt_dev(w, (size_t)D * 4);
        int32_t *dr = kt_dev(rows, (size_t)T * 4);
        uint16_t *dout = kt_dev_poison((size_t)T * D * 2);
        assert_int_equal(kc_rmsnorm(dout, dx, dr, dw, T, D, 1e-6f, 0), 0);
        float *got = kt_get_bf16(dout, (size_t)T * D);
        double e = kt_rel(got, ref, (size_t)T * D);
        printf("rmsnorm T=%d D=%d rel %.2e\n", T, D, e);
        assert_true(e < 3e-3); /* bf16 output: each element within 2^-9 relative */
        free(x), free(w), free(ref), free(got);
        cudaFree(dx), cudaFree(dw), cudaFree(dr), cudaFree(dout);
    }
}

/* y = x W^T reference with bf16-rounded operands */
static void ref_matmul(float *y, const float *x, const float *W, int T, int N, int K)
{
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)x[(size_t)t * K + k] * W[(size_t)n * K + k];
            y[(size_t)t * N + n] = (float)s;
        }
}

static void test_gemv_and_gemm_match_reference(void **st)
{
    (void)st;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    /* split-K factors of the GEMV: 1/2/8 for the first three, 4 for 1030 x 8064;
     * 9001 x 256 has more row groups than blocks resident on an H200, so the
     * persistent GEMV walks several rows per warp */
    const int shapes[][2] = {{37, 64}, {2072, 2048}, {130, 8064}, {1030, 8064}, {9001, 256}};
    for (int s = 0; s < 5; s++) {
        const int N = shapes[s][0], K = shapes[s][1];
        float *W = malloc((size_t)2 * N * K * 4);
        kt_fill(W, (size_t)2 * N * K, 1.0f / sqrtf((float)K));
        kt_bf16_round(W, (size_t)2 * N * K);
        uint16_t *Wb = kt_to_bf16(W, (size_t)2 * N * K);
        uint16_t *dW = kt_dev(Wb, (size_t)2 * N * K * 2);
        const int Ts[] = {1, 3, 4, 8, 9, 70};
        for (int ti = 0; ti < 6; ti++) {
            const int T = Ts[ti];
            float *x = malloc((size_t)T * K * 4), *nw = malloc((size_t)K * 4), *xn = malloc((size_t)T * K * 4);
            float *ref = malloc((size_t)T * 2 * N * 4), *res = malloc((size_t)T * N * 4);
            kt_fill(x, (size_t)T * K, 1.5f);
            kt_fill(res, (size_t)T * N, 1.0f);
            for (int i = 0; i < K; i++) nw[i] = 1.0f + 0.1f * kt_randn();
            for (int t = 0; t < T; t++) rmsnorm_f32(xn + (size_t)t * K, x + (size_t)t * K, nw, K, 1e-6f);
            kt_bf16_round(xn, (size_t)T * K);
            float *dx = kt_dev(x, (size_t)T * K * 4), *dnw = kt_dev(nw, (size_t)K * 4);
            uint16_t *xnb = kt_to_bf16(xn, (size_t)T * K);
            uint16_t *dxn = kt_dev(xnb, (size_t)T * K * 2);
            ref_matmul(ref, xn, W, T, 2 * N, K); /* [T, 2N] over all 2N rows */
            if (T <= KC_GEMV_MAX_T) {
                /* store, normalised input */
                float *dy = kt_dev_poison((size_t)T * 2 * N * 4), *got = malloc((size_t)T * 2 * N * 4);
                assert_int_equal(kc_gemv(dy, 2 * N, dW, 2 * N, K, dx, K, dnw, 1e-6f, T, KC_IN_NORM, KC_OUT_STORE, 0), 0);
                kt_get(got, dy, (size_t)T * 2 * N * 4);
                double e = kt_rel(got, ref, (size_t)T * 2 * N);
                printf("gemv norm/store N=%d K=%d T=%d rel %.2e\n", 2 * N, K, T, e);
                assert_true(e < 2e-3);
                /* residual add, bf16 input, first N rows */
                float *want = malloc((size_t)T * N * 4);
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++) want[(size_t)t * N + n] = res[(size_t)t * N + n] + ref[(size_t)t * 2 * N + n];
                float *dres = kt_dev(res, (size_t)T * N * 4);
                assert_int_equal(kc_gemv(dres, N, dW, N, K, dxn, K, NULL, 0, T, KC_IN_BF16, KC_OUT_ADD, 0), 0);
                kt_get(got, dres, (size_t)T * N * 4);
                e = kt_rel(got, want, (size_t)T * N);
                printf("gemv bf16/add T=%d rel %.2e\n", T, e);
                assert_true(e < 2e-3);
                /* SwiGLU pairs: gate rows 0..N-1, up rows N..2N-1 */
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++)
                        want[(size_t)t * N + n] = silu_f32(ref[(size_t)t * 2 * N + n]) * ref[(size_t)t * 2 * N + N + n];
                uint16_t *dact = kt_dev_poison((size_t)T * N * 2);
                assert_int_equal(kc_gemv(dact, N, dW, N, K, dx, K, dnw, 1e-6f, T, KC_IN_NORM, KC_OUT_SWIGLU, 0), 0);
                float *gact = kt_get_bf16(dact, (size_t)T * N);
                e = kt_rel(gact, want, (size_t)T * N);
                printf("gemv swiglu T=%d rel %.2e\n", T, e);
                assert_true(e < 1e-2);
                free(got), free(want), free(gact);
                cudaFree(dy), cudaFree(dres), cudaFree(dact);
            }
            {   /* cuBLAS path: norm kernel + GEMM + SwiGLU kernel */
                uint16_t *dxn2 = kt_dev_poison((size_t)T * K * 2);
                assert_int_equal(kc_rmsnorm(dxn2, dx, NULL, dnw, T, K, 1e-6f, 0), 0);
                float *dy = kt_dev_poison((size_t)T * 2 * N * 4), *got = malloc((size_t)T * 2 * N * 4);
                assert_int_equal(kc_gemm(h, dy, 2 * N, dxn2, K, dW, T, 2 * N, K, 0.0f, 0), 0);
                kt_get(got, dy, (size_t)T * 2 * N * 4);
                double e = kt_rel(got, ref, (size_t)T * 2 * N);
                printf("gemm N=%d K=%d T=%d rel %.2e\n", 2 * N, K, T, e);
                assert_true(e < 2e-3);
                uint16_t *dact = kt_dev_poison((size_t)T * N * 2);
                assert_int_equal(kc_swiglu(dact, dy, T, N, 0), 0);
                float *gact = kt_get_bf16(dact, (size_t)T * N), *want = malloc((size_t)T * N * 4);
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++)
                        want[(size_t)t * N + n] = silu_f32(got[(size_t)t * 2 * N + n]) * got[(size_t)t * 2 * N + N + n];
                e = kt_rel(gact, want, (size_t)T * N);
                assert_true(e < 1e-2);
                /* bf16 gate|up (tuning gu_bf16): each element is the fp32 product rounded
                 * once (within one bf16 ulp of the reference's rounding: the sums differ in
                 * their last bits), then SwiGLU from it; N = 37 runs the scalar kernel, the
                 * others the 8-wide one */
                uint16_t *dy16 = kt_dev_poison((size_t)T * 2 * N * 2);
                assert_int_equal(kc_gemm_y16(h, dy16, 2 * N, dxn2, K, dW, T, 2 * N, K, 0), 0);
                float *g16 = kt_get_bf16(dy16, (size_t)T * 2 * N);
                /* cuBLAS may pick another algorithm for the bf16 output (split-K whose partial
                 * sums it reduces in bf16, measured at K = 8064, T = 3): an element may then
                 * differ from the rounded fp32 GEMM by its own bf16 ulp plus one bf16 ulp of the
                 * largest output; most are the rounding itself */
                float amax = 0.0f, worst = 0.0f;
                for (size_t i = 0; i < (size_t)T * 2 * N; i++) amax = fmaxf(amax, fabsf(got[i]));
                size_t off_ulp = 0, over = 0;
                for (size_t i = 0; i < (size_t)T * 2 * N; i++) {
                    const float r = bf16_to_f32(f32_to_bf16(got[i])), d = fabsf(g16[i] - got[i]);
                    if (g16[i] != r) off_ulp++;
                    worst = fmaxf(worst, d / (fabsf(got[i]) + amax));
                    if (d > fabsf(got[i]) * (1.0f / 128) + amax * (1.0f / 256)) over++;
                }
                printf("gemm y16 N=%d K=%d T=%d: %zu of %zu not the rounding of the fp32 GEMM, worst |d| / (|y| + max|y|) "
                       "%.2e, %zu over the bound\n", 2 * N, K, T, off_ulp, (size_t)T * 2 * N, worst, over);
                assert_true(over == 0); /* (K = 8064, T = 3: 309 of 780 differ, worst 1.6e-3) */
                uint16_t *dact16 = kt_dev_poison((size_t)T * N * 2);
                assert_int_equal(kc_swiglu_bf16(dact16, dy16, T, N, 0), 0);
                float *gact16 = kt_get_bf16(dact16, (size_t)T * N);
                for (int t = 0; t < T; t++)
                    for (int n = 0; n < N; n++) {
                        const float w = silu_f32(g16[(size_t)t * 2 * N + n]) * g16[(size_t)t * 2 * N + N + n];
                        /* one bf16 rounding of the fp32 product (the GPU's __expf-free siluf_ vs the CPU's) */
                        assert_true(fabsf(gact16[(size_t)t * N + n] - w) <= fabsf(w) * (1.0f / 128) + 1e-6f);
                    }
                free(g16), free(gact16);
                cudaFree(dy16), cudaFree(dact16);
                free(got), free(gact), free(want);
                cudaFree(dxn2), cudaFree(dy), cudaFree(dact);
            }
            free(x), free(nw), free(xn), free(ref), free(res), free(xnb);
            cudaFree(dx), cudaFree(dnw), cudaFree(dxn);
        }
        free(W), free(Wb);
        cudaFree(dW);
    }
    cublasDestroy(h);
}

static void test_embed_gathers_rows_and_zeroes_padding(void **st)
{
    (void)st;
    enum { V = 50, D = 72, T = 7 };
    float *E = malloc((size_t)V * D * 4);
    kt_fill(E, (size_t)V * D, 1.0f);
    kt_bf16_round(E, (size_t)V * D);
    uint16_t *Eb = kt_to_bf16(E, (size_t)V * D);
    int32_t ids[T] = {3, 0, 49, -1, 7, 7, 12};
    uint16_t *dE = kt_dev(Eb, (size_t)V * D * 2);
    int32_t *dids = kt_dev(ids, sizeof ids);
    float *dh = kt_dev_poison((size_t)T * D * 4), *h = malloc((size_t)T * D * 4);
    assert_int_equal(kc_embed(dh, dE, dids, T, D, 0), 0);
    kt_get(h, dh, (size_t)T * D * 4);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) assert_true(h[t * D + i] == (ids[t] < 0 ? 0.0f : E[(size_t)ids[t] * D + i]));
    free(E), free(Eb), free(h);
    cudaFree(dE), cudaFree(dids), cudaFree(dh);
}

/* ---- KDA step ---- */
#include "kda_step_cases.h"

static void test_kda_step_matches_reference(void **st)
{
    (void)st;
    /* with the low-rank pass (the backend's way) and without */
    for (int lr = 0; lr < 2; lr++) {
        { const int nt[] = {1, 3, 17, 2}, sl[] = {2, -1, 0, 3}; run_kda_case(2, 16, 4, nt, sl, 4, lr); }
        { const int nt[] = {1, 1, 1}, sl[] = {1, 3, 0}; run_kda_case(3, 64, 4, nt, sl, 3, lr); }
        { const int nt[] = {1, 5, 1, 70}, sl[] = {0, 1, -1, 3}; run_kda_case(4, 128, 4, nt, sl, 4, lr); }
        { const int nt[] = {2, 1}, sl[] = {1, 2}; run_kda_case(2, 32, 3, nt, sl, 2, lr); }
    }
}

/* The fla options at K 16 / 32 / 64 / 128, with and without the low-rank
 * scratch. */
static void test_kda_step_options_match_reference(void **st)
{
    (void)st;
    const kda_opts lb = {.lower_bound = -5.0f}, neg = {.neg_eigval = 1}, cb = {.conv_bias = 1};
    const kda_opts nc = {.no_conv = 1}, gva2 = {.group = 2}, gva4 = {.group = 4, .conv_bias = 1};
    const kda_opts all = {.group = 2, .lower_bound = -3.0f, .neg_eigval = 1, .conv_bias = 1};
    for (int lr = 0; lr < 2; lr++) {
        { const int nt[] = {1, 3, 17, 2}, sl[] = {2, -1, 0, 3}; run_kda_case_opt(2, 16, 4, nt, sl, 4, lr, &lb); }
        { const int nt[] = {1, 1, 9}, sl[] = {1, 3, 0}; run_kda_case_opt(3, 64, 4, nt, sl, 3, lr, &lb); }
        { const int nt[] = {1, 5, 1, 30}, sl[] = {0, 1, -1, 3}; run_kda_case_opt(2, 128, 4, nt, sl, 4, lr, &neg); }
        { const int nt[] = {2, 1, 11}, sl[] = {1, 2, 0}; run_kda_case_opt(2, 32, 3, nt, sl, 3, lr, &cb); }
        { const int nt[] = {1, 7}, sl[] = {1, 2}; run_kda_case_opt(2, 64, 4, nt, sl, 2, lr, &cb); }
        { const int nt[] = {1, 6, 1}, sl[] = {3, 0, -1}; run_kda_case_opt(2, 64, 4, nt, sl, 3, lr, &nc); }
        { const int nt[] = {1, 4, 13}, sl[] = {0, 2, 1}; run_kda_case_opt(4, 64, 4, nt, sl, 3, lr, &gva2); }
        { const int nt[] = {3, 1, 1}, sl[] = {2, -1, 1}; run_kda_case_opt(4, 16, 4, nt, sl, 3, lr, &gva4); }
        { const int nt[] = {1, 9}, sl[] = {3, 0}; run_kda_case_opt(4, 32, 2, nt, sl, 2, lr, &all); }
    }
}

/* bf16 state storage (--kda-state-dtype bf16) on the default step kernel:
 * every K, with and without the low-rank scratch, multi-token items, and
 * with the options that take the conv pass (the tail offset moves). */
static void test_kda_step_bf16_state(void **st)
{
    (void)st;
    const kda_opts bf = {.state_bf16 = 1}, bf_lb = {.state_bf16 = 1, .lower_bound = -5.0f};
    const kda_opts bf_gva = {.state_bf16 = 1, .group = 2, .conv_bias = 1};
    for (int lr = 0; lr < 2; lr++) {
        { const int nt[] = {1, 3, 17, 2}, sl[] = {2, -1, 0, 3}; run_kda_case_opt(2, 16, 4, nt, sl, 4, lr, &bf); }
        { const int nt[] = {1, 1, 1}, sl[] = {1, 3, 0}; run_kda_case_opt(3, 64, 4, nt, sl, 3, lr, &bf); }
        { const int nt[] = {1, 5, 1, 70}, sl[] = {0, 1, -1, 3}; run_kda_case_opt(4, 128, 4, nt, sl, 4, lr, &bf); }
        { const int nt[] = {2, 1}, sl[] = {1, 2}; run_kda_case_opt(2, 32, 3, nt, sl, 2, lr, &bf); }
        { const int nt[] = {1, 9}, sl[] = {1, 0}; run_kda_case_opt(3, 64, 4, nt, sl, 2, lr, &bf_lb); }
        { const int nt[] = {1, 4, 13}, sl[] = {0, 2, 1}; run_kda_case_opt(4, 64, 4, nt, sl, 3, lr, &bf_gva); }
    }
}

/* The stream path of decode steps (kc_kda_args.stream): kda_step_cases.h. */
static void test_kda_step_stream(void **st)
{
    (void)st;
    kda_stream_cases();
}

/* ---- GQA: qkv (norm + RoPE + append) and attention over a paged cache ---- */
/* window: sliding window (0 = all); scaled_rope: RoPE frequencies from a
 * table (rope_inv_freq) that is not theta's schedule; eps: the q/k norm eps */
static void run_gqa_case_opt(int Hq, int Hkv, int hd, int rope_dim, int gate, const int *pos0, const int *ntok,
                             int n_seq, int split, int window, int scaled_rope, float eps)
{
    const int blk = 16, max_blocks = 64, n_blocks = 200, n_gqa = 2, layer = 1;
    const size_t layer_elems = (size_t)2 * Hkv * blk * hd, block_elems = layer_elems * n_gqa;
    const int QD = Hq * hd, KD = Hkv * hd;
    const int off_q = 0, off_g = gate ? QD : -1, off_k = gate ? 2 * QD : QD, off_v = off_k + KD, ldp = off_v + KD + 1;
    int T = 0;
    for (int i = 0; i < n_seq; i++) T += ntok[i];
    int32_t *tpos = malloc((size_t)T * 4), *tslot = malloc((size_t)T * 4);
    int32_t *table = calloc((size_t)n_seq * max_blocks, 4);
    /* a shuffled block assignment, so paging bugs show */
    int next = 0;
    for (int i = 0; i < n_seq; i++)
        for (int b = 0; b < max_blocks && b * blk < pos0[i] + ntok[i]; b++) table[i * max_blocks + b] = (next++ * 37) % n_blocks;
    for (int i = 0, r = 0; i < n_seq; i++)
        for (int t = 0; t < ntok[i]; t++, r++) tpos[r] = pos0[i] + t, tslot[r] = i;
    float *proj = malloc((size_t)T * ldp * 4), *qn = malloc((size_t)hd * 4), *kn = malloc((size_t)hd * 4);
    kt_fill(proj, (size_t)T * ldp, 1.0f);
    for (int i = 0; i < hd; i++) qn[i] = 1.0f + 0.2f * kt_randn(), kn[i] = 1.0f + 0.2f * kt_randn();
    /* the cache: random history for positions < pos0, in bf16 */
    uint16_t *kv = malloc(block_elems * n_blocks * 2);
    for (size_t i = 0; i < block_elems * n_blocks; i++) kv[i] = f32_to_bf16(kt_randn());
    kc_gqa_args a;
    memset(&a, 0, sizeof a);
    a.proj = kt_dev(proj, (size_t)T * ldp * 4);
    a.ldp = ldp, a.off_q = off_q, a.off_k = off_k, a.off_v = off_v, a.off_gate = off_g;
    a.tok_pos = kt_dev(tpos, (size_t)T * 4);
    a.tok_slot = kt_dev(tslot, (size_t)T * 4);
    a.T = T;
    a.q_norm = kt_dev(qn, (size_t)hd * 4);
    a.k_norm = kt_dev(kn, (size_t)hd * 4);
    a.eps = eps;
    a.Hq = Hq, a.Hkv = Hkv, a.hd = hd, a.rope_dim = rope_dim, a.theta = 10000.0;
    a.window = window;
    /* a per-dimension table unlike theta^(-2i/d) (linear / llama3 scaling are tables like it) */
    double inv[64];
    for (int i = 0; i < rope_dim / 2; i++) inv[i] = pow(10000.0, -2.0 * i / rope_dim) * (i % 3 == 0 ? 0.125 : i % 3 == 1 ? 1.0 : 0.5);
    if (scaled_rope) a.rope_inv_freq = kt_dev(inv, sizeof inv);
    a.q = kt_dev_poison((size_t)T * QD * 4);
    a.kv = kt_dev(kv, block_elems * n_blocks * 2);
    a.block_stride = block_elems, a.layer_off = layer * layer_elems, a.blk = blk;
    a.block_table = kt_dev(table, (size_t)n_seq * max_blocks * 4);
    a.max_blocks = max_blocks;
    const int max_ctx = max_blocks * blk, nsplit = (max_ctx + split - 1) / split;
    float *opart = kt_dev_poison((size_t)T * Hq * nsplit * hd * 4), *ml = kt_dev_poison((size_t)T * Hq * nsplit * 2 * 4);
    uint16_t *dout = kt_dev_poison((size_t)T * QD * 2);
    assert_int_equal(kc_gqa_qkv(&a, 0), 0);
    assert_int_equal(kc_gqa_attn(&a, opart, ml, nsplit, split, dout, QD, 0), 0);
    float *got = kt_get_bf16(dout, (size_t)T * QD);
    uint16_t *kv_after = malloc(block_elems * n_blocks * 2);
    kt_get(kv_after, a.kv, block_elems * n_blocks * 2);

    /* reference per sequence */
    for (int i = 0, r0 = 0; i < n_seq; r0 += ntok[i], i++) {
        const int n_ctx = pos0[i] + ntok[i];
        float *kc = malloc((size_t)n_ctx * KD * 4), *vc = malloc((size_t)n_ctx * KD * 4);
        float *q = malloc((size_t)ntok[i] * QD * 4), *o = malloc((size_t)ntok[i] * QD * 4);
        for (int p = 0; p < pos0[i]; p++)
            for (int h = 0; h < Hkv; h++)
                for (int d = 0; d < hd; d++) {
                    const size_t base = (size_t)table[i * max_blocks + p / blk] * block_elems + layer * layer_elems;
                    kc[(size_t)p * KD + h * hd + d] = bf16_to_f32(kv[base + ((size_t)h * blk + p % blk) * hd + d]);
                    vc[(size_t)p * KD + h * hd + d] = bf16_to_f32(kv[base + ((size_t)(Hkv + h) * blk + p % blk) * hd + d]);
                }
        for (int t = 0; t < ntok[i]; t++) {
            const float *pr = proj + (size_t)(r0 + t) * ldp;
            const int p = pos0[i] + t;
            float *qt = q + (size_t)t * QD, *kt = kc + (size_t)p * KD, *vt = vc + (size_t)p * KD;
            for (int h = 0; h < Hq; h++) rmsnorm_f32(qt + h * hd, pr + off_q + h * hd, qn, hd, eps);
            for (int h = 0; h < Hkv; h++) rmsnorm_f32(kt + h * hd, pr + off_k + h * hd, kn, hd, eps);
            if (scaled_rope) {
                rope_freq(qt, Hq, hd, rope_dim, p, inv);
                rope_freq(kt, Hkv, hd, rope_dim, p, inv);
            } else {
                rope_partial(qt, Hq, hd, rope_dim, p, 10000.0);
                rope_partial(kt, Hkv, hd, rope_dim, p, 10000.0);
            }
            memcpy(vt, pr + off_v, (size_t)KD * 4);
            kt_bf16_round(kt, KD);
            kt_bf16_round(vt, KD);
            /* the appended K/V landed in the right paged slot */
            const size_t base = (size_t)table[i * max_blocks + p / blk] * block_elems + layer * layer_elems;
            for (int h = 0; h < Hkv; h++)
                for (int d = 0; d < hd; d++) {
                    float gk = bf16_to_f32(kv_after[base + ((size_t)h * blk + p % blk) * hd + d]);
                    float gv = bf16_to_f32(kv_after[base + ((size_t)(Hkv + h) * blk + p % blk) * hd + d]);
                    assert_true(fabsf(gk - kt[h * hd + d]) <= 1e-2f * (fabsf(kt[h * hd + d]) + 0.1f));
                    assert_true(gv == vt[h * hd + d]);
                }
        }
        gqa_attention_window_f32(o, q, kc, vc, ntok[i], pos0[i], Hq, Hkv, hd, window);
        if (gate)
            for (int t = 0; t < ntok[i]; t++)
                for (int c = 0; c < QD; c++) o[(size_t)t * QD + c] *= sigmoid_f32(proj[(size_t)(r0 + t) * ldp + off_g + c]);
        double e = kt_rel(got + (size_t)r0 * QD, o, (size_t)ntok[i] * QD);
        printf("gqa Hq=%d Hkv=%d hd=%d split=%d window=%d rope table %d eps %g seq %d (pos0 %d, %d tokens) rel %.2e\n",
               Hq, Hkv, hd, split, window, scaled_rope, eps, i, pos0[i], ntok[i], e);
        assert_true(e < 1e-2);
        free(kc), free(vc), free(q), free(o);
    }
    free(tpos), free(tslot), free(table), free(proj), free(qn), free(kn), free(kv), free(got), free(kv_after);
    cudaFree((void *)a.proj), cudaFree((void *)a.tok_pos), cudaFree((void *)a.tok_slot), cudaFree((void *)a.q_norm);
    cudaFree((void *)a.k_norm), cudaFree(a.q), cudaFree(a.kv), cudaFree((void *)a.block_table);
    cudaFree(opart), cudaFree(ml), cudaFree(dout);
    if (a.rope_inv_freq) cudaFree((void *)a.rope_inv_freq);
}

static void run_gqa_case(int Hq, int Hkv, int hd, int rope_dim, int gate, const int *pos0, const int *ntok, int n_seq,
                         int split)
{
    run_gqa_case_opt(Hq, Hkv, hd, rope_dim, gate, pos0, ntok, n_seq, split, 0, 0, 1e-6f);
}

static void test_gqa_attention_matches_reference(void **st)
{
    (void)st;
    { const int p0[] = {0, 5, 40}, nt[] = {9, 1, 1}; run_gqa_case(4, 2, 16, 8, 1, p0, nt, 3, 256); }
    { const int p0[] = {700, 0, 1, 31}, nt[] = {1, 1, 1, 2}; run_gqa_case(16, 4, 128, 32, 1, p0, nt, 4, 256); }
    { const int p0[] = {700, 300}, nt[] = {1, 3}; run_gqa_case(16, 4, 128, 32, 0, p0, nt, 2, 32); }
    { const int p0[] = {100, 7}, nt[] = {1, 20}; run_gqa_case(12, 6, 64, 64, 0, p0, nt, 2, 64); }
}

/* Sliding window (keys before p - W + 1 masked; windows shorter and longer
 * than a split, positions inside and past the first window), a RoPE frequency
 * table, a q/k norm eps of its own. */
static void test_gqa_options_match_reference(void **st)
{
    (void)st;
    { const int p0[] = {0, 5, 40, 700}, nt[] = {30, 1, 1, 3}; run_gqa_case_opt(4, 2, 16, 8, 1, p0, nt, 4, 256, 24, 0, 1e-6f); }
    { const int p0[] = {700, 0, 100}, nt[] = {1, 1, 2}; run_gqa_case_opt(16, 4, 128, 32, 1, p0, nt, 3, 32, 100, 0, 1e-6f); }
    { const int p0[] = {300, 2}, nt[] = {4, 9}; run_gqa_case_opt(8, 8, 64, 64, 0, p0, nt, 2, 64, 1, 0, 1e-6f); }
    { const int p0[] = {700, 300}, nt[] = {1, 3}; run_gqa_case_opt(16, 4, 128, 32, 0, p0, nt, 2, 32, 0, 1, 1e-6f); }
    { const int p0[] = {100, 7}, nt[] = {1, 20}; run_gqa_case_opt(12, 6, 64, 64, 1, p0, nt, 2, 64, 40, 1, 1e-3f); }
}

/* kc_add_bias: exactly y + bias on the first n columns, the rest of each row untouched */
static void test_add_bias_adds_exactly_the_bias(void **st)
{
    (void)st;
    enum { T = 5, N = 300, LD = 333 };
    float *y = malloc((size_t)T * LD * 4), *b = malloc((size_t)N * 4), *got = malloc((size_t)T * LD * 4);
    kt_fill(y, (size_t)T * LD, 1.0f);
    kt_fill(b, N, 1.0f);
    float *dy = kt_dev(y, (size_t)T * LD * 4), *db = kt_dev(b, (size_t)N * 4);
    assert_int_equal(kc_add_bias(dy, LD, db, T, N, 0), 0);
    kt_get(got, dy, (size_t)T * LD * 4);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < LD; c++) assert_true(got[t * LD + c] == (c < N ? y[t * LD + c] + b[c] : y[t * LD + c]));
    free(y), free(b), free(got);
    cudaFree(dy), cudaFree(db);
}

/* ---- sampling on the GPU = engine/sampling.c ---- */
static void test_sampler_matches_cpu_sampler(void **st)
{
    (void)st;
    const int vocabs[] = {300, 32000};
    for (int vi = 0; vi < 2; vi++) {
        const int vocab = vocabs[vi], n = 48;
        float *logits = malloc((size_t)n * vocab * 4);
        kt_fill(logits, (size_t)n * vocab, 3.0f);
        /* some exact ties, to pin the lowest-id rule */
        for (int r = 0; r < n; r += 5) logits[(size_t)r * vocab + 7] = logits[(size_t)r * vocab + 3] = 12.0f;
        int32_t hist[64 * 40];
        kc_logit_bias bias[64 * 3];
        kc_sample_param p[64];
        kda_sampling cs[64];
        memset(p, 0, sizeof p);
        memset(cs, 0, sizeof cs);
        for (int i = 0; i < n; i++) {
            kda_sampling *s = &cs[i];
            s->temperature = (i % 6 == 0) ? 0.0f : 0.3f + 1.5f * (float)kt_u01();
            s->top_k = (i % 3 == 1) ? 1 + (int)(kt_u01() * 50) : 0;
            s->top_p = (i % 4 == 2) ? 0.3f + 0.6f * (float)kt_u01() : 1.0f;
            s->min_p = (i % 5 == 3) ? 0.05f : 0.0f;
            s->repetition_penalty = (i % 7 == 4) ? 1.3f : 1.0f;
            s->presence_penalty = (i % 8 == 5) ? 0.5f : 0.0f;
            s->frequency_penalty = (i % 8 == 5) ? 0.25f : 0.0f;
            s->seed = 1000 + i;
            for (int k = 0; k < 40; k++) hist[i * 40 + k] = (int)(kt_u01() * 20); /* repeats */
            s->n_prompt = 25; /* history: 25 prompt tokens, then 15 generated */
            /* logit_bias on some rows: a ban of the best raw token, a boost, a repeated id */
            if (i % 4 == 3) {
                int best = 0;
                for (int v = 1; v < vocab; v++) best = logits[(size_t)i * vocab + v] > logits[(size_t)i * vocab + best] ? v : best;
                bias[i * 3 + 0] = (kc_logit_bias){best, -INFINITY};
                bias[i * 3 + 1] = (kc_logit_bias){(best + 11) % vocab, 2.5f};
                bias[i * 3 + 2] = (kc_logit_bias){(best + 11) % vocab, 0.5f};
                s->logit_bias = (const kda_logit_bias *)&bias[i * 3];
                s->n_logit_bias = 3;
            }
            p[i] = (kc_sample_param){.row = i, .temperature = s->temperature, .top_p = s->top_p, .min_p = s->min_p,
                                     .rep = s->repetition_penalty, .pres = s->presence_penalty,
                                     .freq = s->frequency_penalty, .top_k = s->top_k, .hist_off = i * 40,
                                     .n_prompt = 25, .n_gen = 15, .bias_off = i * 3, .n_bias = s->n_logit_bias,
                                     .n_top = 5, .seed = s->seed, .counter = 15};
        }
        float *dl = kt_dev(logits, (size_t)n * vocab * 4), *dlse = kt_dev_poison((size_t)n * 4);
        kc_sample_param *dp = kt_dev(p, sizeof p);
        int32_t *dh = kt_dev(hist, sizeof hist);
        kc_logit_bias *db = kt_dev(bias, sizeof bias);
        int *scratch = kt_dev(NULL, (size_t)n * vocab * 4);
        int32_t *dtok = kt_dev_poison(64 * 4), *dtop = kt_dev_poison(64 * 8 * 4);
        float *dlp = kt_dev_poison(64 * 4), *dtoplp = kt_dev_poison(64 * 8 * 4);
        assert_int_equal(kc_row_lse(dlse, dl, n, vocab, 0), 0);
        assert_int_equal(kc_sample(dp, n, dl, vocab, dlse, dh, db, scratch, dtok, dlp, dtop, dtoplp, 8, 0), 0);
        int32_t tok[64], top[64 * 8];
        float lp[64], toplp[64 * 8], lse[64];
        kt_get(tok, dtok, n * 4);
        kt_get(lp, dlp, n * 4);
        kt_get(top, dtop, n * 8 * 4);
        kt_get(toplp, dtoplp, n * 8 * 4);
        kt_get(lse, dlse, n * 4);
        void *work = calloc(1, sampling_work_bytes(vocab));
        int mism = 0;
        for (int i = 0; i < n; i++) {
            const float *lg = logits + (size_t)i * vocab;
            const float l_ref = logsumexp_f32(lg, vocab);
            assert_true(fabsf(lse[i] - l_ref) < 1e-4f * (1 + fabsf(l_ref)));
            int32_t want = sampling_draw(lg, vocab, &cs[i], hist + i * 40, 40, work);
            if (tok[i] != want) {
                mism++;
                printf("sampler row %d (T=%.2f k=%d p=%.2f minp=%.2f): gpu %d cpu %d\n", i, cs[i].temperature,
                       cs[i].top_k, cs[i].top_p, cs[i].min_p, tok[i], want);
            }
            assert_true(fabsf(lp[i] - (lg[tok[i]] - l_ref)) < 1e-4f);
            int32_t ids[5];
            float lps[5];
            sampling_top_n(lg, vocab, l_ref, 5, ids, lps);
            for (int k = 0; k < 5; k++) {
                assert_int_equal(top[i * 8 + k], ids[k]);
                assert_true(fabsf(toplp[i * 8 + k] - lps[k]) < 1e-4f);
            }
        }
        printf("sampler vocab %d: %d/%d draws differ\n", vocab, mism, n);
        assert_int_equal(mism, 0);
        free(logits), free(work);
        cudaFree(dl), cudaFree(dlse), cudaFree(dp), cudaFree(dh), cudaFree(db), cudaFree(scratch);
        cudaFree(dtok), cudaFree(dtop), cudaFree(dlp), cudaFree(dtoplp);
    }
}

int main(int argc, char **argv)
{
    kt_skip_without_gpu();
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* e.g. test_kda_step_stream */
    /* the backend's launch policy (KDA_TUNING=pdl=0: PDL off) */
    kda_tuning tn;
    char err[256];
    kda_tuning_defaults(&tn);
    if (kda_tuning_from_env(&tn, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    kc_set_pdl(tn.pdl);
    kc_set_gemv_persist(tn.gemv_persist);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed_gathers_rows_and_zeroes_padding),
        cmocka_unit_test(test_rmsnorm_matches_reference),
        cmocka_unit_test(test_gemv_and_gemm_match_reference),
        cmocka_unit_test(test_kda_step_matches_reference),
        cmocka_unit_test(test_kda_step_options_match_reference),
        cmocka_unit_test(test_kda_step_bf16_state),
        cmocka_unit_test(test_kda_step_stream),
        cmocka_unit_test(test_gqa_attention_matches_reference),
        cmocka_unit_test(test_gqa_options_match_reference),
        cmocka_unit_test(test_add_bias_adds_exactly_the_bias),
        cmocka_unit_test(test_sampler_matches_cpu_sampler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

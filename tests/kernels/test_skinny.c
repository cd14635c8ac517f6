/*
 * test_skinny.c - the skinny decode GEMM (kernels/skinny_gemm.h) against a
 * float64 reference on random bf16 inputs, on the GPU (exit 77 without one)
 * and, built with -DKC_EMU, on the CPU emulator of emu/ (small shapes; meson
 * test skinny_emu).
 *
 * Every case (T rows, [N, K] weight, split ks, output mode store / add / bf16)
 * runs on buffers with padding (ldx > K, ldy > N, rows past T) poisoned with
 * NaN (store, bf16) or filled with random values (add), then checks
 *   each y element   |y - ref| <= 4e-6 * sum_k |w x| + 1e-6 * |y_old| + 1e-6
 *                    (bf16 y: + |ref| / 256, one rounding of the fp32 sum);
 *                    the fp32 sum's own rounding is far below this bound, and
 *                    one missing or doubled product term is far above it in
 *                    almost every element;
 *   the padding      bitwise unchanged;
 *   the counters     back to zero (split-K), so a second run is valid;
 *   a second run     bitwise equal to the first (deterministic split-K);
 * and that unsupported arguments launch nothing and return 1.
 *
 *   test_skinny              the cases (KDA_SKINNY_TEST_QUICK=1: the small shapes
 *                            only, for compute-sanitizer)
 *   test_skinny --bench      the decode GEMM shapes of DM-KDAGQA-1.7B at T = 2..64:
 *     isolated: every (rows, ks) of the kernel, the best, cublasGemmEx and the
 *       cuBLAS path (the cuBLASLt plan kc_gemm_lt_tune picks with the skinny
 *       kernel left out), each call alone with L2 flushed before it (memset);
 *     sequence: 24 copies of the weight multiplied back to back in one CUDA
 *       graph (cold by construction, as a decode step meets them; no flush),
 *       the kernel at its best isolated (rows, ks) with PDL on against the
 *       tuned cuBLAS path: microseconds per GEMM;
 *   all as time and as a fraction of the copy bandwidth measured in the same run.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kt_util.h"
#include "skinny_gemm.h"

#ifndef KC_EMU
#include <cublas_v2.h>

#include "cuda_gemm.h"
#include "cuda_ops.h"
#include "cuda_plan.h"
#endif

static int g_fail, g_cases;

static uint16_t *rand_bf16(size_t n, float scale)
{
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(kt_randn() * scale);
    return h;
}

/* ref[t][n] = sum_k W[n][k] x[t][k], mag[t][n] = sum_k |W x|, float64 */
static void reference(const uint16_t *W, const uint16_t *x, int ldx, int T, int N, int K, double *ref, double *mag)
{
    float *xf = malloc((size_t)K * 4), *wf = malloc((size_t)K * 4);
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) xf[k] = bf16_to_f32(x[(size_t)t * ldx + k]);
        for (int n = 0; n < N; n++) {
            const uint16_t *w = W + (size_t)n * K;
            double s = 0, m = 0;
            for (int k = 0; k < K; k++) {
                const double p = (double)bf16_to_f32(w[k]) * xf[k];
                s += p, m += fabs(p);
            }
            ref[(size_t)t * N + n] = s, mag[(size_t)t * N + n] = m;
        }
    }
    free(xf), free(wf);
}

typedef struct {
    int N, K, ldx, ldy, Tpad;
    uint16_t *W, *x;        /* host */
    void *dW, *dx, *dy;     /* device */
    float *ws;
    unsigned *cnt;
} problem;

enum { M_STORE, M_ADD, M_BF16 };
static const char *mode_name[] = {"store", "add", "bf16"};

/* one (T, ks, block rows, mode) on problem p with reference ref/mag (T rows) */
static void run_case(problem *p, int T, int ks, int rows_blk, int mode, const double *ref, const double *mag)
{
    g_cases++;
    const int N = p->N, ldy = p->ldy, rows = p->Tpad;
    const size_t es = mode == M_BF16 ? 2 : 4, ny = (size_t)rows * ldy;
    /* y before: NaN poison (store, bf16) or random (add) */
    void *y0 = malloc(ny * es);
    if (mode == M_ADD) {
        float *f = y0;
        for (size_t i = 0; i < ny; i++) f[i] = kt_randn();
    } else {
        memset(y0, 0xFF, ny * es);
    }
    void *y1 = malloc(ny * es), *y2 = malloc(ny * es);
    int rc1 = -99, rc2 = -99;
    KT_CK(cudaMemcpy(p->dy, y0, ny * es, cudaMemcpyHostToDevice));
    rc1 = kc_gemm_skinny(p->dy, mode == M_BF16, ldy, p->dx, p->ldx, p->dW, T, N, p->K, mode == M_ADD ? 1.0f : 0.0f,
                         ks, rows_blk, p->ws, p->cnt, 0);
    kt_get(y1, p->dy, ny * es);
    KT_CK(cudaMemcpy(p->dy, y0, ny * es, cudaMemcpyHostToDevice));
    rc2 = kc_gemm_skinny(p->dy, mode == M_BF16, ldy, p->dx, p->ldx, p->dW, T, N, p->K, mode == M_ADD ? 1.0f : 0.0f,
                         ks, rows_blk, p->ws, p->cnt, 0);
    kt_get(y2, p->dy, ny * es);
    int cnt_bad = 0;
    const int nc = kc_skinny_cnt_len(N);
    unsigned *hc = malloc((size_t)nc * sizeof(unsigned));
    kt_get(hc, p->cnt, (size_t)nc * sizeof(unsigned));
    for (int i = 0; i < nc; i++) cnt_bad += hc[i] != 0;
    free(hc);

    size_t bad = 0, pad_bad = 0, first = (size_t)-1;
    double worst = 0;
    for (int t = 0; t < rows; t++)
        for (int n = 0; n < ldy; n++) {
            const size_t o = (size_t)t * ldy + n;
            if (t >= T || n >= N) {
                pad_bad += memcmp((char *)y1 + o * es, (char *)y0 + o * es, es) != 0;
                continue;
            }
            const double r = ref[(size_t)t * N + n], m = mag[(size_t)t * N + n];
            double got, old = 0;
            if (mode == M_BF16) {
                got = bf16_to_f32(((uint16_t *)y1)[o]);
            } else {
                got = ((float *)y1)[o];
                if (mode == M_ADD) old = ((float *)y0)[o];
            }
            const double want = r + old;
            const double tol = 4e-6 * m + 1e-6 * fabs(old) + 1e-6 + (mode == M_BF16 ? fabs(want) / 256 : 0);
            const double e = fabs(got - want);
            if (!(e <= tol)) {
                if (!bad) first = o;
                bad++;
            }
            if (e / (tol > 0 ? tol : 1) > worst || isnan(e)) worst = isnan(e) ? INFINITY : e / tol;
        }
    const int nondet = memcmp(y1, y2, ny * es) != 0;
    const int ok = rc1 == 0 && rc2 == 0 && !bad && !pad_bad && !nondet && !cnt_bad;
    printf("%s T=%2d N=%5d K=%4d ldx=%4d ldy=%5d ks=%2d rows=%3d %-5s: worst err/tol %.3f%s%s%s%s\n",
           ok ? "ok  " : "FAIL", T, N, p->K, p->ldx, ldy, ks, rows_blk, mode_name[mode], worst, bad ? " VALUES" : "", pad_bad ? " PADDING" : "",
           nondet ? " NONDETERMINISTIC" : "", cnt_bad ? " COUNTERS" : "");
    if (!ok) {
        g_fail++;
        if (rc1 || rc2) printf("      rc %d %d\n", rc1, rc2);
        if (bad) printf("      %zu bad of %zu, first at row %zu col %zu\n", bad, (size_t)T * N, first / ldy, first % ldy);
        if (cnt_bad) {
            unsigned zero = 0;
            for (int i = 0; i < nc; i++) KT_CK(cudaMemcpy(p->cnt + i, &zero, sizeof zero, cudaMemcpyHostToDevice));
        }
    }
    free(y0), free(y1), free(y2);
}

static void problem_init(problem *p, int N, int K, int ldx_extra, int ldy_extra, int Tmax, int ks_max)
{
    memset(p, 0, sizeof *p);
    p->N = N, p->K = K, p->ldx = K + ldx_extra, p->ldy = N + ldy_extra, p->Tpad = Tmax + 3;
    p->W = rand_bf16((size_t)N * K, 1.0f);
    p->x = rand_bf16((size_t)p->Tpad * p->ldx, 1.0f);
    p->dW = kt_dev(p->W, (size_t)N * K * 2);
    p->dx = kt_dev(p->x, (size_t)p->Tpad * p->ldx * 2);
    p->dy = kt_dev(NULL, (size_t)p->Tpad * p->ldy * 4);
    const size_t wsb = kc_skinny_ws_bytes(Tmax, N, ks_max);
    p->ws = kt_dev_poison(wsb ? wsb : 16);
    p->cnt = kt_dev(NULL, (size_t)kc_skinny_cnt_len(N) * sizeof(unsigned));
    KT_CK(cudaMemset(p->cnt, 0, (size_t)kc_skinny_cnt_len(N) * sizeof(unsigned)));
}

static void problem_free(problem *p)
{
    free(p->W), free(p->x);
    cudaFree(p->dW), cudaFree(p->dx), cudaFree(p->dy), cudaFree(p->ws), cudaFree(p->cnt);
}

/* every (T, ks, mode) of the lists on one weight shape */
static void run_shape(int N, int K, int ldx_extra, int ldy_extra, const int *Ts, int nT, const int *kss, int nks)
{
    int Tmax = 0, ksmax = 1;
    for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    for (int i = 0; i < nks; i++) ksmax = kss[i] > ksmax ? kss[i] : ksmax;
    problem p;
    problem_init(&p, N, K, ldx_extra, ldy_extra, Tmax, ksmax);
    double *ref = malloc((size_t)Tmax * N * sizeof(double)), *mag = malloc((size_t)Tmax * N * sizeof(double));
    reference(p.W, p.x, p.ldx, Tmax, N, K, ref, mag); /* row t of the reference does not depend on T */
    for (int i = 0; i < nT; i++)
        for (int j = 0; j < nks; j++) {
            if (kss[j] > K / 128) continue;
            for (int rw = 64; rw <= 128; rw += 64)
                for (int m = 0; m < 3; m++) run_case(&p, Ts[i], kss[j], rw, m, ref, mag);
        }
    free(ref), free(mag);
    problem_free(&p);
}

/* arguments the kernel does not take: 1, nothing written */
static void check_rejects(void)
{
    problem p;
    problem_init(&p, 100, 256, 8, 0, 8, 2);
    const size_t ny = (size_t)p.Tpad * p.ldy;
    KT_CK(cudaMemset(p.dy, 0xFF, ny * 4));
    struct {
        const char *what;
        int T, K, ldx, ks, rows, xoff;
        float beta;
        int ybf;
    } c[] = {
        {"T = 0", 0, 128, 136, 1, 64, 0, 0.0f, 0},
        {"T = 65", 65, 128, 136, 1, 64, 0, 0.0f, 0},
        {"K % 128", 8, 192, 200, 1, 64, 0, 0.0f, 0},
        {"ldx % 8", 8, 128, 132, 1, 64, 0, 0.0f, 0},
        {"x misaligned", 8, 128, 136, 1, 64, 1, 0.0f, 0},
        {"ks > K / 128", 8, 128, 136, 2, 64, 0, 0.0f, 0},
        {"rows 96", 8, 128, 136, 1, 96, 0, 0.0f, 0},
        {"beta 0.5", 8, 128, 136, 1, 64, 0, 0.5f, 0},
        {"bf16 with beta 1", 8, 128, 136, 1, 64, 0, 1.0f, 1},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        g_cases++;
        const int rc = kc_gemm_skinny(p.dy, c[i].ybf, p.ldy, (const uint16_t *)p.dx + c[i].xoff, c[i].ldx, p.dW, c[i].T,
                                      p.N, c[i].K, c[i].beta, c[i].ks, c[i].rows, p.ws, p.cnt, 0);
        if (rc != 1) {
            printf("FAIL reject %s: rc %d\n", c[i].what, rc);
            g_fail++;
        }
    }
    g_cases++;
    if (kc_gemm_skinny(p.dy, 0, p.ldy, p.dx, p.ldx, p.dW, 8, p.N, p.K, 0.0f, 2, 64, NULL, p.cnt, 0) != 1) {
        printf("FAIL reject ks = 2 without workspace\n");
        g_fail++;
    }
    uint32_t *h = malloc(ny * 4);
    kt_get(h, p.dy, ny * 4);
    size_t touched = 0;
    for (size_t i = 0; i < ny; i++) touched += h[i] != 0xFFFFFFFFu;
    if (touched) {
        printf("FAIL rejected calls wrote %zu elements of y\n", touched);
        g_fail++;
    }
    free(h);
    problem_free(&p);
}

#ifndef KC_EMU
/* ---- benchmark ---- */
#define BENCH_REPS 20
static void *g_flush;
static size_t g_flush_bytes;

typedef int (*launch_fn)(void *ctx);
static float time_us(launch_fn f, void *ctx)
{
    cudaEvent_t a[BENCH_REPS], b[BENCH_REPS];
    for (int r = 0; r < BENCH_REPS; r++) cudaEventCreate(&a[r]), cudaEventCreate(&b[r]);
    for (int i = 0; i < 3; i++) f(ctx);
    for (int r = 0; r < BENCH_REPS; r++) {
        if (g_flush_bytes) cudaMemsetAsync(g_flush, r, g_flush_bytes, 0);
        cudaEventRecord(a[r], 0);
        f(ctx);
        cudaEventRecord(b[r], 0);
    }
    KT_CK(cudaDeviceSynchronize());
    float t[BENCH_REPS];
    for (int r = 0; r < BENCH_REPS; r++) cudaEventElapsedTime(&t[r], a[r], b[r]);
    for (int i = 1; i < BENCH_REPS; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            const float v = t[j];
            t[j] = t[j - 1], t[j - 1] = v;
        }
    for (int r = 0; r < BENCH_REPS; r++) cudaEventDestroy(a[r]), cudaEventDestroy(b[r]);
    return 500.0f * (t[BENCH_REPS / 2 - 1] + t[BENCH_REPS / 2]);
}

#define SEQ 24 /* weights of a sequence */
typedef struct {
    void *y, *x, *W;
    int ybf, T, N, K, ks, rows;
    float beta;
    float *ws;
    unsigned *cnt;
    cublasHandle_t h;
    kc_gemm_lt *lt;
    void *Wseq[SEQ];
    cudaStream_t cs;      /* the sequences' stream (captured) */
    cudaStream_t cur;     /* where the cuBLAS path launches: 0, cs while capturing */
    cudaGraphExec_t gexec; /* the captured sequence */
} bench_ctx;

static int run_skinny(void *c_)
{
    bench_ctx *c = c_;
    return kc_gemm_skinny(c->y, c->ybf, c->N, c->x, c->K, c->W, c->T, c->N, c->K, c->beta, c->ks, c->rows, c->ws,
                          c->cnt, 0);
}
static int run_cublas(void *c_)
{
    bench_ctx *c = c_;
    return c->ybf ? kc_gemm_y16(c->h, c->y, c->N, c->x, c->K, c->W, c->T, c->N, c->K, 0)
                  : kc_gemm(c->h, c->y, c->N, c->x, c->K, c->W, c->T, c->N, c->K, c->beta, 0);
}
/* the backend's path: the tuned plan, else cublasGemmEx */
static int run_prod_w(bench_ctx *c, const void *W)
{
    const int rc = c->ybf ? kc_gemm_lt_run_y16(c->lt, c->y, c->N, c->x, c->K, W, c->T, c->N, c->K, c->cur)
                          : kc_gemm_lt_run(c->lt, c->y, c->N, c->x, c->K, W, c->T, c->N, c->K, c->beta, c->cur);
    if (rc <= 0) return rc;
    return c->ybf ? kc_gemm_y16(c->h, c->y, c->N, c->x, c->K, W, c->T, c->N, c->K, c->cur)
                  : kc_gemm(c->h, c->y, c->N, c->x, c->K, W, c->T, c->N, c->K, c->beta, c->cur);
}
static int run_prod(void *c_) { return run_prod_w(c_, ((bench_ctx *)c_)->W); }
static int seq_prod(bench_ctx *c)
{
    for (int i = 0; i < SEQ; i++)
        if (run_prod_w(c, c->Wseq[i])) return 1;
    return 0;
}
static int seq_skinny(bench_ctx *c)
{
    for (int i = 0; i < SEQ; i++)
        if (kc_gemm_skinny(c->y, c->ybf, c->N, c->x, c->K, c->Wseq[i], c->T, c->N, c->K, c->beta, c->ks, c->rows,
                           c->ws, c->cnt, c->cs))
            return 1;
    return 0;
}
static int run_graph(void *c_) { return cudaGraphLaunch(((bench_ctx *)c_)->gexec, 0) != cudaSuccess; }
/* the sequence captured into a CUDA graph, as the backend replays a decode
 * step, timed without flushing (its 24 weights are cold by construction) */
static float time_seq_us(bench_ctx *c, int (*seq)(bench_ctx *))
{
    cudaGraph_t gr;
    cublasSetStream(c->h, c->cs);
    c->cur = c->cs;
    KT_CK(cudaStreamBeginCapture(c->cs, cudaStreamCaptureModeThreadLocal));
    const int rc = seq(c);
    KT_CK(cudaStreamEndCapture(c->cs, &gr));
    c->cur = 0;
    if (rc) return -1.0f;
    KT_CK(cudaGraphInstantiate(&c->gexec, gr, 0));
    const size_t keep = g_flush_bytes;
    g_flush_bytes = 0;
    const float us = time_us(run_graph, c) / SEQ;
    g_flush_bytes = keep;
    cudaGraphExecDestroy(c->gexec);
    cudaGraphDestroy(gr);
    cublasSetStream(c->h, 0);
    return us;
}
static int run_copy(void *c_)
{
    bench_ctx *c = c_;
    return cudaMemcpyAsync(c->y, c->x, (size_t)c->N * c->K, cudaMemcpyDeviceToDevice, 0) != cudaSuccess;
}

static int bench(void)
{
    int dev = 0, l2 = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
    g_flush_bytes = (size_t)(l2 > 0 ? l2 : 64 << 20) * 2;
    KT_CK(cudaMalloc(&g_flush, g_flush_bytes));
    bench_ctx c = {0};
    if (cublasCreate(&c.h) != CUBLAS_STATUS_SUCCESS) return 1;
    void *ltws = NULL;
    KT_CK(cudaMalloc(&ltws, CP_CUBLAS_WS));
    c.lt = kc_gemm_lt_create(CP_CUBLAS_WS, ltws, 0, 1, 1, 0); /* cuBLAS only */
    if (!c.lt) return 1;
    KT_CK(cudaStreamCreateWithFlags(&c.cs, cudaStreamNonBlocking));
    double copy_gbs;
    /* copy bandwidth: 1 GiB device to device, read + write */
    {
        bench_ctx cc = {0};
        cc.N = 1 << 15, cc.K = 1 << 15; /* bytes = N * K */
        KT_CK(cudaMalloc(&cc.x, (size_t)cc.N * cc.K));
        KT_CK(cudaMalloc(&cc.y, (size_t)cc.N * cc.K));
        const float us = time_us(run_copy, &cc);
        copy_gbs = 2.0 * cc.N * cc.K / (us * 1e-6) * 1e-9;
        printf("copy: %.0f GB/s (1 GiB device to device, read + write)\n", copy_gbs);
        cudaFree(cc.x), cudaFree(cc.y);
    }
    static const struct {
        const char *name;
        int N, K, ybf;
        float beta;
    } sh[] = {
        {"kda in-proj", 6416, 2048, 0, 0.0f}, {"kda o-proj", 2048, 2048, 0, 1.0f}, {"gate|up", 16128, 2048, 1, 0.0f},
        {"down", 2048, 8064, 0, 1.0f},        {"lm-head", 32000, 2048, 0, 0.0f},
    };
    static const int Ts[] = {2, 4, 8, 16, 32, 64}, kss[] = {1, 2, 3, 4, 6, 8, 12, 16};
    printf("isolated (L2 flushed before each call): skinny us by ks 1 2 3 4 6 8 12 16, rows 64 then 128; its best;\n"
           "cublasGemmEx; prod = the tuned cuBLASLt plan (skinny left out); prod / best.\n"
           "sequence (%d copies of the weight back to back in a CUDA graph, PDL on): us per GEMM, skinny at its best (rows, ks)\n"
           "against prod.\n", SEQ);
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        const int N = sh[i].N, K = sh[i].K, Tm = 64;
        KT_CK(cudaMalloc(&c.W, (size_t)N * K * 2));
        KT_CK(cudaMalloc(&c.x, (size_t)Tm * K * 2));
        KT_CK(cudaMalloc(&c.y, (size_t)Tm * N * 4));
        const size_t wsb = kc_skinny_ws_bytes(Tm, N, 16);
        KT_CK(cudaMalloc((void **)&c.ws, wsb));
        KT_CK(cudaMalloc((void **)&c.cnt, (size_t)kc_skinny_cnt_len(N) * 4));
        KT_CK(cudaMemset(c.cnt, 0, (size_t)kc_skinny_cnt_len(N) * 4));
        KT_CK(cudaMemset(c.y, 0, (size_t)Tm * N * 4));
        kc_gemm_lt_fill_bf16(c.W, (size_t)N * K, 7u, 0);
        for (int q = 0; q < SEQ; q++) {
            KT_CK(cudaMalloc(&c.Wseq[q], (size_t)N * K * 2));
            kc_gemm_lt_fill_bf16(c.Wseq[q], (size_t)N * K, 100u + q, 0);
        }
        kc_gemm_lt_fill_bf16(c.x, (size_t)Tm * K, 8u, 0);
        c.N = N, c.K = K, c.ybf = sh[i].ybf, c.beta = sh[i].beta;
        for (size_t j = 0; j < sizeof Ts / sizeof Ts[0]; j++) {
            c.T = Ts[j];
            const double bytes = (double)N * K * 2 + (double)c.T * K * 2 +
                                 (double)c.T * N * (c.ybf ? 2 : 4) * (c.beta != 0.0f ? 2 : 1);
            char line[512];
            int o = 0;
            float best = 1e30f;
            int best_rows = 64, best_ks = 1;
            for (c.rows = 64; c.rows <= 128; c.rows += 64) {
                o += snprintf(line + o, sizeof line - o, "%s", c.rows == 128 ? " |" : "");
                for (size_t k = 0; k < sizeof kss / sizeof kss[0]; k++) {
                    c.ks = kss[k];
                    if (c.ks > K / 128) continue;
                    const float us = time_us(run_skinny, &c);
                    o += snprintf(line + o, sizeof line - o, " %5.1f", us);
                    if (us < best) best = us, best_rows = c.rows, best_ks = c.ks;
                }
            }
            const float cb = time_us(run_cublas, &c);
            /* the cuBLAS path: tune this shape as the backend does without the skinny kernel, time its plan */
            const int trc = c.ybf ? kc_gemm_lt_tune_y16(c.lt, c.h, c.y, N, c.x, K, c.W, c.T, N, K, 0)
                                  : kc_gemm_lt_tune(c.lt, c.h, c.y, N, c.x, K, c.W, c.T, N, K, c.beta, 0);
            cublasSetStream(c.h, 0);
            const float pr = trc ? -1.0f : time_us(run_prod, &c);
            c.rows = best_rows, c.ks = best_ks;
            kc_set_pdl(1);
            const float sq_sk = time_seq_us(&c, seq_skinny);
            kc_set_pdl(0);
            const float sq_pr = time_seq_us(&c, seq_prod);
#define PCT(us) (100.0 * bytes / ((us) * 1e-6) * 1e-9 / copy_gbs)
            printf("%-12s T=%-3d %5dx%-5d isolated |%s | best %5.1f (rows %d ks %d) %3.0f%% | cublas %5.1f %3.0f%% | "
                   "prod %5.1f %3.0f%% | %.2fx || sequence skinny %5.1f %3.0f%% prod %5.1f %3.0f%% | %.2fx\n",
                   sh[i].name, c.T, N, K, line, best, best_rows, best_ks, PCT(best), cb, PCT(cb), pr, PCT(pr), pr / best,
                   sq_sk, PCT(sq_sk), sq_pr, PCT(sq_pr), sq_pr / sq_sk);
#undef PCT
        }
        cudaFree(c.W), cudaFree(c.x), cudaFree(c.y), cudaFree(c.ws), cudaFree(c.cnt);
        for (int q = 0; q < SEQ; q++) cudaFree(c.Wseq[q]);
    }
    kc_gemm_lt_destroy(c.lt);
    cudaFree(ltws);
    cublasDestroy(c.h);
    cudaFree(g_flush);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    kt_skip_without_gpu();
#ifndef KC_EMU
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
#else
    (void)argc, (void)argv;
#endif
    check_rejects();
#ifdef KC_EMU
    {
        const int Ts[] = {1, 5, 9, 16, 33, 64}, kss[] = {1, 2, 3};
        run_shape(100, 128, 8, 3, Ts, 6, kss, 2);
        run_shape(257, 384, 0, 0, Ts, 6, kss, 3);
    }
    {
        const int Ts[] = {3, 24}, kss[] = {1, 4};
        run_shape(130, 512, 16, 5, Ts, 2, kss, 2);
    }
#else
    {
        const int Ts[] = {1, 3, 8, 9, 16, 31, 33, 64}, kss[] = {1, 2, 3, 8, 16, 32};
        run_shape(100, 128, 8, 3, Ts, 8, kss, 6);
        run_shape(2050, 384, 0, 0, Ts, 8, kss, 6);
        run_shape(257, 2048, 24, 1, Ts, 8, kss, 6);
    }
    const char *quick = getenv("KDA_SKINNY_TEST_QUICK");
    if (!quick || !*quick || !strcmp(quick, "0")) {
        const int Ts[] = {2, 16, 31, 64}, kss[] = {1, 4, 16};
        run_shape(6416, 2048, 0, 0, Ts, 4, kss, 3);
        run_shape(2048, 8064, 0, 0, Ts, 4, kss, 3);
        const int Ts2[] = {16}, kss2[] = {1, 2};
        run_shape(16128, 2048, 0, 0, Ts2, 1, kss2, 2);
        run_shape(32000, 2048, 0, 0, Ts2, 1, kss2, 2);
    }
#endif
    printf("%d of %d cases failed\n", g_fail, g_cases);
    return g_fail ? 1 : 0;
}

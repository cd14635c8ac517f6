/*
 * ops_gemm.cu - cuBLASLt GEMM with per-shape autotuning (cuda_gemm.h).
 *
 * The skinny decode GEMMs (T = 8..256 rows times a [N, 2048..8064] weight)
 * are memory bound; cublasGemmEx's default algorithm often launches too few
 * CTAs for them. kc_gemm_lt_tune times the cublasLt heuristic's candidates
 * (and split-K variants of them), and for T <= 64 rows the tensor-core
 * skinny GEMM of skinny_gemm.h at several split-K factors, against that
 * default once per shape and caches the winner; kc_gemm_lt_run replays it
 * (capture safe).
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_gemm.h"
#include "skinny_gemm.h"

#define LT_MAX_PLANS 128
#define LT_HEUR 16      /* heuristic candidates requested */
#define LT_MAX_CAND 64  /* heuristic + split-K variants timed (16 + 4 x 4 x 2 at most) */
#define LT_WARMUP 2
#define LT_REPS 10
/* the skinny GEMM's split-K scratch: allocated once at the first tune (before
 * any graph capture) and never moved; a candidate needing more is not timed */
#define SK_WS_BYTES ((size_t)32 << 20)
#define SK_CNT_LEN (1 << 16) /* counters: weights up to 8M rows */

typedef struct {
    int used;
    int T, N, K, ldx, ldy;
    float beta;
    int ybf; /* y is bf16 (beta 0): cuBLAS rounds the fp32 accumulators once */
    int use_default; /* tuning found cublasGemmEx faster: run returns 1 */
    int skinny_ks;   /* > 0: the skinny GEMM with this split-K won (no cublasLt descriptors) */
    int skinny_rows; /* its block width, 64 or 128 weight rows */
    unsigned align_a, align_b, align_c; /* min pointer alignment the plan was tuned for */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    size_t ws_need;
} lt_plan;

struct kc_gemm_lt {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_size;
    void *flush;
    size_t flush_bytes;
    int verbose, flush_on, splitk_on, skinny_on;
    float *sk_ws;     /* SK_WS_BYTES */
    unsigned *sk_cnt; /* SK_CNT_LEN, zero between calls */
    lt_plan plan[LT_MAX_PLANS];
};


/* alignment of a device address, capped at 256 bytes */
static unsigned ptr_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && (a & (al - 1))) al >>= 1;
    return al;
}

static void plan_free(lt_plan *p)
{
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

static lt_plan *plan_find(kc_gemm_lt *g, int T, int N, int K, int ldx, int ldy, float beta, int ybf)
{
    for (int i = 0; i < LT_MAX_PLANS; i++) {
        lt_plan *p = &g->plan[i];
        if (p->used && p->T == T && p->N == N && p->K == K && p->ldx == ldx && p->ldy == ldy && p->beta == beta &&
            p->ybf == ybf)
            return p;
    }
    return NULL;
}

extern "C" kc_gemm_lt *kc_gemm_lt_create(size_t workspace_bytes, void *workspace, int verbose, int flush_l2, int splitk,
                                         int skinny)
{
    kc_gemm_lt *g = (kc_gemm_lt *)calloc(1, sizeof(kc_gemm_lt));
    if (!g) return NULL;
    if (cublasLtCreate(&g->lt) != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return NULL;
    }
    g->ws = workspace;
    g->ws_size = workspace ? workspace_bytes : 0;
    g->verbose = verbose;
    g->flush_on = flush_l2;
    g->splitk_on = splitk;
    g->skinny_on = skinny;
    return g;
}

extern "C" void kc_gemm_lt_release_scratch(kc_gemm_lt *g)
{
    if (!g || !g->flush) return;
    cudaFree(g->flush);
    g->flush = NULL;
    g->flush_bytes = 0;
}

extern "C" void kc_gemm_lt_destroy(kc_gemm_lt *g)
{
    if (!g) return;
    for (int i = 0; i < LT_MAX_PLANS; i++)
        if (g->plan[i].used || g->plan[i].op) plan_free(&g->plan[i]);
    kc_gemm_lt_release_scratch(g);
    if (g->sk_ws) cudaFree(g->sk_ws);
    if (g->sk_cnt) cudaFree(g->sk_cnt);
    cublasLtDestroy(g->lt);
    free(g);
}

/* ---- tuning ---- */

/* Times launch() (returns 0 on a successful launch): LT_WARMUP untimed runs,
 * then LT_REPS runs each between an event pair, L2 flushed before each.
 * Returns the median in ms, or a negative value when a launch failed. */
template <typename F>
static float time_median(kc_gemm_lt *g, cudaStream_t s, cudaEvent_t *ev, F launch)
{
    for (int i = 0; i < LT_WARMUP; i++)
        if (launch() != 0) return -1.0f;
    for (int r = 0; r < LT_REPS; r++) {
        if (g->flush) cudaMemsetAsync(g->flush, r & 0xff, g->flush_bytes, s);
        cudaEventRecord(ev[2 * r], s);
        if (launch() != 0) {
            cudaStreamSynchronize(s);
            return -1.0f;
        }
        cudaEventRecord(ev[2 * r + 1], s);
    }
    if (cudaEventSynchronize(ev[2 * LT_REPS - 1]) != cudaSuccess) return -2.0f;
    float t[LT_REPS];
    for (int r = 0; r < LT_REPS; r++) {
        if (cudaEventElapsedTime(&t[r], ev[2 * r], ev[2 * r + 1]) != cudaSuccess) return -2.0f;
    }
    /* insertion sort, median */
    for (int i = 1; i < LT_REPS; i++) {
        float v = t[i];
        int j = i - 1;
        while (j >= 0 && t[j] > v) t[j + 1] = t[j], j--;
        t[j + 1] = v;
    }
    return 0.5f * (t[(LT_REPS - 1) / 2] + t[LT_REPS / 2]);
}

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t ws;
} lt_cand;

static int algo_get_i32(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t attr)
{
    int32_t v = -1;
    size_t w = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, attr, &v, sizeof v, &w) != CUBLAS_STATUS_SUCCESS) return -1;
    return (int)v;
}

/* Copies T rows of N elements of es bytes (row stride ld) between device and a dense host buffer. */
static cudaError_t copy_rows_d2h(void *h, const void *d, int ld, int T, int N, size_t es, cudaStream_t s)
{
    return cudaMemcpy2DAsync(h, (size_t)N * es, d, (size_t)ld * es, (size_t)N * es, (size_t)T, cudaMemcpyDeviceToHost,
                             s);
}
static cudaError_t copy_rows_h2d(void *d, const void *h, int ld, int T, int N, size_t es, cudaStream_t s)
{
    return cudaMemcpy2DAsync(d, (size_t)ld * es, h, (size_t)N * es, (size_t)N * es, (size_t)T, cudaMemcpyHostToDevice,
                             s);
}

/* bf16 results read back as uint16 in place: widened to fp32 from the end down */
static void widen_bf16(float *v, size_t n)
{
    const uint16_t *u = (const uint16_t *)v;
    for (size_t i = n; i-- > 0;) {
        const uint32_t b = (uint32_t)u[i] << 16;
        memcpy(&v[i], &b, 4);
    }
}

static int lt_tune(kc_gemm_lt *g, void *cublas_handle, void *y, int ybf, int ldy, const uint16_t *x, int ldx,
                   const uint16_t *W, int T, int N, int K, float beta, cudaStream_t s, const uint16_t *const *Wl = NULL,
                   int nW = 0)
{
    if (!g || !cublas_handle || !y || !x || !W || T <= 0 || N <= 0 || K <= 0 || ldx < K || ldy < N) return -1;
    if (ybf && beta != 0.0f) return -1;
    const cudaDataType_t ydt = ybf ? CUDA_R_16BF : CUDA_R_32F;
    const size_t yes = ybf ? 2 : 4;
    cublasHandle_t h = (cublasHandle_t)cublas_handle;
    const float alpha = 1.0f;
    int rc = 0;

    /* the slot: an earlier plan for this key, else a free one */
    lt_plan *slot = plan_find(g, T, N, K, ldx, ldy, beta, ybf);
    if (!slot)
        for (int i = 0; i < LT_MAX_PLANS && !slot; i++)
            if (!g->plan[i].used) slot = &g->plan[i];
    if (!slot) {
        fprintf(stderr, "kc_gemm_lt_tune: plan cache full (%d)\n", LT_MAX_PLANS);
        return -1;
    }

    lt_plan p;
    memset(&p, 0, sizeof p);
    p.T = T, p.N = N, p.K = K, p.ldx = ldx, p.ldy = ldy, p.beta = beta, p.ybf = ybf;
    p.align_a = ptr_align(W), p.align_b = ptr_align(x), p.align_c = ptr_align(y);

    cudaEvent_t ev[2 * LT_REPS];
    int n_ev = 0;
    cublasLtMatmulPreference_t pref = NULL;
    lt_cand *cand = NULL;
    float *hbuf = NULL;
    int n_cand = 0, best = -1, best_sk = 0, best_sk_rows = 0;
    float best_ms = 0.0f, def_ms = -1.0f, sk_ms = 0.0f, seq_lib_ms = -1.0f, seq_sk_ms = -1.0f;

#define LT_CK(call)                                                                                \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #call, (int)st_);       \
            rc = -7;                                                                               \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
#define CU_CK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            rc = -7;                                                                               \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

    {
        /* descriptors: exactly the cublasGemmEx call of kc_gemm */
        const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
        LT_CK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        LT_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
        LT_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN));
        LT_CK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, (int64_t)K));
        LT_CK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, (uint64_t)K, (uint64_t)T, (int64_t)ldx));
        LT_CK(cublasLtMatrixLayoutCreate(&p.lc, ydt, (uint64_t)N, (uint64_t)T, (int64_t)ldy));

        /* the L2 flush buffer: twice the L2 */
        if (g->flush_on && !g->flush) {
            int dev = 0, l2 = 0;
            if (cudaGetDevice(&dev) == cudaSuccess &&
                cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess && l2 > 0) {
                const size_t bytes = (size_t)l2 * 2;
                if (cudaMalloc(&g->flush, bytes) == cudaSuccess) {
                    g->flush_bytes = bytes;
                } else {
                    (void)cudaGetLastError();
                    g->flush = NULL; /* time without flushing */
                }
            }
        }
        for (; n_ev < 2 * LT_REPS; n_ev++) CU_CK(cudaEventCreate(&ev[n_ev]));

        /* heuristic candidates */
        LT_CK(cublasLtMatmulPreferenceCreate(&pref));
        {
            const uint64_t wsb = g->ws_size;
            const uint32_t aa = p.align_a, ab = p.align_b, ac = p.align_c;
            LT_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
            LT_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
            LT_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
            LT_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
            LT_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
        }
        cublasLtMatmulHeuristicResult_t heur[LT_HEUR];
        int n_heur = 0;
        memset(heur, 0, sizeof heur);
        {
            cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g->lt, p.op, p.la, p.lb, p.lc, p.lc, pref, LT_HEUR,
                                                               heur, &n_heur);
            if (st != CUBLAS_STATUS_SUCCESS) n_heur = 0; /* NOT_SUPPORTED: only the default remains */
        }
        cand = (lt_cand *)calloc(LT_MAX_CAND, sizeof(lt_cand));
        if (!cand) {
            rc = -1;
            goto done;
        }
        for (int i = 0; i < n_heur && n_cand < LT_MAX_CAND; i++) {
            if (heur[i].state != CUBLAS_STATUS_SUCCESS || heur[i].workspaceSize > g->ws_size) continue;
            cand[n_cand].algo = heur[i].algo;
            cand[n_cand].ws = heur[i].workspaceSize;
            n_cand++;
        }
        /* split-K variants of the heuristic's non-split candidates (the skinny
         * shapes have too few output tiles to fill 132 SMs) */
        const int n_base = n_cand;
        for (int i = 0; g->splitk_on && i < n_base && i < 4; i++) {
            int32_t sk_support = 0;
            uint32_t red_mask = 0;
            size_t w = 0;
            if (cublasLtMatmulAlgoCapGetAttribute(&cand[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &sk_support,
                                                  sizeof sk_support, &w) != CUBLAS_STATUS_SUCCESS ||
                !sk_support)
                continue;
            if (algo_get_i32(&cand[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) continue;
            if (cublasLtMatmulAlgoCapGetAttribute(&cand[i].algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask,
                                                  sizeof red_mask, &w) != CUBLAS_STATUS_SUCCESS)
                continue;
            static const int32_t splits[] = {2, 4, 8, 16};
            static const uint32_t schemes[] = {CUBLASLT_REDUCTION_SCHEME_INPLACE,
                                               CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE};
            for (int j = 0; j < 4 && n_cand < LT_MAX_CAND; j++) {
                const int32_t sk = splits[j];
                if (K / sk < 128) break;
                for (int q = 0; q < 2 && n_cand < LT_MAX_CAND; q++) {
                    const uint32_t sch = schemes[q];
                    if (!(red_mask & sch)) continue;
                    if (ybf && sch == CUBLASLT_REDUCTION_SCHEME_INPLACE) continue; /* partial sums in bf16 */
                    cublasLtMatmulAlgo_t a = cand[i].algo;
                    if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) !=
                            CUBLAS_STATUS_SUCCESS ||
                        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &sch,
                                                             sizeof sch) != CUBLAS_STATUS_SUCCESS)
                        continue;
                    cublasLtMatmulHeuristicResult_t chk;
                    memset(&chk, 0, sizeof chk);
                    if (cublasLtMatmulAlgoCheck(g->lt, p.op, p.la, p.lb, p.lc, p.lc, &a, &chk) !=
                            CUBLAS_STATUS_SUCCESS ||
                        chk.workspaceSize > g->ws_size)
                        continue;
                    cand[n_cand].algo = a;
                    cand[n_cand].ws = chk.workspaceSize;
                    n_cand++;
                }
            }
        }

        /* the default */
        CU_CK(cudaStreamSynchronize(s));
        if (cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) {
            rc = -7;
            goto done;
        }
        def_ms = time_median(g, s, ev, [&]() -> int {
            return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, CUDA_R_16BF, K, x, CUDA_R_16BF, ldx,
                                &beta, y, ydt, ldy, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS
                       ? 0
                       : -1;
        });
        if (def_ms < -1.5f) {
            rc = -7;
            goto done;
        }

        /* the candidates */
        for (int i = 0; i < n_cand; i++) {
            const cublasLtMatmulAlgo_t *a = &cand[i].algo;
            const float ms = time_median(g, s, ev, [&]() -> int {
                return cublasLtMatmul(g->lt, p.op, &alpha, W, p.la, x, p.lb, &beta, y, p.lc, y, p.lc, a, g->ws,
                                      g->ws_size, s) == CUBLAS_STATUS_SUCCESS
                           ? 0
                           : -1;
            });
            if (ms < -1.5f) {
                rc = -7;
                goto done;
            }
            if (ms < 0.0f) continue; /* this candidate does not run here */
            if (best < 0 || ms < best_ms) best = i, best_ms = ms;
        }
        (void)cudaGetLastError();

        /* the skinny GEMM, split-K 1 to 16 (pieces of at least two 128-k stages) */
        if (g->skinny_on && T <= KC_SKINNY_MAX_T && K % 128 == 0 && kc_skinny_cnt_len(N) <= SK_CNT_LEN) {
            if (!g->sk_ws) {
                if (cudaMalloc((void **)&g->sk_ws, SK_WS_BYTES) != cudaSuccess ||
                    cudaMalloc((void **)&g->sk_cnt, SK_CNT_LEN * sizeof(unsigned)) != cudaSuccess ||
                    cudaMemsetAsync(g->sk_cnt, 0, SK_CNT_LEN * sizeof(unsigned), s) != cudaSuccess) {
                    (void)cudaGetLastError();
                    if (g->sk_ws) cudaFree(g->sk_ws);
                    if (g->sk_cnt) cudaFree(g->sk_cnt);
                    g->sk_ws = NULL, g->sk_cnt = NULL, g->skinny_on = 0;
                }
            }
            /* 3, 6, 12: a grid of 51 x 4 blocks fills 132 SMs unevenly; the tuner sees it */
            static const int splits[] = {1, 2, 3, 4, 6, 8, 12, 16};
            int unsuited = 0;
            for (int wdt = 64; g->sk_ws && wdt <= 128 && !unsuited; wdt += 64)
                for (int j = 0; j < 8; j++) {
                    const int ks = splits[j];
                    if (ks > 1 && K / 128 / ks < 2) break;
                    if (kc_skinny_ws_bytes(T, N, ks) > SK_WS_BYTES) continue;
                    const float ms = time_median(g, s, ev, [&]() -> int {
                        return kc_gemm_skinny(y, ybf, ldy, x, ldx, W, T, N, K, beta, ks, wdt, g->sk_ws, g->sk_cnt,
                                              s) == 0
                                   ? 0
                                   : -1;
                    });
                    if (ms < -1.5f) {
                        rc = -7;
                        goto done;
                    }
                    if (ms < 0.0f) { /* these pointers or strides do not suit it */
                        unsuited = 1;
                        break;
                    }
                    if (!best_sk || ms < sk_ms) best_sk = ks, best_sk_rows = wdt, sk_ms = ms;
                }
            (void)cudaGetLastError();
        }

        p.use_default = best < 0 || (def_ms >= 0.0f && def_ms <= best_ms);
        int sk_wins = 0;
        if (best_sk && nW >= 2) {
            /* the two winners back to back over the weights of every layer of
             * this shape, in a CUDA graph (cold weights, PDL overlap, no launch
             * gaps: as a decode step runs them). Timed alone, the skinny
             * kernel's PDL prologue overlap cannot show. */
            auto seq_ms = [&](int sk) -> float {
                cudaGraph_t gr = NULL;
                cudaGraphExec_t ge = NULL;
                cudaStream_t cs = NULL;
                float ms = -1.0f;
                if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess) return -1.0f;
                cublasSetStream(h, cs);
                int bad = cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess;
                for (int i = 0; i < nW && !bad; i++) {
                    if (sk) {
                        bad = kc_gemm_skinny(y, ybf, ldy, x, ldx, Wl[i], T, N, K, beta, best_sk, best_sk_rows, g->sk_ws,
                                             g->sk_cnt, cs) != 0;
                    } else if (p.use_default) {
                        bad = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, Wl[i], CUDA_R_16BF, K, x,
                                           CUDA_R_16BF, ldx, &beta, y, ydt, ldy, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS;
                    } else {
                        bad = cublasLtMatmul(g->lt, p.op, &alpha, Wl[i], p.la, x, p.lb, &beta, y, p.lc, y, p.lc,
                                             &cand[best].algo, g->ws, g->ws_size, cs) != CUBLAS_STATUS_SUCCESS;
                    }
                }
                if (cudaStreamEndCapture(cs, &gr) != cudaSuccess) bad = 1;
                if (!bad && cudaGraphInstantiate(&ge, gr, 0) == cudaSuccess) {
                    void *fl = g->flush;
                    g->flush = NULL; /* the layers' weights exceed L2 by themselves */
                    ms = time_median(g, s, ev, [&]() -> int { return cudaGraphLaunch(ge, s) == cudaSuccess ? 0 : -1; });
                    g->flush = fl;
                }
                if (ge) cudaGraphExecDestroy(ge);
                if (gr) cudaGraphDestroy(gr);
                cudaStreamSynchronize(s);
                cudaStreamDestroy(cs);
                cublasSetStream(h, s);
                (void)cudaGetLastError();
                return ms;
            };
            seq_lib_ms = seq_ms(0);
            seq_sk_ms = seq_ms(1);
            sk_wins = seq_sk_ms > 0.0f && (seq_lib_ms < 0.0f || seq_sk_ms < seq_lib_ms || g->skinny_on == 2);
        } else if (best_sk) {
            const float win_ms = p.use_default ? def_ms : best_ms;
            sk_wins = win_ms < 0.0f || sk_ms < win_ms || g->skinny_on == 2;
        }
        if (sk_wins) p.use_default = 0, p.skinny_ks = best_sk, p.skinny_rows = best_sk_rows;

        /* check the winner against cublasGemmEx on these buffers */
        if (!p.use_default) {
            const size_t n = (size_t)T * N;
            hbuf = (float *)malloc(n * 3 * sizeof(float));
            if (!hbuf) {
                rc = -1;
                goto done;
            }
            float *old = hbuf, *ref = hbuf + n, *got = hbuf + 2 * n;
            if (beta != 0.0f) CU_CK(copy_rows_d2h(old, y, ldy, T, N, yes, s));
            if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, CUDA_R_16BF, K, x, CUDA_R_16BF, ldx,
                             &beta, y, ydt, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
                CUBLAS_STATUS_SUCCESS) {
                rc = -7;
                goto done;
            }
            CU_CK(copy_rows_d2h(ref, y, ldy, T, N, yes, s));
            if (beta != 0.0f) CU_CK(copy_rows_h2d(y, old, ldy, T, N, yes, s));
            if (p.skinny_ks) {
                if (kc_gemm_skinny(y, ybf, ldy, x, ldx, W, T, N, K, beta, p.skinny_ks, p.skinny_rows, g->sk_ws,
                                   g->sk_cnt, s)) {
                    rc = -7;
                    goto done;
                }
            } else {
                LT_CK(cublasLtMatmul(g->lt, p.op, &alpha, W, p.la, x, p.lb, &beta, y, p.lc, y, p.lc,
                                     &cand[best].algo, g->ws, g->ws_size, s));
            }
            CU_CK(copy_rows_d2h(got, y, ldy, T, N, yes, s));
            CU_CK(cudaStreamSynchronize(s));
            if (ybf) widen_bf16(ref, n), widen_bf16(got, n);
            /* tolerance from the largest product term x @ W^T (ref - y_old when beta = 1:
             * timing accumulated into y many times) */
            float amax = 0.0f;
            for (size_t i = 0; i < n; i++) {
                const float v = beta != 0.0f ? ref[i] - beta * old[i] : ref[i];
                if (isfinite(v) && fabsf(v) > amax) amax = fabsf(v);
            }
            size_t bad = 0, first_bad = 0;
            for (size_t i = 0; i < n; i++) {
                const float d = fabsf(got[i] - ref[i]);
                /* bf16 y: the two may round fp32 sums that differ in the last bits to neighbouring bf16 values */
                const float tol = 1e-3f * amax + 1e-5f + (beta != 0.0f ? 4e-6f * fabsf(old[i]) : 0.0f) +
                                  (ybf ? fabsf(ref[i]) * (1.0f / 128) : 0.0f);
                if (d <= tol) continue;
                if (!isfinite(ref[i]) && !isfinite(got[i])) continue; /* garbage in scratch y */
                if (!bad) first_bad = i;
                bad++;
            }
            if (bad) {
                fprintf(stderr,
                        "kc_gemm_lt_tune: T=%d N=%d K=%d: tuned algo disagrees with cublasGemmEx at %zu of %zu "
                        "(first [%zu]: %g vs %g); keeping the default\n",
                        T, N, K, bad, n, first_bad, (double)got[first_bad], (double)ref[first_bad]);
                p.use_default = 1, p.skinny_ks = 0, p.skinny_rows = 0;
            }
        }

        if (g->verbose) {
            const double bytes = (double)N * K * 2 + (double)T * K * 2 + (double)T * N * yes * (beta != 0.0f ? 2 : 1);
            const float win_ms = p.use_default ? def_ms : p.skinny_ks ? sk_ms : best_ms;
            char skb[160] = "", sqb[80] = "";
            if (seq_sk_ms > 0.0f) /* timed back to back: per GEMM */
                snprintf(sqb, sizeof sqb, " seq/gemm lib %.2f skinny %.2f us", seq_lib_ms * 1e3 / nW,
                         seq_sk_ms * 1e3 / nW);
            if (best_sk)
                snprintf(skb, sizeof skb, " skinny %.2f us (ks %d rows %d)%s", sk_ms * 1e3, best_sk, best_sk_rows, sqb);
            const char *won = p.use_default ? "default" : p.skinny_ks ? "skinny" : "lt";
            if (best >= 0) {
                const cublasLtMatmulAlgo_t *a = &cand[best].algo;
                fprintf(stderr,
                        "kc_gemm_lt: T=%d N=%d K=%d ldx=%d ldy=%d beta=%g%s: lt best %.2f us (algo %d tile %d splitk %d "
                        "red %d ws %zu, %d cands)%s default %.2f us -> %s %.0f GB/s\n",
                        T, N, K, ldx, ldy, (double)beta, ybf ? " y bf16" : "", best_ms * 1e3, algo_get_i32(a, CUBLASLT_ALGO_CONFIG_ID),
                        algo_get_i32(a, CUBLASLT_ALGO_CONFIG_TILE_ID), algo_get_i32(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                        algo_get_i32(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), cand[best].ws, n_cand, skb,
                        def_ms * 1e3, won, bytes / (win_ms * 1e-3) * 1e-9);
            } else {
                fprintf(stderr,
                        "kc_gemm_lt: T=%d N=%d K=%d ldx=%d ldy=%d beta=%g%s: no lt candidate ran (%d)%s default %.2f us "
                        "-> %s %.0f GB/s\n",
                        T, N, K, ldx, ldy, (double)beta, ybf ? " y bf16" : "", n_cand, skb, def_ms * 1e3, won,
                        bytes / (win_ms * 1e-3) * 1e-9);
            }
        }

        if (!p.use_default && !p.skinny_ks) {
            p.algo = cand[best].algo;
            p.ws_need = cand[best].ws;
        } else {
            /* the run path returns 1 or launches the skinny GEMM: no descriptors needed */
            lt_plan keep = p;
            plan_free(&keep);
            p.op = NULL, p.la = p.lb = p.lc = NULL;
        }
        p.used = 1;
        if (slot->used || slot->op) plan_free(slot);
        *slot = p;
        memset(&p, 0, sizeof p); /* owned by the cache now */
    }

done:
    if (rc) (void)cudaGetLastError();
    if (p.op || p.la || p.lb || p.lc) plan_free(&p);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < n_ev; i++) cudaEventDestroy(ev[i]);
    free(cand);
    free(hbuf);
    return rc;
#undef LT_CK
#undef CU_CK
}

extern "C" int kc_gemm_lt_tune(kc_gemm_lt *g, void *cublas_handle, float *y, int ldy, const uint16_t *x, int ldx,
                               const uint16_t *W, int T, int N, int K, float beta, cudaStream_t s)
{
    return lt_tune(g, cublas_handle, y, 0, ldy, x, ldx, W, T, N, K, beta, s);
}

extern "C" int kc_gemm_lt_tune_y16(kc_gemm_lt *g, void *cublas_handle, uint16_t *y, int ldy, const uint16_t *x,
                                   int ldx, const uint16_t *W, int T, int N, int K, cudaStream_t s)
{
    return lt_tune(g, cublas_handle, y, 1, ldy, x, ldx, W, T, N, K, 0.0f, s);
}

extern "C" int kc_gemm_lt_tune_seq(kc_gemm_lt *g, void *cublas_handle, void *y, int ybf, int ldy, const uint16_t *x,
                                   int ldx, const uint16_t *const *W, int nW, int T, int N, int K, float beta,
                                   cudaStream_t s)
{
    if (!W || nW < 1) return -1;
    return lt_tune(g, cublas_handle, y, ybf, ldy, x, ldx, W[0], T, N, K, beta, s, W, nW);
}

static int lt_run(kc_gemm_lt *g, void *y, int ybf, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T,
                  int N, int K, float beta, cudaStream_t s)
{
    if (T <= 0) return 0;
    if (!g) return 1;
    const lt_plan *p = plan_find(g, T, N, K, ldx, ldy, beta, ybf);
    if (!p || p->use_default) return 1;
    if (p->skinny_ks) /* 1 (kc_gemm instead) when these pointers do not suit it */
        return kc_gemm_skinny(y, ybf, ldy, x, ldx, W, T, N, K, beta, p->skinny_ks, p->skinny_rows, g->sk_ws,
                              g->sk_cnt, s);
    if (ptr_align(W) < p->align_a || ptr_align(x) < p->align_b || ptr_align(y) < p->align_c) return 1;
    const float alpha = 1.0f;
    cublasStatus_t st = cublasLtMatmul(g->lt, p->op, &alpha, W, p->la, x, p->lb, &beta, y, p->lc, y, p->lc, &p->algo,
                                       g->ws, g->ws_size, s);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasLtMatmul failed (%d): T=%d N=%d K=%d\n", (int)st, T, N, K);
        return -7;
    }
    return 0;
}

extern "C" int kc_gemm_lt_run(kc_gemm_lt *g, float *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T,
                              int N, int K, float beta, cudaStream_t s)
{
    return lt_run(g, y, 0, ldy, x, ldx, W, T, N, K, beta, s);
}

extern "C" int kc_gemm_lt_run_y16(kc_gemm_lt *g, uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W,
                                  int T, int N, int K, cudaStream_t s)
{
    return lt_run(g, y, 1, ldy, x, ldx, W, T, N, K, 0.0f, s);
}

/* ---- test data ---- */

__global__ void fill_bf16_kernel(bf16 *x, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) ^ seed;
        v ^= v >> 16;
        v *= 0x85EBCA6Bu;
        v ^= v >> 13;
        v *= 0xC2B2AE35u;
        v ^= v >> 16;
        x[i] = f2bf((float)(v >> 8) * (1.0f / 8388608.0f) - 1.0f);
    }
}

extern "C" int kc_gemm_lt_fill_bf16(uint16_t *x, size_t n, uint32_t seed, cudaStream_t s)
{
    if (n == 0) return 0;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    fill_bf16_kernel<<<(unsigned)blocks, 256, 0, s>>>((bf16 *)x, n, seed);
    KC_LAUNCH_CHECK();
    return 0;
}

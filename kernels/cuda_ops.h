/*
 * cuda_ops.h - C interface of the CUDA kernels (kc_ prefix). Every pointer is
 * device memory; bf16 tensors travel as uint16_t. Launchers return 0, or
 * KDA_EDEVICE (-7) when the launch failed. The backend (cuda_backend.cu)
 * strings them into a forward pass; tests/kernels calls each one against the
 * fp32 reference in engine/cpu_ops.h.
 *
 * Row metadata: a step packs all its tokens into T rows. tok_slot[t] < 0
 * marks a padding row (graph buckets): no kernel reads or writes any
 * sequence state for it.
 */
#ifndef KDA_CUDA_OPS_H
#define KDA_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Launch policy for every kernel below, set by the backend's create from its
 * tuning (engine.h kda_tuning) before any launch: programmatic dependent
 * launch (default off here), persistent GEMV blocks (default on). */
void kc_set_pdl(int on);
void kc_set_gemv_persist(int on);

/* h[t] = E[ids[t]] as fp32 (ids[t] < 0: zeros). E [vocab, D] bf16. */
int kc_embed(float *h, const uint16_t *E, const int32_t *ids, int T, int D, cudaStream_t s);

/* hist[slot[t] * cap + pos[t]] = ids[t] for rows with slot[t] >= 0: each
 * slot's token history, read by the sampler's penalties. */
int kc_hist_append(int32_t *hist, int cap, const int32_t *ids, const int32_t *pos, const int32_t *slot, int T,
                   cudaStream_t s);

/* out[i] = bf16(RMSNorm(x[rows ? rows[i] : i]; w, eps)), i < T. x [*, D] fp32. */
int kc_rmsnorm(uint16_t *out, const float *x, const int32_t *rows, const float *w, int T, int D,
               float eps, cudaStream_t s);

/* out[t * ldo + c] = bf16(in[t * ldi + c]) for c < ncols. */
int kc_cast_bf16(uint16_t *out, int ldo, const float *in, int ldi, int T, int ncols, cudaStream_t s);

/* y[t * ldy + c] += bias[c] for c < n, t < T (projection biases after a GEMM). */
int kc_add_bias(float *y, int ldy, const float *bias, int T, int n, cudaStream_t s);

/* out[t, f] = bf16(silu(gu[t, f]) * gu[t, F + f]); gu [T, 2F] fp32. */
int kc_swiglu(uint16_t *out, const float *gu, int T, int F, cudaStream_t s);
/* the same from a bf16 gate|up [T, 2F] */
int kc_swiglu_bf16(uint16_t *out, const uint16_t *gu, int T, int F, cudaStream_t s);

/* Skinny GEMM for few rows (T <= KC_GEMV_MAX_T): y[t, n] = sum_k W[n, k] x[t, k].
 * in_mode  KC_IN_BF16: x bf16 [T, ldx];  KC_IN_NORM: x fp32 [T, ldx], normalised
 *          in the prologue by RMSNorm(normw, eps) then rounded to bf16 (same
 *          numerics as kc_rmsnorm + GEMM).
 * out_mode KC_OUT_STORE: y fp32 [T, ldy] = ;  KC_OUT_ADD: y += (residual);
 *          KC_OUT_SWIGLU: W has 2N rows (gate 0..N-1, up N..2N-1), y bf16 [T, ldy]
 *          = silu(gate) * up.
 * K % 8 == 0. */
enum { KC_IN_BF16 = 0, KC_IN_NORM = 1 };
enum { KC_OUT_STORE = 0, KC_OUT_ADD = 1, KC_OUT_SWIGLU = 2 };
#define KC_GEMV_MAX_T 8
int kc_gemv(void *y, int ldy, const uint16_t *W, int N, int K, const void *x, int ldx,
            const float *normw, float eps, int T, int in_mode, int out_mode, cudaStream_t s);

/* cuBLAS: y[T, N] (fp32, ldy) = beta * y + x[T, K] (bf16, ldx) @ W[N, K]^T (bf16). */
int kc_gemm(void *cublas_handle, float *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W,
            int T, int N, int K, float beta, cudaStream_t s);
/* the same into a bf16 y (beta 0): each fp32 sum rounded once */
int kc_gemm_y16(void *cublas_handle, uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W,
                int T, int N, int K, cudaStream_t s);

/* ---- KDA decode/prefill step (MODEL_SPEC 3, steps 2-7 after the projections) ----
 * One block per (item, value head) walks the item's tokens in order: conv +
 * SiLU, L2 norms, gate (F1 f0 + dt_bias), beta, delta-rule update, read-out,
 * gated output RMSNorm. The head's state is read once and written once per call.
 * H is the number of value heads (state heads); with GVA (group > 1) value
 * head h reads q/k head h / group, and there are H / group q/k heads:
 * QK = (H / group) * K columns each for q and k. Below HK = H*K (gate
 * columns, one K-vector per value head) and HV = H*V. */
typedef struct {
    const float *proj;     /* [T, ldp]: q raw [QK] | k raw [QK] | v raw [HV] at col 0.. (after
                              kc_kda_conv, with preconv: the activated q | k | v) */
    int ldp;
    int off_f0, off_g0, off_beta; /* cols of f0 out [R], g0 out [R], beta logits [H] */
    const int32_t *item_row0, *item_ntok, *item_slot; /* [n_items]; slot < 0 = skip */
    int n_items;
    float *state;          /* per slot: S [H, K, V] fp32, then conv tail [taps-1, 2QK+HV] */
    int state_bf16;        /* S stored as bf16 (kc_tail_off): the tail starts at H*K*V/2 floats */
    size_t slot_stride;    /* floats between slots */
    const float *convw;    /* [2QK+HV, taps] q|k|v channels; NULL: no short conv (fla
                              use_short_conv false: SiLU alone, no tail; kc_kda_conv only) */
    const float *conv_bias; /* [2QK+HV] added before the SiLU, or NULL (kc_kda_conv only) */
    const uint16_t *f1t;   /* [R, HK] bf16 (F1 transposed) */
    const uint16_t *g1t;   /* [R, HV] bf16 (G1 transposed) */
    const float *g_bias;   /* [HV] or NULL */
    const float *A_log;    /* [H] */
    const float *dt_bias;  /* [HK] */
    const float *onorm;    /* [V] */
    float eps;
    int H, K, V, R, taps;
    int group;             /* value heads per q/k head (fla GVA); 0 or 1: none */
    float lower_bound;     /* < 0: fla's lower-bound gate lower_bound * sigmoid(exp(A_log) (g + dt_bias));
                              0: the softplus gate -exp(A_log) softplus(g + dt_bias) */
    int neg_eigval;        /* beta = 2 sigmoid(b) (fla allow_neg_eigval), else sigmoid(b) */
    int preconv;           /* q | k | v in proj are already conv'd and activated (kc_kda_conv ran):
                              the step reads them as they are and touches no conv tail. Required
                              with group > 1 (the value heads of a group share one q/k tail) and
                              without a conv (convw NULL) */
    uint16_t *y;           /* [T, ldy] bf16 gated output, cols h*V.. */
    int ldy;
    /* optional scratch [lowrank_rows, H*K + H*V] fp32: when set, F1 f0 and
     * G1 g0 are computed for all rows by a separate GEMM-like kernel first */
    float *lowrank;
    int lowrank_rows;
    /* every item carries exactly one token (a decode step; the caller
     * guarantees it): with lowrank set, K = V = 128 and no GVA, the step runs
     * as a prologue kernel and a persistent kernel that streams the state
     * (ops_kda.cu). The prologue overwrites the token's q | k | v and beta
     * entries of proj and its lowrank row with what the state kernel reads;
     * other shapes take the block-per-head kernel (kc_kda_step_streams) */
    int stream;
    int stream_blocks;     /* persistent blocks of the stream kernel; 0 = one per SM (tests: fewer) */
} kc_kda_args;
int kc_kda_step(const kc_kda_args *a, cudaStream_t s);
/* 1 when kc_kda_step(a) takes the stream path, else 0 */
int kc_kda_step_streams(const kc_kda_args *a);
/* The low-rank pass alone (F1 f0 and G1 g0 of every row into a->lowrank; no-op
 * without it), which kc_kda_step runs first; for the kernel lab's step variants. */
int kc_kda_lowrank(const kc_kda_args *a, cudaStream_t s);
/* The short conv alone, in place: for every live item, the q | k | v columns
 * of its rows become SiLU(causal conv over (tail ++ rows) + conv_bias) (SiLU
 * alone when convw is NULL), and the slot's conv tail moves on; one thread per
 * channel walks the item's tokens. Reads proj, item_*, state, slot_stride,
 * convw, conv_bias, H, K, V, taps, group. kc_kda_step with preconv follows. */
int kc_kda_conv(const kc_kda_args *a, cudaStream_t s);

/* ---- GQA ----
 * Paged KV cache: block b (blk tokens) starts at kv + b * block_stride; GQA
 * layer l's part at + layer_off: K [Hkv, blk, hd] then V [Hkv, blk, hd], bf16.
 * block_table [slots, max_blocks]: position p of slot s lives in block
 * block_table[s * max_blocks + p / blk], row p % blk. */
typedef struct {
    const float *proj;     /* [T, ldp] */
    int ldp, off_q, off_k, off_v, off_gate; /* off_gate < 0: no output gate */
    const int32_t *tok_pos, *tok_slot;
    int T;
    const float *q_norm, *k_norm; /* [hd] or NULL */
    float eps;
    int Hq, Hkv, hd, rope_dim;
    double theta;
    const double *rope_inv_freq; /* [rope_dim / 2] device: the RoPE frequencies (model_config
                                    rope_inv_freq: default, linear or llama3 schedule); NULL:
                                    theta^(-2i / rope_dim) */
    int window;            /* sliding window W: the row at position p attends to positions
                              max(0, p - W + 1) .. p; 0: all (the cache keeps every row either way) */
    float *q;              /* [T, Hq, hd] scratch: normed + roped queries */
    uint16_t *kv;
    size_t block_stride, layer_off;
    int blk;
    const int32_t *block_table;
    int max_blocks;
} kc_gqa_args;
/* q/k RMSNorm + partial RoPE, q to a->q, k and v appended to the cache. */
int kc_gqa_qkv(const kc_gqa_args *a, cudaStream_t s);
/* Causal attention of each row's query over its sequence's cache positions
 * 0..tok_pos[t] (the last `window` of them when window > 0), split over the context in chunks of `split` keys (at most
 * nsplit_max chunks), combined, times sigmoid(gate), to out bf16 [T, ldo].
 * opart [T, Hq, nsplit_max, hd] and ml [T, Hq, nsplit_max, 2] are scratch. */
int kc_gqa_attn(const kc_gqa_args *a, float *opart, float *ml, int nsplit_max, int split,
                uint16_t *out, int ldo, cudaStream_t s);

/* ---- logits ---- */
/* lse[i] = logsumexp(logits[i, :]) */
int kc_row_lse(float *lse, const float *logits, int n, int vocab, cudaStream_t s);
/* out[i] = logits[rows[i], targets[i]] - lse[rows[i]]  (0 where targets[i] < 0) */
int kc_gather_logprob(float *out, const float *logits, const float *lse, const int32_t *rows,
                      const int32_t *targets, int n, int vocab, cudaStream_t s);

/* ---- sampling (engine/sampling.c semantics, on the GPU) ---- */
typedef struct { int32_t id; float bias; } kc_logit_bias; /* same layout as engine.h kda_logit_bias */
typedef struct {
    int row;               /* logits row */
    float temperature, top_p, min_p, rep, pres, freq;
    int top_k;
    int hist_off, n_prompt, n_gen; /* penalty history in hist[hist_off ..]: prompt then generated */
    int bias_off, n_bias;  /* logit_bias entries bias[bias_off .. + n_bias) */
    int n_top;
    uint64_t seed, counter;
} kc_sample_param;
/* One block per param: tok[i] drawn, lp[i] its raw log-prob, top_ids/top_lps
 * [i, max_top] the n_top best raw. counts [n, vocab] 4-byte scratch. */
int kc_sample(const kc_sample_param *p, int n, const float *logits, int vocab, const float *lse,
              const int32_t *hist, const kc_logit_bias *bias, int *counts, int32_t *tok, float *lp,
              int32_t *top_ids, float *top_lps, int max_top, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif

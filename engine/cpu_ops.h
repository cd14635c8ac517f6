/*
 * cpu_ops.h - fp32 reference operators. These are the oracle for every CUDA
 * kernel (tests/kernels compare against them) and the building blocks of the
 * CPU backend. Plain loops, written to be obviously MODEL_SPEC.md; the only
 * optimisation is threading over output rows in matmul_tv.
 *
 * Dims: T tokens, D model width, H heads, K key width, V value width.
 */
#ifndef KDA_CPU_OPS_H
#define KDA_CPU_OPS_H

#include <math.h>
#include <stdint.h>

#include "model.h"

/* y[T, W.rows] = x[T, W.cols] @ W^T, fp32 accumulation, threaded over rows.
 * Each weight row is converted once and used for all T tokens. */
void matmul_tv(float *y, const float *x, const tensor_view *W, int T);

/* out[n] = x * rsqrt(mean(x^2) + eps) * w; out may alias x */
void rmsnorm_f32(float *out, const float *x, const float *w, int n, float eps);

/* In-place GPT-NeoX half-split RoPE on the first rope_dim dims of each of nh
 * heads of width hd, at absolute position pos: pairs (i, i + rope_dim/2). */
void rope_partial(float *x, int nh, int hd, int rope_dim, int pos, double theta);
/* The same with the frequencies given: inv_freq[rope_dim/2] (model_config's
 * rope_inv_freq, which holds the scaled schedules); rope_partial is this with
 * inv_freq[i] = theta^(-2i/rope_dim). */
void rope_freq(float *x, int nh, int hd, int rope_dim, int pos, const double *inv_freq);

static inline float silu_f32(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus_f32(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Causal depthwise conv + SiLU over T tokens for C channels.
 * x [T, C] raw inputs; w [C, taps] (w[c][taps-1] multiplies the current token);
 * tail [taps-1, C] the previous raw inputs (oldest first), updated in place to
 * the last taps-1 raw inputs after this call. y [T, C]. */
void short_conv_f32(float *y, const float *x, int T, int C, const float *w, int taps, float *tail);
/* The same with a per-channel bias added before the SiLU (bias may be NULL). */
void short_conv_bias_f32(float *y, const float *x, int T, int C, const float *w, const float *bias, int taps,
                         float *tail);

/* gk[c] = -exp(A_log[h]) * softplus(graw[c] + dt_bias[c]) for c in [0, H*K), h = c / K. */
void kda_gate_f32(float *gk, const float *graw, const float *A_log, const float *dt_bias, int H, int K);
/* fla's lower-bound gate: gk[c] = lower_bound * sigmoid(exp(A_log[h]) * (graw[c] + dt_bias[c])),
 * in [lower_bound, 0). */
void kda_gate_lb_f32(float *gk, const float *graw, const float *A_log, const float *dt_bias, int H, int K,
                     float lower_bound);

/* x / sqrt(sum x^2 + 1e-6), in place, n elements */
void l2norm_f32(float *x, int n);

/* One exact KDA recurrence step for one head (MODEL_SPEC 3.6).
 * S [K, V] fp32 state (in/out); q, k already L2-normalised, q scaled;
 * gk [K] log-decay; beta scalar; o [V] out (read after the write). */
void kda_step_f32(float *S, const float *q, const float *k, const float *v,
                  const float *gk, float beta, float *o, int K, int V);

/* T tokens of one head by the per-token recurrence. Strides are in floats
 * between consecutive tokens (so q can point into [T, H*K] rows). */
void kda_recurrent_f32(float *S, const float *q, const float *k, const float *v,
                       const float *gk, const float *beta, float *o, int T, int K, int V,
                       int q_stride, int v_stride, int beta_stride, int o_stride);
/* The same function by the chunked WY form (chunk C tokens), fp32. */
void kda_chunked_f32(float *S, const float *q, const float *k, const float *v,
                     const float *gk, const float *beta, float *o, int T, int K, int V,
                     int q_stride, int v_stride, int beta_stride, int o_stride, int chunk);
/* Both forms with the gate's stride given apart from q's: with grouped value
 * heads the gate is per value head ([T, HV*K]) while q and k are per q/k head
 * ([T, H*K]). The two above are these with g_stride = q_stride. */
void kda_recurrent_strided_f32(float *S, const float *q, const float *k, const float *v,
                               const float *gk, const float *beta, float *o, int T, int K, int V,
                               int q_stride, int g_stride, int v_stride, int beta_stride, int o_stride);
void kda_chunked_strided_f32(float *S, const float *q, const float *k, const float *v,
                             const float *gk, const float *beta, float *o, int T, int K, int V,
                             int q_stride, int g_stride, int v_stride, int beta_stride, int o_stride, int chunk);

/* Causal GQA attention for T new query tokens of one sequence at absolute
 * positions pos0..pos0+T-1, against a cache holding positions 0..pos0+T-1.
 * q [T, Hq, hd]; kc, vc [n_ctx, Hkv, hd] (row = position); o [T, Hq, hd].
 * Query head h uses KV head h / (Hq / Hkv). scale = 1/sqrt(hd). */
void gqa_attention_f32(float *o, const float *q, const float *kc, const float *vc,
                       int T, int pos0, int Hq, int Hkv, int hd);
/* The same with a sliding window: the query at position p attends to
 * positions max(0, p - window + 1) .. p; window 0 = all (gqa_attention_f32). */
void gqa_attention_window_f32(float *o, const float *q, const float *kc, const float *vc,
                              int T, int pos0, int Hq, int Hkv, int hd, int window);

/* fla attention residuals (fla/ops/attnres, naive_attnres) for one row:
 * out[D] = sum_l p_l src[l], p = softmax_l( RMSNorm(src[l]; norm_w, eps) . query ).
 * L <= KDA_ATTNRES_MAX_SOURCES. (fla then RMSNorms out with the sub-layer's
 * own input-norm weight: the caller does.) */
#define KDA_ATTNRES_MAX_SOURCES (2 * KDA_MAX_LAYERS + 2)
void attnres_mix_f32(float *out, const float *const *src, int L, const float *query, const float *norm_w, int D,
                     float eps);

/* log_softmax of one row, returning logsumexp; lp may be NULL. */
float logsumexp_f32(const float *x, int n);

#endif

/*
 * cpu_ops.c - fp32 reference operators (see cpu_ops.h). Written to read like
 * MODEL_SPEC.md; the CUDA kernels are tested against these.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"

/* The dot products every matmul uses: one function per weight dtype, applied
 * to every (token, row) pair, so an output element is bit-identical whatever
 * the batch composition. bf16 rows are widened inside the loop (a shift), which
 * keeps batch-1 decode at memory speed; target_clones picks an AVX2 version where the
 * CPU has it (a given machine always runs the same clone). */
#define DOT_CLONES __attribute__((target_clones("avx2", "default")))

DOT_CLONES static float dot_f32(const float *a, const float *b, int n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

DOT_CLONES static float dot_bf16(const uint16_t *w, const float *x, int n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) {
        uint32_t u = (uint32_t)w[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        s += f * x[i];
    }
    return s;
}

/* Four bf16 rows against one x: four independent weight streams in flight
 * per core roughly double the read bandwidth one stream gets (measured on the
 * dev VM: 17 GB/s against 8-10 GB/s with two threads). */
DOT_CLONES static void dot4_bf16(const uint16_t *w0, const uint16_t *w1, const uint16_t *w2, const uint16_t *w3,
                                 const float *x, int n, float *out)
{
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int i = 0; i < n; i++) {
        uint32_t u0 = (uint32_t)w0[i] << 16, u1 = (uint32_t)w1[i] << 16;
        uint32_t u2 = (uint32_t)w2[i] << 16, u3 = (uint32_t)w3[i] << 16;
        float f0, f1, f2, f3;
        memcpy(&f0, &u0, 4), memcpy(&f1, &u1, 4), memcpy(&f2, &u2, 4), memcpy(&f3, &u3, 4);
        const float xi = x[i];
        s0 += f0 * xi, s1 += f1 * xi, s2 += f2 * xi, s3 += f3 * xi;
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

/* Rows go in groups of 4 (bf16: dot4_bf16) with the R % 4 tail row by row.
 * Which function computes row r depends on r alone, never on T or the batch. */
void matmul_tv(float *y, const float *x, const tensor_view *W, int T)
{
    const int64_t R = W->rows, G = W->dtype == DT_BF16 ? R / 4 : 0;
    const int C = (int)W->cols;
    const dtype_t dt = W->dtype;
    /* one thread for small products: waking the team costs more than the work */
#pragma omp parallel if ((long)R * C * T >= (1 << 16))
    {
#pragma omp for schedule(static) nowait
        for (int64_t g = 0; g < G; g++) {
            const uint16_t *w[4];
            for (int k = 0; k < 4; k++) w[k] = tv_row(W, 4 * g + k);
            for (int t = 0; t < T; t++) {
                float o[4];
                dot4_bf16(w[0], w[1], w[2], w[3], x + (size_t)t * C, C, o);
                for (int k = 0; k < 4; k++) y[(size_t)t * R + 4 * g + k] = o[k];
            }
        }
        float *row = dt == DT_F16 ? malloc((size_t)C * sizeof(float)) : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 4 * G; r < R; r++) {
            const void *src = tv_row(W, r);
            if (dt == DT_BF16) {
                for (int t = 0; t < T; t++) y[(size_t)t * R + r] = dot_bf16(src, x + (size_t)t * C, C);
                continue;
            }
            const float *wr = src;
            if (dt == DT_F16) {
                tv_row_f32(W, r, row);
                wr = row;
            }
            for (int t = 0; t < T; t++) y[(size_t)t * R + r] = dot_f32(wr, x + (size_t)t * C, C);
        }
        free(row);
    }
}

void rmsnorm_f32(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

void rope_partial(float *x, int nh, int hd, int rope_dim, int pos, double theta)
{
    double inv[KDA_MAX_HEAD_DIM / 2];
    for (int i = 0; i < rope_dim / 2; i++) inv[i] = pow(theta, -2.0 * i / rope_dim);
    rope_freq(x, nh, hd, rope_dim, pos, inv);
}

void rope_freq(float *x, int nh, int hd, int rope_dim, int pos, const double *inv_freq)
{
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        /* angle in double: positions up to 1e6 times frequencies near 1 */
        double a = pos * inv_freq[i];
        float c = (float)cos(a), s = (float)sin(a);
        for (int h = 0; h < nh; h++) {
            float *v = x + (size_t)h * hd;
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x1 * c + x0 * s;
        }
    }
}

void short_conv_f32(float *y, const float *x, int T, int C, const float *w, int taps, float *tail)
{
    short_conv_bias_f32(y, x, T, C, w, NULL, taps, tail);
}

void short_conv_bias_f32(float *y, const float *x, int T, int C, const float *w, const float *bias, int taps,
                         float *tail)
{
    const int P = taps - 1; /* history length */
    for (int c = 0; c < C; c++) {
        const float *wc = w + (size_t)c * taps;
        const float b0 = bias ? bias[c] : 0.0f;
        for (int t = 0; t < T; t++) {
            float s = 0.0f;
            for (int i = 0; i < taps; i++) {
                int src = t - P + i; /* token index; negative = from the tail */
                float xv = src >= 0 ? x[(size_t)src * C + c] : tail[(size_t)(P + src) * C + c];
                s += wc[i] * xv;
            }
            y[(size_t)t * C + c] = silu_f32(s + b0);
        }
    }
    /* new tail = last P raw inputs of (old tail ++ x) */
    if (P == 0) return;
    if (T >= P) {
        memcpy(tail, x + (size_t)(T - P) * C, (size_t)P * C * sizeof(float));
    } else {
        memmove(tail, tail + (size_t)T * C, (size_t)(P - T) * C * sizeof(float));
        memcpy(tail + (size_t)(P - T) * C, x, (size_t)T * C * sizeof(float));
    }
}

void kda_gate_f32(float *gk, const float *graw, const float *A_log, const float *dt_bias, int H, int K)
{
    for (int h = 0; h < H; h++) {
        float a = -expf(A_log[h]);
        for (int k = 0; k < K; k++) {
            int c = h * K + k;
            gk[c] = a * softplus_f32(graw[c] + dt_bias[c]);
        }
    }
}

void kda_gate_lb_f32(float *gk, const float *graw, const float *A_log, const float *dt_bias, int H, int K,
                     float lower_bound)
{
    for (int h = 0; h < H; h++) {
        float a = expf(A_log[h]);
        for (int k = 0; k < K; k++) {
            int c = h * K + k;
            gk[c] = lower_bound * sigmoid_f32(a * (graw[c] + dt_bias[c]));
        }
    }
}

void l2norm_f32(float *x, int n)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= r;
}

void kda_step_f32(float *S, const float *q, const float *k, const float *v, const float *gk, float beta,
                  float *o, int K, int V)
{
    /* Two passes over S instead of four (decay + S^T k, then write + read-out);
     * every element sees the same operations in the same order as the
     * four-pass spelling of MODEL_SPEC 3.6. */
    float u[KDA_MAX_HEAD_DIM]; /* V <= KDA_MAX_HEAD_DIM (config.c refuses wider) */
    for (int j = 0; j < V; j++) u[j] = 0.0f;
    for (int d = 0; d < K; d++) {
        const float a = expf(gk[d]), kd = k[d];
        float *row = S + (size_t)d * V;
        for (int j = 0; j < V; j++) {
            row[j] *= a;
            u[j] += row[j] * kd;
        }
    }
    for (int j = 0; j < V; j++) {
        u[j] = beta * (v[j] - u[j]);
        o[j] = 0.0f;
    }
    for (int d = 0; d < K; d++) {
        const float kd = k[d], qd = q[d];
        float *row = S + (size_t)d * V;
        for (int j = 0; j < V; j++) {
            row[j] += kd * u[j];
            o[j] += row[j] * qd;
        }
    }
}

void kda_recurrent_f32(float *S, const float *q, const float *k, const float *v, const float *gk,
                       const float *beta, float *o, int T, int K, int V, int q_stride, int v_stride,
                       int beta_stride, int o_stride)
{
    kda_recurrent_strided_f32(S, q, k, v, gk, beta, o, T, K, V, q_stride, q_stride, v_stride, beta_stride, o_stride);
}

void kda_recurrent_strided_f32(float *S, const float *q, const float *k, const float *v, const float *gk,
                               const float *beta, float *o, int T, int K, int V, int q_stride, int g_stride,
                               int v_stride, int beta_stride, int o_stride)
{
    for (int t = 0; t < T; t++)
        kda_step_f32(S, q + (size_t)t * q_stride, k + (size_t)t * q_stride, v + (size_t)t * v_stride,
                     gk + (size_t)t * g_stride, beta[(size_t)t * beta_stride], o + (size_t)t * o_stride, K, V);
}

/*
 * Chunked WY form (MODEL_SPEC §3). Within a chunk of n tokens, Gam[r] is the
 * cumulative log-decay up to and including token r. Only differences
 * Gam[r] - Gam[s] with s <= r, and Gam itself, are exponentiated: all <= 0.
 */
void kda_chunked_f32(float *S, const float *q, const float *k, const float *v, const float *gk,
                     const float *beta, float *o, int T, int K, int V, int q_stride, int v_stride,
                     int beta_stride, int o_stride, int chunk)
{
    kda_chunked_strided_f32(S, q, k, v, gk, beta, o, T, K, V, q_stride, q_stride, v_stride, beta_stride, o_stride,
                            chunk);
}

void kda_chunked_strided_f32(float *S, const float *q, const float *k, const float *v, const float *gk,
                             const float *beta, float *o, int T, int K, int V, int q_stride, int g_stride,
                             int v_stride, int beta_stride, int o_stride, int chunk)
{
    const int Cn = chunk;
    float *Gam = malloc((size_t)Cn * K * sizeof(float));
    float *A = malloc((size_t)Cn * Cn * sizeof(float));     /* L, then (I+L)^-1 */
    float *Wm = malloc((size_t)Cn * K * sizeof(float));     /* beta k exp(Gam), then A times it */
    float *U = malloc((size_t)Cn * V * sizeof(float));      /* beta v, then A times it, then Vnew */
    for (int t0 = 0; t0 < T; t0 += Cn) {
        const int n = T - t0 < Cn ? T - t0 : Cn;
#define Q(r) (q + (size_t)(t0 + (r)) * q_stride)
#define KK(r) (k + (size_t)(t0 + (r)) * q_stride)
#define G(r) (gk + (size_t)(t0 + (r)) * g_stride)
#define VV(r) (v + (size_t)(t0 + (r)) * v_stride)
#define B(r) (beta[(size_t)(t0 + (r)) * beta_stride])
        for (int r = 0; r < n; r++)
            for (int d = 0; d < K; d++) Gam[r * K + d] = (r ? Gam[(r - 1) * K + d] : 0.0f) + G(r)[d];
        /* L[r][s] = beta_r sum_d k_r k_s exp(Gam_r - Gam_s), s < r */
        memset(A, 0, (size_t)Cn * Cn * sizeof(float));
        for (int r = 0; r < n; r++)
            for (int s = 0; s < r; s++) {
                float acc = 0.0f;
                for (int d = 0; d < K; d++) acc += KK(r)[d] * KK(s)[d] * expf(Gam[r * K + d] - Gam[s * K + d]);
                A[r * Cn + s] = B(r) * acc;
            }
        /* Right-hand sides: Wm = beta k exp(Gam), U = beta v */
        for (int r = 0; r < n; r++) {
            for (int d = 0; d < K; d++) Wm[r * K + d] = B(r) * KK(r)[d] * expf(Gam[r * K + d]);
            for (int j = 0; j < V; j++) U[r * V + j] = B(r) * VV(r)[j];
        }
        /* Solve (I + L) X = RHS by forward substitution (L strictly lower). */
        for (int r = 0; r < n; r++)
            for (int s = 0; s < r; s++) {
                float l = A[r * Cn + s];
                if (l == 0.0f) continue;
                for (int d = 0; d < K; d++) Wm[r * K + d] -= l * Wm[s * K + d];
                for (int j = 0; j < V; j++) U[r * V + j] -= l * U[s * V + j];
            }
        /* Vnew = U - W S */
        for (int r = 0; r < n; r++)
            for (int d = 0; d < K; d++) {
                float wd = Wm[r * K + d];
                const float *Srow = S + (size_t)d * V;
                for (int j = 0; j < V; j++) U[r * V + j] -= wd * Srow[j];
            }
        /* O = (q exp(Gam)) S + tril(q k^T exp(Gam_r - Gam_s)) Vnew, s <= r */
        for (int r = 0; r < n; r++) {
            float *orow = o + (size_t)(t0 + r) * o_stride;
            for (int j = 0; j < V; j++) orow[j] = 0.0f;
            for (int d = 0; d < K; d++) {
                float qd = Q(r)[d] * expf(Gam[r * K + d]);
                const float *Srow = S + (size_t)d * V;
                for (int j = 0; j < V; j++) orow[j] += qd * Srow[j];
            }
            for (int s = 0; s <= r; s++) {
                float a = 0.0f;
                for (int d = 0; d < K; d++) a += Q(r)[d] * KK(s)[d] * expf(Gam[r * K + d] - Gam[s * K + d]);
                for (int j = 0; j < V; j++) orow[j] += a * U[s * V + j];
            }
        }
        /* S = exp(Gam_last) S + (k exp(Gam_last - Gam))^T Vnew */
        const float *Gl = Gam + (size_t)(n - 1) * K;
        for (int d = 0; d < K; d++) {
            float *Srow = S + (size_t)d * V;
            float decay = expf(Gl[d]);
            for (int j = 0; j < V; j++) Srow[j] *= decay;
            for (int r = 0; r < n; r++) {
                float kr = KK(r)[d] * expf(Gl[d] - Gam[r * K + d]);
                for (int j = 0; j < V; j++) Srow[j] += kr * U[r * V + j];
            }
        }
#undef Q
#undef KK
#undef G
#undef VV
#undef B
    }
    free(Gam);
    free(A);
    free(Wm);
    free(U);
}

/* One pass per (token, head) with a running max (online softmax): no buffer
 * of n_ctx scores, so nothing is allocated on the decode path. */
void gqa_attention_f32(float *o, const float *q, const float *kc, const float *vc, int T, int pos0, int Hq,
                       int Hkv, int hd)
{
    gqa_attention_window_f32(o, q, kc, vc, T, pos0, Hq, Hkv, hd, 0);
}

void gqa_attention_window_f32(float *o, const float *q, const float *kc, const float *vc, int T, int pos0, int Hq,
                              int Hkv, int hd, int window)
{
    const int group = Hq / Hkv;
    const float scale = 1.0f / sqrtf((float)hd);
    float acc[KDA_MAX_HEAD_DIM]; /* hd <= KDA_MAX_HEAD_DIM (config.c refuses wider) */
    for (int t = 0; t < T; t++) {
        const int n = pos0 + t + 1; /* causal: positions 0..pos0+t */
        const int s0 = window > 0 && n > window ? n - window : 0; /* sliding window: the last `window` */
        for (int h = 0; h < Hq; h++) {
            const int kh = h / group;
            const float *qv = q + ((size_t)t * Hq + h) * hd;
            float m = -INFINITY, l = 0.0f;
            for (int i = 0; i < hd; i++) acc[i] = 0.0f;
            for (int s = s0; s < n; s++) {
                const float *kv = kc + ((size_t)s * Hkv + kh) * hd, *vv = vc + ((size_t)s * Hkv + kh) * hd;
                float a = 0.0f;
                for (int i = 0; i < hd; i++) a += qv[i] * kv[i];
                a *= scale;
                if (a > m) { /* new max: rescale what was summed so far */
                    const float c = expf(m - a);
                    l *= c;
                    for (int i = 0; i < hd; i++) acc[i] *= c;
                    m = a;
                }
                const float p = expf(a - m);
                l += p;
                for (int i = 0; i < hd; i++) acc[i] += p * vv[i];
            }
            float *ov = o + ((size_t)t * Hq + h) * hd;
            for (int i = 0; i < hd; i++) ov[i] = acc[i] / l;
        }
    }
}

void attnres_mix_f32(float *out, const float *const *src, int L, const float *query, const float *norm_w, int D,
                     float eps)
{
    float logit[KDA_ATTNRES_MAX_SOURCES];
    float m = -INFINITY;
    for (int l = 0; l < L; l++) {
        double ss = 0.0, dot = 0.0;
        for (int i = 0; i < D; i++) ss += (double)src[l][i] * src[l][i];
        const float r = (float)(1.0 / sqrt(ss / D + eps));
        for (int i = 0; i < D; i++) dot += (double)(src[l][i] * r * norm_w[i]) * query[i];
        logit[l] = (float)dot;
        if (logit[l] > m) m = logit[l];
    }
    double z = 0.0;
    for (int l = 0; l < L; l++) z += exp((double)(logit[l] - m));
    for (int i = 0; i < D; i++) out[i] = 0.0f;
    for (int l = 0; l < L; l++) {
        const float p = (float)(exp((double)(logit[l] - m)) / z);
        for (int i = 0; i < D; i++) out[i] += p * src[l][i];
    }
}

float logsumexp_f32(const float *x, int n)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    double s = 0.0;
    for (int i = 0; i < n; i++) s += exp((double)(x[i] - m));
    return m + (float)log(s);
}

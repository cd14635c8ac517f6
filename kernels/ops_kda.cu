/*
 * ops_kda.cu - the fused KDA step: everything of MODEL_SPEC 3 between the
 * input projections and W_o, for every token of an item, in one kernel.
 *
 * One block per (item, head). Thread j owns value column j of the head's
 * state S [K, V]: the recurrence needs no cross-thread reduction
 * (S^T k and S^T q are per-column dot products over d), so the column lives
 * in registers (K floats) for the whole call: one read and one write of the
 * 64 KiB head state however many tokens the item carries. Threads j < K also
 * own q/k channel j (conv tail, L2 norm, gate row), threads j < V the v
 * channel and the output-gate row. Padding items (slot < 0) return at once,
 * so no padding token ever touches a state or conv tail.
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define KDA_MAX_V 128
#define KDA_MAX_R 256

template <int K>
__global__ void __launch_bounds__(256, 2) kda_step_kernel(kc_kda_args a)
{
    /* K = 128 splits each column over two adjacent threads (64 rows each) to
     * keep the state in registers without spilling. */
    constexpr int SP = K >= 128 ? 2 : 1, KP = K / SP;
    const int item = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const int slot = a.item_slot[item];
    if (slot < 0) return;
    const int row0 = a.item_row0[item], nt = a.item_ntok[item];
    const int H = a.H, V = a.V, R = a.R, P = a.taps - 1;
    const int HK = H * K, HV = H * V, C = 2 * HK + HV;
    __shared__ float q_s[K], k_s[K], eg_s[K], G_s[KDA_MAX_V], f0_s[KDA_MAX_R], g0_s[KDA_MAX_R], red[32];

    float *Sg = a.state + (size_t)slot * a.slot_stride + (size_t)h * K * V;
    float *tail = a.state + (size_t)slot * a.slot_stride + (size_t)H * K * V; /* [P, C] */
    const int sc = j / SP, d0 = (j % SP) * KP; /* state column and first row of this thread */
    const bool scol = sc < V;
    const bool kch = j < K, vch = j < V;
    const int cq = h * K + j, ck = HK + h * K + j, cv = 2 * HK + h * V + j;

    float S[KP];
    if (scol) {
#pragma unroll
        for (int d = 0; d < KP; d++) S[d] = Sg[(size_t)(d0 + d) * V + sc];
    }
    /* Conv window right-aligned in 4 registers: t[0..2] = previous raw
     * inputs (t[2] newest), w[3] the current token's tap. Taps < 4 leave
     * leading zero weights, which add exact zeros (same sum as the reference). */
    float tq[3] = {0, 0, 0}, tk[3] = {0, 0, 0}, tv[3] = {0, 0, 0};
    float wq[4] = {0, 0, 0, 0}, wk[4] = {0, 0, 0, 0}, wv[4] = {0, 0, 0, 0};
    const int sh = 3 - P;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (i >= sh) {
            const int m = i - sh; /* memory tap / tail row */
            if (kch) {
                wq[i] = a.convw[(size_t)cq * a.taps + m];
                wk[i] = a.convw[(size_t)ck * a.taps + m];
                if (i < 3) {
                    tq[i] = tail[(size_t)m * C + cq];
                    tk[i] = tail[(size_t)m * C + ck];
                }
            }
            if (vch) {
                wv[i] = a.convw[(size_t)cv * a.taps + m];
                if (i < 3) tv[i] = tail[(size_t)m * C + cv];
            }
        }
    }
    const float a_h = -expf(a.A_log[h]);
    const float qscale = 1.0f / sqrtf((float)K);

    for (int i = 0; i < nt; i++) {
        const size_t row = (size_t)(row0 + i);
        const float *pr = a.proj + row * a.ldp;
        float qv = 0.0f, kv = 0.0f, vv = 0.0f;
        if (kch) {
            const float xq = pr[cq], xk = pr[ck];
            const float sq = ((wq[0] * tq[0] + wq[1] * tq[1]) + wq[2] * tq[2]) + wq[3] * xq;
            const float sk = ((wk[0] * tk[0] + wk[1] * tk[1]) + wk[2] * tk[2]) + wk[3] * xk;
            qv = siluf_(sq);
            kv = siluf_(sk);
            tq[0] = tq[1]; tq[1] = tq[2]; tq[2] = xq;
            tk[0] = tk[1]; tk[1] = tk[2]; tk[2] = xk;
        }
        if (vch) {
            const float xv = pr[cv];
            const float sv = ((wv[0] * tv[0] + wv[1] * tv[1]) + wv[2] * tv[2]) + wv[3] * xv;
            vv = siluf_(sv);
            tv[0] = tv[1]; tv[1] = tv[2]; tv[2] = xv;
        }
        if (!a.lowrank)
            for (int r = j; r < R; r += blockDim.x) {
                f0_s[r] = pr[a.off_f0 + r];
                g0_s[r] = pr[a.off_g0 + r];
            }
        const float beta = sigmoidf_(pr[a.off_beta + h]);
        const float ssq = block_sum(qv * qv, red);
        const float ssk = block_sum(kv * kv, red); /* its barriers also publish f0_s/g0_s */
        if (kch) {
            q_s[j] = qv * (1.0f / sqrtf(ssq + 1e-6f)) * qscale;
            k_s[j] = kv * (1.0f / sqrtf(ssk + 1e-6f));
            float g = 0.0f;
            if (a.lowrank)
                g = a.lowrank[row * (HK + HV) + cq];
            else
                for (int r = 0; r < R; r++) g += bf2f(((const bf16 *)a.f1t)[(size_t)r * HK + cq]) * f0_s[r];
            eg_s[j] = expf(a_h * softplusf_(g + a.dt_bias[cq]));
        }
        if (vch) {
            float G = 0.0f;
            if (a.lowrank)
                G = a.lowrank[row * (HK + HV) + HK + h * V + j];
            else
                for (int r = 0; r < R; r++) G += bf2f(((const bf16 *)a.g1t)[(size_t)r * HV + h * V + j]) * g0_s[r];
            G_s[j] = G + (a.g_bias ? a.g_bias[h * V + j] : 0.0f);
        }
        __syncthreads();
        float ks = 0.0f, o = 0.0f;
        if (scol) {
#pragma unroll
            for (int d = 0; d < KP; d++) {
                S[d] *= eg_s[d0 + d];
                ks += S[d] * k_s[d0 + d];
            }
        }
        if (SP == 2) ks += __shfl_xor_sync(0xffffffffu, ks, 1);
        /* the v value after conv + SiLU lives with thread sc (v channel sc) */
        __shared__ float v_s[KDA_MAX_V];
        if (vch) v_s[j] = vv;
        __syncthreads();
        if (scol) {
            const float u = beta * (v_s[sc] - ks);
#pragma unroll
            for (int d = 0; d < KP; d++) {
                S[d] += k_s[d0 + d] * u;
                o += S[d] * q_s[d0 + d];
            }
        }
        if (SP == 2) o += __shfl_xor_sync(0xffffffffu, o, 1);
        const bool writer = scol && (j % SP) == 0;
        const float sso = block_sum(writer ? o * o : 0.0f, red);
        if (writer) {
            const float r = 1.0f / sqrtf(sso / V + a.eps);
            ((bf16 *)a.y)[row * a.ldy + h * V + sc] = f2bf(o * r * a.onorm[sc] * sigmoidf_(G_s[sc]));
        }
    }
    if (scol) {
#pragma unroll
        for (int d = 0; d < KP; d++) Sg[(size_t)(d0 + d) * V + sc] = S[d];
    }
#pragma unroll
    for (int i = 0; i < 3; i++) {
        if (i >= sh) {
            const int m = i - sh;
            if (kch) {
                tail[(size_t)m * C + cq] = tq[i];
                tail[(size_t)m * C + ck] = tk[i];
            }
            if (vch) tail[(size_t)m * C + cv] = tv[i];
        }
    }
}

/* graw = F1 f0 and G = G1 g0 for all rows before the step kernel, so the
 * step kernel's critical path is the state alone. 8 rows per block share
 * each weight load; out [T, HK + HV] (graw | G). */
#define LR_ROWS 8
__global__ void __launch_bounds__(256) kda_lowrank_kernel(kc_kda_args a, int T, int K)
{
    __shared__ float xs[LR_ROWS][2 * KDA_MAX_R];
    const int HK = a.H * K, HV = a.H * a.V, R = a.R, t0 = blockIdx.x * LR_ROWS;
    for (int i = threadIdx.x; i < LR_ROWS * 2 * R; i += blockDim.x) {
        const int rr = i / (2 * R), r = i % (2 * R), t = t0 + rr;
        xs[rr][r] = t < T ? a.proj[(size_t)t * a.ldp + (r < R ? a.off_f0 + r : a.off_g0 + r - R)] : 0.0f;
    }
    __syncthreads();
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= HK + HV) return;
    const bf16 *w = c < HK ? (const bf16 *)a.f1t + c : (const bf16 *)a.g1t + (c - HK);
    const int ld = c < HK ? HK : HV, xo = c < HK ? 0 : R;
    float acc[LR_ROWS];
#pragma unroll
    for (int i = 0; i < LR_ROWS; i++) acc[i] = 0.0f;
#pragma unroll 8
    for (int r = 0; r < R; r++) {
        const float wv = bf2f(w[(size_t)r * ld]);
#pragma unroll
        for (int i = 0; i < LR_ROWS; i++) acc[i] += wv * xs[i][xo + r];
    }
#pragma unroll
    for (int i = 0; i < LR_ROWS; i++)
        if (t0 + i < T) a.lowrank[(size_t)(t0 + i) * (HK + HV) + c] = acc[i];
}

int kc_kda_step(const kc_kda_args *a, cudaStream_t s)
{
    if (a->n_items <= 0) return 0;
    if (a->V > KDA_MAX_V || a->R > KDA_MAX_R || a->taps < 1 || a->taps > 4) return -5;
    const int sp = a->K >= 128 ? 2 : 1;
    int threads = a->V * sp > a->K ? a->V * sp : a->K;
    threads = (threads + 31) / 32 * 32;
    if (a->lowrank) {
        const int T = a->lowrank_rows, cols = a->H * (a->K + a->V);
        kda_lowrank_kernel<<<dim3((T + LR_ROWS - 1) / LR_ROWS, (cols + 255) / 256), 256, 0, s>>>(*a, T, a->K);
        KC_LAUNCH_CHECK();
    }
    dim3 grid(a->n_items, a->H);
    switch (a->K) {
    case 16: kda_step_kernel<16><<<grid, threads, 0, s>>>(*a); break;
    case 32: kda_step_kernel<32><<<grid, threads, 0, s>>>(*a); break;
    case 64: kda_step_kernel<64><<<grid, threads, 0, s>>>(*a); break;
    case 128: kda_step_kernel<128><<<grid, threads, 0, s>>>(*a); break;
    default: return -5;
    }
    KC_LAUNCH_CHECK();
    return 0;
}

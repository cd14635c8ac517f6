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
 * (A column-tiled cluster variant measured slower; it is in kernels/lab/.)
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#include <stdlib.h>
#include <string.h>

#define KDA_MAX_V 128
#define KDA_MAX_R 256

/* OPT: the model uses one of the fla options (pre-run conv, grouped value
 * heads, the lower-bound gate, beta x 2). Without them the options fold to
 * constants: as runtime reads they cost the default kernel 7-11% (H200, B=64
 * and 256: 0.085 -> 0.091 and 0.291 -> 0.322 ms per layer). */
/* BF: the state S is stored as bf16 (kc_tail_off): read into fp32 registers
 * once, rounded once when written back. */
template <int K, bool OPT, bool BF>
__global__ void __launch_bounds__(256, 2) kda_step_kernel(kc_kda_args a)
{
    /* K = 128 splits each column over two adjacent threads (64 rows each) to
     * keep the state in registers without spilling. */
    constexpr int SP = K >= 128 ? 2 : 1, KP = K / SP;
    /* Before the PDL wait: the item table (uploaded before the step's first
     * kernel) and this head's state, which no kernel of the step writes before
     * this one (whatever wrote it earlier has completed: every kernel waits
     * for its predecessor before it triggers its dependents), so the state's
     * load overlaps the previous kernel's end. The conv tail is read after the
     * wait (kc_kda_conv may write it). */
    const int item = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const int slot = a.item_slot[item];
    if (slot < 0) {
        KC_PDL_WAIT();
        return;
    }
    const bool pre = OPT && a.preconv; /* q|k|v already activated, no tail (kc_kda_conv ran) */
    const int H = a.H, V = a.V, R = a.R, P = pre ? 0 : a.taps - 1;
    const int grp = OPT && a.group > 1 ? a.group : 1, hq = h / grp; /* GVA: the q/k head of this value head */
    const int QK = H / grp * K, HK = H * K, HV = H * V, C = 2 * QK + HV;
    __shared__ float q_s[K], k_s[K], eg_s[K], G_s[KDA_MAX_V], f0_s[KDA_MAX_R], g0_s[KDA_MAX_R], red[32];

    float *Sg = a.state + (size_t)slot * a.slot_stride + (size_t)h * K * V;
    bf16 *Sb = (bf16 *)(a.state + (size_t)slot * a.slot_stride) + (size_t)h * K * V;
    float *tail = a.state + (size_t)slot * a.slot_stride + kc_tail_off(H, K, V, BF); /* [P, C] */
    const int sc = j / SP, d0 = (j % SP) * KP; /* state column and first row of this thread */
    const bool scol = sc < V;
    const bool kch = j < K, vch = j < V;
    const int cq = hq * K + j, ck = QK + hq * K + j, cv = 2 * QK + h * V + j;
    const int cg = h * K + j; /* gate column: per value head */

    float S[KP];
    if (scol) {
#pragma unroll
        for (int d = 0; d < KP; d++) S[d] = BF ? bf2f(Sb[(size_t)(d0 + d) * V + sc]) : Sg[(size_t)(d0 + d) * V + sc];
    }
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int row0 = a.item_row0[item], nt = a.item_ntok[item];
    /* Conv window right-aligned in 4 registers: t[0..2] = previous raw
     * inputs (t[2] newest), w[3] the current token's tap. Taps < 4 leave
     * leading zero weights, which add exact zeros (same sum as the reference).
     * preconv: the identity tap alone (w[3] = 1, exact) and no SiLU. */
    float tq[3] = {0, 0, 0}, tk[3] = {0, 0, 0}, tv[3] = {0, 0, 0};
    float wq[4] = {0, 0, 0, 0}, wk[4] = {0, 0, 0, 0}, wv[4] = {0, 0, 0, 0};
    const int sh = 3 - P;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (i >= sh) {
            const int m = i - sh; /* memory tap / tail row */
            if (kch) {
                wq[i] = pre ? 1.0f : a.convw[(size_t)cq * a.taps + m];
                wk[i] = pre ? 1.0f : a.convw[(size_t)ck * a.taps + m];
                if (i < 3) {
                    tq[i] = tail[(size_t)m * C + cq];
                    tk[i] = tail[(size_t)m * C + ck];
                }
            }
            if (vch) {
                wv[i] = pre ? 1.0f : a.convw[(size_t)cv * a.taps + m];
                if (i < 3) tv[i] = tail[(size_t)m * C + cv];
            }
        }
    }
    const float a_pos = expf(a.A_log[h]), a_h = -a_pos, lb = OPT ? a.lower_bound : 0.0f;
    const float bscale = OPT && a.neg_eigval ? 2.0f : 1.0f;
    const float qscale = 1.0f / sqrtf((float)K);

    for (int i = 0; i < nt; i++) {
        const size_t row = (size_t)(row0 + i);
        const float *pr = a.proj + row * a.ldp;
        float qv = 0.0f, kv = 0.0f, vv = 0.0f;
        if (kch) {
            const float xq = pr[cq], xk = pr[ck];
            const float sq = ((wq[0] * tq[0] + wq[1] * tq[1]) + wq[2] * tq[2]) + wq[3] * xq;
            const float sk = ((wk[0] * tk[0] + wk[1] * tk[1]) + wk[2] * tk[2]) + wk[3] * xk;
            qv = pre ? sq : siluf_(sq);
            kv = pre ? sk : siluf_(sk);
            tq[0] = tq[1]; tq[1] = tq[2]; tq[2] = xq;
            tk[0] = tk[1]; tk[1] = tk[2]; tk[2] = xk;
        }
        if (vch) {
            const float xv = pr[cv];
            const float sv = ((wv[0] * tv[0] + wv[1] * tv[1]) + wv[2] * tv[2]) + wv[3] * xv;
            vv = pre ? sv : siluf_(sv);
            tv[0] = tv[1]; tv[1] = tv[2]; tv[2] = xv;
        }
        if (!a.lowrank)
            for (int r = j; r < R; r += blockDim.x) {
                f0_s[r] = pr[a.off_f0 + r];
                g0_s[r] = pr[a.off_g0 + r];
            }
        const float beta = bscale * sigmoidf_(pr[a.off_beta + h]);
        const float ssq = block_sum(qv * qv, red);
        const float ssk = block_sum(kv * kv, red); /* its barriers also publish f0_s/g0_s */
        if (kch) {
            q_s[j] = qv * (1.0f / sqrtf(ssq + 1e-6f)) * qscale;
            k_s[j] = kv * (1.0f / sqrtf(ssk + 1e-6f));
            float g = 0.0f;
            if (a.lowrank)
                g = a.lowrank[row * (HK + HV) + cg];
            else
                for (int r = 0; r < R; r++) g += bf2f(((const bf16 *)a.f1t)[(size_t)r * HK + cg]) * f0_s[r];
            const float gx = g + a.dt_bias[cg];
            eg_s[j] = expf(lb < 0.0f ? lb * sigmoidf_(a_pos * gx) : a_h * softplusf_(gx));
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
        for (int d = 0; d < KP; d++) {
            if (BF) Sb[(size_t)(d0 + d) * V + sc] = f2bf(S[d]);
            else Sg[(size_t)(d0 + d) * V + sc] = S[d];
        }
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
 * step kernel's critical path is the state alone; out [T, HK + HV] (graw | G).
 * Block: 256 output columns (8 per lane, one 16-byte load of the transposed
 * weights per r) x LR_ROWS rows; the 8 warps split the r range and their
 * partial sums meet in shared memory. Every lane has all its weight loads of a
 * batch in flight at once: the kernel costs about one memory round trip
 * (v2's version walked r serially per thread: ~46 us per call at any T). */
#define LR_ROWS 4
#define LR_COLS 256
__global__ void __launch_bounds__(256) kda_lowrank_kernel(kc_kda_args a, int T, int K)
{
    __shared__ float xs[LR_ROWS][2 * KDA_MAX_R];
    __shared__ float red[8][LR_ROWS][LR_COLS];
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int HK = a.H * K, HV = a.H * a.V, R = a.R, t0 = blockIdx.y * LR_ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < LR_ROWS * 2 * R; i += blockDim.x) {
        const int rr = i / (2 * R), r = i % (2 * R), t = t0 + rr;
        xs[rr][r] = t < T ? a.proj[(size_t)t * a.ldp + (r < R ? a.off_f0 + r : a.off_g0 + r - R)] : 0.0f;
    }
    __syncthreads();
    const int c0 = blockIdx.x * LR_COLS + lane * 8; /* 8 columns, all in F1 or all in G1 (HK % 8 == 0) */
    const bool on = c0 < HK + HV;
    const bool isf = c0 < HK;
    const bf16 *w = isf ? (const bf16 *)a.f1t + c0 : (const bf16 *)a.g1t + (c0 - HK);
    const int ld = isf ? HK : HV, xo = isf ? 0 : R;
    float acc[LR_ROWS][8];
#pragma unroll
    for (int i = 0; i < LR_ROWS; i++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[i][e] = 0.0f;
    if (on) {
        for (int rb = warp; rb < R; rb += 8 * 8) { /* 8 loads per lane in flight */
            uint4 raw[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int r = rb + 8 * u;
                raw[u] = r < R ? *(const uint4 *)(w + (size_t)r * ld) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int r = rb + 8 * u;
                if (r < R) {
                    float wf[8];
                    bf8_to_f(raw[u], wf);
#pragma unroll
                    for (int i = 0; i < LR_ROWS; i++) {
                        const float xv = xs[i][xo + r];
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[i][e] += wf[e] * xv;
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < LR_ROWS; i++)
#pragma unroll
        for (int e = 0; e < 8; e++) red[warp][i][lane * 8 + e] = acc[i][e];
    __syncthreads();
    const int c = blockIdx.x * LR_COLS + threadIdx.x;
    if (c >= HK + HV) return;
#pragma unroll
    for (int i = 0; i < LR_ROWS; i++) {
        if (t0 + i >= T) break;
        float sum = 0.0f;
#pragma unroll
        for (int w8 = 0; w8 < 8; w8++) sum += red[w8][i][threadIdx.x];
        a.lowrank[(size_t)(t0 + i) * (HK + HV) + c] = sum;
    }
}

/* ---- decode steps of one token per item: a prologue, then the state streamed ----
 *
 * At batch >= 16 a KDA decode step is the state's traffic: 64 KiB per (item,
 * head) read and written. The block-per-head kernel above holds a column in
 * registers and runs the token's prologue (conv, norms, gates) between the
 * state's load and its store, 2 blocks per SM, so an SM has little in flight
 * during the prologue's barriers (37-43% of copy at B = 64..256,
 * bench/NOTES.md). When every item carries one token (kc_kda_args.stream):
 *  - kda_stream_prep_kernel, grid (item, head), K threads: conv + SiLU (the
 *    tail moves on), L2 norms, q / sqrt(K), the decay exp(gate), sigmoid(G +
 *    g_bias) and beta, written in place over the token's proj / lowrank
 *    entries (each is read once, by this block);
 *  - kda_stream_kernel: one block of 256 threads per SM walks (item, head)
 *    pairs with the next three pairs' state and vectors in flight (cp.async
 *    into a ring of three state buffers: a pair's state moves to registers
 *    first, which frees its buffer), so the SM's memory pipe stays busy while
 *    a pair computes; the item tables sit in shared memory, so issuing a copy
 *    waits for no global load. Warp w owns rows 16w..16w+15 of the K x V state, lane l
 *    columns 4l..4l+3 (a warp's row is 512 contiguous bytes); S^T k and S^T q
 *    are reduced over the warps in shared memory, warp 0 does the gated output
 *    RMSNorm, and the updated state goes from registers to global memory.
 * K = V = 128 only, no GVA (kc_kda_step falls back to the kernel above). */
#define KS_K 128
#define KS_NB 3               /* state buffers: 3 pairs in flight while one computes from registers */
#define KS_NV (KS_NB + 1)     /* vector slots (the computing pair's stay until it is done) */
#define KS_VEC (5 * KS_K + 4) /* q k eg | v gsig | beta, padded to 16 bytes */
#define KS_MAX_ITEMS 1024     /* item slot / row tables in shared memory */

template <bool BF> __host__ __device__ static constexpr int ks_state_floats() { return BF ? KS_K * KS_K / 2 : KS_K * KS_K; }
template <bool BF> static constexpr size_t ks_smem_bytes()
{
    return ((size_t)KS_NB * ks_state_floats<BF>() + (size_t)KS_NV * KS_VEC + 2 * 8 * KS_K + 2 * KS_MAX_ITEMS) *
           sizeof(float);
}

template <bool OPT>
__global__ void __launch_bounds__(KS_K) kda_stream_prep_kernel(kc_kda_args a)
{
    __shared__ float red[32];
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int item = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const int slot = a.item_slot[item];
    if (slot < 0) return;
    constexpr int K = KS_K, V = KS_K;
    const int H = a.H, HK = H * K, HV = H * V, C = 2 * HK + HV;
    const bool pre = OPT && a.preconv; /* q | k | v already activated (kc_kda_conv ran) */
    const int P = pre ? 0 : a.taps - 1;
    const size_t row = (size_t)a.item_row0[item];
    float *pr = const_cast<float *>(a.proj) + row * a.ldp; /* in place: kc_kda_args.stream */
    float *lr = a.lowrank + row * (HK + HV);
    const int cq = h * K + j, ck = HK + h * K + j, cv = 2 * HK + h * V + j;
    float x[3] = {pr[cq], pr[ck], pr[cv]};
    if (!pre) {
        float *tail = a.state + (size_t)slot * a.slot_stride + kc_tail_off(H, K, V, a.state_bf16); /* [P, C] */
        const int ch[3] = {cq, ck, cv};
#pragma unroll
        for (int c = 0; c < 3; c++) { /* oldest tap first, the current token last */
            const float *w = a.convw + (size_t)ch[c] * a.taps;
            float t[3] = {0.0f, 0.0f, 0.0f}, sum = 0.0f;
#pragma unroll
            for (int m = 0; m < 3; m++)
                if (m < P) t[m] = tail[(size_t)m * C + ch[c]];
#pragma unroll
            for (int m = 0; m < 3; m++)
                if (m < P) sum += w[m] * t[m];
            sum += w[P] * x[c];
#pragma unroll
            for (int m = 0; m < 3; m++)
                if (m < P) tail[(size_t)m * C + ch[c]] = m + 1 < P ? t[m + 1] : x[c];
            x[c] = siluf_(sum);
        }
    }
    const float ssq = block_sum(x[0] * x[0], red);
    const float ssk = block_sum(x[1] * x[1], red);
    pr[cq] = x[0] * (1.0f / sqrtf(ssq + 1e-6f)) * (1.0f / sqrtf((float)K));
    pr[ck] = x[1] * (1.0f / sqrtf(ssk + 1e-6f));
    pr[cv] = x[2];
    const float a_pos = expf(a.A_log[h]), lb = OPT ? a.lower_bound : 0.0f;
    const float gx = lr[h * K + j] + a.dt_bias[h * K + j];
    lr[h * K + j] = expf(lb < 0.0f ? lb * sigmoidf_(a_pos * gx) : -a_pos * softplusf_(gx));
    const int cG = HK + h * V + j;
    lr[cG] = sigmoidf_(lr[cG] + (a.g_bias ? a.g_bias[h * V + j] : 0.0f));
    if (j == 0) pr[a.off_beta + h] = (OPT && a.neg_eigval ? 2.0f : 1.0f) * sigmoidf_(pr[a.off_beta + h]);
}

/* two bf16 in one 32-bit word (the lower address first) and back */
static __device__ __forceinline__ unsigned ks_pack2(float a, float b)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    unsigned u;
    memcpy(&u, &v, 4);
    return u;
}
static __device__ __forceinline__ float2 ks_unpack2(unsigned u)
{
    __nv_bfloat162 v;
    memcpy(&v, &u, 4);
    return make_float2(__low2float(v), __high2float(v));
}

/* pair p = item * H + h: its state into sdst (16-byte copies) if WHAT & KS_STATE
 * and the prologue's vectors into vdst (4-byte copies: proj rows need not be
 * aligned) if WHAT & KS_VECS; always one commit group, empty for padding items
 * and past the end */
enum { KS_STATE = 1, KS_VECS = 2 };
template <bool BF>
static __device__ __forceinline__ void ks_issue(const kc_kda_args &a, int p, int npairs, float *sdst, float *vdst,
                                                const int *islot, const int *irow, int what = KS_STATE | KS_VECS)
{
    constexpr int K = KS_K, SB = ks_state_floats<BF>();
    if (p < npairs) {
        const int H = a.H, item = p / H, h = p % H, slot = islot[item];
        if (slot >= 0 && (what & KS_STATE)) {
            const float *src = a.state + (size_t)slot * a.slot_stride + (size_t)h * SB;
            for (int c = threadIdx.x; c < SB / 4; c += blockDim.x) cp_async16(sdst + 4 * c, src + 4 * c, true);
        }
        if (slot >= 0 && (what & KS_VECS)) {
            const size_t row = (size_t)irow[item];
            const float *pr = a.proj + row * a.ldp, *lr = a.lowrank + row * (size_t)(H * 2 * K);
            const int HK = H * K;
            for (int e = threadIdx.x; e < 5 * K + 1; e += blockDim.x) {
                const int q = e / K, r = e % K;
                const float *s = q == 0 ? pr + h * K + r
                               : q == 1 ? pr + HK + h * K + r
                               : q == 2 ? lr + h * K + r
                               : q == 3 ? pr + 2 * HK + h * K + r
                               : q == 4 ? lr + HK + h * K + r
                                        : pr + a.off_beta + h;
                cp_async_n<4>(vdst + e, s);
            }
        }
    }
    cp_async_commit();
}

/* Pair i (the block's i-th) computes from state buffer i % KS_NB and vector
 * slot i % KS_NV. Its state moves to registers first; the barrier after that
 * frees the buffer for pair i + KS_NB, so three pairs are in flight while one
 * computes. Barriers per pair: data ready; state in registers and S^T k
 * partials published; S^T q partials published (warp 0 then finishes). */
template <bool BF>
__global__ void __launch_bounds__(256, 1) kda_stream_kernel(kc_kda_args a)
{
    KC_DYNAMIC_SMEM(sm);
    constexpr int K = KS_K, V = KS_K, SB = ks_state_floats<BF>();
    float *vec = sm + KS_NB * SB, *redk = vec + KS_NV * KS_VEC, *redo = redk + 8 * V;
    int *islot = (int *)(redo + 8 * V), *irow = islot + KS_MAX_ITEMS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, H = a.H, npairs = a.n_items * H;
    const int p0 = blockIdx.x, ps = gridDim.x;
    /* The first KS_NB pairs' states are copied before the PDL wait: no kernel
     * of this step writes the recurrent state before this one (the prologue
     * kernel before it writes proj, lowrank and the conv tail, which lies
     * past the state in the slot; whatever wrote a state earlier has completed,
     * since every kernel waits for its predecessor before it triggers its
     * dependents), and the item tables are uploaded before the step's first
     * kernel. So the state streams in while the prologue runs; the vectors,
     * its outputs, are copied after the wait. Groups: states 0..2, then
     * vectors 0..2, then one per later pair (both), so waiting until KS_NB - 1
     * groups are pending still covers pair i's state and vectors. */
    for (int i = threadIdx.x; i < a.n_items; i += blockDim.x) islot[i] = a.item_slot[i], irow[i] = a.item_row0[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < KS_NB; i++) ks_issue<BF>(a, p0 + i * ps, npairs, sm + i * SB, nullptr, islot, irow, KS_STATE);
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
#pragma unroll
    for (int i = 0; i < KS_NB; i++) ks_issue<BF>(a, p0 + i * ps, npairs, nullptr, vec + i * KS_VEC, islot, irow, KS_VECS);
    int sb = 0, vb = 0; /* this pair's state buffer and vector slot */
    for (int p = p0; p < npairs; p += ps) {
        cp_async_wait<KS_NB - 1>(); /* this pair's copies (this thread's) */
        __syncthreads();            /* everyone's */
        const int item = p / H, h = p % H, slot = islot[item];
        const bool live = slot >= 0; /* uniform over the block */
        const float *Ss = sm + sb * SB, *vq = vec + vb * KS_VEC, *vk = vq + K, *veg = vk + K, *vv = veg + K, *vgs = vv + V;
        const int r0 = warp * 16, c0 = lane * 4;
        float4 S[16];
        if (live) {
            float4 ks = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int r = r0 + i;
                float4 s;
                if (BF) {
                    const uint2 u = *(const uint2 *)((const bf16 *)Ss + (size_t)r * V + c0);
                    const float2 lo = ks_unpack2(u.x), hi = ks_unpack2(u.y);
                    s = make_float4(lo.x, lo.y, hi.x, hi.y);
                } else {
                    s = *(const float4 *)(Ss + (size_t)r * V + c0);
                }
                const float e = veg[r], kr = vk[r];
                s.x *= e, s.y *= e, s.z *= e, s.w *= e;
                ks.x += s.x * kr, ks.y += s.y * kr, ks.z += s.z * kr, ks.w += s.w * kr;
                S[i] = s;
            }
            *(float4 *)(redk + warp * V + c0) = ks;
        }
        __syncthreads(); /* the state buffer is free, the partials are in */
        {
            const int nb = (sb + KS_NB) % KS_NB, nv = (vb + KS_NB) % KS_NV; /* = sb; vb + 3 */
            ks_issue<BF>(a, p + KS_NB * ps, npairs, sm + nb * SB, vec + nv * KS_VEC, islot, irow);
        }
        if (live) {
            const float beta = vgs[V];
            float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < 8; w++) {
                const float4 t = *(const float4 *)(redk + w * V + c0);
                u.x += t.x, u.y += t.y, u.z += t.z, u.w += t.w;
            }
            u.x = beta * (vv[c0] - u.x), u.y = beta * (vv[c0 + 1] - u.y);
            u.z = beta * (vv[c0 + 2] - u.z), u.w = beta * (vv[c0 + 3] - u.w);
            float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float *Sg = a.state + (size_t)slot * a.slot_stride + (size_t)h * SB;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int r = r0 + i;
                const float kr = vk[r], qr = vq[r];
                float4 s = S[i];
                s.x += kr * u.x, s.y += kr * u.y, s.z += kr * u.z, s.w += kr * u.w;
                o.x += s.x * qr, o.y += s.y * qr, o.z += s.z * qr, o.w += s.w * qr;
                if (BF) {
                    uint2 w2;
                    w2.x = ks_pack2(s.x, s.y), w2.y = ks_pack2(s.z, s.w);
                    *(uint2 *)((bf16 *)Sg + (size_t)r * V + c0) = w2;
                } else {
                    *(float4 *)(Sg + (size_t)r * V + c0) = s;
                }
            }
            *(float4 *)(redo + warp * V + c0) = o;
            __syncthreads();
            if (warp == 0) {
                float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int w = 0; w < 8; w++) {
                    const float4 q = *(const float4 *)(redo + w * V + c0);
                    t.x += q.x, t.y += q.y, t.z += q.z, t.w += q.w;
                }
                const float ss = warp_sum(t.x * t.x + t.y * t.y + t.z * t.z + t.w * t.w);
                const float rn = 1.0f / sqrtf(ss / V + a.eps);
                bf16 *y = (bf16 *)a.y + (size_t)irow[item] * a.ldy + h * V + c0;
                const float *on = a.onorm + c0;
                *(unsigned *)y = ks_pack2(t.x * rn * on[0] * vgs[c0], t.y * rn * on[1] * vgs[c0 + 1]);
                *(unsigned *)(y + 2) = ks_pack2(t.z * rn * on[2] * vgs[c0 + 2], t.w * rn * on[3] * vgs[c0 + 3]);
            }
        }
        sb = (sb + 1) % KS_NB, vb = (vb + 1) % KS_NV;
    }
}

/* The stream path of kc_kda_step, or -5 where it does not apply (the caller
 * falls back). Requirements: see kc_kda_args.stream. */
int kc_kda_step_streams(const kc_kda_args *a)
{
    return a->stream && a->lowrank && a->K == KS_K && a->V == KS_K && a->group <= 1 && a->slot_stride % 4 == 0 &&
           ((uintptr_t)a->state & 15) == 0 && a->ldy % 2 == 0 && a->H > 0 && a->n_items <= KS_MAX_ITEMS &&
           (a->preconv || (a->convw && a->taps >= 1 && a->taps <= 4));
}

static int kda_stream(const kc_kda_args *a, cudaStream_t s)
{
    if (!kc_kda_step_streams(a)) return -5;
    static int sms;
    static size_t allowed[2];
    if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        sms = 0;
        return -7;
    }
    const bool opt = a->preconv || a->lower_bound != 0.0f || a->neg_eigval;
    cudaError_t e = opt ? kc_launch(kda_stream_prep_kernel<true>, dim3(a->n_items, a->H), dim3(KS_K), 0, s, *a)
                        : kc_launch(kda_stream_prep_kernel<false>, dim3(a->n_items, a->H), dim3(KS_K), 0, s, *a);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: kda stream prologue launch failed: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));
        return -7;
    }
    const int npairs = a->n_items * a->H;
    int grid = a->stream_blocks > 0 ? a->stream_blocks : sms;
    if (grid > npairs) grid = npairs;
    const int bf = a->state_bf16 ? 1 : 0;
    const size_t bytes = bf ? ks_smem_bytes<true>() : ks_smem_bytes<false>();
    void (*kern)(kc_kda_args) = bf ? kda_stream_kernel<true> : kda_stream_kernel<false>;
    if (allowed[bf] < bytes) { /* once per kernel, before any graph capture (warm-up) */
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            fprintf(stderr, "%s:%d: kda stream: %zu bytes of shared memory refused: %s\n", __FILE__, __LINE__, bytes,
                    cudaGetErrorString(e));
            return -7;
        }
        allowed[bf] = bytes;
    }
    e = kc_launch(kern, dim3(grid), dim3(256), bytes, s, *a);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: kda stream launch failed: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));
        return -7;
    }
    return 0;
}

/* ---- the short conv as its own pass (kc_kda_conv) ----
 * grid (n_items, ceil(C / 128)), 128 threads: thread = one q|k|v channel of
 * one item, its taps and tail in registers, walking the item's tokens in
 * order and overwriting each raw input with its activation once the input
 * has entered the window. Same sum order as short_conv_bias_f32 (oldest tap
 * first, the bias added before the SiLU). */
__global__ void __launch_bounds__(128) kda_conv_kernel(kc_kda_args a)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int item = blockIdx.x, slot = a.item_slot[item];
    if (slot < 0) return;
    const int grp = a.group > 1 ? a.group : 1;
    const int C = 2 * (a.H / grp) * a.K + a.H * a.V;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int row0 = a.item_row0[item], nt = a.item_ntok[item];
    /* in place: the one writer of proj among the KDA kernels (cuda_ops.h kc_kda_conv) */
    float *x = const_cast<float *>(a.proj) + (size_t)row0 * a.ldp + c;
    if (!a.convw) { /* fla use_short_conv false: q, k, v = SiLU(projection) */
        for (int i = 0; i < nt; i++) x[(size_t)i * a.ldp] = siluf_(x[(size_t)i * a.ldp]);
        return;
    }
    const int taps = a.taps, P = taps - 1, sh = 3 - P;
    float *tail = a.state + (size_t)slot * a.slot_stride + kc_tail_off(a.H, a.K, a.V, a.state_bf16); /* [P, C], oldest first */
    /* right-aligned in registers (static indices only): t[0..2] the previous
     * raw inputs (t[2] newest), w[3] the current token's tap; the leading
     * zero taps of taps < 4 add exact zeros */
    float w[4] = {0, 0, 0, 0}, t[3] = {0, 0, 0};
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i >= sh) {
            w[i] = a.convw[(size_t)c * taps + (i - sh)];
            if (i < 3) t[i] = tail[(size_t)(i - sh) * C + c];
        }
    const float b = a.conv_bias ? a.conv_bias[c] : 0.0f;
    for (int i = 0; i < nt; i++) {
        const float xi = x[(size_t)i * a.ldp];
        float sum = 0.0f;
        sum += w[0] * t[0];
        sum += w[1] * t[1];
        sum += w[2] * t[2];
        sum += w[3] * xi;
        t[0] = t[1], t[1] = t[2], t[2] = xi;
        x[(size_t)i * a.ldp] = siluf_(sum + b);
    }
#pragma unroll
    for (int i = 0; i < 3; i++)
        if (i >= sh) tail[(size_t)(i - sh) * C + c] = t[i];
}

int kc_kda_conv(const kc_kda_args *a, cudaStream_t s)
{
    if (a->n_items <= 0) return 0;
    const int group = a->group > 1 ? a->group : 1;
    if (a->H % group || (a->convw && (a->taps < 1 || a->taps > 4))) return -5;
    const int C = 2 * (a->H / group) * a->K + a->H * a->V;
    const cudaError_t e = kc_launch(kda_conv_kernel, dim3(a->n_items, (C + 127) / 128), dim3(128), 0, s, *a);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: kda conv launch failed: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));
        return -7;
    }
    return 0;
}

int kc_kda_lowrank(const kc_kda_args *a, cudaStream_t s)
{
    if (!a->lowrank || a->n_items <= 0) return 0;
    if (a->R > KDA_MAX_R || (a->H * a->K) % 8 || (a->H * a->V) % 8) return -5; /* 16-byte weight loads */
    const int T = a->lowrank_rows, cols = a->H * (a->K + a->V);
    cudaError_t e = kc_launch(kda_lowrank_kernel, dim3((cols + LR_COLS - 1) / LR_COLS, (T + LR_ROWS - 1) / LR_ROWS),
                              dim3(256), 0, s, *a, T, a->K);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: kda lowrank launch failed: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));
        return -7;
    }
    return 0;
}

int kc_kda_step(const kc_kda_args *a, cudaStream_t s)
{
    if (a->n_items <= 0) return 0;
    if (a->V > KDA_MAX_V || a->R > KDA_MAX_R || a->taps < 1 || a->taps > 4) return -5;
    const int group = a->group > 1 ? a->group : 1;
    if (a->H % group) return -5;
    /* the value heads of a group would race on their shared q/k conv tail, and
     * without a conv there is no tail: kc_kda_conv first */
    if ((group > 1 || !a->convw) && !a->preconv) return -5;
    const int sp = a->K >= 128 ? 2 : 1;
    int threads = a->V * sp > a->K ? a->V * sp : a->K;
    threads = (threads + 31) / 32 * 32;
    const int lr = kc_kda_lowrank(a, s);
    if (lr) return lr;
    if (kc_kda_step_streams(a)) return kda_stream(a, s);
    dim3 grid(a->n_items, a->H);
    const bool opt = a->preconv || a->group > 1 || a->lower_bound != 0.0f || a->neg_eigval;
    cudaError_t e;
#define KDA_STEP_BF(KK, BF) (opt ? kc_launch(kda_step_kernel<KK, true, BF>, grid, dim3(threads), 0, s, *a) \
                                 : kc_launch(kda_step_kernel<KK, false, BF>, grid, dim3(threads), 0, s, *a))
#define KDA_STEP(KK) (a->state_bf16 ? KDA_STEP_BF(KK, true) : KDA_STEP_BF(KK, false))
    switch (a->K) {
    case 16: e = KDA_STEP(16); break;
    case 32: e = KDA_STEP(32); break;
    case 64: e = KDA_STEP(64); break;
    case 128: e = KDA_STEP(128); break;
    default: return -5;
    }
#undef KDA_STEP
#undef KDA_STEP_BF
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: kda step launch failed: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));
        return -7;
    }
    return 0;
}

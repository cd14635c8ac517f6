/*
 * kda_step_tiled.cu - kernel lab (kernels/lab/README.md): the column-tiled,
 * persistent, cluster variant of the KDA decode step. Not in the production
 * path: kc_kda_step (kernels/ops_kda.cu, one block per (item, head)) is the
 * kernel the backend runs; on the H200 this variant measured 6-7% slower
 * (bench/NOTES.md, v3), so it moved here with its test and benchmark
 * (lab_kda_step_tiled.c).
 *
 * Contract: the same kc_kda_args as kc_kda_step, with the low-rank scratch
 * (a->lowrank) required, K in {32, 64, 128}, V a multiple of 32 (at most
 * 256), fp32 state only, a slot stride of a multiple of 4 floats and a
 * 16-byte aligned state. lab_kda_step_tiled runs the production low-rank
 * pass (kc_kda_lowrank) and then this kernel; -5 for arguments outside the
 * contract, -7 for a failed launch.
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#include <cooperative_groups.h>
#include <stdio.h>
namespace cg = cooperative_groups;

#include "lab_kda_step_tiled.h"

/* ---- column-tiled step (K in {32, 64, 128}, V % 32 == 0, lowrank scratch) ----
 *
 * The state traffic is the whole cost of this kernel at batch >= 16, so the
 * layout is chosen for memory-level parallelism: a block owns 32 value
 * columns of one (item, head) (a K x 32 fp32 tile, 16 KiB for K = 128), and
 * the V/32 blocks of a head form a thread-block cluster. Each of the 256
 * threads holds K/32 float4 of the tile (rows rsub + 4*warp + 32*t, columns
 * 4*(lane%8)..+3): one 16-byte load and store per element group, ~64
 * registers, 4 blocks per SM, and the loads are issued before the prologue
 * (conv, norms, gate) so they are in flight while it runs.
 * Per token: p = S^T k over the tile (after the decay), reduced across the
 * 8 warps in shared memory; u = beta (v - p); S += k u^T; o = S^T q reduced
 * the same way. The gated output RMSNorm needs sum(o^2) over all V columns:
 * each block publishes its partial in shared memory and reads the others'
 * through distributed shared memory after one cluster barrier.
 * q/k (and their conv tails) are computed by every block of the cluster
 * (128 channels, cheap); block 0 writes the q/k tails back, each block the
 * tails of its own v channels. */
#define KT_COLS 32
#define KT_MAX_NR 4
/* One (item, head) column tile: load the K x 32 state tile into registers */
template <int NR>
static __device__ __forceinline__ void kt_load(float4 *S, const float *Sg, int V, int rsub, int warp)
{
#pragma unroll
    for (int t = 0; t < NR; t++) S[t] = *(const float4 *)(Sg + (size_t)(rsub + 4 * warp + 32 * t) * V);
}

/* add the 4 column sums of the lanes that share a column group (lane % 8) */
static __device__ __forceinline__ void sum_over_rsub(float &a, float &b, float &c, float &d)
{
#pragma unroll
    for (int o = 8; o < 32; o <<= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
        c += __shfl_xor_sync(0xffffffffu, c, o);
        d += __shfl_xor_sync(0xffffffffu, d, o);
    }
}

template <int K, int MINB>
__global__ void __launch_bounds__(256, MINB) kda_step_tile_kernel(kc_kda_args a)
{
    constexpr int NR = K / 32; /* float4 row groups per thread */
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    cg::cluster_group cl = cg::this_cluster();
    const bool pre = a.preconv; /* q|k|v already activated, no tail (kc_kda_conv ran) */
    const int H = a.H, V = a.V, P = pre ? 0 : a.taps - 1, NT = V / KT_COLS;
    const int grp = a.group > 1 ? a.group : 1;
    const int QK = H / grp * K, HK = H * K, HV = H * V, C = 2 * QK + HV, LR = HK + HV;
    const int ct = blockIdx.x % NT, cid = blockIdx.x / NT, ncl = gridDim.x / NT;
    const int nwork = a.n_items * H;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, cgp = lane & 7, rsub = lane >> 3;
    __shared__ float q_s[K], k_s[K], eg_s[K], v_s[KT_COLS], G_s[KT_COLS];
    __shared__ float red_p[8][KT_COLS], red_o[8][KT_COLS], red2[8][2];
    __shared__ float part_s[2];
    const bool kch = tid < K;
    const int vt = tid - 128;
    const bool vch = vt >= 0 && vt < KT_COLS;
    const float qscale = 1.0f / sqrtf((float)K);
    const float onw = tid < KT_COLS ? a.onorm[ct * KT_COLS + tid] : 0.0f;
    int tc = 0; /* tokens done by this cluster: parity of the part_s slot */

    /* Persistent over work items w = item * H + head, all blocks of a cluster
     * on the same w (so they agree on padding and barriers); the next item's
     * state tile is loaded while the current one is processed. */
    int w = cid;
    int slot = w < nwork ? a.item_slot[w / H] : -1;
    float4 S[NR];
    if (slot >= 0) kt_load<NR>(S, a.state + (size_t)slot * a.slot_stride + (size_t)(w % H) * K * V + ct * KT_COLS + cgp * 4, V, rsub, warp);
    while (w < nwork) {
        const int wn = w + ncl;
        const int slotn = wn < nwork ? a.item_slot[wn / H] : -1;
        float4 Sn[NR];
        if (slotn >= 0) kt_load<NR>(Sn, a.state + (size_t)slotn * a.slot_stride + (size_t)(wn % H) * K * V + ct * KT_COLS + cgp * 4, V, rsub, warp);
        if (slot >= 0) {
            const int item = w / H, h = w % H;
            const int row0 = a.item_row0[item], nt = a.item_ntok[item];
            float *Sg = a.state + (size_t)slot * a.slot_stride + (size_t)h * K * V + ct * KT_COLS + cgp * 4;
            float *tail = a.state + (size_t)slot * a.slot_stride + (size_t)H * K * V; /* [P, C] */
            /* channel roles: tid < K: q/k channel tid (conv taps/tail in w1/t1 = q,
             * w2/t2 = k); 128 <= tid < 160: v channel vt of this tile (w1/t1) */
            const int hq = h / grp; /* GVA: the q/k head of this value head */
            const int c1 = kch ? hq * K + tid : 2 * QK + h * V + ct * KT_COLS + vt, c2 = QK + hq * K + tid;
            const int cg = h * K + tid; /* gate column (kch): per value head */
            float t1[3] = {0, 0, 0}, t2[3] = {0, 0, 0}, w1[4] = {0, 0, 0, 0}, w2[4] = {0, 0, 0, 0};
            const int sh = 3 - P;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (i >= sh && (kch || vch)) {
                    const int m = i - sh;
                    w1[i] = pre ? 1.0f : a.convw[(size_t)c1 * a.taps + m];
                    if (i < 3) t1[i] = tail[(size_t)m * C + c1];
                    if (kch) {
                        w2[i] = pre ? 1.0f : a.convw[(size_t)c2 * a.taps + m];
                        if (i < 3) t2[i] = tail[(size_t)m * C + c2];
                    }
                }
            }
            const float a_pos = expf(a.A_log[h]), a_h = -a_pos, lb = a.lower_bound;
            const float bscale = a.neg_eigval ? 2.0f : 1.0f;
            const float dtb = kch ? a.dt_bias[cg] : 0.0f;
            const float gb = vch && a.g_bias ? a.g_bias[h * V + ct * KT_COLS + vt] : 0.0f;

            for (int i = 0; i < nt; i++, tc++) {
                const size_t row = (size_t)(row0 + i);
                const float *pr = a.proj + row * a.ldp;
                const float *lr = a.lowrank + row * LR;
                float qv = 0.0f, kv = 0.0f;
                if (kch || vch) {
                    const float x1 = pr[c1];
                    const float s1 = ((w1[0] * t1[0] + w1[1] * t1[1]) + w1[2] * t1[2]) + w1[3] * x1;
                    t1[0] = t1[1]; t1[1] = t1[2]; t1[2] = x1;
                    if (kch) {
                        const float x2 = pr[c2];
                        const float s2 = ((w2[0] * t2[0] + w2[1] * t2[1]) + w2[2] * t2[2]) + w2[3] * x2;
                        t2[0] = t2[1]; t2[1] = t2[2]; t2[2] = x2;
                        qv = pre ? s1 : siluf_(s1);
                        kv = pre ? s2 : siluf_(s2);
                        const float gx = lr[cg] + dtb;
                        eg_s[tid] = expf(lb < 0.0f ? lb * sigmoidf_(a_pos * gx) : a_h * softplusf_(gx));
                    } else {
                        v_s[vt] = pre ? s1 : siluf_(s1);
                        G_s[vt] = lr[HK + h * V + ct * KT_COLS + vt] + gb;
                    }
                }
                const float beta = bscale * sigmoidf_(pr[a.off_beta + h]);
                /* ||q||^2 and ||k||^2 in one block reduction */
                const float sq2 = warp_sum(qv * qv), sk2 = warp_sum(kv * kv);
                if (lane == 0) red2[warp][0] = sq2, red2[warp][1] = sk2;
                __syncthreads();
                if (kch) {
                    float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
                    for (int w8 = 0; w8 < 8; w8++) ssq += red2[w8][0], ssk += red2[w8][1];
                    q_s[tid] = qv * (1.0f / sqrtf(ssq + 1e-6f)) * qscale;
                    k_s[tid] = kv * (1.0f / sqrtf(ssk + 1e-6f));
                }
                __syncthreads();
                /* decay, then p = S^T k for this thread's 4 columns over its rows */
                float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
#pragma unroll
                for (int t = 0; t < NR; t++) {
                    const int r = rsub + 4 * warp + 32 * t;
                    const float e = eg_s[r], kk = k_s[r];
                    S[t].x *= e; S[t].y *= e; S[t].z *= e; S[t].w *= e;
                    p0 += S[t].x * kk; p1 += S[t].y * kk; p2 += S[t].z * kk; p3 += S[t].w * kk;
                }
                sum_over_rsub(p0, p1, p2, p3);
                if (rsub == 0) *(float4 *)&red_p[warp][cgp * 4] = make_float4(p0, p1, p2, p3);
                __syncthreads();
                float4 u = make_float4(0, 0, 0, 0);
#pragma unroll
                for (int w8 = 0; w8 < 8; w8++) {
                    const float4 r = *(const float4 *)&red_p[w8][cgp * 4];
                    u.x += r.x; u.y += r.y; u.z += r.z; u.w += r.w;
                }
                const float4 vv = *(const float4 *)&v_s[cgp * 4];
                u.x = beta * (vv.x - u.x); u.y = beta * (vv.y - u.y);
                u.z = beta * (vv.z - u.z); u.w = beta * (vv.w - u.w);
                float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
#pragma unroll
                for (int t = 0; t < NR; t++) {
                    const int r = rsub + 4 * warp + 32 * t;
                    const float kk = k_s[r], qq = q_s[r];
                    S[t].x += kk * u.x; S[t].y += kk * u.y; S[t].z += kk * u.z; S[t].w += kk * u.w;
                    o0 += S[t].x * qq; o1 += S[t].y * qq; o2 += S[t].z * qq; o3 += S[t].w * qq;
                }
                sum_over_rsub(o0, o1, o2, o3);
                if (rsub == 0) *(float4 *)&red_o[warp][cgp * 4] = make_float4(o0, o1, o2, o3);
                __syncthreads();
                float oj = 0.0f, gate = 0.0f;
                if (tid < KT_COLS) {
#pragma unroll
                    for (int w8 = 0; w8 < 8; w8++) oj += red_o[w8][tid];
                    gate = sigmoidf_(G_s[tid]);
                    const float ss = warp_sum(oj * oj);
                    if (tid == 0) part_s[tc & 1] = ss;
                }
                cl.sync(); /* partials of all V/32 blocks published; also orders this token's smem reads */
                if (tid < KT_COLS) {
                    float sso = 0.0f;
                    for (int r = 0; r < NT; r++) sso += cl.map_shared_rank(part_s, r)[tc & 1];
                    const float rn = 1.0f / sqrtf(sso / V + a.eps);
                    ((bf16 *)a.y)[row * a.ldy + h * V + ct * KT_COLS + tid] = f2bf(oj * rn * onw * gate);
                }
            }
#pragma unroll
            for (int t = 0; t < NR; t++) *(float4 *)(Sg + (size_t)(rsub + 4 * warp + 32 * t) * V) = S[t];
#pragma unroll
            for (int i = 0; i < 3; i++) {
                if (i >= sh) {
                    const int m = i - sh;
                    if ((kch && ct == 0) || vch) tail[(size_t)m * C + c1] = t1[i];
                    if (kch && ct == 0) tail[(size_t)m * C + c2] = t2[i];
                }
            }
        }
        w = wn;
        slot = slotn;
#pragma unroll
        for (int t = 0; t < NR; t++) S[t] = Sn[t];
    }
    cl.sync(); /* no block leaves while another may still read its part_s */
}

int lab_kda_step_tiled(const kc_kda_args *a, int tile_occ, int tile_clusters, cudaStream_t s)
{
    if (a->n_items <= 0) return 0;
    const int group = a->group > 1 ? a->group : 1;
    if (a->H % group || a->taps < 1 || a->taps > 4) return -5;
    if ((group > 1 || !a->convw) && !a->preconv) return -5;
    const int NT = a->V / KT_COLS;
    if (!a->lowrank || a->V % KT_COLS || NT > 8 || !(a->K == 32 || a->K == 64 || a->K == 128) ||
        a->slot_stride % 4 || ((uintptr_t)a->state & 15) || a->state_bf16 || (tile_occ != 2 && tile_occ != 3))
        return -5;
    int rc = kc_kda_lowrank(a, s);
    if (rc) return rc;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = NT;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = kc_pdl_on ? 2 : 1;
    /* tile_occ 3: 3 blocks per SM (80 registers, small spills) instead of 2
     * (128 registers, none) */
    const int occ3 = tile_occ == 3;
    void (*kern)(kc_kda_args) =
        occ3 ? (a->K == 32 ? kda_step_tile_kernel<32, 3> : a->K == 64 ? kda_step_tile_kernel<64, 3> : kda_step_tile_kernel<128, 3>)
             : (a->K == 32 ? kda_step_tile_kernel<32, 2> : a->K == 64 ? kda_step_tile_kernel<64, 2> : kda_step_tile_kernel<128, 2>);
    /* persistent: as many clusters as fit on the device at once (asked once
     * per kernel and cluster size), each walking work items */
    static int max_cl[6][9];
    const int ki = (a->K == 32 ? 0 : a->K == 64 ? 1 : 2) + 3 * occ3;
    if (!max_cl[ki][NT]) {
        int n = 0;
        cfg.gridDim = dim3(NT * 1024);
        if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess || n <= 0) {
            cudaGetLastError();
            n = 1 << 20; /* unknown: one cluster per work item */
        }
        max_cl[ki][NT] = n;
    }
    const int nwork = a->n_items * a->H;
    int ncl = nwork < max_cl[ki][NT] ? nwork : max_cl[ki][NT];
    if (tile_clusters > 0 && tile_clusters < ncl) ncl = tile_clusters; /* tests: clusters walk several items */
    cfg.gridDim = dim3(ncl * NT);
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, *a);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: kda tile kernel launch failed: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));
        return -7;
    }
    return 0;
}

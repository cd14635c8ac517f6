/*
 * ops_gqa.cu - GQA decode/prefill: q/k RMSNorm + partial RoPE + paged KV
 * append, then flash-decoding attention over the paged cache (split over
 * the context, the query heads of one KV head sharing every K/V load), then
 * the split combine fused with the sigmoid output gate.
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define ATTN_THREADS 128
#define ATTN_MAX_SPLIT 256

static __device__ __forceinline__ bf16 *kv_ptr(const kc_gqa_args &a, int slot, int pos, int kvh, int is_v)
{
    const int b = a.block_table[(size_t)slot * a.max_blocks + pos / a.blk];
    return (bf16 *)a.kv + (size_t)b * a.block_stride + a.layer_off +
           ((size_t)(is_v * a.Hkv + kvh) * a.blk + pos % a.blk) * a.hd;
}

/* grid (T, Hq + Hkv), block = hd threads (rounded to a warp) */
__global__ void gqa_qkv_kernel(kc_gqa_args a)
{
    __shared__ float xs[128], red[32];
    const int t = blockIdx.x, hh = blockIdx.y, d = threadIdx.x, hd = a.hd;
    const int slot = a.tok_slot[t];
    if (slot < 0) return;
    const int pos = a.tok_pos[t];
    const float *pr = a.proj + (size_t)t * a.ldp;
    const bool is_q = hh < a.Hq;
    const int head = is_q ? hh : hh - a.Hq;
    const float *nw = is_q ? a.q_norm : a.k_norm;
    float x = d < hd ? pr[(is_q ? a.off_q : a.off_k) + head * hd + d] : 0.0f;
    if (nw) {
        const float ss = block_sum(x * x, red);
        if (d < hd) x = x * (1.0f / sqrtf(ss / hd + a.eps)) * nw[d];
    }
    if (d < hd) xs[d] = x;
    __syncthreads();
    const int half = a.rope_dim / 2;
    if (d < a.rope_dim) {
        const int i = d < half ? d : d - half;
        const double ang = (double)pos * pow(a.theta, -2.0 * i / a.rope_dim);
        const float c = (float)cos(ang), s = (float)sin(ang);
        x = d < half ? xs[d] * c - xs[d + half] * s : xs[d] * c + xs[d - half] * s;
    }
    if (d >= hd) return;
    if (is_q) {
        a.q[((size_t)t * a.Hq + head) * hd + d] = x;
    } else {
        kv_ptr(a, slot, pos, head, 0)[d] = f2bf(x);
        kv_ptr(a, slot, pos, head, 1)[d] = f2bf(pr[a.off_v + head * hd + d]);
    }
}

int kc_gqa_qkv(const kc_gqa_args *a, cudaStream_t s)
{
    if (a->T <= 0) return 0;
    if (a->hd > 128 || a->rope_dim > a->hd || (a->rope_dim & 1)) return -5;
    gqa_qkv_kernel<<<dim3(a->T, a->Hq + a->Hkv), (a->hd + 31) / 32 * 32, 0, s>>>(*a);
    KC_LAUNCH_CHECK();
    return 0;
}

/* grid (T, Hkv, nsplit), ATTN_THREADS threads. Scores of one split in shared
 * memory, softmax partials (m, l) and the unnormalised output to scratch. */
template <int HD, int G>
__global__ void __launch_bounds__(ATTN_THREADS) gqa_attn_kernel(kc_gqa_args a, float *opart, float *ml,
                                                                int nsplit_max, int split)
{
    constexpr int EPL = HD >= 32 ? HD / 32 : 1;  /* key elements per lane in the score loop */
    constexpr int NP = HD / 2, NG = ATTN_THREADS / NP; /* value loop: dim pairs x key groups */
    __shared__ float qs[G][HD];
    __shared__ float sc[G][ATTN_MAX_SPLIT];
    __shared__ float accs[NG][G][HD];
    const int t = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
    const int slot = a.tok_slot[t];
    if (slot < 0) return;
    const int n_ctx = a.tok_pos[t] + 1, start = sp * split;
    if (start >= n_ctx) return;
    const int end = min(start + split, n_ctx), nk = end - start;
    const float scale = 1.0f / sqrtf((float)HD);
    for (int i = threadIdx.x; i < G * HD; i += ATTN_THREADS)
        qs[i / HD][i % HD] = a.q[((size_t)t * a.Hq + kvh * G + i / HD) * HD + i % HD] * scale;
    __syncthreads();

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool lane_on = lane * EPL < HD;
    constexpr int NW = ATTN_THREADS / 32, U = 4; /* U keys per warp in flight */
    for (int j0 = start + warp; j0 < end; j0 += NW * U) {
        float kf[U][EPL];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * NW;
            if (lane_on && j < end) {
                const bf16 *kp = kv_ptr(a, slot, j, kvh, 0) + lane * EPL;
                if (EPL == 4) {
                    const uint2 raw = *(const uint2 *)kp;
                    const float2 x0 = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.x);
                    const float2 x1 = __bfloat1622float2(*(const __nv_bfloat162 *)&raw.y);
                    kf[u][0] = x0.x;
                    kf[u][1] = x0.y;
                    kf[u][2 % EPL] = x1.x;
                    kf[u][3 % EPL] = x1.y;
                } else {
#pragma unroll
                    for (int e = 0; e < EPL; e++) kf[u][e] = bf2f(kp[e]);
                }
            } else {
#pragma unroll
                for (int e = 0; e < EPL; e++) kf[u][e] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u * NW;
#pragma unroll
            for (int g = 0; g < G; g++) {
                float s = 0.0f;
                if (lane_on) {
#pragma unroll
                    for (int e = 0; e < EPL; e++) s += kf[u][e] * qs[g][lane * EPL + e];
                }
                s = warp_sum(s);
                if (lane == 0 && j < end) sc[g][j - start] = s;
            }
        }
    }
    __syncthreads();
    for (int g = warp; g < G; g += ATTN_THREADS / 32) {
        float m = -INFINITY;
        for (int i = lane; i < nk; i += 32) m = fmaxf(m, sc[g][i]);
        m = warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < nk; i += 32) {
            const float p = expf(sc[g][i] - m);
            sc[g][i] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) {
            float *o = ml + (((size_t)t * a.Hq + kvh * G + g) * nsplit_max + sp) * 2;
            o[0] = m;
            o[1] = l;
        }
    }
    __syncthreads();
    const int pair = threadIdx.x % NP, kg = threadIdx.x / NP;
    float acc[G][2];
#pragma unroll
    for (int g = 0; g < G; g++) acc[g][0] = acc[g][1] = 0.0f;
#pragma unroll 4
    for (int j = start + kg; j < end; j += NG) {
        const float2 v = __bfloat1622float2(*(const __nv_bfloat162 *)(kv_ptr(a, slot, j, kvh, 1) + 2 * pair));
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float p = sc[g][j - start];
            acc[g][0] += p * v.x;
            acc[g][1] += p * v.y;
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        accs[kg][g][2 * pair] = acc[g][0];
        accs[kg][g][2 * pair + 1] = acc[g][1];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += ATTN_THREADS) {
        const int g = i / HD, d = i % HD;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < NG; k++) s += accs[k][g][d];
        opart[(((size_t)t * a.Hq + kvh * G + g) * nsplit_max + sp) * HD + d] = s;
    }
}

/* grid (T, Hq), block hd threads: merge the splits, gate, write bf16. */
__global__ void gqa_combine_kernel(kc_gqa_args a, const float *opart, const float *ml, int nsplit_max, int split,
                                   bf16 *out, int ldo)
{
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x, hd = a.hd;
    if (a.tok_slot[t] < 0 || d >= hd) return;
    const int ns = (a.tok_pos[t] + 1 + split - 1) / split;
    const float *mlp = ml + ((size_t)t * a.Hq + h) * nsplit_max * 2;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, mlp[2 * s]);
    float L = 0.0f, o = 0.0f;
    for (int s = 0; s < ns; s++) {
        const float w = expf(mlp[2 * s] - M);
        L += w * mlp[2 * s + 1];
        o += w * opart[(((size_t)t * a.Hq + h) * nsplit_max + s) * hd + d];
    }
    o /= L;
    if (a.off_gate >= 0) o *= sigmoidf_(a.proj[(size_t)t * a.ldp + a.off_gate + h * hd + d]);
    out[(size_t)t * ldo + h * hd + d] = f2bf(o);
}

template <int HD>
static int attn_launch_g(const kc_gqa_args *a, float *opart, float *ml, int nsplit_max, int split, cudaStream_t s)
{
    const int G = a->Hq / a->Hkv;
    dim3 grid(a->T, a->Hkv, nsplit_max);
    switch (G) {
    case 1: gqa_attn_kernel<HD, 1><<<grid, ATTN_THREADS, 0, s>>>(*a, opart, ml, nsplit_max, split); break;
    case 2: gqa_attn_kernel<HD, 2><<<grid, ATTN_THREADS, 0, s>>>(*a, opart, ml, nsplit_max, split); break;
    case 4: gqa_attn_kernel<HD, 4><<<grid, ATTN_THREADS, 0, s>>>(*a, opart, ml, nsplit_max, split); break;
    case 8: gqa_attn_kernel<HD, 8><<<grid, ATTN_THREADS, 0, s>>>(*a, opart, ml, nsplit_max, split); break;
    default: return -5;
    }
    return 0;
}

int kc_gqa_attn(const kc_gqa_args *a, float *opart, float *ml, int nsplit_max, int split, uint16_t *out, int ldo,
                cudaStream_t s)
{
    if (a->T <= 0) return 0;
    if (split > ATTN_MAX_SPLIT || a->Hq % a->Hkv) return -5;
    int rc;
    switch (a->hd) {
    case 16: rc = attn_launch_g<16>(a, opart, ml, nsplit_max, split, s); break;
    case 32: rc = attn_launch_g<32>(a, opart, ml, nsplit_max, split, s); break;
    case 64: rc = attn_launch_g<64>(a, opart, ml, nsplit_max, split, s); break;
    case 128: rc = attn_launch_g<128>(a, opart, ml, nsplit_max, split, s); break;
    default: return -5;
    }
    if (rc) return rc;
    KC_LAUNCH_CHECK();
    gqa_combine_kernel<<<dim3(a->T, a->Hq), (a->hd + 31) / 32 * 32, 0, s>>>(*a, opart, ml, nsplit_max, split,
                                                                          (bf16 *)out, ldo);
    KC_LAUNCH_CHECK();
    return 0;
}

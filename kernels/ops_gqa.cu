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

/* kc_launch result -> 0 or -7 (KC_LAUNCH_CHECK's code), with a message */
static int gqa_launch_rc(cudaError_t e, const char *what, int line)
{
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s:%d: %s launch failed: %s\n", __FILE__, line, what, cudaGetErrorString(e));
    return -7;
}

static __device__ __forceinline__ bf16 *kv_ptr(const kc_gqa_args &a, int slot, int pos, int kvh, int is_v)
{
    const int b = a.block_table[(size_t)slot * a.max_blocks + pos / a.blk];
    return (bf16 *)a.kv + (size_t)b * a.block_stride + a.layer_off +
           ((size_t)(is_v * a.Hkv + kvh) * a.blk + pos % a.blk) * a.hd;
}

/* One warp per (row, head): lane l holds elements l + 32 j (j < hd / 32),
 * QKV_WARPS pairs a block. A block per pair (hd threads, a block-wide sum)
 * made a prompt pass's launch of T x (Hq + Hkv) blocks latency-bound: 57 us
 * at 2048 rows, 360 at 8192 on the H200 (prof, 1.7B shape), against ~175 MB
 * of traffic at 8192 rows. The norm's sum keeps that kernel's order (each
 * 32-element slice summed across the warp, then the slices as block_sum
 * adds them), so the outputs are the same bits. */
#define QKV_WARPS 8
__global__ void __launch_bounds__(QKV_WARPS * 32) gqa_qkv_kernel(kc_gqa_args a)
{
    __shared__ float xs_all[QKV_WARPS][128];
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nh = a.Hq + a.Hkv, hd = a.hd;
    const long pair = (long)blockIdx.x * QKV_WARPS + warp;
    if (pair >= (long)a.T * nh) return;
    const int t = (int)(pair / nh), hh = (int)(pair % nh);
    const int slot = a.tok_slot[t];
    if (slot < 0) return;
    const int pos = a.tok_pos[t];
    const float *pr = a.proj + (size_t)t * a.ldp;
    const bool is_q = hh < a.Hq;
    const int head = is_q ? hh : hh - a.Hq;
    const float *nw = is_q ? a.q_norm : a.k_norm;
    const float *src = pr + (is_q ? a.off_q : a.off_k) + head * hd;
    float *xs = xs_all[warp];
    const int nj = (hd + 31) / 32;
    float x[4], p[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int d = lane + 32 * j;
        x[j] = j < nj && d < hd ? src[d] : 0.0f;
        p[j] = j < nj ? warp_sum(x[j] * x[j]) : 0.0f;
    }
    if (nw) {
        const float ss = nj == 4 ? (p[0] + p[2]) + (p[1] + p[3]) : nj == 2 ? p[0] + p[1] : p[0];
        const float r = 1.0f / sqrtf(ss / hd + a.eps);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int d = lane + 32 * j;
            if (j < nj && d < hd) x[j] = x[j] * r * nw[d];
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int d = lane + 32 * j;
        if (j < nj && d < hd) xs[d] = x[j];
    }
    __syncwarp();
    const int half = a.rope_dim / 2;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int d = lane + 32 * j;
        if (j >= nj || d >= hd) continue;
        if (d < a.rope_dim) {
            const int i = d < half ? d : d - half;
            const double inv = a.rope_inv_freq ? a.rope_inv_freq[i] : pow(a.theta, -2.0 * i / a.rope_dim);
            const double ang = (double)pos * inv; /* in double, as rope_freq */
            const float c = (float)cos(ang), sn = (float)sin(ang);
            x[j] = d < half ? xs[d] * c - xs[d + half] * sn : xs[d] * c + xs[d - half] * sn;
        }
        if (is_q) {
            a.q[((size_t)t * a.Hq + head) * hd + d] = x[j];
        } else {
            kv_ptr(a, slot, pos, head, 0)[d] = f2bf(x[j]);
            kv_ptr(a, slot, pos, head, 1)[d] = f2bf(pr[a.off_v + head * hd + d]);
        }
    }
}

int kc_gqa_qkv(const kc_gqa_args *a, cudaStream_t s)
{
    if (a->T <= 0) return 0;
    if (a->hd > 128 || a->rope_dim > a->hd || (a->rope_dim & 1)) return -5;
    const long pairs = (long)a->T * (a->Hq + a->Hkv);
    const cudaError_t e =
        kc_launch(gqa_qkv_kernel, dim3((unsigned)((pairs + QKV_WARPS - 1) / QKV_WARPS)), dim3(QKV_WARPS * 32), 0, s, *a);
    return gqa_launch_rc(e, "gqa qkv", __LINE__);
}

/* ---- split-context decode attention (flash-decoding) ----
 * grid (T, Hkv, nsplit), ATTN_THREADS threads; block (t, kvh, sp) covers the
 * keys [sp * split, min(sp * split + split, n_ctx)) of row t for the G query
 * heads of KV head kvh, and writes per query head the softmax partials
 * ml = (m, l) (max score, sum of exp(score - m)) and the unnormalised output
 * opart = sum exp(score - m) v, which gqa_combine_kernel merges over splits.
 *
 * A key row (hd bf16) is read by LPK = hd / 8 lanes with one 16-byte load
 * each, so a warp load instruction covers KPI = 32 / LPK keys (2 for hd 128).
 * Each warp walks tiles of TK keys (U load instructions for K and U for V per
 * lane), tiles interleaved over the warps, with the next tile's K and V loads
 * issued before the current tile is computed (register double buffering).
 * Every group of LPK lanes (one key of each load) is an independent
 * online-softmax stream with its own (m, l, acc) for all G query heads, so
 * each K/V load serves the G heads and the loop needs no cross-group
 * communication. Streams are merged inside the warp by shuffles at the end,
 * then across the warps in shared memory. fp32 throughout, accurate expf. */
#define ATTN_NW (ATTN_THREADS / 32)

/* 16-byte K/V load; read once, so no L1 allocation */
static __device__ __forceinline__ uint4 ld_stream16(const bf16 *p)
{
    uint4 r;
    asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

/* 16-byte shared load the compiler may not hoist out of the key loop (that
 * would pin G * 8 query registers per lane) */
static __device__ __forceinline__ float4 lds16(const float4 *p)
{
    float4 r;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
    return r;
}

template <int U> struct attn_tile {
    uint4 k[U], v[U];
};

/* Issue the K and V loads of warp tile `tile` (keys tile*TK .. of the split)
 * for this lane: key kq + u * KPI of the tile, dims sub*8 .. sub*8+7. Keys
 * past the split's end read nothing and are zero. */
template <int HD, int U, int KPI>
static __device__ __forceinline__ void attn_load(attn_tile<U> &b, const bf16 *kvb, const long long *koff, size_t voff,
                                                 int tile, int nk, int kq, int sub)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int idx = tile * (U * KPI) + u * KPI + kq;
        if (idx < nk) {
            const bf16 *p = kvb + koff[idx] + sub * 8;
            b.k[u] = ld_stream16(p);
            b.v[u] = ld_stream16(p + voff);
        } else {
            b.k[u] = make_uint4(0u, 0u, 0u, 0u);
            b.v[u] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* Online-softmax update of this lane's stream with one loaded tile. */
template <int HD, int G, int U, int KPI>
static __device__ __forceinline__ void attn_compute(const attn_tile<U> &b, const float4 *qs, float (&m)[G],
                                                    float (&l)[G], float (&acc)[G][8], int tile, int nk, int kq)
{
    constexpr int LPK = HD / 8;
    float s[U][G];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float kf[8];
        bf8_to_f(b.k[u], kf);
#pragma unroll
        for (int g = 0; g < G; g++) {
            /* q re-read from shared memory (2 LDS.128): keeps 8 G registers free */
            const float4 q0 = lds16(qs + g * (HD / 4)), q1 = lds16(qs + g * (HD / 4) + 1);
            float x = q0.x * kf[0];
            x = fmaf(q0.y, kf[1], x);
            x = fmaf(q0.z, kf[2], x);
            x = fmaf(q0.w, kf[3], x);
            x = fmaf(q1.x, kf[4], x);
            x = fmaf(q1.y, kf[5], x);
            x = fmaf(q1.z, kf[6], x);
            x = fmaf(q1.w, kf[7], x);
            s[u][g] = x;
        }
    }
    /* complete the dot products over the LPK lanes of the key row; every lane
     * of the group ends with the same (bitwise) sums */
#pragma unroll
    for (int o = LPK / 2; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int g = 0; g < G; g++) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], o);
#pragma unroll
    for (int u = 0; u < U; u++)
        if (tile * (U * KPI) + u * KPI + kq >= nk)
#pragma unroll
            for (int g = 0; g < G; g++) s[u][g] = -INFINITY;
#pragma unroll
    for (int g = 0; g < G; g++) {
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < U; u++) mn = fmaxf(mn, s[u][g]);
        /* mn == -inf only while the stream has seen no key: then corr and all
         * p are exp(-inf) = 0 instead of NaN */
        const float mref = mn == -INFINITY ? 0.0f : mn;
        const float corr = expf(m[g] - mref);
        m[g] = mn;
        float ls = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            s[u][g] = expf(s[u][g] - mref);
            ls += s[u][g];
        }
        l[g] = fmaf(l[g], corr, ls);
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] *= corr;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        float vf[8];
        bf8_to_f(b.v[u], vf);
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[g][e] = fmaf(s[u][g], vf[e], acc[g][e]);
    }
}

template <int HD, int G>
__global__ void __launch_bounds__(ATTN_THREADS, G >= 8 ? 2 : 3) gqa_attn_kernel(kc_gqa_args a, float *opart, float *ml,
                                                                int nsplit_max, int split)
{
    constexpr int LPK = HD / 8;                  /* lanes per key row */
    constexpr int KPI = 32 / LPK;                /* keys per warp load instruction */
    constexpr int TKW = G >= 8 ? 4 : 8;          /* wanted keys per warp tile (register budget) */
    constexpr int U = KPI >= TKW ? 1 : TKW / KPI; /* load instructions per tile (K and V each) */
    constexpr int TK = U * KPI;                  /* keys per warp tile */
    static_assert(HD % 16 == 0 && HD >= 16 && HD <= 128, "head dim");
    __shared__ long long koff[ATTN_MAX_SPLIT];   /* element offset of each key's K row */
    __shared__ __align__(16) float qsh[G][HD];   /* the G queries, pre-scaled */
    __shared__ float sm_m[ATTN_NW][G], sm_l[ATTN_NW][G];
    __shared__ __align__(16) float sm_acc[ATTN_NW][G][HD];
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
    const int slot = a.tok_slot[t];
    if (slot < 0) return;
    /* keys [lo, n_ctx): the causal range, its last `window` with a sliding
     * window; split sp starts at lo + sp * split */
    const int n_ctx = a.tok_pos[t] + 1, lo = a.window > 0 && n_ctx > a.window ? n_ctx - a.window : 0;
    const int start = lo + sp * split;
    if (start >= n_ctx) return; /* the combine reads only splits with start < n_ctx */
    const int nk = min(split, n_ctx - start);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane % LPK, kq = lane / LPK;

    for (int i = threadIdx.x; i < nk; i += ATTN_THREADS) {
        const int pos = start + i;
        const long long b = a.block_table[(size_t)slot * a.max_blocks + pos / a.blk];
        koff[i] = b * (long long)a.block_stride + (long long)a.layer_off +
                  ((long long)kvh * a.blk + pos % a.blk) * HD;
    }
    const float scale = 1.0f / sqrtf((float)HD);
    for (int i = threadIdx.x; i < G * HD; i += ATTN_THREADS)
        qsh[i / HD][i % HD] = a.q[((size_t)t * a.Hq + kvh * G + i / HD) * HD + i % HD] * scale;
    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0.0f;
    }
    __syncthreads(); /* koff, qsh */
    const float4 *qs = (const float4 *)&qsh[0][sub * 8];

    const bf16 *kvb = (const bf16 *)a.kv;
    const size_t voff = (size_t)a.Hkv * a.blk * HD; /* V rows follow the K rows of the layer's block */
    const int ntiles = (nk + TK - 1) / TK;
    attn_tile<U> b0, b1;
    if (warp < ntiles) attn_load<HD, U, KPI>(b0, kvb, koff, voff, warp, nk, kq, sub);
    for (int tile = warp; tile < ntiles; tile += 2 * ATTN_NW) {
        const int t1 = tile + ATTN_NW, t2 = tile + 2 * ATTN_NW;
        if (t1 < ntiles) attn_load<HD, U, KPI>(b1, kvb, koff, voff, t1, nk, kq, sub);
        attn_compute<HD, G, U, KPI>(b0, qs, m, l, acc, tile, nk, kq);
        if (t1 >= ntiles) break;
        if (t2 < ntiles) attn_load<HD, U, KPI>(b0, kvb, koff, voff, t2, nk, kq, sub);
        attn_compute<HD, G, U, KPI>(b1, qs, m, l, acc, t1, nk, kq);
    }

    /* merge the KPI streams of the warp (lanes sub, sub + LPK, ...) */
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float mn = fmaxf(m[g], mo), mref = mn == -INFINITY ? 0.0f : mn;
            const float c0 = expf(m[g] - mref), c1 = expf(mo - mref);
            m[g] = mn;
            l[g] = l[g] * c0 + lo * c1;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
                acc[g][e] = acc[g][e] * c0 + ao * c1;
            }
        }
    }
    if (kq == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            float4 *d = (float4 *)&sm_acc[warp][g][sub * 8];
            d[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
            d[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
            if (lane == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = l[g];
        }
    }
    __syncthreads();
    /* merge the warps; nk >= 1, so the block max is finite */
    for (int i = threadIdx.x; i < G * HD; i += ATTN_THREADS) {
        const int g = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATTN_NW; w++) M = fmaxf(M, sm_m[w][g]);
        float o = 0.0f, L = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_NW; w++) {
            const float c = expf(sm_m[w][g] - M);
            o += c * sm_acc[w][g][d];
            L += c * sm_l[w][g];
        }
        const size_t row = ((size_t)t * a.Hq + kvh * G + g) * nsplit_max + sp;
        opart[row * HD + d] = o;
        if (d == 0) {
            ml[row * 2] = M;
            ml[row * 2 + 1] = L;
        }
    }
}

/* grid (T, Hq), block hd threads: merge the splits, gate, write bf16. */
__global__ void gqa_combine_kernel(kc_gqa_args a, const float *opart, const float *ml, int nsplit_max, int split,
                                   bf16 *out, int ldo)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x, hd = a.hd;
    if (a.tok_slot[t] < 0 || d >= hd) return;
    const int n_ctx = a.tok_pos[t] + 1, lo = a.window > 0 && n_ctx > a.window ? n_ctx - a.window : 0;
    const int ns = (n_ctx - lo + split - 1) / split; /* the splits gqa_attn_kernel wrote */
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
    const dim3 grid(a->T, a->Hkv, nsplit_max), block(ATTN_THREADS);
    cudaError_t e;
    switch (a->Hq / a->Hkv) {
    case 1: e = kc_launch(gqa_attn_kernel<HD, 1>, grid, block, 0, s, *a, opart, ml, nsplit_max, split); break;
    case 2: e = kc_launch(gqa_attn_kernel<HD, 2>, grid, block, 0, s, *a, opart, ml, nsplit_max, split); break;
    case 4: e = kc_launch(gqa_attn_kernel<HD, 4>, grid, block, 0, s, *a, opart, ml, nsplit_max, split); break;
    case 8: e = kc_launch(gqa_attn_kernel<HD, 8>, grid, block, 0, s, *a, opart, ml, nsplit_max, split); break;
    default: return -5;
    }
    return gqa_launch_rc(e, "gqa attention", __LINE__);
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
    const cudaError_t e = kc_launch(gqa_combine_kernel, dim3(a->T, a->Hq), dim3((a->hd + 31) / 32 * 32), 0, s, *a,
                                    (const float *)opart, (const float *)ml, nsplit_max, split, (bf16 *)out, ldo);
    return gqa_launch_rc(e, "gqa combine", __LINE__);
}

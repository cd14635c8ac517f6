/*
 * ops_logprob.cu - logsumexp, target log-prob and top-n of logits rows in
 * one pass over each row (kc_row_lse + kc_gather_logprob + the top-n loop of
 * kc_sample read a row 2 + 1 + n_top times).
 *
 * One block per row. Every thread streams 4 elements per round (one 16-byte
 * load, the next round's load in flight) and keeps an online (max, sum) pair;
 * the sum is kept in double like logsumexp_f32. Top-n: every element gets a
 * unique 64-bit key ordered like sampling_top_n (order-preserving float bits,
 * then the inverted id: ties go to the lower id, -0 equals +0). Each warp
 * keeps a candidate buffer in shared memory and a threshold key, the n-th
 * best key of what it has kept; an element enters only if its key beats the
 * threshold (one float compare for nearly all elements). A full buffer is
 * sorted (bitonic, one warp) and cut back to its best n, which raises the
 * threshold. At the end the warps' lists are merged by one block-wide
 * bitonic sort. Random rows pass ~n log(vocab / n) elements into a buffer;
 * adversarial ones (ascending logits) fill it every few rounds and stay
 * correct, only slower.
 */
#include "cuda_common.cuh"
#include "prefill_ops.h"

#define LP_THREADS 256
#define LP_NW (LP_THREADS / 32)
#define LP_CAP 256 /* candidates per warp: >= KC_LOGPROB_MAX_TOP + 4 * 32, power of two */

typedef unsigned long long u64;

static __device__ __forceinline__ u64 lp_key(float v, int id)
{
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) == 0) u = 0; /* -0 ties +0, as the CPU's > comparison */
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((u64)u << 32) | (u64)(0xffffffffu - (uint32_t)id);
}
static __device__ __forceinline__ float lp_key_value(u64 k)
{
    uint32_t u = (uint32_t)(k >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    return __uint_as_float(u);
}
static __device__ __forceinline__ int lp_key_id(u64 k) { return (int)(0xffffffffu - (uint32_t)k); }

/* Descending bitonic sort of buf[0, N), N a power of two, by threads t of nt
 * (a warp, or the block when BLOCK). Ends with a barrier. */
template <bool BLOCK> static __device__ void lp_sort_desc(u64 *buf, int N, int t, int nt)
{
    for (int k = 2; k <= N; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = t; i < N; i += nt) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const u64 x = buf[i], y = buf[ixj];
                    if ((i & k) == 0 ? x < y : x > y) {
                        buf[i] = y;
                        buf[ixj] = x;
                    }
                }
            }
            if (BLOCK) __syncthreads();
            else __syncwarp();
        }
}

/* The warp's buffer cut back to its best min(cnt, ntop) keys, sorted; the
 * threshold is the ntop-th once that many are kept. Whole warp. */
static __device__ void lp_compact(u64 *buf, int &cnt, int ntop, u64 &thr, float &thr_v, int lane)
{
    int N = 32;
    while (N < cnt) N <<= 1;
    for (int i = cnt + lane; i < N; i += 32) buf[i] = 0; /* 0 is below every real key */
    __syncwarp();
    lp_sort_desc<false>(buf, N, lane, 32);
    if (cnt > ntop) cnt = ntop;
    if (cnt == ntop) {
        thr = buf[ntop - 1];
        thr_v = lp_key_value(thr);
    }
}

static __device__ __forceinline__ float lp_tof(float v) { return v; }
static __device__ __forceinline__ float lp_tof(bf16 v) { return bf2f(v); }

/* elements e0 .. e0+3 of the row; past vocab: -inf */
template <typename E, bool VEC> static __device__ __forceinline__ void lp_load4(const E *x, int e0, int vocab, float (&v)[4])
{
    if (VEC && e0 + 4 <= vocab) {
        if constexpr (sizeof(E) == 4) {
            const float4 f = __ldcs((const float4 *)(x + e0));
            v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
            const uint2 u = __ldcs((const uint2 *)(x + e0));
            v[0] = __uint_as_float(u.x << 16), v[1] = __uint_as_float(u.x & 0xffff0000u);
            v[2] = __uint_as_float(u.y << 16), v[3] = __uint_as_float(u.y & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = e0 + k < vocab ? lp_tof(x[e0 + k]) : -INFINITY;
    }
}

/* grid n, LP_THREADS threads. VEC: rows 4-element aligned (vector loads). */
template <typename E, bool VEC>
__global__ void __launch_bounds__(LP_THREADS)
    logprob_rows_kernel(const E *logits, int ldl, int vocab, const int32_t *targets, float *lse_out, float *tlp,
                        int n_top, int32_t *top_ids, float *top_lps, int ldt)
{
    __shared__ u64 cand[LP_NW][LP_CAP];
    __shared__ u64 merged[LP_NW * KC_LOGPROB_MAX_TOP];
    __shared__ float red_m[LP_NW];
    __shared__ double red_s[LP_NW];
    __shared__ float lse_sh;
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int row = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const E *x = logits + (size_t)row * ldl;
    const int ntop = min(n_top, vocab);
    const unsigned lanes_below = (1u << lane) - 1u;
    u64 *buf = cand[warp];
    float m = -INFINITY;
    double s = 0.0;
    u64 thr = 0; /* warp-uniform: keys <= thr cannot be in the top ntop */
    float thr_v = -INFINITY;
    int cnt = 0; /* warp-uniform: keys in buf */

    constexpr int STEP = 4 * LP_THREADS;
    float v[4], nv[4];
    lp_load4<E, VEC>(x, tid * 4, vocab, v);
    for (int base = 0; base < vocab; base += STEP) {
        const int e0 = base + tid * 4;
        if (base + STEP < vocab) lp_load4<E, VEC>(x, e0 + STEP, vocab, nv);
        const float mx = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
        if (mx > m) {
            s *= (double)expf(m - mx);
            m = mx;
        }
        if (m > -INFINITY) s += (double)((expf(v[0] - m) + expf(v[1] - m)) + (expf(v[2] - m) + expf(v[3] - m)));
        if (ntop > 0) {
            u64 key[4];
            unsigned bal[4];
            int tot = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                bool in = e0 + k < vocab && v[k] >= thr_v;
                if (in) {
                    key[k] = lp_key(v[k], e0 + k);
                    in = key[k] > thr;
                }
                bal[k] = __ballot_sync(0xffffffffu, in);
                tot += __popc(bal[k]);
            }
            if (tot) {
                if (cnt + tot > LP_CAP) lp_compact(buf, cnt, ntop, thr, thr_v, lane); /* cnt <= 64 after */
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if ((bal[k] >> lane) & 1u) buf[cnt + __popc(bal[k] & lanes_below)] = key[k];
                    cnt += __popc(bal[k]);
                }
                __syncwarp();
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = nv[k];
    }

#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, o);
        const double so = __shfl_xor_sync(0xffffffffu, s, o);
        const float mn = fmaxf(m, mo);
        s = mn == -INFINITY ? 0.0 : s * (double)expf(m - mn) + so * (double)expf(mo - mn);
        m = mn;
    }
    if (lane == 0) red_m[warp] = m, red_s[warp] = s;
    int np = 1; /* each warp's list padded to a power of two, so the merge is one */
    while (np < ntop) np <<= 1;
    if (ntop > 0) {
        lp_compact(buf, cnt, ntop, thr, thr_v, lane);
        for (int k = lane; k < np; k += 32) merged[warp * np + k] = k < cnt ? buf[k] : 0;
    }
    __syncthreads();
    if (tid == 0) {
        float M = -INFINITY;
        for (int w = 0; w < LP_NW; w++) M = fmaxf(M, red_m[w]);
        double S = 0.0;
        for (int w = 0; w < LP_NW; w++)
            if (red_m[w] > -INFINITY) S += red_s[w] * (double)expf(red_m[w] - M);
        const float L = M == -INFINITY ? -INFINITY : M + (float)log(S);
        lse_sh = L;
        if (lse_out) lse_out[row] = L;
        if (targets) {
            const int t = targets[row];
            tlp[row] = t >= 0 && t < vocab ? lp_tof(x[t]) - L : 0.0f;
        }
    }
    if (ntop > 0) lp_sort_desc<true>(merged, LP_NW * np, tid, LP_THREADS);
    __syncthreads();
    const float L = lse_sh;
    for (int k = tid; k < n_top; k += LP_THREADS) {
        const size_t o = (size_t)row * ldt + k;
        if (k < ntop) {
            top_ids[o] = lp_key_id(merged[k]);
            top_lps[o] = lp_key_value(merged[k]) - L;
        } else { /* n_top > vocab */
            top_ids[o] = -1;
            top_lps[o] = -INFINITY;
        }
    }
}

template <typename E>
static int lp_launch(const char *name, const E *logits, int ldl, int n, int vocab, const int32_t *targets, float *lse,
                     float *tlp, int n_top, int32_t *top_ids, float *top_lps, int ldt, cudaStream_t s)
{
    if (n <= 0) return 0;
    if (vocab <= 0 || vocab > (1 << 30) || ldl < vocab || n_top < 0 || n_top > KC_LOGPROB_MAX_TOP ||
        (n_top > 0 && (!top_ids || !top_lps || ldt < n_top)) || (targets && !tlp)) {
        fprintf(stderr, "%s: refused: vocab %d, ldl %d, n_top %d (0..%d), ldt %d, targets %s with tlp %s\n", name,
                vocab, ldl, n_top, KC_LOGPROB_MAX_TOP, ldt, targets ? "set" : "NULL", tlp ? "set" : "NULL");
        return -5;
    }
    const bool vec = ldl % 4 == 0 && ((uintptr_t)logits % (4 * sizeof(E))) == 0;
    if (vec)
        KC_LAUNCH(logprob_rows_kernel<E, true>, dim3(n), dim3(LP_THREADS), 0, s, logits, ldl, vocab, targets, lse, tlp,
                  n_top, top_ids, top_lps, ldt);
    else
        KC_LAUNCH(logprob_rows_kernel<E, false>, dim3(n), dim3(LP_THREADS), 0, s, logits, ldl, vocab, targets, lse, tlp,
                  n_top, top_ids, top_lps, ldt);
    return 0;
}

int kc_logprob_rows(const float *logits, int ldl, int n, int vocab, const int32_t *targets, float *lse, float *tlp,
                    int n_top, int32_t *top_ids, float *top_lps, int ldt, cudaStream_t s)
{
    return lp_launch("kc_logprob_rows", logits, ldl, n, vocab, targets, lse, tlp, n_top, top_ids, top_lps, ldt, s);
}

int kc_logprob_rows_bf16(const uint16_t *logits, int ldl, int n, int vocab, const int32_t *targets, float *lse,
                         float *tlp, int n_top, int32_t *top_ids, float *top_lps, int ldt, cudaStream_t s)
{
    return lp_launch("kc_logprob_rows_bf16", (const bf16 *)logits, ldl, n, vocab, targets, lse, tlp, n_top, top_ids,
                     top_lps, ldt, s);
}

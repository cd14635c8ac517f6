/*
 * ops_sample.cu - the sampler of engine/sampling.c on the GPU, one block per
 * sequence. The CPU sorts the vocabulary by (value desc, id asc) and walks
 * prefixes (top-k, top-p, the draw). Here every such prefix is found without
 * sorting: each element gets a unique 64-bit key that orders like the sort
 * (order-preserving float bits, then the inverted id), and a bisection on the
 * key finds the prefix boundary: the largest key whose "mass (or count) of
 * keys >= it" still satisfies the condition. Same sets, same draw.
 */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_MAX_TOP 64

static __device__ __forceinline__ uint64_t sort_key(float v, int id, int idbits)
{
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << idbits) | (uint64_t)((1u << idbits) - 1u - (uint32_t)id);
}

/* argmax with the lowest id on ties, over x[0..n) skipping ids in excl[0..ne) */
static __device__ int block_argmax(const float *x, int n, const int32_t *excl, int ne, float *redv, int *redi)
{
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        bool skip = false;
        for (int e = 0; e < ne; e++) skip |= excl[e] == i;
        if (skip) continue;
        const float v = x[i];
        if (bi < 0 || v > bv) { bv = v; bi = i; } /* i increases: ties keep the lower id */
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) { redv[warp] = bv; redi[warp] = bi; }
    __syncthreads();
    bv = lane < nw ? redv[lane] : -INFINITY;
    bi = lane < nw ? redi[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
    }
    return bi;
}

/* Largest key k in [lo, hi) such that f(k) holds, f monotone (true below a
 * boundary); f(lo) must hold. f(k) = "sum over kept i with key_i >= k of
 * (count ? 1 : p_i)" compared with target (strict: >, else >=). */
static __device__ uint64_t bisect_key(const float *v, const float *p, const unsigned char *kept, int n, int idbits,
                                      uint64_t lo, uint64_t hi, int count, double target, int strict,
                                      double *redd)
{
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        double s = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (kept[i] && sort_key(v[i], i, idbits) >= mid) s += count ? 1.0 : (double)p[i];
        s = block_sum_d(s, redd);
        const bool ok = strict ? s > target : s >= target;
        if (ok) lo = mid; else hi = mid;
    }
    return lo;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(const kc_sample_param *P, const float *logits, int vocab, const float *lse, const int32_t *hist,
              const kc_logit_bias *bias,
              int *counts, int32_t *tok_out, float *lp_out, int32_t *top_ids, float *top_lps, int max_top)
{
    extern __shared__ float sm[];
    float *l = sm;                           /* [vocab] penalised / scaled values */
    float *p = (float *)counts + (size_t)blockIdx.x * vocab; /* [vocab] probabilities (global scratch,
                                                                after the counts are used) */
    unsigned *seen = (unsigned *)(l + vocab); /* [vocab/32] bitmap */
    unsigned char *kept = (unsigned char *)(seen + (vocab + 31) / 32); /* [vocab] */
    __shared__ float redv[32];
    __shared__ int redi[32];
    __shared__ double redd[32];
    __shared__ int32_t chosen[SAMPLE_MAX_TOP];
    __shared__ uint64_t key_sh;
    __shared__ int tok_sh;

    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const kc_sample_param pr = P[blockIdx.x];
    const float *x = logits + (size_t)pr.row * vocab;
    const float row_lse = lse[pr.row];
    const int tid = threadIdx.x;

    /* top-n raw log-probs (before penalties) */
    const int n_top = min(pr.n_top, min(max_top, SAMPLE_MAX_TOP));
    for (int k = 0; k < n_top; k++) {
        const int b = block_argmax(x, vocab, chosen, k, redv, redi);
        if (tid == 0) {
            chosen[k] = b;
            top_ids[(size_t)blockIdx.x * max_top + k] = b;
            top_lps[(size_t)blockIdx.x * max_top + k] = x[b] - row_lse;
        }
        __syncthreads();
    }

    for (int i = tid; i < vocab; i += blockDim.x) l[i] = x[i];
    for (int i = tid; i < (vocab + 31) / 32; i += blockDim.x) seen[i] = 0;
    __syncthreads();
    if (tid == 0) /* in order: a repeated id gets every bias, as on the CPU */
        for (int k = 0; k < pr.n_bias; k++) {
            const kc_logit_bias e = bias[pr.bias_off + k];
            if (e.id >= 0 && e.id < vocab) l[e.id] += e.bias;
        }
    __syncthreads();
    const int32_t *hp = hist + pr.hist_off, *hg = hp + pr.n_prompt;
    if (pr.rep != 1.0f && pr.rep > 0.0f) { /* once per distinct id of prompt + generated */
        for (int i = tid; i < pr.n_prompt + pr.n_gen; i += blockDim.x) {
            const int32_t t = hp[i];
            if (t < 0 || t >= vocab) continue;
            const unsigned bit = 1u << (t & 31);
            if (atomicOr(&seen[t >> 5], bit) & bit) continue;
            l[t] = l[t] > 0 ? l[t] / pr.rep : l[t] * pr.rep;
        }
    }
    __syncthreads();
    if (pr.pres != 0.0f || pr.freq != 0.0f) {
        int *cnt = counts + (size_t)blockIdx.x * vocab;
        for (int i = tid; i < vocab; i += blockDim.x) cnt[i] = 0;
        __syncthreads();
        for (int i = tid; i < pr.n_gen; i += blockDim.x)
            if (hg[i] >= 0 && hg[i] < vocab) atomicAdd(&cnt[hg[i]], 1);
        __syncthreads();
        for (int i = tid; i < vocab; i += blockDim.x)
            if (cnt[i]) l[i] -= pr.pres + pr.freq * (float)cnt[i];
    }
    __syncthreads();

    int tok;
    if (!(pr.temperature > 0.0f)) {
        tok = block_argmax(l, vocab, chosen, 0, redv, redi);
    } else {
        int idbits = 1;
        while ((1 << idbits) < vocab) idbits++;
        for (int i = tid; i < vocab; i += blockDim.x) {
            l[i] = l[i] / pr.temperature;
            kept[i] = 1;
        }
        __syncthreads();
        const int top = block_argmax(l, vocab, chosen, 0, redv, redi);
        const float v0 = l[top];
        const uint64_t hi = (uint64_t)1 << (32 + idbits);
        /* top-k: the k-th key */
        if (pr.top_k > 0 && pr.top_k < vocab) {
            const uint64_t kk = bisect_key(l, p, kept, vocab, idbits, 0, hi, 1, (double)pr.top_k, 0, redd);
            for (int i = tid; i < vocab; i += blockDim.x) kept[i] = sort_key(l[i], i, idbits) >= kk;
            __syncthreads();
        }
        double sum = 0.0;
        for (int i = tid; i < vocab; i += blockDim.x) {
            p[i] = kept[i] ? (float)exp((double)(l[i] - v0)) : 0.0f;
            sum += p[i];
        }
        sum = block_sum_d(sum, redd);
        for (int i = tid; i < vocab; i += blockDim.x) p[i] = (float)(p[i] / sum);
        __syncthreads();
        if (pr.top_p > 0.0f && pr.top_p < 1.0f) {
            double tot = 0.0;
            for (int i = tid; i < vocab; i += blockDim.x) tot += kept[i] ? (double)p[i] : 0.0;
            tot = block_sum_d(tot, redd);
            if (tot >= pr.top_p) { /* else the CPU keeps everything */
                const uint64_t kp = bisect_key(l, p, kept, vocab, idbits, 0, hi, 0, (double)pr.top_p, 0, redd);
                for (int i = tid; i < vocab; i += blockDim.x) kept[i] = kept[i] && sort_key(l[i], i, idbits) >= kp;
                __syncthreads();
            }
        }
        if (pr.min_p > 0.0f) {
            const float thr = pr.min_p * p[top];
            for (int i = tid; i < vocab; i += blockDim.x) kept[i] = kept[i] && (i == top || p[i] >= thr);
            __syncthreads();
        }
        double tot = 0.0;
        uint64_t kmin = ~(uint64_t)0;
        for (int i = tid; i < vocab; i += blockDim.x)
            if (kept[i]) tot += (double)p[i];
        tot = block_sum_d(tot, redd);
        const double u = kda_rng_uniform(pr.seed, pr.counter) * tot;
        /* token = the kept element with the largest key k such that mass(keys >= k) > u */
        uint64_t kd;
        if (tot > u) {
            kd = bisect_key(l, p, kept, vocab, idbits, 0, hi, 0, u, 1, redd);
        } else { /* rounding: the CPU falls back to the last kept element */
            for (int i = tid; i < vocab; i += blockDim.x)
                if (kept[i]) {
                    const uint64_t k = sort_key(l[i], i, idbits);
                    kmin = k < kmin ? k : kmin;
                }
            if (tid == 0) key_sh = ~(uint64_t)0;
            __syncthreads();
            atomicMin((unsigned long long *)&key_sh, (unsigned long long)kmin);
            __syncthreads();
            kd = key_sh;
        }
        /* the element whose key is the smallest one >= kd among kept */
        if (tid == 0) key_sh = ~(uint64_t)0;
        __syncthreads();
        kmin = ~(uint64_t)0;
        for (int i = tid; i < vocab; i += blockDim.x)
            if (kept[i]) {
                const uint64_t k = sort_key(l[i], i, idbits);
                if (k >= kd && k < kmin) kmin = k;
            }
        atomicMin((unsigned long long *)&key_sh, (unsigned long long)kmin);
        __syncthreads();
        tok = (int)((1u << idbits) - 1u - (uint32_t)(key_sh & ((1ull << idbits) - 1)));
    }
    if (tid == 0) tok_sh = tok;
    __syncthreads();
    if (tid == 0) {
        tok_out[blockIdx.x] = tok_sh;
        lp_out[blockIdx.x] = x[tok_sh] - row_lse;
    }
}

int kc_sample(const kc_sample_param *p, int n, const float *logits, int vocab, const float *lse, const int32_t *hist,
              const kc_logit_bias *bias, int *counts, int32_t *tok, float *lp, int32_t *top_ids, float *top_lps,
              int max_top, cudaStream_t s)
{
    if (n <= 0) return 0;
    const size_t smem = (size_t)vocab * 4 + (size_t)(vocab + 31) / 32 * 4 + (size_t)vocab + 16;
    static size_t attr = 0;
    if (smem > 48 * 1024 && smem > attr) {
        if (cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
            return -5; /* vocab too large for one block's shared memory */
        attr = smem;
    }
    KC_LAUNCH(sample_kernel, dim3(n), dim3(SAMPLE_THREADS), smem, s, p, logits, vocab, lse, hist, bias, counts, tok, lp,
              top_ids, top_lps, max_top);
    return 0;
}

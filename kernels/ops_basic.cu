/*
 * ops_basic.cu - embedding gather, RMSNorm, SwiGLU, the skinny GEMM (GEMV)
 * with its fused norm/residual/SwiGLU epilogues, the cuBLAS GEMM wrapper, and
 * the log-softmax helpers for logits.
 */
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

int kc_pdl_on = 0;
void kc_set_pdl(int on) { kc_pdl_on = on; }
static int kc_gemv_persist_on = 1;
void kc_set_gemv_persist(int on) { kc_gemv_persist_on = on; }

__global__ void embed_kernel(float *h, const bf16 *E, const int32_t *ids, int D)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.x, id = ids[t];
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        h[(size_t)t * D + i] = id >= 0 ? bf2f(E[(size_t)id * D + i]) : 0.0f;
}

int kc_embed(float *h, const uint16_t *E, const int32_t *ids, int T, int D, cudaStream_t s)
{
    if (T <= 0) return 0;
    KC_LAUNCH(embed_kernel, dim3(T), dim3(256), 0, s, h, (const bf16 *)E, ids, D);
    return 0;
}

__global__ void hist_kernel(int32_t *hist, int cap, const int32_t *ids, const int32_t *pos, const int32_t *slot,
                            int T)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < T && slot[t] >= 0) hist[(size_t)slot[t] * cap + pos[t]] = ids[t];
}

int kc_hist_append(int32_t *hist, int cap, const int32_t *ids, const int32_t *pos, const int32_t *slot, int T,
                   cudaStream_t s)
{
    if (T <= 0) return 0;
    KC_LAUNCH(hist_kernel, dim3((T + 255) / 256), dim3(256), 0, s, hist, cap, ids, pos, slot, T);
    return 0;
}

__global__ void cast_bf16_kernel(bf16 *out, int ldo, const float *in, int ldi, int ncols)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < ncols; c += blockDim.x) out[(size_t)t * ldo + c] = f2bf(in[(size_t)t * ldi + c]);
}

int kc_cast_bf16(uint16_t *out, int ldo, const float *in, int ldi, int T, int ncols, cudaStream_t s)
{
    if (T <= 0 || ncols <= 0) return 0;
    KC_LAUNCH(cast_bf16_kernel, dim3(T), dim3(256), 0, s, (bf16 *)out, ldo, in, ldi, ncols);
    return 0;
}

__global__ void rmsnorm_kernel(bf16 *out, const float *x, const int32_t *rows, const float *w, int D, float eps)
{
    __shared__ float red[32];
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[t] : t) * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) out[(size_t)t * D + i] = f2bf(xr[i] * r * w[i]);
}

/* The same with 16-byte loads, the row held in registers (one read of x, not
 * two) and 8-byte bf16 stores: D % 4 == 0, D <= 4 x 256 x NV. Scalar loads made
 * the prompt passes' norms (8192 rows of 2048) run at ~2.1 TB/s (ncu, 45 us a
 * call in a score 1 x 8192 pass). Thread i takes float4s i, i + 256, ... */
template <int NV>
__global__ void __launch_bounds__(256) rmsnorm4_kernel(bf16 *out, const float *x, const int32_t *rows, const float *w,
                                                       int D, float eps)
{
    __shared__ float red[32];
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.x, D4 = D >> 2;
    const float4 *xr = (const float4 *)(x + (size_t)(rows ? rows[t] : t) * D);
    float4 v[NV];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = threadIdx.x + 256 * j;
        v[j] = i < D4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / D + eps);
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = threadIdx.x + 256 * j;
        if (i >= D4) break;
        const float4 w4 = ((const float4 *)w)[i];
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v[j].x * r * w4.x, v[j].y * r * w4.y);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v[j].z * r * w4.z, v[j].w * r * w4.w);
        uint2 pk;
        pk.x = *(const uint32_t *)&lo;
        pk.y = *(const uint32_t *)&hi;
        ((uint2 *)(out + (size_t)t * D))[i] = pk;
    }
}

int kc_rmsnorm(uint16_t *out, const float *x, const int32_t *rows, const float *w, int T, int D, float eps,
               cudaStream_t s)
{
    if (T <= 0) return 0;
    /* the vector kernel wants 16-byte aligned rows of x and w and 8-byte rows of out */
    const int vec = D % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)out & 7) == 0;
    if (vec && D <= 1024)
        KC_LAUNCH(rmsnorm4_kernel<1>, dim3(T), dim3(256), 0, s, (bf16 *)out, x, rows, w, D, eps);
    else if (vec && D <= 2048)
        KC_LAUNCH(rmsnorm4_kernel<2>, dim3(T), dim3(256), 0, s, (bf16 *)out, x, rows, w, D, eps);
    else if (vec && D <= 4096)
        KC_LAUNCH(rmsnorm4_kernel<4>, dim3(T), dim3(256), 0, s, (bf16 *)out, x, rows, w, D, eps);
    else
        KC_LAUNCH(rmsnorm_kernel, dim3(T), dim3(256), 0, s, (bf16 *)out, x, rows, w, D, eps);
    return 0;
}

__global__ void add_bias_kernel(float *y, int ldy, const float *bias, int n)
{
    KC_PDL_WAIT(); /* before the bounds return */
    KC_PDL_TRIGGER();
    const int t = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < n) y[(size_t)t * ldy + c] += bias[c];
}

int kc_add_bias(float *y, int ldy, const float *bias, int T, int n, cudaStream_t s)
{
    if (T <= 0 || n <= 0) return 0;
    KC_LAUNCH(add_bias_kernel, dim3((n + 255) / 256, T), dim3(256), 0, s, y, ldy, bias, n);
    return 0;
}

__global__ void swiglu_kernel(bf16 *out, const float *gu, int F)
{
    KC_PDL_WAIT(); /* before the bounds return: no thread may exit before waiting */
    KC_PDL_TRIGGER();
    const int t = blockIdx.y;
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= F) return;
    const float g = gu[(size_t)t * 2 * F + f], u = gu[(size_t)t * 2 * F + F + f];
    out[(size_t)t * F + f] = f2bf(siluf_(g) * u);
}

int kc_swiglu(uint16_t *out, const float *gu, int T, int F, cudaStream_t s)
{
    if (T <= 0) return 0;
    KC_LAUNCH(swiglu_kernel, dim3((F + 255) / 256, T), dim3(256), 0, s, (bf16 *)out, gu, F);
    return 0;
}

/* the same from a bf16 gate|up, 8 columns (16 bytes) per thread when F % 8 == 0 */
template <int VEC>
__global__ void swiglu16_kernel(bf16 *out, const bf16 *gu, int F)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int t = blockIdx.y;
    const int f = VEC * (blockIdx.x * blockDim.x + threadIdx.x);
    if (f >= F) return;
    const bf16 *gr = gu + (size_t)t * 2 * F + f, *ur = gr + F;
    bf16 *o = out + (size_t)t * F + f;
    if constexpr (VEC == 8) {
        const uint4 gv = *(const uint4 *)gr, uv = *(const uint4 *)ur;
        const bf16 *g8 = (const bf16 *)&gv, *u8 = (const bf16 *)&uv;
        uint4 ov;
        bf16 *o8 = (bf16 *)&ov;
#pragma unroll
        for (int i = 0; i < 8; i++) o8[i] = f2bf(siluf_(bf2f(g8[i])) * bf2f(u8[i]));
        *(uint4 *)o = ov;
    } else {
        *o = f2bf(siluf_(bf2f(*gr)) * bf2f(*ur));
    }
}

int kc_swiglu_bf16(uint16_t *out, const uint16_t *gu, int T, int F, cudaStream_t s)
{
    if (T <= 0) return 0;
    if (F % 8 == 0 && ((uintptr_t)gu & 15) == 0 && ((uintptr_t)out & 15) == 0)
        KC_LAUNCH(swiglu16_kernel<8>, dim3((F / 8 + 255) / 256, T), dim3(256), 0, s, (bf16 *)out, (const bf16 *)gu, F);
    else
        KC_LAUNCH(swiglu16_kernel<1>, dim3((F + 255) / 256, T), dim3(256), 0, s, (bf16 *)out, (const bf16 *)gu, F);
    return 0;
}

/* ---- GEMV (skinny GEMM, T <= 8 rows): 16-byte weight loads, the T input
 * rows staged once per block in shared memory as bf16.
 *
 * Block = GEMV_WARPS warps. S warps (S | GEMV_WARPS, chosen per shape by
 * gemv_split) share one output row (SwiGLU: its gate and up rows), split
 * over K: warp seg of the row takes the 16-byte chunks seg*32 + lane +
 * j*32*S, so the S warps of a row read adjacent 512-byte pieces, and the S
 * partial sums are added in shared memory in a fixed order. Short K (one
 * warp per row) and long K (several warps per row: the 2048 x 8064 down
 * projection) both end up with about 8 loads per lane, and small N (2048
 * rows) still gets enough warps to fill the machine.
 *
 * Weight loads run in groups of 4 per lane, double-buffered (8 in flight).
 * The first two groups -- for K = 2048 (and 8064 at S = 4) the whole of this
 * lane's share -- are issued BEFORE the PDL wait: weights are never written,
 * so their stream overlaps the tail of the previous kernel. Everything else
 * (input staging, the RMSNorm prologue, the outputs) comes after the wait. */
#define GEMV_WARPS 8

/* weights: read once, streamed (no L1 allocation, so the staged input stays cached) */
static __device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <int T, int IN, int OUT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, T <= 2 ? 4 : T <= 4 ? 3 : 2)
gemv_kernel(void *y, int ldy, const bf16 *__restrict__ W, int N, int K, const void *x, int ldx,
            const float *__restrict__ normw, float eps, int S, int n_it)
{
    constexpr int NR = OUT == KC_OUT_SWIGLU ? 2 : 1; /* weight rows per output */
    constexpr int G = 4 / NR;                         /* chunks per row per load group (4 loads) */
    extern __shared__ uint4 xs4[];                    /* [T][K/8] */
    __shared__ float red[32];
    __shared__ float part[GEMV_WARPS][NR * T];
    bf16 *xs = (bf16 *)xs4;
    const int K8 = K / 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rl = warp / S, seg = warp - rl * S;
    const int c0 = seg * 32 + lane, cs = 32 * S;
    /* Persistent over row groups: iteration it takes rows
     * (blockIdx.x + it * gridDim.x) * (GEMV_WARPS / S) + rl, so the input
     * staging / RMSNorm prologue runs once per block, and the next row's first
     * loads are issued before this row's reduction and store. */
    int r0 = 0, nc = 0, ng = 0;
    bool live = false;
    const uint4 *wr[NR];
    auto setup_row = [&](int it) {
        r0 = (blockIdx.x + it * gridDim.x) * (GEMV_WARPS / S) + rl;
        live = r0 < N;
        wr[0] = (const uint4 *)(W + (size_t)(live ? r0 : 0) * K);
        if (NR == 2) wr[NR - 1] = (const uint4 *)(W + (size_t)(live ? N + r0 : 0) * K);
        nc = live && c0 < K8 ? (K8 - c0 + cs - 1) / cs : 0; /* this lane's chunks per row */
        ng = (nc + G - 1) / G;
    };

    auto load = [&](uint4(&buf)[NR][G], int g) {
#pragma unroll
        for (int u = 0; u < G; u++) {
            const int j = g * G + u;
#pragma unroll
            for (int q = 0; q < NR; q++) buf[q][u] = j < nc ? ld_stream(wr[q] + c0 + j * cs) : make_uint4(0, 0, 0, 0);
        }
    };
    uint4 A[NR][G], B[NR][G];
    setup_row(0);
    load(A, 0);
    load(B, 1);

    KC_PDL_WAIT();
    KC_PDL_TRIGGER();

    if (IN == KC_IN_NORM) {
        for (int t = 0; t < T; t++) {
            const float *xr = (const float *)x + (size_t)t * ldx;
            float ss = 0.0f;
            for (int i = threadIdx.x; i < K; i += blockDim.x) ss += xr[i] * xr[i];
            ss = block_sum(ss, red);
            const float r = 1.0f / sqrtf(ss / K + eps);
            for (int i = threadIdx.x; i < K; i += blockDim.x) xs[t * K + i] = f2bf(xr[i] * r * normw[i]);
        }
    } else {
        for (int i = threadIdx.x; i < T * K8; i += blockDim.x) {
            const int t = i / K8, c = i - t * K8;
            xs4[i] = ((const uint4 *)((const bf16 *)x + (size_t)t * ldx))[c];
        }
    }
    __syncthreads();

    float acc[NR][T];
    auto consume = [&](const uint4(&buf)[NR][G], int g) {
#pragma unroll
        for (int u = 0; u < G; u++) {
            const int j = g * G + u;
            if (j >= nc) break;
            const int c = c0 + j * cs;
            float wf[NR][8];
#pragma unroll
            for (int q = 0; q < NR; q++) bf8_to_f(buf[q][u], wf[q]);
#pragma unroll
            for (int t = 0; t < T; t++) {
                float xf[8];
                bf8_to_f(xs4[t * K8 + c], xf);
#pragma unroll
                for (int q = 0; q < NR; q++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[q][t] = fmaf(wf[q][e], xf[e], acc[q][t]);
            }
        }
    };
    for (int it = 0; it < n_it; it++) {
#pragma unroll
        for (int q = 0; q < NR; q++)
#pragma unroll
            for (int t = 0; t < T; t++) acc[q][t] = 0.0f;
        for (int g = 0; g < ng; g += 2) {
            consume(A, g);
            load(A, g + 2);
            consume(B, g + 1);
            load(B, g + 3);
        }
        const int r0c = r0;
        const bool livec = live;
        if (it + 1 < n_it) { /* the next row's first two groups, in flight during this row's epilogue */
            setup_row(it + 1);
            load(A, 0);
            load(B, 1);
        }

        float v[NR][T];
#pragma unroll
        for (int q = 0; q < NR; q++)
#pragma unroll
            for (int t = 0; t < T; t++) v[q][t] = warp_sum(acc[q][t]);
        if (S > 1) { /* uniform over the block: every warp runs n_it iterations */
            if (lane == 0)
#pragma unroll
                for (int q = 0; q < NR; q++)
#pragma unroll
                    for (int t = 0; t < T; t++) part[warp][q * T + t] = v[q][t];
            __syncthreads();
            if (seg == 0)
#pragma unroll
                for (int q = 0; q < NR; q++)
#pragma unroll
                    for (int t = 0; t < T; t++) {
                        float sum = part[warp][q * T + t];
                        for (int k = 1; k < S; k++) sum += part[warp + k][q * T + t];
                        v[q][t] = sum;
                    }
            __syncthreads(); /* part is rewritten by the next iteration */
        }
        if (livec && seg == 0) {
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (lane != t) continue; /* lane t writes row t */
                if (OUT == KC_OUT_SWIGLU) {
                    ((bf16 *)y)[(size_t)t * ldy + r0c] = f2bf(siluf_(v[0][t]) * v[NR - 1][t]);
                } else if (OUT == KC_OUT_ADD) {
                    ((float *)y)[(size_t)t * ldy + r0c] += v[0][t];
                } else {
                    ((float *)y)[(size_t)t * ldy + r0c] = v[0][t];
                }
            }
        }
    }
}

/* Warps per output row: split K until a lane has at most 8 loads (NR rows x
 * chunks), and keep splitting while fewer than 4096 warps would run (about
 * 31 per SM on 132 SMs) and a lane still keeps >= 4 chunks. */
static int gemv_split(int N, int K8, int nr)
{
    int S = 1;
    while (S < GEMV_WARPS) {
        const int per_lane = (K8 + 32 * S - 1) / (32 * S);
        if (nr * per_lane > 8 || ((long)N * S < 4096 && K8 / (32 * S) >= 4))
            S *= 2;
        else
            break;
    }
    return S;
}

template <int T, int IN, int OUT>
static int gemv_launch(void *y, int ldy, const bf16 *W, int N, int K, const void *x, int ldx, const float *nw,
                       float eps, cudaStream_t s)
{
    static int attr_done = 0;
    const size_t smem = (size_t)T * K * sizeof(bf16);
    if (!attr_done) { /* first call is always outside graph capture (the backend warms up eagerly) */
        cudaFuncSetAttribute(gemv_kernel<T, IN, OUT>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        attr_done = 1;
    }
    const int S = gemv_split(N, K / 8, OUT == KC_OUT_SWIGLU ? 2 : 1), rows = GEMV_WARPS / S;
    const int groups = (N + rows - 1) / rows;
    /* persistent: at most the blocks resident at once (kc_set_gemv_persist(0):
     * one row group per block) */
    static int resident = -1;
    if (resident < 0) { /* first call: outside graph capture (see above) */
        int nb = 0, dev = 0, sms = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (!kc_gemv_persist_on ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, gemv_kernel<T, IN, OUT>, GEMV_WARPS * 32, smem) != cudaSuccess ||
            nb <= 0 || sms <= 0) {
            cudaGetLastError();
            resident = 0;
        } else {
            resident = nb * sms;
        }
    }
    const int grid = resident > 0 && groups > resident ? resident : groups;
    const int n_it = (groups + grid - 1) / grid;
    KC_LAUNCH(gemv_kernel<T, IN, OUT>, dim3(grid), dim3(GEMV_WARPS * 32), smem, s, y, ldy, W, N, K, x, ldx, nw,
              eps, S, n_it);
    return 0;
}

template <int T>
static int gemv_dispatch_t(void *y, int ldy, const bf16 *W, int N, int K, const void *x, int ldx,
                           const float *nw, float eps, int in, int out, cudaStream_t s)
{
#define GV(I, O)                                                                                   \
    if (in == I && out == O) return gemv_launch<T, I, O>(y, ldy, W, N, K, x, ldx, nw, eps, s);
    GV(KC_IN_BF16, KC_OUT_STORE) GV(KC_IN_BF16, KC_OUT_ADD) GV(KC_IN_BF16, KC_OUT_SWIGLU)
    GV(KC_IN_NORM, KC_OUT_STORE) GV(KC_IN_NORM, KC_OUT_ADD) GV(KC_IN_NORM, KC_OUT_SWIGLU)
#undef GV
    return -1;
}

int kc_gemv(void *y, int ldy, const uint16_t *W, int N, int K, const void *x, int ldx, const float *normw,
            float eps, int T, int in_mode, int out_mode, cudaStream_t s)
{
    if (K % 8 != 0 || (in_mode == KC_IN_BF16 && ldx % 8 != 0)) return -1;
    const bf16 *Wb = (const bf16 *)W;
    switch (T) {
    case 1: return gemv_dispatch_t<1>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    case 2: return gemv_dispatch_t<2>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    case 3: return gemv_dispatch_t<3>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    case 4: return gemv_dispatch_t<4>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    case 5: return gemv_dispatch_t<5>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    case 6: return gemv_dispatch_t<6>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    case 7: return gemv_dispatch_t<7>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    case 8: return gemv_dispatch_t<8>(y, ldy, Wb, N, K, x, ldx, normw, eps, in_mode, out_mode, s);
    default: return -1;
    }
}

static int gemm_ex(void *handle, void *y, cudaDataType_t ydt, int ldy, const uint16_t *x, int ldx, const uint16_t *W,
                   int T, int N, int K, float beta, cudaStream_t s)
{
    if (T <= 0) return 0;
    cublasHandle_t h = (cublasHandle_t)handle;
    const float alpha = 1.0f;
    if (cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) return -7;
    /* column-major view: Y^T [N, T] = W^T' [N, K] x X^T [K, T] */
    cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, W, CUDA_R_16BF, K, x,
                                     CUDA_R_16BF, ldx, &beta, y, ydt, ldy, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx failed (%d): T=%d N=%d K=%d\n", (int)st, T, N, K);
        return -7;
    }
    return 0;
}

int kc_gemm(void *handle, float *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N, int K,
            float beta, cudaStream_t s)
{
    return gemm_ex(handle, y, CUDA_R_32F, ldy, x, ldx, W, T, N, K, beta, s);
}

int kc_gemm_y16(void *handle, uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N,
                int K, cudaStream_t s)
{
    return gemm_ex(handle, y, CUDA_R_16BF, ldy, x, ldx, W, T, N, K, 0.0f, s);
}

__global__ void lse_kernel(float *lse, const float *logits, int vocab)
{
    __shared__ float red[32];
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const float *x = logits + (size_t)blockIdx.x * vocab;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, x[i]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += expf(x[i] - m);
    s = block_sum(s, red);
    if (threadIdx.x == 0) lse[blockIdx.x] = m + logf(s);
}

int kc_row_lse(float *lse, const float *logits, int n, int vocab, cudaStream_t s)
{
    if (n <= 0) return 0;
    KC_LAUNCH(lse_kernel, dim3(n), dim3(1024), 0, s, lse, logits, vocab);
    return 0;
}

__global__ void gather_lp_kernel(float *out, const float *logits, const float *lse, const int32_t *rows,
                                 const int32_t *targets, int n, int vocab)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int r = rows[i], t = targets[i];
    out[i] = (t >= 0 && t < vocab) ? logits[(size_t)r * vocab + t] - lse[r] : 0.0f;
}

int kc_gather_logprob(float *out, const float *logits, const float *lse, const int32_t *rows,
                      const int32_t *targets, int n, int vocab, cudaStream_t s)
{
    if (n <= 0) return 0;
    KC_LAUNCH(gather_lp_kernel, dim3((n + 127) / 128), dim3(128), 0, s, out, logits, lse, rows, targets, n, vocab);
    return 0;
}

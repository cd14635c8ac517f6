/*
 * cuda_common.cuh - what every .cu file in kernels/ shares: error checks,
 * bf16 conversions, warp/block reductions. Device code only here; the C
 * interface of the kernels is cuda_ops.h.
 *
 * Numerics: built WITHOUT --use_fast_math. expf/logf/rsqrtf are the accurate
 * versions; the only approximations are bf16 storage of weights, KV cache and
 * GEMM inputs (MODEL_SPEC 7). fp32 everywhere else.
 */
#ifndef KDA_CUDA_COMMON_CUH
#define KDA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

typedef __nv_bfloat16 bf16;

/* Kernel launch check for the launchers in cuda_ops.h: they return 0 or a
 * KDA_EDEVICE-style negative code instead of aborting (request paths). */
#define KC_LAUNCH_CHECK()                                                                        \
    do {                                                                                         \
        cudaError_t e_ = cudaGetLastError();                                                     \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: kernel launch failed: %s\n", __FILE__, __LINE__,             \
                    cudaGetErrorString(e_));                                                     \
            return -7;                                                                           \
        }                                                                                        \
    } while (0)

static __device__ __forceinline__ float bf2f(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 f2bf(float x) { return __float2bfloat16_rn(x); }
/* A slot's per-layer KDA state: S [H, K, V] (fp32, or bf16 with state_bf16:
 * fp32 math, rounded to nearest even when stored), then the fp32 conv tail.
 * Float offset of the tail from the layer's start. */
static __host__ __device__ __forceinline__ size_t kc_tail_off(int H, int K, int V, int state_bf16)
{
    return state_bf16 ? (size_t)H * K * V / 2 : (size_t)H * K * V;
}

/* 8 bf16 packed in a uint4 (one 16-byte load) -> 8 floats */
static __device__ __forceinline__ void bf8_to_f(uint4 u, float *f)
{
    const __nv_bfloat162 *p = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(p[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double warp_sum_d(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum; every thread gets the result. scratch: >= 32 floats of
 * shared memory. Contains two __syncthreads: call from all threads. */
static __device__ __forceinline__ float block_sum(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(t);
}
static __device__ __forceinline__ double block_sum_d(double v, double *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < nw ? scratch[lane] : 0.0;
    return warp_sum_d(t);
}
static __device__ __forceinline__ float block_max(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nw ? scratch[lane] : -INFINITY;
    return warp_max(t);
}

static __device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* the block's dynamic shared memory (the emulator supplies its own) */
#ifndef KC_DYNAMIC_SMEM
#define KC_DYNAMIC_SMEM(name) extern __shared__ __align__(128) float name[]
#endif

/* 16-byte global -> shared copy, in flight until cp_async_wait; full = false
 * fills the 16 bytes with zeros instead (src is then not read). KC_EMU: the
 * CPU emulator of tests/kernels/emu runs these kernels without a GPU. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, bool full)
{
#if defined(__CUDA_ARCH__)
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(full ? 16 : 0) : "memory");
#elif defined(KC_EMU)
    kc_emu_cp_async16(dst, src, full);
#endif
}
static __device__ __forceinline__ void cp_async_commit()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(KC_EMU)
    kc_emu_cp_async_commit();
#endif
}
template <int N> static __device__ __forceinline__ void cp_async_wait()
{
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#elif defined(KC_EMU)
    kc_emu_cp_async_wait(N);
#endif
}
/* bytes (4, 8 or 16, aligned) from global to shared, in the same groups */
template <int BYTES> static __device__ __forceinline__ void cp_async_n(void *dst, const void *src)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__)
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(BYTES) : "memory");
#elif defined(KC_EMU)
    kc_emu_cp_async(dst, src, BYTES);
#endif
}

/* the RNG of engine.h, one definition for host and device */
#include "kda_rng.h"

/* Programmatic dependent launch (PDL, sm_90). Kernels launched through
 * kc_launch() with PDL on may start while the previous kernel in the stream
 * is still running. Rules for every kernel launched that way:
 *   - KC_PDL_WAIT() before ANY global-memory access other than reading
 *     weights (inputs may not be written yet; outputs may still be read),
 *   - never return before KC_PDL_WAIT() (the next kernel's wait covers only
 *     this kernel's completion, so a kernel that skips the wait could let a
 *     later kernel overtake the one before it),
 *   - KC_PDL_TRIGGER() may come anywhere; it only lets the next kernel be
 *     scheduled early, its wait still sees this kernel's complete results.
 * Off (kc_pdl_on == 0) both are no-ops in effect and launches are ordinary. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KC_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define KC_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define KC_PDL_WAIT() ((void)0)
#define KC_PDL_TRIGGER() ((void)0)
#endif

extern int kc_pdl_on; /* defined in ops_basic.cu; set by kc_set_pdl() */

/* Launch with the PDL attribute when kc_pdl_on; returns the launch error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t kc_launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                    Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = kc_pdl_on ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, static_cast<Args &&>(args)...);
}

/* kc_launch() with the KC_LAUNCH_CHECK contract: a failed launch prints and
 * makes the calling launcher return -7. */
#define KC_LAUNCH(...)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = kc_launch(__VA_ARGS__);                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (void)cudaGetLastError();                                                              \
            fprintf(stderr, "%s:%d: kernel launch failed: %s\n", __FILE__, __LINE__,               \
                    cudaGetErrorString(e_));                                                       \
            return -7;                                                                             \
        }                                                                                          \
    } while (0)

#endif

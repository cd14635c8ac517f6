/*
 * emu/cuda_runtime.h - just enough of CUDA's device side to compile a .cu
 * file of kernels/ as plain C++ and run it on the CPU (emu.cpp): every CUDA
 * thread of a block is a fiber; __syncthreads, warp shuffles, __syncwarp and
 * the wmma operations are barriers of the block or of the warp (a warp
 * collective that not all live lanes reach is reported as a deadlock).
 * Blocks run one after another, so function-local __shared__ arrays (static
 * here) are shared by the block's threads, as on the device.
 */
#ifndef KC_EMU_CUDA_RUNTIME_H
#define KC_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_bf16.h"
#include "cuda_runtime_api.h"

#ifndef KC_EMU
#define KC_EMU 1
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
int kc_emu_lane();
void kc_emu_warp_barrier();
uint64_t kc_emu_warp_exchange(uint64_t v, int src_lane);

template <typename T> static inline T kc_emu_shfl(T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    u = kc_emu_warp_exchange(u, src & 31);
    T r;
    memcpy(&r, &u, sizeof(T));
    return r;
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int m) { return kc_emu_shfl(v, kc_emu_lane() ^ m); }
template <typename T> static inline T __shfl_up_sync(unsigned, T v, unsigned d)
{
    const int l = kc_emu_lane();
    return kc_emu_shfl(v, l >= (int)d ? l - (int)d : l);
}
template <typename T> static inline T __shfl_down_sync(unsigned, T v, unsigned d)
{
    const int l = kc_emu_lane();
    return kc_emu_shfl(v, l + (int)d < 32 ? l + (int)d : l);
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int src) { return kc_emu_shfl(v, src); }
/* every lane of the warp must take part (the kernels pass the full mask) */
unsigned kc_emu_ballot(int pred);
static inline unsigned __ballot_sync(unsigned, int pred) { return kc_emu_ballot(pred); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
static inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}
/* ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8m .. 8m + 7 give the
 * row addresses of matrix m (16 bytes each); lane 4 g + t gets in r[m] the
 * elements (g, 2t), (g, 2t + 1) of matrix m, or of its transpose (.trans),
 * the lower column in the low half */
void kc_emu_ldmatrix_x4(uint32_t (&r)[4], const void *row, bool trans);

/* fibers switch only at barriers: a read-modify-write is atomic */
static inline int atomicAdd(int *p, int v)
{
    const int o = *p;
    *p = o + v;
    return o;
}
static inline float atomicAdd(float *p, float v)
{
    const float o = *p;
    *p = o + v;
    return o;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* ---- launches ---- */
enum cudaLaunchAttributeID {
    cudaLaunchAttributeClusterDimension = 4,
    cudaLaunchAttributeProgrammaticStreamSerialization = 6,
};
union cudaLaunchAttributeValue {
    struct {
        unsigned x, y, z;
    } clusterDim;
    int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
};

cudaError_t kc_emu_launch(const void *kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
cudaError_t kc_emu_set_smem_limit(const void *kernel, int bytes);

template <typename... ExpT, typename... ActT>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *cfg, void (*k)(ExpT...), ActT &&...args)
{
    std::tuple<typename std::decay<ExpT>::type...> t(std::forward<ActT>(args)...);
    return kc_emu_launch(reinterpret_cast<const void *>(k), cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes,
                         [&]() { std::apply(k, t); });
}
template <typename K> static inline cudaError_t cudaFuncSetAttribute(K k, cudaFuncAttribute, int v)
{
    return kc_emu_set_smem_limit(reinterpret_cast<const void *>(k), v);
}

template <typename K> static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, K, int, size_t)
{
    *n = 2; /* the emulator has no occupancy; kernels only size their grids by it */
    return cudaSuccess;
}

float *kc_emu_dynamic_smem();
#define KC_DYNAMIC_SMEM(name) float *name = kc_emu_dynamic_smem()
void kc_emu_cp_async16(void *dst, const void *src, bool full);
void kc_emu_cp_async(void *dst, const void *src, int bytes); /* 4, 8 or 16 bytes, aligned */
void kc_emu_cp_async_commit();
void kc_emu_cp_async_wait(int n);

/* D = A B + C for one warp: the first lane to arrive computes, the others
 * copy (and check that their operands are the same as that lane's) */
void kc_emu_mma(float *d, const float *a, const float *b, const float *c, int M, int N, int K);
/* mma.sync.m16n8k8 .tf32 for one warp in the PTX fragment layout (lane
 * 4 g + t holds A(g|g+8, t|t+4), B(t|t+4, g), C(g|g+8, 2t|2t+1)): every
 * lane deposits its fragments, then computes its own four outputs; a, b are
 * tf32 bit patterns (their low 13 bits are ignored, as on the device) */
void kc_emu_mma_m16n8k8(float c[4], const uint32_t a[4], const uint32_t b[2]);
/* mma.sync.m16n8k16 .bf16, fp32 accumulation, in the same way (emu.cpp says the layout) */
void kc_emu_mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]);

#endif

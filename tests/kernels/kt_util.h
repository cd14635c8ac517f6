/* kt_util.h - helpers shared by the CUDA tests: device buffers, poison,
 * random data, error norms, and the skip rule (exit 77 without a GPU). */
#ifndef KT_UTIL_H
#define KT_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cpu_ops.h"

#define KT_CK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static inline void kt_skip_without_gpu(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "no CUDA device: skipping\n");
        exit(77);
    }
}

static uint64_t kt_rng = 0x12345678abcdefull;
static inline double kt_u01(void)
{
    kt_rng = kt_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(kt_rng >> 11) * 0x1.0p-53;
}
static inline float kt_randn(void)
{
    double u = kt_u01() + 1e-12, v = kt_u01();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static inline void kt_fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = kt_randn() * scale;
}
/* round to bf16 and back (what the device sees) */
static inline void kt_bf16_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}
static inline uint16_t *kt_to_bf16(const float *x, size_t n)
{
    uint16_t *o = malloc(n * 2);
    for (size_t i = 0; i < n; i++) o[i] = f32_to_bf16(x[i]);
    return o;
}
static inline void *kt_dev(const void *host, size_t bytes)
{
    void *d;
    KT_CK(cudaMalloc(&d, bytes ? bytes : 4));
    if (host) KT_CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}
/* 0xFF bytes: NaN in fp32 and bf16, so any element a kernel fails to write shows */
static inline void *kt_dev_poison(size_t bytes)
{
    void *d = kt_dev(NULL, bytes);
    KT_CK(cudaMemset(d, 0xFF, bytes));
    return d;
}
static inline void kt_get(void *host, const void *dev, size_t bytes)
{
    KT_CK(cudaDeviceSynchronize());
    KT_CK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}
static inline float *kt_get_bf16(const void *dev, size_t n)
{
    uint16_t *h = malloc(n * 2);
    kt_get(h, dev, n * 2);
    float *f = malloc(n * 4);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
    free(h);
    return f;
}
/* ||a - b|| / ||b||; NaN anywhere gives +inf */
static inline double kt_rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

#endif

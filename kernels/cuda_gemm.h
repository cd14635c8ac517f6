/*
 * cuda_gemm.h - cuBLASLt GEMM with per-shape autotuning (kc_gemm_lt_ prefix).
 *
 * Same semantics as kc_gemm (cuda_ops.h):
 *   y[T, N] (fp32, row stride ldy) = beta * y + x[T, K] (bf16, row stride ldx) @ W[N, K]^T (bf16, ld K)
 * fp32 accumulate, beta 0 or 1. Column-major view as in kc_gemm:
 *   Y^T [N, T] = op_T(W) [N, K] x X^T [K, T].
 *
 * Use: kc_gemm_lt_tune() every (T, N, K, ldx, ldy, beta) the forward pass will
 * call, at init (NOT during stream capture); then kc_gemm_lt_run() in the
 * forward pass, falling back to kc_gemm when it returns > 0.
 * Thread-compatible (one engine thread per object). Every pointer is device
 * memory; bf16 travels as uint16_t.
 *
 * Options at create (engine.h kda_tuning gemm_verbose / gemm_tune_flush /
 * gemm_splitk / gemm_skinny): verbose prints one line per tuned shape
 * (stderr); flush_l2 = 0 times without flushing L2 between repetitions;
 * splitk = 0 times only the heuristic's own candidates (no extra split-K
 * variants); skinny = 0 leaves out the skinny tensor-core GEMM of
 * skinny_gemm.h (T <= 64, K % 128 == 0), which is otherwise timed at both
 * block widths and split-K 1..16 (skinny = 2: taken wherever it runs, a
 * diagnosis switch). The skinny plans share one split-K scratch: their runs
 * must be ordered on one stream (the backend's GEMMs all run on st).
 */
#ifndef KDA_CUDA_GEMM_H
#define KDA_CUDA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* opaque: cublasLt handle + tuned-plan cache (fixed array, linear lookup) */
typedef struct kc_gemm_lt kc_gemm_lt;

/* workspace: device memory owned by the caller, >= workspace_bytes, 256-byte
 * aligned, kept alive until destroy. It may be the cuBLAS handle's workspace
 * when both libraries only run on one stream (stream order keeps them apart).
 * Returns NULL on failure. */
kc_gemm_lt *kc_gemm_lt_create(size_t workspace_bytes, void *workspace, int verbose, int flush_l2, int splitk,
                              int skinny);
void kc_gemm_lt_destroy(kc_gemm_lt *g);

/* Tune (T, N, K, ldx, ldy, beta): times up to 16 cublasLt heuristic candidates
 * (plus split-K variants of them unless created with splitk = 0) and the plain
 * cublasGemmEx default (cublas_handle, whose stream it sets to s) on stream s,
 * L2 flushed before every timed repetition; keeps the fastest in the cache
 * (replacing an earlier plan for the same key). The winner is checked against
 * cublasGemmEx on the buffers given; on mismatch the default is kept.
 * x, W, y: device buffers valid for the shape (scratch is fine; for realistic
 * timing and a meaningful check fill x with kc_gemm_lt_fill_bf16 first).
 * CLOBBERS y (every candidate writes it, beta = 1 accumulates many times).
 * Synchronises s; allocates (an L2-flush buffer, kept until destroy or
 * kc_gemm_lt_release_scratch; at the first call the skinny GEMM's 32 MiB
 * split-K scratch, kept until destroy). Must NOT be called during stream capture.
 * Returns 0, -1 (bad arguments or cache full), -7 (CUDA / cuBLAS error). */
int kc_gemm_lt_tune(kc_gemm_lt *g, void *cublas_handle, float *y, int ldy, const uint16_t *x, int ldx,
                    const uint16_t *W, int T, int N, int K, float beta, cudaStream_t s);

/* Run: if a plan for (T, N, K, ldx, ldy, beta) is cached, one
 * cublasLtMatmul with it (or the skinny GEMM's kernel) on s (graph-capture
 * safe: no allocation, no sync, the fixed workspaces) and return 0. Return 1
 * (nothing launched) when no plan is cached, when tuning found the cublasGemmEx default faster, or when a
 * pointer is less aligned than the tuned buffers were: the caller then calls
 * kc_gemm. -7 when cublasLtMatmul fails. T <= 0: 0. */
int kc_gemm_lt_run(kc_gemm_lt *g, float *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T,
                   int N, int K, float beta, cudaStream_t s);

/* The same with a bf16 y (beta 0): cuBLAS rounds each fp32 sum to bf16 once.
 * Its own plans (the key includes y's type); fallback kc_gemm_y16. */
int kc_gemm_lt_tune_y16(kc_gemm_lt *g, void *cublas_handle, uint16_t *y, int ldy, const uint16_t *x, int ldx,
                        const uint16_t *W, int T, int N, int K, cudaStream_t s);
int kc_gemm_lt_run_y16(kc_gemm_lt *g, uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T,
                       int N, int K, cudaStream_t s);

/* Tune as above, y fp32 (ybf 0) or bf16 (ybf 1, beta 0), on W[0]; when the
 * skinny GEMM takes part and nW >= 2 the final choice between its best and
 * the cuBLAS side's best is timed back to back over W[0..nW-1] (the weights
 * of every layer of this shape) in a CUDA graph, as a decode step runs them:
 * timed alone, the skinny kernel's PDL prologue (the next weight's first
 * stages load while the previous kernel ends) cannot show, and an L2 flush by
 * memset makes every small GEMM look ~1.6x slower than it runs in a step. */
int kc_gemm_lt_tune_seq(kc_gemm_lt *g, void *cublas_handle, void *y, int ybf, int ldy, const uint16_t *x, int ldx,
                        const uint16_t *const *W, int nW, int T, int N, int K, float beta, cudaStream_t s);

/* Free the L2-flush buffer tune allocated (tune allocates it again if needed). */
void kc_gemm_lt_release_scratch(kc_gemm_lt *g);

/* x[i] = bf16 of a hash-based pseudo-random value in [-1, 1), i < n: test data
 * for tuning scratch buffers. Returns 0 or -7. */
int kc_gemm_lt_fill_bf16(uint16_t *x, size_t n, uint32_t seed, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

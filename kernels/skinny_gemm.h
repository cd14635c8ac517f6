/*
 * skinny_gemm.h - a tensor-core GEMM for the decode shapes, T = 1..64 rows
 * of input times a [N, K] bf16 weight (memory bound: the weight is read once,
 * the rows ride along). kc_gemm_lt_tune_seq (cuda_gemm.h) times it beside
 * cuBLAS's candidates and keeps it where it is faster back to back over the
 * model's layers: alone it only matches cuBLAS, but its PDL prologue (the
 * next weight's first stages load while the previous kernel ends) makes the
 * MLP's gate|up and down and the lm-head ~7-11% faster in a decode step's
 * sequence (H100, 2026-12-05, bench/NOTES.md).
 *
 * Same semantics as kc_gemm (cuda_ops.h):
 *   y[T, N] (row stride ldy) = beta * y + x[T, K] (bf16, row stride ldx) @ W[N, K]^T (bf16, ld K)
 * fp32 accumulation; y fp32 (beta 0 or 1) or bf16 (ybf = 1, beta 0: each fp32
 * sum rounded once). Only the T x N block of y is written.
 *
 * Work split: a block of 4 or 8 warps owns rows = 64 or 128 weight rows, a
 * warp 16 of them; the K range is cut into ks pieces (split-K, grid.y = ks)
 * so a 2048-row weight still fills the machine. With ks > 1 the pieces' fp32
 * partial tiles go to ws and the last block of each row group (a counter in
 * cnt) adds them in piece order 0..ks-1 and writes y: the result does not
 * depend on which block finishes last (bitwise deterministic), and the
 * counter is back to 0 when the kernel ends (graph replay safe). One call at
 * a time per (ws, cnt): calls ordered on one stream are fine.
 *
 * Requirements (else 1 is returned and nothing launched: the caller falls
 * back to cuBLAS): 1 <= T <= 64,
 * N >= 1, K % 128 == 0, 1 <= ks <= K / 128, ks <= KC_SKINNY_MAX_KS, rows 64
 * or 128, W and x 16-byte aligned, ldx % 8 == 0, ldy >= N, beta 0 or 1 (0
 * with ybf), and for ks > 1: ws of kc_skinny_ws_bytes(T, N, ks) bytes and cnt
 * of kc_skinny_cnt_len(N) zeroed unsigned ints. -7: launch error. Launched
 * with programmatic dependent launch when kc_pdl_on (the first weight stages
 * load while the previous kernel finishes).
 */
#ifndef KDA_SKINNY_GEMM_H
#define KDA_SKINNY_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KC_SKINNY_MAX_T 64
#define KC_SKINNY_MAX_KS 32

/* bytes of partials a call with ks > 1 needs (0 for ks <= 1), either width */
size_t kc_skinny_ws_bytes(int T, int N, int ks);
/* counters a call needs (one per block), either width */
int kc_skinny_cnt_len(int N);

int kc_gemm_skinny(void *y, int ybf, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N, int K,
                   float beta, int ks, int rows, float *ws, unsigned *cnt, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

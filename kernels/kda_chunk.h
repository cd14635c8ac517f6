/*
 * kda_chunk.h - the chunked (WY / UT-transform) KDA forward on the GPU: the
 * same function as kc_kda_step (cuda_ops.h) for every token of every item,
 * MODEL_SPEC 3 steps 2-7 after the projections, computed 64 tokens at a time
 * on the tensor cores instead of one token at a time. For prefill and
 * scoring; decode steps (1 token per item) stay on kc_kda_step.
 *
 * Boundary: every pointer is device memory; the launcher checks shapes and
 * sizes on the host and never allocates or synchronises (graph-capture safe).
 * The workspace is caller-owned scratch of kc_kda_chunk_workspace() bytes.
 * Each item continues from its slot's state S and conv tail and writes both
 * back once; items with slot < 0 (padding) read and write nothing, and their
 * output rows are left untouched. Two items must not share a slot or rows.
 */
#ifndef KDA_KDA_CHUNK_H
#define KDA_KDA_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Matrix arithmetic of the chunk stages (kc_kda_chunk_args.gemm). */
enum {
    KC_KDA_GEMM_TF32 = 0,   /* tensor cores, tf32 operands, fp32 accumulation (default) */
    KC_KDA_GEMM_3XTF32 = 1, /* tensor cores, each operand split hi + lo: fp32-accurate, 3x the mma work */
    KC_KDA_GEMM_SIMT = 2,   /* plain fp32 FMA: the reference path of the same stages */
};

typedef struct {
    const float *proj;     /* [T, ldp] fp32: q raw [H*K] | k raw [H*K] | v raw [H*V] at cols 0.. */
    int ldp;
    int off_beta;          /* col of the beta logits [H] in proj */
    const float *lowrank;  /* [T, H*K + H*V] fp32: graw = F1 f0 (before dt_bias) | G1 g0 (before g_bias) */
    const int32_t *item_row0, *item_ntok, *item_slot; /* [n_items]; item i = rows row0..row0+ntok-1 */
    int n_items;
    int T;                 /* rows of proj / lowrank / y; every item lies in 0..T-1 */
    float *state;          /* per slot: S [H, K, V] fp32, then conv tail [taps-1, 2HK+HV] (oldest first) */
    int state_bf16;        /* S stored as bf16 (kc_tail_off in cuda_common.cuh): read once, rounded once
                            * when written back; the sequence split is refused with it */
    size_t slot_stride;    /* floats between slots */
    const float *convw;    /* [2HK+HV, taps] q|k|v channels; [c, taps-1] multiplies the current token */
    const float *g_bias;   /* [H*V] or NULL */
    const float *A_log;    /* [H] */
    const float *dt_bias;  /* [H*K] */
    const float *onorm;    /* [V] */
    float eps;
    int H, K, V, taps;
    uint16_t *y;           /* [T, ldy] bf16: RMSNorm(o_h; onorm, eps) * sigmoid(G_h), cols h*V.. */
    int ldy;
    void *work;            /* device scratch, 256-byte aligned */
    size_t work_bytes;     /* >= kc_kda_chunk_workspace(T, n_items, H, K, V) */
    /* variants; 0 selects the default of each */
    int gemm;              /* KC_KDA_GEMM_* */
    int bv;                /* value columns per recurrence block: 0 = auto, 16, 32 or 64 */
    int recur_buffers;     /* recurrence: 2 (0 = default) = next chunk's loads in flight, 1 = half the
                            * shared memory, two blocks per SM */
    int seq_split;         /* > 1: an item of nc chunks runs as min(seq_split, nc / 4) segments
                            * (<= 16) in parallel: each segment's transition S -> M S + B, a scan
                            * over the segments, then each segment again from its true start.
                            * Needs kc_kda_chunk_workspace_split() bytes. 0 or 1: off */
    int intra_split;       /* intra stage in two launches (pass 1 per K slice, then the solve and W / U per
                            * slice): 0 = auto (K >= 64 and chunks x heads <= 256), 1 = off, 2 = on
                            * (needs K >= 64 and chunks x heads <= 512, else -1) */
    int out_split;         /* output stage: blocks per chunk, each with 64 / out_split of its rows:
                            * 0 = auto (4 or 2 while the grid stays within ~12 blocks per SM, else 1), 1, 2 or 4 */
    int recur_ksplit;      /* recurrence at BV = 16 (wmma walk): Vnew = U - W X split over K between two
                            * warps per tile (four tiles leave four of eight warps idle): 0 = auto (on
                            * while the recurrence grid fits one block per SM, where the chunk chain is
                            * the time; off on larger grids, where it does not pay: H200 recur ms on / off
                            * 1 x 2048 0.151 / 0.168, 1 x 8192 0.554 / 0.628, 1 x 512 0.041 / 0.044, 8 x 128
                            * 0.070 / 0.067), 1 = off, 2 = on */
    int plan_ready;        /* 1: the workspace already holds the chunk table of these items and T (an
                            * earlier call with the same items, T, seq_split and workspace, nothing
                            * else written there since: the layers of one pass), so it is not
                            * planned again; 0: plan it */
    int debug_stop_after;  /* tests: 1..4 runs stages 1..n only (plan+prep, intra, recurrence, output)
                            * and leaves state, tail and (n < 4) y untouched; 0 = everything */
} kc_kda_chunk_args;

/* Bytes of workspace for any call with <= T rows and <= n_items items. */
size_t kc_kda_chunk_workspace(int T, int n_items, int H, int K, int V);
/* The same with the buffers of the sequence split (seq_split > 1). */
size_t kc_kda_chunk_workspace_split(int T, int n_items, int H, int K, int V, int seq_split);
/* 1 if the kernels handle this shape: K in {16, 32, 64, 128}, V = K or
 * V = 2K (K <= 64), 1 <= taps <= 4, H >= 1. */
int kc_kda_chunk_supported(int H, int K, int V, int taps);
/* 0; -5 (KDA_EUNSUP) for a shape kc_kda_chunk_supported rejects, -1
 * (KDA_EINVAL) for bad arguments (NULL pointer, strides, workspace too small
 * or misaligned), both before anything is launched; -7 (KDA_EDEVICE) when a
 * launch failed. Items are validated on the device: one whose rows leave
 * 0..T-1 is skipped like a padding item and counted in the workspace's
 * status word (kc_kda_chunk_layout.status). */
int kc_kda_chunk(const kc_kda_chunk_args *a, cudaStream_t s);

/* ---- workspace layout (for tests and diagnostics) ----
 * Byte offsets into work for a call with these T, n_items. Per-row buffers
 * are head-major [H][T][width] at the item's own rows; each one holds one
 * stage's result and is overwritten by a later stage:
 *   q:  q after conv, SiLU, L2 norm and 1/sqrt(K) (stage 1), then
 *       qg = q exp(Gam) (stage 2)                             [H][T][K]
 *   k:  k after conv, SiLU, L2 norm (1), then kg = k exp(Gam_last - Gam) (2)
 *   v:  v after conv, SiLU (1), then U = A beta v (2), then
 *       Vnew = U - W S (3)                                    [H][T][V]
 *   g:  Gam, the cumulative log-decay within the chunk (1), then
 *       W = A beta k exp(Gam) (2)                             [H][T][K]
 *   beta: sigmoid(beta logit)                                 [H][T]
 *   aqk: tril(q k^T exp(Gam_r - Gam_s)) within the chunk, s <= r (2) [H][T][64]
 *   egl: exp(Gam_last) per chunk (2)                          [chunks][H][K]
 *   sc:  the state at the start of each chunk (3)             [chunks][H][K][V]
 * Chunk c of the call's chunk table (plan: int32) is chunk chunk_local[c] of
 * item chunk_item[c] (rows row0 + 64 chunk_local ..); item i's chunks are
 * item_chunk0[i] .. + item_nchunks[i] - 1; n_chunks at plan_nchunks. Here
 * A = (I + L)^-1 with L[r][s] = beta_r sum_d k_r k_s exp(Gam_r - Gam_s), s < r.
 * Sequence split: item i has item_nseg[i] segments, buffers item_seg0[i]..;
 * segx holds each segment's [M | B] (segment 0: its end state in the B part),
 * sstart each segment's true start state. */
typedef struct {
    size_t plan_nchunks, status, item_chunk0, item_nchunks, item_nseg, item_seg0, chunk_item, chunk_local; /* int32 */
    size_t q, k, v, g, beta, aqk, egl, sc;  /* fp32 */
    size_t segx, sstart;                    /* fp32, seq_split > 1 only: [max_segs][H][K][K+V], [max_segs][H][K][V] */
    size_t ipart;                           /* fp32, the intra split's parts: [ipart_chunks][H][K/32][2][64][64] */
    int max_chunks, max_segs, ipart_chunks;
    size_t bytes;
} kc_kda_chunk_layout;
void kc_kda_chunk_layout_of(int T, int n_items, int H, int K, int V, int seq_split, kc_kda_chunk_layout *out);

#ifdef __cplusplus
}
#endif
#endif

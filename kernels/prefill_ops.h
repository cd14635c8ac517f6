/*
 * prefill_ops.h - C interface of the prompt-chunk kernels (issue #12):
 * causal flash attention of prompt chunks over the paged KV cache
 * (ops_attn_prefill.cu) and the log-prob / top-n reduction of lm-head rows
 * (ops_logprob.cu). Same conventions as cuda_ops.h: device pointers, bf16 as
 * uint16_t, launchers return 0, KDA_EUNSUP (-5) for a shape they refuse
 * (with a message on stderr, nothing launched) or KDA_EDEVICE (-7) when a
 * launch failed. tests/kernels/test_prefill_ops.c checks both against the
 * fp32 reference (engine/cpu_ops.h, engine/sampling.c) and benchmarks them.
 */
#ifndef KDA_PREFILL_OPS_H
#define KDA_PREFILL_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- causal attention of prompt chunks ----
 * Item i = rows item_row0[i] .. + item_ntok[i] - 1 of sequence slot item_slot[i]
 * at absolute positions item_pos0[i] .. + item_ntok[i] - 1 (all four arrays on
 * the device, [n_items]). The cache already holds positions 0 .. pos0 + ntok - 1
 * of the slot (a cached prefix + this chunk: kc_gqa_qkv has appended it).
 * From *a it reads q (fp32 [T, Hq, hd], normed + roped, as kc_gqa_qkv writes
 * it), T, the cache (kv, block_stride, layer_off, blk, block_table,
 * max_blocks), Hq, Hkv, hd and, when off_gate >= 0, the gate in proj
 * ([T, ldp] fp32, col off_gate + h*hd + d); tok_pos / tok_slot are not used.
 *   out bf16 [T, ldo], cols h*hd .. = softmax(q k^T / sqrt(hd)) v (* sigmoid(gate))
 * Query head h uses KV head h / (Hq / Hkv). Items with slot < 0 are skipped
 * and their rows left untouched, as are rows outside [0, T). The live items'
 * rows must be disjoint (each row belongs to at most one item).
 * Supported: hd in {16, 32, 64, 128}, Hq / Hkv in {1, 2, 4, 8}, ldo even,
 * block_stride and layer_off multiples of 8, kv 16-byte aligned.
 * max_ctx: an upper bound of pos0 + ntok over the items. It only sizes the
 * split over the context (a wrong value costs speed, never correctness).
 * work: scratch for the split partials (fp32); NULL / too small = fewer or no
 * splits. kc_attn_prefill_workspace(T_max, n_items_max, Hq, hd, max_ctx_max)
 * bytes serve every call with T <= T_max and max_ctx <= max_ctx_max. */
typedef struct {
    int variant;    /* 0 or 1: the default kernel; 2, 3: the alternatives for hd 128, group 4
                     * (ops_attn_prefill.cu; benchmarks) */
    int split_keys; /* > 0: split the context every split_keys keys (rounded up to 64) in
                     * every call (tests); 0: by shape */
} kc_attn_prefill_tuning;          /* zero-initialised = the defaults; NULL = the same */
int kc_attn_prefill(const kc_gqa_args *a, const int32_t *item_row0, const int32_t *item_ntok,
                    const int32_t *item_pos0, const int32_t *item_slot, int n_items, int max_ctx,
                    uint16_t *out, int ldo, void *work, size_t work_bytes, const kc_attn_prefill_tuning *tune,
                    cudaStream_t s);
size_t kc_attn_prefill_workspace(int T, int n_items, int Hq, int hd, int max_ctx);

/* How kc_attn_prefill will run a call (for benchmarks and diagnosis): the
 * kernel variant (see ops_attn_prefill.cu), warps per
 * block, query tokens per row tile (rows = tokens x group), context splits
 * and keys per split (nsplit 1: no split, no workspace used), the grid (kv
 * heads x row-tile bound x splits) and the workspace bytes it uses.
 * 0, or -5 for a refused shape. */
typedef struct {
    int variant, warps, tile_tokens, nsplit, split_keys, grid_x, grid_y, grid_z;
    size_t work_needed;
} kc_attn_prefill_plan;
int kc_attn_prefill_plan_for(const kc_gqa_args *a, int n_items, int max_ctx, size_t work_bytes,
                             const kc_attn_prefill_tuning *tune, kc_attn_prefill_plan *plan);

/* ---- log-probs and top-n of logits rows ----
 * For each of n rows of logits [n, vocab] (row stride ldl >= vocab), one pass
 * over the row:
 *   lse[i] = logsumexp(row)                                   (lse may be NULL)
 *   tlp[i] = row[targets[i]] - lse[i], 0 when targets[i] is not in [0, vocab)
 *            (only when targets != NULL)
 *   top_ids / top_lps [i * ldt + k], k < n_top = the n_top largest log-probs,
 *            descending, ties to the lower id (engine/sampling.c sampling_top_n
 *            order); entries past vocab (n_top > vocab) get id -1 and -inf. A
 *            top-m list is the first m of the top-n one, so rows wanting fewer
 *            can share a call with the largest n_top.
 * 0 <= n_top <= 64 (= KDA_MAX_TOP), ldt >= n_top. The fp32 form is the one to use: the bf16 form reads half
 * the bytes, but bf16 logits are off by up to 2^-9 relative (0.03 nats at a
 * logit of 16), so it is only for callers that accept that. */
#define KC_LOGPROB_MAX_TOP 64
int kc_logprob_rows(const float *logits, int ldl, int n, int vocab, const int32_t *targets, float *lse,
                    float *tlp, int n_top, int32_t *top_ids, float *top_lps, int ldt, cudaStream_t s);
int kc_logprob_rows_bf16(const uint16_t *logits, int ldl, int n, int vocab, const int32_t *targets, float *lse,
                         float *tlp, int n_top, int32_t *top_ids, float *top_lps, int ldt, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif

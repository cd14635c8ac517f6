/*
 * cuda_plan.h - the CUDA backend's host-side planner, plain C with no CUDA
 * dependency, so CI tests it on every run:
 *   cp_dims   the shapes the kernels see, derived from the config once (and
 *             the check that the kernels support them);
 *   cp_layout every size and offset of the one device pool, computed by one
 *             pure function (llm.c style: compute, allocate once, carve);
 *   kv_alloc  the paged KV cache's block allocator (free list + per-slot
 *             block tables, host side; the executor mirrors changed table
 *             rows to the device);
 *   step packing: which rows, slots and graph bucket a decode step uses, and
 *             how prompt chunks are cut into passes of at most TM rows.
 * Nothing here allocates after init, and nothing touches the device.
 */
#ifndef KDA_CUDA_PLAN_H
#define KDA_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_BLK 16       /* tokens per KV block */
#define CP_N_BUCKETS 16 /* decode graph buckets: powers of two up to TM */

typedef struct {
    int D, F, vocab, L, n_kda, n_gqa;
    int H, K, V, R, taps, HK, HV;                 /* KDA: H value (state) heads, V = value width per
                                                     head, HK = H*K gate columns, HV = H*V */
    int Hqk, QK;                                  /* KDA q/k heads (H / Hqk value heads share one, fla
                                                     GVA) and the q (= k) width Hqk*K */
    int kda_off_f0, kda_off_g0, kda_off_beta, kda_cols; /* KDA projection columns */
    int Hq, Hkv, hd, rope_dim;                    /* GQA */
    int gqa_off_q, gqa_off_g, gqa_off_k, gqa_off_v, gqa_cols; /* gqa_off_g < 0: no output gate */
    int ldp;                                      /* row stride of the projection buffer */
    int ycols;                                    /* widest mixer output (HV or Hq*hd) */
    int max_seqs, max_seq_len;
    int n_snaps;                                  /* prefix snapshot state slots (set after cp_dims_init; 0 = none) */
    int TM;                                       /* decode rows (>= max_seqs, power of two): graph buckets, logits blocks */
    int PM;                                       /* rows per prefill pass (>= TM) */
    size_t kda_chunk_ws, attn_prefill_ws;         /* prefill kernels' workspaces (set by the executor; 0 = none) */
    int max_blocks;                               /* KV blocks of one full-context sequence */
    size_t kv_layer_elems, block_elems;           /* bf16 elements of one block: per GQA layer, all layers */
    size_t kda_layer_floats, slot_floats;         /* KDA state per layer (16-byte rounded), per slot */
    int state_bf16;                               /* S stored as bf16 (kc_tail_off), the tail fp32 */
    int rs_cap;                                   /* rows x splits the decode attention scratch holds */
    int tied;                                     /* lm_head is the embedding */
} cp_dims;

/* Derives the dims and checks every shape the kernels support; KDA_EUNSUP
 * naming the shape otherwise. prefill_rows: rows of one prefill pass (0 or
 * less than TM: TM). */
int cp_dims_init(cp_dims *d, const model_config *c, const model_weights *w, int max_seqs, int max_seq_len,
                 int prefill_rows, int state_bf16, char *err, size_t errlen);

/* Byte offsets into the pool (every region 256-byte aligned). */
typedef struct {
    size_t w_mix, w_o, w_gu, w_down, attn_norm, mlp_norm; /* every layer */
    size_t convw, f1t, g1t, g_bias, A_log, dt_bias, onorm; /* KDA layers */
    size_t f1, g1;                                         /* KDA: F1 [HK, R], G1 [HV, R] for the prefill GEMMs */
    size_t conv_bias;                                      /* KDA with conv_bias: [2QK+HV] */
    size_t mix_bias, o_bias;                               /* GQA with qkv_bias: [n_mix] (0 on gate rows);
                                                              with o_bias: [D] */
    size_t gu_bias, down_bias;                             /* mlp_bias: [2F], [D] */
    size_t q_norm, k_norm;                                 /* GQA layers with qk_norm */
    int n_mix;                                             /* rows of w_mix */
} cp_layer_off;

typedef struct {
    cp_layer_off layer[KDA_MAX_LAYERS];
    size_t embed, lm_head, final_norm;
    size_t rope_inv;                      /* GQA: [rope_dim / 2] double, model_config rope_inv_freq */
    size_t weights_end;                   /* weights occupy [0, weights_end) */
    size_t state;                         /* [max_seqs][slot_floats] fp32 */
    size_t snap_state;                    /* [n_snaps][slot_floats] fp32: prefix snapshots */
    size_t h, proj, q, lowrank, lowrank_dec, opart, ml, logits, lse, tlp, xn, act, ybuf; /* activations */
    size_t lowin, kda_ws, attn_ws;        /* prefill: f0|g0 as bf16 [PM, 2R]; kernel workspaces */
    size_t meta, sample_params, hist, scratch, tok, lp, top, toplp, ptop, ptoplp, bias, table;
    size_t cublas_ws;
    size_t act_end;                       /* everything but the KV blocks: [0, act_end) */
    size_t kv;                            /* [n_blocks][n_gqa][K|V][Hkv][KV_BLK][hd] bf16 */
    size_t total;                         /* pool bytes */
    size_t weight_bytes, state_bytes, snap_bytes, act_bytes, kv_bytes;
    int n_blocks;
} cp_layout;

#define CP_META_ARRAYS 10       /* cp_meta int32 arrays of PM each */
#define CP_CUBLAS_WS (32u << 20)

/* Host mirror of the per-step row metadata (uploaded in one copy). */
typedef struct {
    int32_t *tok_ids, *tok_pos, *tok_slot;      /* [rows] */
    int32_t *item_row0, *item_ntok, *item_slot; /* [items] */
    int32_t *item_pos0;                         /* [items] position of the item's first row */
    int32_t *out_rows;                          /* [rows] rows whose logits are computed, in order */
    int32_t *lp_rows, *lp_targets;              /* [rows] */
} cp_meta;
void cp_meta_carve(cp_meta *m, int32_t *base, int PM); /* CP_META_ARRAYS x PM int32 from base */

/* The pool for n_blocks KV blocks. Pure: same inputs, same layout. */
void cp_layout_compute(cp_layout *lo, const cp_dims *d, const model_config *c, int n_blocks);
/* How many KV blocks fit when the pool may take budget bytes, capped at
 * max_seqs full contexts; KDA_ENOMEM with the reason when not even the
 * fixed part or one full-context sequence fits. */
int cp_layout_fit(cp_layout *lo, const cp_dims *d, const model_config *c, size_t budget, char *err,
                  size_t errlen);

/* ---- KV block allocator ----
 * Blocks are held by slots (their tables) and by prefix snapshots (the blocks
 * of the prefix they froze); a block is free when nobody holds it. Sharing
 * needs no copy-on-write because every holder reads only rows below its own
 * length and nobody writes a row another holder reads: a slot appends at its
 * position, past every snapshot taken from it, and a slot restored from a
 * snapshot shares only the snapshot's full blocks (its partial last block is
 * a private copy, kv_alloc_restore). */
typedef struct {
    int n_blocks, max_seqs, max_blocks;
    int32_t *table;   /* [max_seqs][max_blocks] block ids of each slot, in position order */
    int *nblk;        /* [max_seqs] blocks held */
    int *free_list;   /* [n_blocks] stack of free block ids */
    int n_free;
    int32_t *seq_refs, *snap_refs; /* [n_blocks] slots / snapshots holding each block */
    int n_snap_only;  /* blocks held by snapshots alone: the prefix cache's own KV memory */
} kv_alloc;

int kv_alloc_init(kv_alloc *a, int n_blocks, int max_seqs, int max_blocks);
void kv_alloc_free(kv_alloc *a);
/* Blocks for slot to hold n_tokens. Returns 0 and the range of table entries
 * [*first, *last) that changed (empty when nothing was needed), or KDA_ENOMEM
 * when the free blocks do not suffice (nothing taken). */
int kv_alloc_reserve(kv_alloc *a, int slot, int n_tokens, int *first, int *last);
void kv_alloc_release(kv_alloc *a, int slot);
int kv_alloc_used(const kv_alloc *a); /* blocks held by anyone */
/* A snapshot of the slot's first n_tokens (which the slot holds): references
 * its ceil(n_tokens / KV_BLK) first blocks, written to blocks[]; returns how
 * many. kv_alloc_unref gives a snapshot's references back. */
int kv_alloc_snap_ref(kv_alloc *a, int slot, int n_tokens, int32_t *blocks);
void kv_alloc_snap_unref(kv_alloc *a, const int32_t *blocks, int n);
/* Slot (holding nothing) continues a snapshot of n_tokens whose blocks are
 * blocks[]: it shares the full ones and takes a fresh block for a partial
 * last one, whose rows the caller copies from *copy_from into *copy_to (both
 * -1 when n_tokens is a multiple of KV_BLK). *last = table entries set.
 * KDA_ENOMEM (nothing taken) when no block is free for the copy. */
int kv_alloc_restore(kv_alloc *a, int slot, const int32_t *blocks, int n_tokens, int *copy_from, int *copy_to,
                     int *last);

/* ---- step packing ---- */
/* Decode step (every item one token): rows 0..n-1 are the items in order,
 * padded with slot -1 rows up to the bucket. Returns the row count Tb (the
 * bucket, a power of two, when graphs; n otherwise) and its bucket index. */
int cp_pack_decode(cp_meta *m, const step_item *items, int n, int graphs, int *bucket);

/* Prompt chunks: each call packs the next pass of at most TM rows; each item
 * contributes one contiguous chunk per pass, in order, so its recurrence
 * stays sequential. done[n] (zero before the first call) tracks progress.
 * Output rows (logits wanted) go to m->out_rows with their (item, token) in
 * row_item/row_tok. Returns the pass's rows T (0 when all is done) and sets
 * *n_items / *n_out / *max_ctx (the largest pos0 + ntok of its items). */
int cp_pack_pass(cp_meta *m, const step_item *items, int n, int *done, int PM, int *n_items, int *n_out,
                 int *max_ctx, int *row_item, int *row_tok);

/* 1 when row t of the item needs its logits (per-position outputs, or the last
 * row when it samples or returns logits). */
int cp_item_wants_row(const kda_batch_item *it, int t);

#ifdef __cplusplus
}
#endif

#endif

/*
 * model.h - the loaded model inside the engine: config, weight views and
 * the backend interface. Internal to engine/ and kernels/; server/ and cli/
 * never include it.
 *
 * Weights stay in the mmapped safetensors files (llama2.c style): a
 * tensor_view points into the mapping and carries its dtype; the CPU backend
 * converts rows to fp32 on the fly, the CUDA backend uploads and re-lays
 * them out once at load.
 */
#ifndef KDA_MODEL_H
#define KDA_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 } dtype_t;

static inline size_t dtype_size(dtype_t t) { return t == DT_F32 ? 4 : 2; }

/* A 1-D or 2-D weight. Logical row r (0..rows-1) of a 2-D view starts at
 * element ((r / group_rows) * group_stride + r % group_rows) * cols from data.
 * Plain matrices have group_rows = rows. The grouping lets the interleaved
 * GQA q|gate projection (rows 256h..256h+127 query head h, +128..+255 its
 * gate) be two views of one mapped tensor with no copy. 1-D tensors have
 * rows = 1, cols = length. */
typedef struct {
    const void *data;      /* NULL = absent (optional tensor) */
    dtype_t dtype;
    int64_t rows, cols;
    int64_t group_rows, group_stride;
    const char *name;      /* tensor name in the checkpoint (for messages) */
} tensor_view;

static inline const void *tv_row(const tensor_view *t, int64_t r)
{
    int64_t phys = (r / t->group_rows) * t->group_stride + r % t->group_rows;
    return (const char *)t->data + (size_t)(phys * t->cols) * dtype_size(t->dtype);
}

/* out[cols] = logical row r of t, as fp32 */
static inline void tv_row_f32(const tensor_view *t, int64_t r, float *out)
{
    const void *src = tv_row(t, r);
    const int64_t n = t->cols;
    if (t->dtype == DT_F32) {
        memcpy(out, src, (size_t)n * 4);
    } else if (t->dtype == DT_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(s[i]);
    }
}

/* ---- config ---- */

/* Widest head the engine takes (KDA key and value widths, attention head_dim):
 * the per-head scratch of the CPU ops is sized by it. config.c refuses wider. */
#define KDA_MAX_HEAD_DIM 1024

/* The KDA decay gate (MODEL_SPEC 3.3; fla fla/ops/kda/gate.py), log space:
 *   softplus:    gk = -exp(A_log[h]) * softplus(graw + dt_bias)
 *   lower_bound: gk = lower_bound * sigmoid(exp(A_log[h]) * (graw + dt_bias)), in [lower_bound, 0)
 * fla picks the second whenever lower_bound is set (safe_gate only selects a
 * faster chunk kernel for the same math, and requires lower_bound). */
typedef enum { KDA_GATE_SOFTPLUS = 0, KDA_GATE_LOWER_BOUND = 1 } kda_gate_kind;

/* RoPE frequency schedules (transformers modeling_rope_utils): default
 * theta^(-2i/dim); linear divides every frequency by factor; llama3 divides
 * the low frequencies by factor and interpolates the middle band. */
typedef enum { KDA_ROPE_DEFAULT = 0, KDA_ROPE_LINEAR = 1, KDA_ROPE_LLAMA3 = 2 } kda_rope_kind;

typedef struct {
    kda_family family;
    int d;                 /* hidden_size */
    int n_layers;
    int vocab;
    int ffn;               /* intermediate_size */
    float norm_eps;
    int tie_embeddings;
    int bos_id, eos_id;
    int max_pos;           /* max_position_embeddings */
    int byte_tokenizer;    /* "tokenizer": "bytes" */
    int mlp_bias;          /* gate/up/down_proj carry a bias (llama mlp_bias) */
    /* KDA layers */
    int kda_h;                /* q/k heads */
    int kda_hv;               /* value heads (fla num_v_heads): a multiple of kda_h; value
                                 head j reads q/k head j / (kda_hv / kda_h) (fla GVA) */
    int kda_k, kda_v;         /* key width, value width per head */
    int conv_size;            /* short conv taps (4) */
    int short_conv;           /* 0: q, k, v = silu(projection), no conv (fla use_short_conv false) */
    int conv_bias;            /* the short convs carry a bias per channel */
    kda_gate_kind gate;
    float gate_lower_bound;   /* KDA_GATE_LOWER_BOUND: the bound (< 0) */
    int safe_gate;            /* recorded for inspect: fla's kernel choice, same math */
    float beta_scale;         /* beta = beta_scale * sigmoid(b): 2 with allow_neg_eigval, else 1 */
    /* GQA layers */
    int gqa_h, gqa_kvh, gqa_hd;
    int rope_dim;             /* rotated dims per head (first rope_dim of hd) */
    double rope_theta;
    kda_rope_kind rope_kind;
    double rope_factor;       /* linear, llama3 */
    double rope_low_freq_factor, rope_high_freq_factor, rope_orig_max_pos; /* llama3 */
    double rope_inv_freq[KDA_MAX_HEAD_DIM / 2]; /* [rope_dim/2], from the above (config.c) */
    int qk_norm;              /* per-head RMSNorm on q and k */
    float qk_norm_eps;        /* its eps (llama qk_norm_eps, else norm_eps) */
    int output_gate;          /* sigmoid output gate (g_proj or interleaved in q_proj) */
    int qkv_bias;             /* q/k/v_proj carry a bias */
    int o_bias;               /* o_proj carries a bias (llama attention_bias) */
    int window;               /* sliding window W: token t attends t-W+1..t; 0 = all */
    /* fla attention residuals (attnres_block_size): 0 off; else sub-layer s
     * (2i attention, 2i+1 MLP) closes a block when s % attnres_block == 0 */
    int attnres_block;
    kda_layer_kind kind[KDA_MAX_LAYERS];
} model_config;

/* Parses dir/config.json. Unknown keys and unsupported values are errors
 * naming the key. config_map: NULL, a config-map file, or a folder of them
 * (configs/README.md): the map whose "model_type" matches config.json's
 * rewrites its keys into the engine's before parsing. */
int config_load(model_config *c, const char *dir, const char *config_map, char *err, size_t errlen);
/* Same, from a JSON string (tests). */
int config_parse(model_config *c, const char *json, char *err, size_t errlen);
/* config_parse after the map file at map_path (tests). */
int config_parse_mapped(model_config *c, const char *json, const char *map_path, char *err, size_t errlen);

/* config_map.c: applies the config map at path to root (a parsed config.json)
 * in place; *applied = 0 when path is a folder with no map for this model_type. */
struct cJSON;
int config_map_apply(struct cJSON *root, const char *path, int *applied, char *err, size_t errlen);

/* ---- weights ---- */
/* H q/k heads, HV value heads (= H unless GVA), K key width, V value width. */
typedef struct {
    tensor_view q, k, v;          /* [H*K, D], [H*K, D], [HV*V, D] */
    tensor_view q_conv, k_conv, v_conv; /* [H*K, conv], [H*K, conv], [HV*V, conv] (stored [C,1,conv]);
                                           absent when !short_conv */
    tensor_view q_conv_bias, k_conv_bias, v_conv_bias; /* [H*K], [H*K], [HV*V] when conv_bias */
    tensor_view f0, f1;           /* gate bottleneck: [V, D], [HV*K, V] */
    tensor_view b;                /* beta: [HV, D] */
    tensor_view A_log;            /* [HV] */
    tensor_view dt_bias;          /* [HV*K] */
    tensor_view g0, g1, g1_bias;  /* output gate: [V, D], [HV*V, V], [HV*V] */
    tensor_view o_norm;           /* [V] */
    tensor_view o;                /* [D, HV*V] */
} kda_layer;

typedef struct {
    tensor_view q;                /* [Hq*hd, D] (possibly a grouped view of a fused q|gate) */
    tensor_view gate;             /* [Hq*hd, D] or absent when !output_gate */
    tensor_view k, v;             /* [Hkv*hd, D] */
    tensor_view o;                /* [D, Hq*hd] */
    tensor_view q_norm, k_norm;   /* [hd] or absent when !qk_norm */
    tensor_view q_bias, k_bias, v_bias; /* [Hq*hd], [Hkv*hd], [Hkv*hd] when qkv_bias */
    tensor_view o_bias;           /* [D] when o_bias */
} gqa_layer;

typedef struct {
    tensor_view gate, up;         /* [F, D] */
    tensor_view down;             /* [D, F] */
    tensor_view gate_bias, up_bias, down_bias; /* [F], [F], [D] when mlp_bias */
} mlp;

/* fla attention residuals: a pseudo-query and a key RMSNorm weight before
 * each sub-layer's input norm (and before the final norm, in model_weights). */
typedef struct {
    tensor_view query;            /* [1, D] (attn_res_proj / mlp_res_proj / res_proj .weight) */
    tensor_view norm;             /* [D] */
} attnres_weights;

typedef struct {
    kda_layer_kind kind;
    tensor_view attn_norm;        /* [D] */
    tensor_view mlp_norm;         /* [D] */
    kda_layer kda;                /* valid when kind == KDA_LAYER_KDA */
    gqa_layer gqa;                /* valid when kind == KDA_LAYER_GQA */
    mlp mlp;
    attnres_weights attn_res, mlp_res; /* when attnres_block */
} layer_weights;

typedef struct {
    tensor_view embed;            /* [vocab, D] */
    tensor_view final_norm;       /* [D] */
    tensor_view lm_head;          /* [vocab, D]; = embed when tied */
    attnres_weights res;          /* when attnres_block */
    layer_weights *layers;        /* [n_layers] */
    int64_t n_params;             /* unique parameters (tied head counted once) */
    size_t bytes;                 /* bytes of all bound tensors as stored */
} model_weights;

struct st_set;  /* safetensors.h */

/* Binds every tensor the config needs (auto-detected fla/HF scheme, or the
 * name map), checking presence, dtype and shape. First bad tensor named. */
int weights_bind(model_weights *w, const model_config *c, struct st_set *st,
                 const char *name_map_path, char *err, size_t errlen);
void weights_free(model_weights *w);

/* ---- backend interface ----
 * A backend owns per-sequence state storage for max_seqs slots and runs the
 * forward pass. engine.c owns sequence bookkeeping (ids, positions, token
 * history) and validates every request before calling these; slot i is
 * sequence id i. A backend trusts its inputs: step() fails only for device
 * reasons (KDA_EDEVICE), or with KDA_ENOMEM for host scratch before it has
 * touched any state; seq_reserve() fails only for memory (KDA_ENOMEM). */
typedef struct {
    int slot;                 /* sequence slot */
    int pos;                  /* tokens already in the sequence before this step */
    const kda_batch_item *it; /* the caller's item (tokens, outputs, sampling) */
    const int32_t *hist;      /* the sequence's tokens [pos + it->n_tokens], this step's included */
} step_item;

typedef struct backend backend;
struct backend {
    /* Prepare a slot for a new sequence: zero its recurrent/conv state (KV needs
     * no clearing: reads stop at pos). May allocate the slot's storage on first
     * use (CPU); fails with KDA_ENOMEM when it cannot. */
    int (*seq_reset)(backend *b, int slot, char *err, size_t errlen);
    /* The sequence in slot is gone: give back what it holds beyond its fixed
     * slot (the CUDA backend's KV blocks), so admission sees the free memory. */
    void (*seq_release)(backend *b, int slot);
    /* Optional: take the memory for the slot to hold n_tokens now (engine.h
     * kda_seq_reserve; the engine also calls it before every step). NULL = the
     * backend's slots are fixed-size (CPU). */
    int (*seq_reserve)(backend *b, int slot, int n_tokens, char *err, size_t errlen);
    int (*step)(backend *b, const step_item *items, int n, char *err, size_t errlen);
    /* Optional: step() in two halves (engine.h kda_engine_step_begin). begin
     * launches and may return before the device finishes; end waits and
     * writes the items' outputs. The engine keeps items[] and what they
     * point to intact in between and calls nothing else on the backend. */
    int (*step_begin)(backend *b, const step_item *items, int n, char *err, size_t errlen);
    int (*step_end)(backend *b, char *err, size_t errlen);
    /* Optional: KV bytes held by live sequences (reserved blocks included). */
    size_t (*kv_bytes_used)(const backend *b);
    /* Optional: engine.h kda_engine_prof_take. */
    void (*prof_take)(backend *b, kda_prof *out);
    /* Prefix snapshots (engine.h), NULL when the backend has none; snapshot
     * ids are 0..n_snaps-1 and the engine calls these only with valid ones.
     * snap_take: snapshot snap (free) of the first n_tokens of slot (which
     * holds at least that many). snap_restore: slot, freshly reset, becomes
     * snapshot snap of n_tokens; hist is its token history [n_tokens]; fails
     * only with KDA_ENOMEM (nothing taken) or KDA_EDEVICE. snap_drop frees
     * snap. cache_bytes: memory held by snapshots alone (engine.h kda_usage). */
    int (*snap_take)(backend *b, int slot, int n_tokens, int snap, char *err, size_t errlen);
    int (*snap_restore)(backend *b, int snap, int slot, int n_tokens, const int32_t *hist, char *err,
                        size_t errlen);
    void (*snap_drop)(backend *b, int snap);
    size_t (*cache_bytes)(const backend *b);
    void (*destroy)(backend *b);
    size_t pool_bytes;
    /* filled by the backend: its KV and state pools, the KV bytes per token
     * as stored (bf16 on CUDA), sequences that fit at full context */
    size_t kv_pool_bytes, state_pool_bytes, kv_bytes_per_token;
    int max_full_context_seqs;
    int pass_rows;            /* rows of one forward pass (engine.h kda_model_info); 0 = any */
    int n_snaps;              /* snapshot slots made (<= backend_params.max_snaps) */
    size_t snap_state_bytes;  /* KDA state of one snapshot as stored */
    const char *device_name;
};

typedef struct {
    const model_config *cfg;
    const model_weights *w;
    int max_seqs, max_seq_len, threads;
    int max_snaps;            /* prefix snapshot slots wanted (0 = none) */
    double gpu_mem_fraction;
    kda_tuning tuning;
    int verbose;
} backend_params;

/* State sizes in floats, the one place they are computed (CPU slots, the
 * engine's info, the CUDA pool): per KDA layer the recurrent state S [HV, K, V]
 * and the conv tails [taps-1, 2HK + HV*V]; per sequence both over all KDA layers;
 * the GQA KV cache of one token over all GQA layers. */
static inline int model_n_kda_layers(const model_config *c)
{
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->kind[l] == KDA_LAYER_KDA;
    return n;
}
static inline int model_n_gqa_layers(const model_config *c) { return c->n_layers - model_n_kda_layers(c); }
/* the conv history a KDA layer keeps: the taps before the current token, none without a conv */
static inline int model_conv_history(const model_config *c) { return c->short_conv ? c->conv_size - 1 : 0; }
static inline size_t model_kda_layer_state_floats(const model_config *c)
{
    return (size_t)c->kda_hv * c->kda_k * c->kda_v;
}
static inline size_t model_kda_layer_tail_floats(const model_config *c)
{
    return (size_t)model_conv_history(c) * (2 * (size_t)c->kda_h * c->kda_k + (size_t)c->kda_hv * c->kda_v);
}
static inline size_t model_state_floats(const model_config *c)
{
    return (size_t)model_n_kda_layers(c) * (model_kda_layer_state_floats(c) + model_kda_layer_tail_floats(c));
}
static inline size_t model_kv_floats_per_token(const model_config *c)
{
    return (size_t)model_n_gqa_layers(c) * 2 * c->gqa_kvh * c->gqa_hd;
}

int cpu_backend_create(backend **out, const backend_params *p, char *err, size_t errlen);
/* Defined in kernels/ when built with CUDA; a stub returning KDA_EUNSUP otherwise. */
int cuda_backend_create(backend **out, const backend_params *p, char *err, size_t errlen);
int cuda_device_available(void);
/* kernels/cuda_config.c: 0 if the CUDA kernels implement every option c uses,
 * else KDA_EUNSUP and a message naming the first option they lack. */
int cuda_config_check(const model_config *c, char *err, size_t errlen);
/* The KDA option of c that the CUDA chunked prompt kernel does not compute
 * (prompts of such a model take the per-token kernel), or NULL. */
const char *cuda_kda_chunk_lacks(const model_config *c);

#ifdef __cplusplus
}
#endif

#endif

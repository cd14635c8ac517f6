/*
 * engine.h - the one interface between the model engine and its users
 * (kda-server, kda-cli, tests).
 *
 * Boundary: everything behind this header is model math and memory
 * (checkpoint loading, CPU reference backend, CUDA backend, sampling).
 * No JSON, no HTTP, no text: callers pass token ids and read token ids,
 * log-probs and logits back.
 *
 * Threading: a kda_engine and all of its sequences are owned by ONE thread
 * at a time (the server's scheduler thread, or the CLI's main thread).
 * Nothing here is internally locked. kda_engine_info() returns data that
 * is immutable after open and may be read from any thread.
 *
 * Errors: every call that can fail returns 0 on success or a negative
 * KDA_E* code, and writes a one-line message into err[errlen] (if err is
 * not NULL). Nothing here calls exit() or abort() on bad input.
 */
#ifndef KDA_ENGINE_H
#define KDA_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    KDA_OK = 0,
    KDA_EINVAL = -1,   /* bad argument (caller's fault) */
    KDA_ENOMEM = -2,   /* no memory / no free sequence slot / no state pool room */
    KDA_EIO = -3,      /* file could not be read */
    KDA_EFORMAT = -4,  /* malformed checkpoint, config or header */
    KDA_EUNSUP = -5,   /* valid but unsupported (config value, dtype, device) */
    KDA_ECTX = -6,     /* sequence would exceed its context capacity */
    KDA_EDEVICE = -7,  /* CUDA / device failure */
};

typedef enum { KDA_LAYER_KDA = 0, KDA_LAYER_GQA = 1 } kda_layer_kind;
typedef enum { KDA_FAMILY_KDA = 0, KDA_FAMILY_LLAMA_KDA = 1 } kda_family;

#define KDA_MAX_LAYERS 256

typedef struct kda_engine kda_engine;

/* Kernel variants and switches, chosen once at load (defaults from
 * kda_tuning_defaults; kda-cli/kda-server set them from --tuning and the
 * KDA_* environment variables through kda_tuning_parse / kda_tuning_from_env).
 * Backends read them only in their create function; tests set them directly.
 * Each field's default is the variant the H200 measurements chose
 * (bench/NOTES.md). */
typedef struct {
    int gemv_max_t;      /* CUDA: steps of at most this many rows use the skinny GEMV (0..8; 1: at 2-4 rows
                          * the tuned cuBLASLt GEMMs are faster, H200 decode B = 4 2.89 -> 1.95 ms/step) */
    int graphs;          /* CUDA: replay decode steps as CUDA graphs (1) */
    int pdl;             /* CUDA: programmatic dependent launch on sm_90+ (1) */
    int gemm_lt;         /* CUDA: autotuned cuBLASLt plans per decode bucket (1) */
    int gemm_verbose;    /* CUDA: one line per tuned GEMM shape on stderr (0) */
    int gemm_tune_flush; /* CUDA: flush L2 between timed tuning runs (1) */
    int gemm_splitk;     /* CUDA: also time split-K variants when tuning (1) */
    int gemm_skinny;     /* CUDA: also time the skinny tensor-core GEMM (skinny_gemm.h) for buckets of
                          * <= 64 rows when tuning, chosen where it is faster back to back over the
                          * layers (1: decode B = 2..16 ~2% faster, H100 2026-12-05); 0 = cuBLAS only;
                          * 2 = wherever it runs (diagnosis) */
    int gemm_pad;        /* CUDA: prompt passes run their GEMMs on rows rounded up to 64 (128 above 4096),
                          * each such shape prepared once at load: cuBLAS's first call per new shape
                          * costs ~2 ms, ~15 ms a pass (1) */
    int gemv_persist;    /* CUDA: persistent GEMV blocks (1) */
    int gu_bf16;         /* CUDA: steps above gemv_max_t rows store the MLP's gate|up GEMM output as bf16
                          * (cuBLAS rounds each fp32 sum once, as a bf16 PyTorch model does) and SwiGLU
                          * reads it: half the bytes of the widest activation (1); 0 = fp32 */
    int attn_split;      /* CUDA: force one decode-attention split size 32/64/128/256 (0 = by shape) */
    int kda_stream;      /* CUDA: steps of at least this many items, one token each, run the KDA step as
                          * a prologue kernel + a persistent kernel streaming the state through shared
                          * memory (ops_kda.cu; 16); 0 = always the block-per-head kernel */
    int fast_prefill;    /* CUDA: prompt chunks through the chunked KDA kernel, flash prefill attention
                            and the fused log-prob kernel (1); 0 = the per-token kernels */
    int mixed_pass;      /* CUDA: a step with decoding sequences and prompt chunks is one pass, the
                            one-token items through the decode kernels (1); 0 = a decode graph, then
                            a prompt pass */
    int mixed_reserve;   /* CUDA: in a one-pass mixed step, the decode rows' KDA step and attention run on a
                          * second stream beside the prompt items' chunked KDA and prefill attention, the
                          * state kernel on all SMs but this many, which stay free for the prompt items'
                          * short, latency-bound kernels (32); 0 = one stream, one after the other */
    int short_prompt;    /* CUDA: a pass of prompt items of at most this many tokens each (at most 4x that many
                          * rows, no decode rows) runs through the per-token kernels, which beat the
                          * chunked ones there (H200: 1 x 8 2.46 vs 3.30 ms, 4 x 16 3.43 vs 3.90; from 32
                          * tokens on they lose) (16); 0 = never */
    int prefill_rows;    /* CUDA: rows of one prefill pass (8192; at least the decode batch bucket) */
    int attn_prefill_variant; /* CUDA: prefill attention kernel variant 0-3 (0 = default; ops_attn_prefill.cu) */
    int kda_chunk_gemm;  /* CUDA: chunked KDA matrix arithmetic: 0 tf32, 1 3xtf32, 2 plain fp32 (kda_chunk.h) */
    int kda_chunk_bv;    /* CUDA: chunked KDA value columns per recurrence block (0 = auto, 16, 32, 64) */
    int kda_chunk_split; /* CUDA: chunked KDA sequence split into up to N segments (0/1 = off) */
    int attn_prefill_split;   /* CUDA: force a context split every N keys in prefill attention (0 = by shape) */
    int prof;            /* CUDA: time kernel categories with events, for kda_engine_prof_take (0) */
    int cpu_bf16_act;    /* CPU: round activations to bf16 where the CUDA backend stores bf16 (0) */
    int poison;          /* CUDA, tests: before every step fill the step's scratch buffers of each set bit
                          * with NaN (0xFF bytes): 1 h, 2 proj, 4 q, 8 lowrank, 16 lowin, 32 kda_ws,
                          * 64 attn_ws, 128 opart, 256 ml, 512 logits, 1024 xn, 2048 act, 4096 ybuf,
                          * 8192 lowrank_dec; a kernel that reads what the step did not write then shows;
                          * 16384: the KV cache and the KDA state slots, once at load (0) */
    int kda_state_bf16;  /* CUDA: store the KDA recurrent state S as bf16, math in fp32 (0 = fp32;
                            --kda-state-dtype bf16): half the state traffic and memory, at the
                            fidelity bench/NOTES.md measures; the CPU backend refuses it */
} kda_tuning;

void kda_tuning_defaults(kda_tuning *t);
/* "key=value,key=value" with the field names above; an unknown key or a
 * value out of range is an error naming it. */
int kda_tuning_parse(kda_tuning *t, const char *spec, char *err, size_t errlen);
/* The KDA_TUNING variable (same syntax as kda_tuning_parse), the one place
 * the environment is read for tuning. */
int kda_tuning_from_env(kda_tuning *t, char *err, size_t errlen);
/* One line per field with its current value, for --help and logs. */
void kda_tuning_describe(const kda_tuning *t, FILE *out);
/* --kda-state-dtype: "fp32" or "bf16" into t->kda_state_bf16 (NULL leaves it);
 * anything else is an error naming the flag. */
int kda_state_dtype_parse(kda_tuning *t, const char *v, char *err, size_t errlen);

typedef struct {
    const char *model_dir;  /* directory with config.json + *.safetensors */
    const char *device;     /* "cpu", "cuda" or "auto" (NULL = "cpu") */
    int threads;            /* CPU worker threads, 0 = all cores */
    int max_seqs;           /* live sequences at once (0 = 64) */
    int max_seq_len;        /* per-sequence context capacity (0 = model's max_position_embeddings) */
    double gpu_mem_fraction;/* CUDA: fraction of free device memory for the pool (0 = 0.9) */
    const char *name_map;   /* optional name-map file (configs/), NULL = auto-detect scheme */
    const kda_tuning *tuning; /* NULL = kda_tuning_defaults */
    const char *config_map; /* optional config map (configs/README.md): a file, or a folder whose
                               *.configmap.json matching config.json's model_type is applied */
    int verbose;            /* print load progress to stderr */
    size_t snapshot_bytes;  /* prefix snapshots: room for this many bytes of KDA state snapshots
                               (0 = none; see "prefix snapshots" below) */
} kda_engine_opts;

/* Immutable description of the loaded model. */
typedef struct {
    kda_family family;
    const char *family_name;   /* "kda" or "llama_kda" */
    const char *device_name;   /* "cpu" or the GPU's name */
    int n_layers, d_model, vocab_size, ffn_dim;
    int kda_heads, kda_head_k, kda_head_v;    /* KDA: H, K, V per head */
    int gqa_heads, gqa_kv_heads, gqa_head_dim, gqa_rope_dim;
    int bos_id, eos_id;
    int max_position;          /* model's max_position_embeddings */
    int max_seq_len;           /* per-sequence capacity in this engine */
    int max_seqs;
    int byte_tokenizer;        /* config.json says "tokenizer": "bytes" */
    int64_t n_params;          /* recomputed from the loaded tensors */
    size_t weight_bytes;       /* bytes of weights as used by the backend */
    size_t state_bytes_per_seq;/* KDA recurrent + conv state per sequence */
    size_t kv_bytes_per_token; /* GQA KV cache per token per sequence */
    size_t pool_bytes;         /* backend memory pool in total (CUDA), or 0 */
    kda_layer_kind layer_kind[KDA_MAX_LAYERS];
    /* as the backend holds them: KV cache and KDA state pools, and how many
     * sequences can each hold max_seq_len tokens at once */
    size_t kv_pool_bytes, state_pool_bytes;
    int max_full_context_seqs;
    int pass_rows;             /* rows one forward pass takes at once (CUDA: the prefill pass); 0 = any */
    int max_snapshots;         /* prefix snapshot slots (kda_engine_opts.snapshot_bytes) */
    size_t snapshot_bytes_each;/* KDA state of one snapshot as the backend stores it */
    int async_step;            /* kda_engine_step_begin returns while the device runs the step */
} kda_model_info;

int kda_engine_open(kda_engine **out, const kda_engine_opts *opts, char *err, size_t errlen);
void kda_engine_close(kda_engine *e);
const kda_model_info *kda_engine_info(const kda_engine *e);

/* ---- sequences ----
 * A sequence owns its KDA recurrent/conv state, its GQA KV cache and its
 * token history (every token fed to it, which the sampler's penalties read).
 * It starts empty (position 0, zero state). Ids are small ints, reused after
 * free. */
int kda_seq_new(kda_engine *e, int *seq_id, char *err, size_t errlen);
void kda_seq_free(kda_engine *e, int seq_id);
int kda_seq_len(const kda_engine *e, int seq_id);  /* tokens consumed so far, <0 if bad id */
int kda_seqs_free_slots(const kda_engine *e);       /* how many more kda_seq_new would succeed */
/* Takes now whatever backend memory the sequence needs to grow to n_tokens in
 * all (CUDA: KV cache blocks), so later steps cannot run out. KDA_ENOMEM when
 * the pool cannot hold it at the moment (nothing taken: wait for others to
 * finish, or refuse), KDA_ECTX when n_tokens exceeds the context capacity.
 * A scheduler that reserves each sequence's prompt + max_tokens at admission
 * never sees a step fail for memory. */
int kda_seq_reserve(kda_engine *e, int seq_id, int n_tokens, char *err, size_t errlen);

/* Memory in use, as the backend accounts it (reserved KV blocks included). */
typedef struct {
    int seqs_used, seqs_total;
    size_t kv_bytes_used, kv_bytes_total;        /* GQA KV cache (CUDA: blocks held or reserved) */
    size_t state_bytes_used, state_bytes_total;  /* KDA recurrent + conv state of live sequences */
    int snaps_used, snaps_total;                 /* prefix snapshots */
    size_t cache_bytes;  /* held by snapshots alone: their states plus KV no live sequence holds
                            (what dropping every snapshot would give back) */
} kda_usage;
void kda_engine_usage(const kda_engine *e, kda_usage *u);

/* ---- sampling ----
 * Applied in this order to the raw logits: logit_bias, repetition penalty
 * (over the whole sequence, prompt and generated, vLLM semantics: divide
 * positive logits / multiply negative ones), presence and frequency penalties
 * (over generated tokens only), temperature, top_k, top_p, min_p, then a draw
 * with the uniform kda_rng_uniform(seed, n_generated). temperature <= 0 means
 * greedy (argmax, lowest id on ties) and ignores the rest.
 * The history comes from the sequence itself: its first n_prompt tokens are
 * the prompt, every later one was generated, and n_generated = (tokens in the
 * sequence after this step) - n_prompt. */
typedef struct { int32_t id; float bias; } kda_logit_bias;

typedef struct {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint64_t seed;
    int n_prompt;             /* tokens of the sequence that are prompt (see above) */
    const kda_logit_bias *logit_bias; int n_logit_bias; /* added to the logits (OpenAI semantics;
                                 -inf bans); caller-owned, read during the step; ids in the vocabulary */
} kda_sampling;

#define KDA_MAX_TOP 64     /* alternatives per position (n_top) at most */
#define KDA_MAX_LOGIT_BIAS 1024 /* logit_bias entries per item at most */

/* ---- one batched step ----
 * Each item appends n_tokens tokens to one sequence (a prompt chunk, or the
 * one token a decoding sequence just produced). All items are processed in
 * one forward pass; different sequences may have any lengths. A sequence may
 * appear at most once per step. Outputs (all optional, caller-owned):
 *   logits          [n_tokens, vocab] when want_all_logits, else [vocab] for the last token
 *   target_logprobs [n_tokens]: log p(targets[i] | tokens up to i); entries
 *                   with targets[i] < 0 are written as 0
 *   pos_top_ids/pos_top_logprobs [n_tokens * n_top]: the n_top best raw
 *                   (id, log-prob) after every position (prompt echo)
 *   sampling        if non-NULL, a token is drawn from the last position's
 *                   distribution into *sampled, its raw log-prob into
 *                   *sampled_logprob, and the n_top best raw (id, log-prob)
 *                   into top_ids/top_logprobs.
 * Raw log-prob = log_softmax of the model's logits, before logit_bias,
 * penalties and temperature. n_top is in [0, KDA_MAX_TOP].
 *
 * Errors. kda_engine_step validates every item and takes every KV block the
 * step needs before any backend work: KDA_EINVAL / KDA_ECTX / KDA_ENOMEM mean
 * no sequence has advanced (a sequence may hold more reserved KV blocks,
 * which it would have needed anyway). KDA_EDEVICE means the device failed
 * during the step: the step's sequences are left in an unknown state and are
 * marked failed (any later step on them is KDA_EINVAL; free them); other
 * sequences are untouched unless the device itself is lost, in which case
 * every later step fails with KDA_EDEVICE too. */
typedef struct {
    int seq;
    const int32_t *tokens;
    int n_tokens;
    float *logits;
    int want_all_logits;
    const int32_t *targets;
    float *target_logprobs;
    const kda_sampling *sampling;
    int32_t *sampled;
    float *sampled_logprob;
    int n_top;
    int32_t *top_ids;
    float *top_logprobs;
    int32_t *pos_top_ids;
    float *pos_top_logprobs;
} kda_batch_item;

int kda_engine_step(kda_engine *e, kda_batch_item *items, int n_items, char *err, size_t errlen);
/* The same step in two halves, so the caller's own work runs while the
 * device computes (a server renders the previous step's tokens meanwhile):
 * kda_engine_step_begin validates, takes memory and launches, with
 * kda_engine_step's refusals (nothing advanced, nothing in flight); the
 * sequences' lengths count the step's tokens from then on.
 * kda_engine_step_end waits for the device, writes the items' outputs and
 * returns the step's result (KDA_EDEVICE as kda_engine_step's). Until then
 * the items and everything they point to must stay as they are. Any other
 * call that changes the engine (sequences, snapshots, a step, close) ends the
 * step in flight first; kda_engine_step_end still returns its result.
 * kda_model_info.async_step says whether begin returns before the device
 * has finished (CUDA); elsewhere begin does the whole step. */
int kda_engine_step_begin(kda_engine *e, kda_batch_item *items, int n_items, char *err, size_t errlen);
int kda_engine_step_end(kda_engine *e, char *err, size_t errlen);
/* After a step refused with KDA_EINVAL / KDA_ECTX / KDA_ENOMEM: the index of
 * the item at fault, or -1 when the step as a whole was (bad count). Nothing
 * advanced, so a caller may drop that item and run the rest again. */
int kda_engine_step_bad_item(const kda_engine *e);

/* Device time of the steps since the last call, by kind of work (CUDA with
 * tuning prof=1; all zero otherwise). Events between the kernels make the
 * steps a little slower: for benchmarks that explain a figure, not for
 * serving. */
typedef enum { KDA_PROF_GEMM, KDA_PROF_KDA, KDA_PROF_ATTN, KDA_PROF_LMHEAD, KDA_PROF_OTHER, KDA_PROF_N } kda_prof_kind;
typedef struct {
    double ms[KDA_PROF_N];  /* GEMMs of the layers; KDA mixer kernels; attention (q/k norm, RoPE, KV append,
                             * attention); lm-head GEMM + log-softmax / top-n / sampling; the rest (embedding,
                             * norms, SwiGLU) */
    int steps;
} kda_prof;
void kda_engine_prof_take(kda_engine *e, kda_prof *out);

/* ---- prefix snapshots ----
 * A snapshot freezes a sequence at a token boundary: its KDA recurrent state
 * and conv tails (which, unlike a KV cache, cannot be cut back to a shorter
 * prefix), its GQA KV cache for every position and its token history.
 * Restoring it into a new sequence continues exactly where the original
 * stood: on the CPU the continuation's numbers are bit-identical to computing
 * the snapshot's tokens from scratch (step boundaries never change a
 * sequence's numbers there); on CUDA the state and KV are the same bytes, so
 * only the continuation's own kernels can differ, within bf16 tolerance.
 *
 * Storage: a fixed table of snapshot slots sized at open from
 * kda_engine_opts.snapshot_bytes (each holds one sequence's KDA state; CUDA
 * carves them in the device pool). KV is shared, not copied, where it can
 * be: CUDA snapshots hold references on their KV blocks (a block is freed
 * when no sequence and no snapshot holds it; a restored sequence shares the
 * full blocks and copies a partial last one); CPU snapshots keep only the
 * rows added since the snapshot their sequence continued, and a restore
 * copies the rows into the sequence's own contiguous cache.
 *
 * The engine has no policy: which prefixes to keep, when to take snapshots
 * and which to drop is the caller's (kda-server's prefix cache). */

/* Snapshot of the sequence as it stands (all kda_seq_len tokens, >= 1).
 * KDA_ENOMEM when every snapshot slot is taken (drop one) or host memory ran
 * out; KDA_EINVAL for a bad or failed sequence. */
int kda_snapshot_take(kda_engine *e, int seq_id, int *snap_id, char *err, size_t errlen);
/* The new, empty sequence seq_id becomes snapshot snap_id's sequence: its
 * length and history are the snapshot's, ready for the next token. tokens
 * [n_tokens] is what the caller believes the prefix is: the snapshot's tokens
 * must be its first kda_snapshot_len ones (KDA_EINVAL otherwise, nothing
 * changed), so a wrong index can never produce wrong numbers. KDA_ENOMEM
 * (CUDA) when no KV block is free for the partial last block. */
int kda_seq_restore(kda_engine *e, int seq_id, int snap_id, const int32_t *tokens, int n_tokens, char *err,
                    size_t errlen);
void kda_snapshot_drop(kda_engine *e, int snap_id);  /* no-op for a free id */
int kda_snapshot_len(const kda_engine *e, int snap_id); /* tokens, < 0 for a free or bad id */
int kda_snapshots_free(const kda_engine *e);

#include "kda_rng.h"

const char *kda_strerror(int code);

/* Describes a model directory (family, dims, layer kinds, tensor table,
 * parameter count, unused tensors) on out, as text or JSON, without creating
 * a backend. Returns the binding error (named tensor) if the model would not load. */
int kda_inspect(const char *dir, const char *name_map, const char *config_map, int json, FILE *out, char *err,
                size_t errlen);

#ifdef __cplusplus
}
#endif
#endif

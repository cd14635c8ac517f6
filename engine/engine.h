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

typedef struct {
    const char *model_dir;  /* directory with config.json + *.safetensors */
    const char *device;     /* "cpu", "cuda" or "auto" (NULL = "cpu") */
    int threads;            /* CPU worker threads, 0 = all cores */
    int max_seqs;           /* live sequences at once (0 = 64) */
    int max_seq_len;        /* per-sequence context capacity (0 = model's max_position_embeddings) */
    double gpu_mem_fraction;/* CUDA: fraction of free device memory for the pool (0 = 0.9) */
    const char *name_map;   /* optional name-map file (configs/), NULL = auto-detect scheme */
    int verbose;            /* print load progress to stderr */
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
} kda_model_info;

int kda_engine_open(kda_engine **out, const kda_engine_opts *opts, char *err, size_t errlen);
void kda_engine_close(kda_engine *e);
const kda_model_info *kda_engine_info(const kda_engine *e);

/* ---- sequences ----
 * A sequence owns its KDA recurrent/conv state and GQA KV cache. It starts
 * empty (position 0, zero state). Ids are small ints, reused after free. */
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

/* ---- sampling ----
 * Applied in this order to the raw logits: repetition penalty (over prompt and
 * generated tokens, vLLM semantics: divide positive logits / multiply negative
 * ones), presence and frequency penalties (over generated tokens only),
 * temperature, top_k, top_p, min_p, then a draw with the uniform
 * kda_rng_uniform(seed, n_generated). temperature <= 0 means greedy (argmax,
 * lowest id on ties) and ignores the rest. */
typedef struct {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint64_t seed;
    const int32_t *prompt_tokens; int n_prompt;   /* history for penalties (caller-owned) */
    const int32_t *gen_tokens; int n_gen;         /* generated so far; n_gen is the RNG counter */
} kda_sampling;

/* ---- one batched step ----
 * Each item appends n_tokens tokens to one sequence (a prompt chunk, or the
 * one token a decoding sequence just produced). All items are processed in
 * one forward pass; different sequences may have any lengths. A sequence may
 * appear at most once per step. Outputs (all optional, caller-owned):
 *   logits          [n_tokens, vocab] when want_all_logits, else [vocab] for the last token
 *   target_logprobs [n_tokens]: log p(targets[i] | tokens up to i); entries
 *                   with targets[i] < 0 are written as 0
 *   sampling        if non-NULL, a token is drawn from the last position's
 *                   distribution into *sampled, its raw log-prob into
 *                   *sampled_logprob, and the n_top best raw (id, log-prob)
 *                   into top_ids/top_logprobs (n_top may be 0).
 * Raw log-prob = log_softmax of the model's logits, before penalties and
 * temperature. On error no sequence in the batch has advanced. */
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
} kda_batch_item;

int kda_engine_step(kda_engine *e, kda_batch_item *items, int n_items, char *err, size_t errlen);

/* Counter-based RNG shared by every backend: same (seed, counter) gives the
 * same uniform in [0,1) on the CPU and on the GPU. */
static inline uint64_t kda_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static inline double kda_rng_uniform(uint64_t seed, uint64_t counter)
{
    return (double)(kda_splitmix64(seed ^ kda_splitmix64(counter)) >> 11) * 0x1.0p-53;
}

const char *kda_strerror(int code);

/* Describes a model directory (family, dims, layer kinds, tensor table,
 * parameter count, unused tensors) on out, as text or JSON, without creating
 * a backend. Returns the binding error (named tensor) if the model would not load. */
int kda_inspect(const char *dir, const char *name_map, int json, FILE *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif

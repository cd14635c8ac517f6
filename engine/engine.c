/*
 * engine.c - engine.h on top of a backend: opens the checkpoint, owns the
 * sequence table (ids, positions, token history), validates every step and
 * takes the memory it needs before any backend work, so a bad request never
 * advances or corrupts a sequence and a backend step can fail only for device
 * reasons (engine.h says what a device error leaves behind).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "safetensors.h"

typedef struct {
    int in_use;
    int pos;     /* tokens consumed */
    int failed;  /* a device error hit a step of this sequence: its state is unknown */
} seq_entry;

/* A prefix snapshot as the engine sees it; the state and KV are the backend's. */
typedef struct {
    int in_use;
    int len;         /* tokens */
    int32_t *tokens; /* [len] its token history (restores copy it into the sequence) */
} snap_entry;

/* Snapshot slots at most, whatever the byte budget (the tiny test models'
 * states are a few KiB). */
#define KDA_MAX_SNAPSHOTS 4096

struct kda_engine {
    model_config cfg;
    st_set *st;
    model_weights w;
    backend *be;
    kda_model_info info;
    seq_entry *seqs;
    int max_seqs;
    step_item *items;    /* [max_seqs] step scratch */
    int *seen;           /* [max_seqs] duplicate check, step-stamped */
    int stamp;
    int32_t *hist;       /* [max_seqs][max_seq_len] every token fed to each sequence */
    int bad_item;        /* the item a refused step failed on, -1 = none */
    int in_flight;       /* items of a step begun and not ended (e->items[0..in_flight)) */
    int flight_rc;       /* its result when another call ended it (returned by kda_engine_step_end) */
    int flight_done;
    char flight_err[256];
    snap_entry *snaps;   /* [n_snaps] prefix snapshots */
    int n_snaps;
};

const char *kda_strerror(int code)
{
    switch (code) {
    case KDA_OK: return "ok";
    case KDA_EINVAL: return "invalid argument";
    case KDA_ENOMEM: return "out of memory";
    case KDA_EIO: return "I/O error";
    case KDA_EFORMAT: return "malformed input";
    case KDA_EUNSUP: return "unsupported";
    case KDA_ECTX: return "context length exceeded";
    case KDA_EDEVICE: return "device error";
    default: return "unknown error";
    }
}

static void fill_info(kda_engine *e)
{
    const model_config *c = &e->cfg;
    kda_model_info *in = &e->info;
    in->family = c->family;
    in->family_name = c->family == KDA_FAMILY_KDA ? "kda" : "llama_kda";
    in->n_layers = c->n_layers;
    in->d_model = c->d;
    in->vocab_size = c->vocab;
    in->ffn_dim = c->ffn;
    in->kda_heads = c->kda_h;
    in->kda_head_k = c->kda_k;
    in->kda_head_v = c->kda_v;
    in->gqa_heads = c->gqa_h;
    in->gqa_kv_heads = c->gqa_kvh;
    in->gqa_head_dim = c->gqa_hd;
    in->gqa_rope_dim = c->rope_dim;
    in->bos_id = c->bos_id;
    in->eos_id = c->eos_id;
    in->max_position = c->max_pos;
    in->byte_tokenizer = c->byte_tokenizer;
    in->n_params = e->w.n_params;
    in->weight_bytes = e->w.bytes;
    for (int l = 0; l < c->n_layers; l++) in->layer_kind[l] = c->kind[l];
    in->state_bytes_per_seq = model_state_floats(c) * 4;
    in->kv_bytes_per_token = model_kv_floats_per_token(c) * 4;
}

/* ---- tuning ---- */

void kda_tuning_defaults(kda_tuning *t)
{
    *t = (kda_tuning){.gemv_max_t = 1, .graphs = 1, .pdl = 1, .gemm_lt = 1, .gemm_verbose = 0, .gemm_tune_flush = 1,
                      .gemm_splitk = 1, .gemm_skinny = 1, .gemm_pad = 1, .gemv_persist = 1, .gu_bf16 = 1, .attn_split = 0, .kda_stream = 16,
                      .fast_prefill = 1,
                      .mixed_pass = 1, .mixed_reserve = 32, .short_prompt = 16, .prefill_rows = 8192, .prof = 0, .cpu_bf16_act = 0};
}

static const struct {
    const char *name;
    size_t off;
    int lo, hi;
} tuning_fields[] = {
#define TF(f, lo, hi) {#f, offsetof(kda_tuning, f), lo, hi}
    TF(gemv_max_t, 0, 8), TF(graphs, 0, 1),   TF(pdl, 0, 1),          TF(gemm_lt, 0, 1),
    TF(gemm_verbose, 0, 1), TF(gemm_tune_flush, 0, 1), TF(gemm_splitk, 0, 1), TF(gemm_skinny, 0, 2), TF(gemm_pad, 0, 1),
    TF(gemv_persist, 0, 1), TF(gu_bf16, 0, 1),
    TF(attn_split, 0, 256), TF(kda_stream, 0, 1 << 20), TF(fast_prefill, 0, 1), TF(mixed_pass, 0, 1), TF(mixed_reserve, 0, 1024), TF(short_prompt, 0, 64), TF(prefill_rows, 1, 1 << 20), TF(attn_prefill_variant, 0, 3),
    TF(kda_chunk_gemm, 0, 2), TF(kda_chunk_bv, 0, 64), TF(kda_chunk_split, 0, 16),
    TF(attn_prefill_split, 0, 1 << 20), TF(prof, 0, 1), TF(cpu_bf16_act, 0, 1), TF(kda_state_bf16, 0, 1), TF(poison, 0, (1 << 15) - 1),
#undef TF
};
#define N_TUNING_FIELDS (int)(sizeof tuning_fields / sizeof tuning_fields[0])

int kda_state_dtype_parse(kda_tuning *t, const char *v, char *err, size_t errlen)
{
    if (!v) return 0;
    if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
        snprintf(err, errlen, "--kda-state-dtype must be fp32 or bf16, not \"%s\"", v);
        return KDA_EINVAL;
    }
    t->kda_state_bf16 = !strcmp(v, "bf16");
    return 0;
}

int kda_tuning_parse(kda_tuning *t, const char *spec, char *err, size_t errlen)
{
    const char *p = spec ? spec : "";
    while (*p) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        if (!eq || eq > end) {
            snprintf(err, errlen, "tuning: expected key=value, got \"%.*s\"", (int)(end - p), p);
            return KDA_EINVAL;
        }
        int f = 0;
        while (f < N_TUNING_FIELDS &&
               !(strlen(tuning_fields[f].name) == (size_t)(eq - p) && !strncmp(tuning_fields[f].name, p, eq - p)))
            f++;
        if (f == N_TUNING_FIELDS) {
            snprintf(err, errlen, "tuning: unknown key \"%.*s\" (see --help)", (int)(eq - p), p);
            return KDA_EINVAL;
        }
        char *num_end = NULL;
        long v = strtol(eq + 1, &num_end, 10);
        if (num_end != end || eq + 1 == end || v < tuning_fields[f].lo || v > tuning_fields[f].hi) {
            snprintf(err, errlen, "tuning: %s must be an integer in [%d, %d]", tuning_fields[f].name,
                     tuning_fields[f].lo, tuning_fields[f].hi);
            return KDA_EINVAL;
        }
        if (!strcmp(tuning_fields[f].name, "attn_split") && v && v != 32 && v != 64 && v != 128 && v != 256) {
            snprintf(err, errlen, "tuning: attn_split must be 0, 32, 64, 128 or 256");
            return KDA_EINVAL;
        }
        *(int *)((char *)t + tuning_fields[f].off) = (int)v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

int kda_tuning_from_env(kda_tuning *t, char *err, size_t errlen)
{
    const char *v = getenv("KDA_TUNING");
    return v && *v ? kda_tuning_parse(t, v, err, errlen) : 0;
}

void kda_tuning_describe(const kda_tuning *t, FILE *out)
{
    for (int f = 0; f < N_TUNING_FIELDS; f++)
        fprintf(out, "%s%s=%d", f ? "," : "", tuning_fields[f].name,
                *(const int *)((const char *)t + tuning_fields[f].off));
}

/* ---- engine ---- */

int kda_engine_open(kda_engine **out, const kda_engine_opts *o, char *err, size_t errlen)
{
    *out = NULL;
    if (!o || !o->model_dir) {
        snprintf(err, errlen, "no model directory given");
        return KDA_EINVAL;
    }
    kda_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return KDA_ENOMEM;
    }
    int rc = config_load(&e->cfg, o->model_dir, o->config_map, err, errlen);
    if (rc) goto fail;
    const char *dev = o->device ? o->device : "cpu";
    if (!strcmp(dev, "auto")) dev = cuda_device_available() ? "cuda" : "cpu";
    /* The weights file may change underneath a long-running process: the CPU
     * backend computes from a private copy (a mapping would SIGBUS once the
     * file is truncated, or mix old and new weights once it is rewritten);
     * the CUDA backend reads the mapping once, at upload, and it is dropped
     * right after (below). */
    const int cpu = !strcmp(dev, "cpu");
    rc = cpu ? st_open_dir_private(&e->st, o->model_dir, err, errlen) : st_open_dir(&e->st, o->model_dir, err, errlen);
    if (rc) goto fail;
    rc = weights_bind(&e->w, &e->cfg, e->st, o->name_map, err, errlen);
    if (rc) goto fail;
    fill_info(e);

    e->max_seqs = o->max_seqs > 0 ? o->max_seqs : 64;
    int cap = o->max_seq_len > 0 ? o->max_seq_len : e->cfg.max_pos;
    if (cap > e->cfg.max_pos) {
        snprintf(err, errlen, "max_seq_len %d exceeds the model's max_position_embeddings %d", cap, e->cfg.max_pos);
        rc = KDA_EINVAL;
        goto fail;
    }
    e->info.max_seq_len = cap;
    e->info.max_seqs = e->max_seqs;
    e->seqs = calloc((size_t)e->max_seqs, sizeof *e->seqs);
    e->items = calloc((size_t)e->max_seqs, sizeof *e->items);
    e->seen = calloc((size_t)e->max_seqs, sizeof *e->seen);
    e->hist = malloc((size_t)e->max_seqs * cap * sizeof *e->hist);
    if (!e->seqs || !e->items || !e->seen || !e->hist) {
        snprintf(err, errlen, "out of memory");
        rc = KDA_ENOMEM;
        goto fail;
    }

    if (o->tuning && o->tuning->kda_state_bf16) /* S as bf16, the conv tails fp32 (the CPU backend refuses it) */
        e->info.state_bytes_per_seq = (size_t)model_n_kda_layers(&e->cfg) *
                                      (model_kda_layer_state_floats(&e->cfg) * 2 + model_kda_layer_tail_floats(&e->cfg) * 4);
    if (o->snapshot_bytes && e->info.state_bytes_per_seq) {
        size_t n = o->snapshot_bytes / e->info.state_bytes_per_seq;
        e->n_snaps = n > KDA_MAX_SNAPSHOTS ? KDA_MAX_SNAPSHOTS : (int)n;
    }
    backend_params bp = {
        .cfg = &e->cfg, .w = &e->w, .max_seqs = e->max_seqs, .max_seq_len = cap, .max_snaps = e->n_snaps,
        .threads = o->threads, .gpu_mem_fraction = o->gpu_mem_fraction > 0 ? o->gpu_mem_fraction : 0.9,
        .verbose = o->verbose,
    };
    if (o->tuning) bp.tuning = *o->tuning;
    else kda_tuning_defaults(&bp.tuning);
    if (cpu) {
        rc = cpu_backend_create(&e->be, &bp, err, errlen);
    } else if (!strcmp(dev, "cuda")) {
        rc = cuda_backend_create(&e->be, &bp, err, errlen);
        if (!rc) {
            /* the weights now live in device memory; nothing reads the host
             * views again, so the mapping goes (and with it any way for the
             * file to reach the process) */
            model_weights sizes = {.n_params = e->w.n_params, .bytes = e->w.bytes};
            weights_free(&e->w);
            e->w = sizes;
            st_close(e->st);
            e->st = NULL;
        }
    } else {
        snprintf(err, errlen, "unknown device \"%s\" (expected cpu, cuda or auto)", dev);
        rc = KDA_EINVAL;
    }
    if (rc) goto fail;
    e->info.device_name = e->be->device_name;
    e->info.pool_bytes = e->be->pool_bytes;
    e->info.kv_pool_bytes = e->be->kv_pool_bytes;
    e->info.state_pool_bytes = e->be->state_pool_bytes;
    e->info.max_full_context_seqs = e->be->max_full_context_seqs;
    e->info.pass_rows = e->be->pass_rows;
    e->info.async_step = e->be->step_begin != NULL;
    if (e->be->kv_bytes_per_token) e->info.kv_bytes_per_token = e->be->kv_bytes_per_token;
    e->n_snaps = e->be->snap_take ? e->be->n_snaps : 0;
    e->info.max_snapshots = e->n_snaps;
    e->info.snapshot_bytes_each = e->be->snap_state_bytes;
    if (e->n_snaps && !(e->snaps = calloc((size_t)e->n_snaps, sizeof *e->snaps))) {
        snprintf(err, errlen, "out of memory");
        rc = KDA_ENOMEM;
        goto fail;
    }
    *out = e;
    return 0;
fail:
    kda_engine_close(e);
    return rc;
}

/* Waits for the step in flight, if any: its outputs into the items, a device
 * failure onto its sequences. */
static int flight_end(kda_engine *e, char *err, size_t errlen)
{
    if (!e->in_flight) return 0;
    const int n = e->in_flight;
    e->in_flight = 0;
    int rc = e->be->step_end(e->be, err, errlen);
    if (rc)
        for (int i = 0; i < n; i++) e->seqs[e->items[i].slot].failed = 1;
    return rc;
}

/* Before a call that changes the engine: the step in flight ends, its result
 * kept for kda_engine_step_end. */
static void flight_settle(kda_engine *e)
{
    if (!e->in_flight) return;
    e->flight_rc = flight_end(e, e->flight_err, sizeof e->flight_err);
    e->flight_done = 1;
}

void kda_engine_close(kda_engine *e)
{
    if (!e) return;
    flight_settle(e);
    if (e->be) e->be->destroy(e->be);
    for (int i = 0; e->snaps && i < e->n_snaps; i++) free(e->snaps[i].tokens);
    free(e->snaps);
    weights_free(&e->w);
    st_close(e->st);
    free(e->seqs);
    free(e->items);
    free(e->seen);
    free(e->hist);
    free(e);
}

const kda_model_info *kda_engine_info(const kda_engine *e) { return &e->info; }

static int live(const kda_engine *e, int id) { return id >= 0 && id < e->max_seqs && e->seqs[id].in_use; }

int kda_seq_new(kda_engine *e, int *seq_id, char *err, size_t errlen)
{
    flight_settle(e);
    for (int i = 0; i < e->max_seqs; i++) {
        if (e->seqs[i].in_use) continue;
        int rc = e->be->seq_reset(e->be, i, err, errlen);
        if (rc) return rc;
        e->seqs[i] = (seq_entry){.in_use = 1};
        *seq_id = i;
        return 0;
    }
    snprintf(err, errlen, "all %d sequence slots are in use", e->max_seqs);
    return KDA_ENOMEM;
}

void kda_seq_free(kda_engine *e, int id)
{
    if (!live(e, id)) return;
    flight_settle(e);
    e->seqs[id].in_use = 0;
    if (e->be->seq_release) e->be->seq_release(e->be, id);
}

int kda_seq_len(const kda_engine *e, int id) { return live(e, id) ? e->seqs[id].pos : KDA_EINVAL; }

int kda_seq_reserve(kda_engine *e, int id, int n_tokens, char *err, size_t errlen)
{
    if (!live(e, id)) {
        snprintf(err, errlen, "no live sequence %d", id);
        return KDA_EINVAL;
    }
    if (n_tokens > e->info.max_seq_len) {
        snprintf(err, errlen, "%d tokens exceed the context capacity %d", n_tokens, e->info.max_seq_len);
        return KDA_ECTX;
    }
    flight_settle(e);
    return e->be->seq_reserve ? e->be->seq_reserve(e->be, id, n_tokens, err, errlen) : 0;
}

int kda_seqs_free_slots(const kda_engine *e)
{
    int n = 0;
    for (int i = 0; i < e->max_seqs; i++) n += !e->seqs[i].in_use;
    return n;
}

void kda_engine_usage(const kda_engine *e, kda_usage *u)
{
    int used = 0;
    for (int i = 0; i < e->max_seqs; i++) used += e->seqs[i].in_use;
    size_t kv_used = 0;
    if (e->be->kv_bytes_used) {
        kv_used = e->be->kv_bytes_used(e->be);
    } else { /* fixed-size slots: what the live sequences' tokens occupy */
        for (int i = 0; i < e->max_seqs; i++)
            if (e->seqs[i].in_use) kv_used += (size_t)e->seqs[i].pos * e->info.kv_bytes_per_token;
    }
    int snaps = 0;
    for (int i = 0; i < e->n_snaps; i++) snaps += e->snaps[i].in_use;
    *u = (kda_usage){
        .snaps_used = snaps, .snaps_total = e->n_snaps,
        .cache_bytes = e->be->cache_bytes ? e->be->cache_bytes(e->be) : 0,
        .seqs_used = used, .seqs_total = e->max_seqs,
        .kv_bytes_used = kv_used, .kv_bytes_total = e->info.kv_pool_bytes,
        .state_bytes_used = (size_t)used * e->info.state_bytes_per_seq,
        .state_bytes_total = (size_t)e->max_seqs * e->info.state_bytes_per_seq,
    };
}

void kda_engine_prof_take(kda_engine *e, kda_prof *out)
{
    flight_settle(e);
    memset(out, 0, sizeof *out);
    if (e->be->prof_take) e->be->prof_take(e->be, out);
}

/* Everything about one item a backend relies on; KDA_EINVAL / KDA_ECTX with
 * the reason, before anything runs. */
static int check_item(const kda_engine *e, const kda_batch_item *it, int i, char *err, size_t errlen)
{
    const int vocab = e->cfg.vocab;
    if (!live(e, it->seq)) {
        snprintf(err, errlen, "item %d: no live sequence %d", i, it->seq);
        return KDA_EINVAL;
    }
    if (e->seqs[it->seq].failed) {
        snprintf(err, errlen, "item %d: sequence %d was lost to a device error; free it", i, it->seq);
        return KDA_EINVAL;
    }
    if (e->seen[it->seq] == e->stamp) {
        snprintf(err, errlen, "item %d: sequence %d appears twice in one step", i, it->seq);
        return KDA_EINVAL;
    }
    if (it->n_tokens <= 0 || !it->tokens) {
        snprintf(err, errlen, "item %d: no tokens", i);
        return KDA_EINVAL;
    }
    for (int t = 0; t < it->n_tokens; t++)
        if (it->tokens[t] < 0 || it->tokens[t] >= vocab) {
            snprintf(err, errlen, "item %d: token %d is outside the vocabulary [0, %d)", i, it->tokens[t], vocab);
            return KDA_EINVAL;
        }
    const int pos = e->seqs[it->seq].pos;
    if (pos + it->n_tokens > e->info.max_seq_len) {
        snprintf(err, errlen, "sequence %d: %d + %d tokens exceeds the context capacity %d", it->seq, pos,
                 it->n_tokens, e->info.max_seq_len);
        return KDA_ECTX;
    }
    if (it->n_top < 0 || it->n_top > KDA_MAX_TOP) {
        snprintf(err, errlen, "item %d: n_top must be in [0, %d]", i, KDA_MAX_TOP);
        return KDA_EINVAL;
    }
    if (it->targets && it->target_logprobs)
        for (int t = 0; t < it->n_tokens; t++)
            if (it->targets[t] >= vocab) {
                snprintf(err, errlen, "item %d: target %d is outside the vocabulary [0, %d)", i, it->targets[t],
                         vocab);
                return KDA_EINVAL;
            }
    const kda_sampling *s = it->sampling;
    if (s) {
        if (s->n_prompt < 0 || s->n_prompt > pos + it->n_tokens) {
            snprintf(err, errlen, "item %d: sampling.n_prompt %d is outside [0, %d]", i, s->n_prompt,
                     pos + it->n_tokens);
            return KDA_EINVAL;
        }
        if (s->n_logit_bias < 0 || s->n_logit_bias > KDA_MAX_LOGIT_BIAS || (s->n_logit_bias && !s->logit_bias)) {
            snprintf(err, errlen, "item %d: at most %d logit_bias entries", i, KDA_MAX_LOGIT_BIAS);
            return KDA_EINVAL;
        }
        for (int k = 0; k < s->n_logit_bias; k++)
            if (s->logit_bias[k].id < 0 || s->logit_bias[k].id >= vocab || isnan(s->logit_bias[k].bias)) {
                snprintf(err, errlen, "item %d: logit_bias entry %d (token %d) is outside the vocabulary or NaN", i,
                         k, s->logit_bias[k].id);
                return KDA_EINVAL;
            }
    }
    return 0;
}

int kda_engine_step_bad_item(const kda_engine *e) { return e->bad_item; }

int kda_engine_step(kda_engine *e, kda_batch_item *items, int n, char *err, size_t errlen)
{
    int rc = kda_engine_step_begin(e, items, n, err, errlen);
    return rc ? rc : kda_engine_step_end(e, err, errlen);
}

int kda_engine_step_end(kda_engine *e, char *err, size_t errlen)
{
    if (e->flight_done) { /* ended by another call */
        e->flight_done = 0;
        if (e->flight_rc && err && errlen) snprintf(err, errlen, "%s", e->flight_err);
        return e->flight_rc;
    }
    return flight_end(e, err, errlen);
}

int kda_engine_step_begin(kda_engine *e, kda_batch_item *items, int n, char *err, size_t errlen)
{
    flight_settle(e);
    e->flight_done = 0; /* a result nobody asked for is dropped with the next step */
    e->bad_item = -1;
    if (n <= 0 || n > e->max_seqs || !items) {
        snprintf(err, errlen, "a step takes 1..%d items (got %d)", e->max_seqs, n);
        return KDA_EINVAL;
    }
    if (++e->stamp == 0) {
        memset(e->seen, 0, (size_t)e->max_seqs * sizeof *e->seen);
        e->stamp = 1;
    }
    for (int i = 0; i < n; i++) {
        int rc = check_item(e, &items[i], i, err, errlen);
        if (rc) {
            e->bad_item = i;
            return rc;
        }
        e->seen[items[i].seq] = e->stamp;
    }
    /* memory next: every block this step writes is taken before it runs */
    if (e->be->seq_reserve)
        for (int i = 0; i < n; i++) {
            int rc = e->be->seq_reserve(e->be, items[i].seq, e->seqs[items[i].seq].pos + items[i].n_tokens, err,
                                        errlen);
            if (rc) {
                e->bad_item = i;
                return rc;
            }
        }
    const size_t cap = (size_t)e->info.max_seq_len;
    for (int i = 0; i < n; i++) {
        const kda_batch_item *it = &items[i];
        const int pos = e->seqs[it->seq].pos;
        int32_t *h = e->hist + (size_t)it->seq * cap;
        memcpy(h + pos, it->tokens, (size_t)it->n_tokens * sizeof *h);
        e->items[i] = (step_item){.slot = it->seq, .pos = pos, .it = it, .hist = h};
    }
    int rc = e->be->step_begin ? e->be->step_begin(e->be, e->items, n, err, errlen)
                               : e->be->step(e->be, e->items, n, err, errlen);
    if (rc) {
        if (rc != KDA_ENOMEM) /* ENOMEM: refused before any state was touched (model.h) */
            for (int i = 0; i < n; i++) e->seqs[items[i].seq].failed = 1;
        return rc;
    }
    for (int i = 0; i < n; i++) e->seqs[items[i].seq].pos += items[i].n_tokens;
    if (e->be->step_begin) e->in_flight = n;
    return 0;
}

/* ---- prefix snapshots ---- */

static int snap_live(const kda_engine *e, int id) { return id >= 0 && id < e->n_snaps && e->snaps[id].in_use; }

int kda_snapshot_take(kda_engine *e, int id, int *snap_id, char *err, size_t errlen)
{
    flight_settle(e);
    if (!live(e, id) || e->seqs[id].failed || e->seqs[id].pos < 1) {
        snprintf(err, errlen, "sequence %d cannot be snapshotted (not live, failed or empty)", id);
        return KDA_EINVAL;
    }
    int k = 0;
    while (k < e->n_snaps && e->snaps[k].in_use) k++;
    if (k == e->n_snaps) {
        snprintf(err, errlen, "all %d snapshot slots are in use", e->n_snaps);
        return KDA_ENOMEM;
    }
    const int n = e->seqs[id].pos;
    snap_entry *sn = &e->snaps[k];
    int32_t *toks = realloc(sn->tokens, (size_t)n * sizeof *toks);
    if (!toks) {
        snprintf(err, errlen, "out of host memory for a snapshot of %d tokens", n);
        return KDA_ENOMEM;
    }
    sn->tokens = toks;
    int rc = e->be->snap_take(e->be, id, n, k, err, errlen);
    if (rc) return rc;
    memcpy(toks, e->hist + (size_t)id * e->info.max_seq_len, (size_t)n * sizeof *toks);
    sn->len = n;
    sn->in_use = 1;
    *snap_id = k;
    return 0;
}

int kda_seq_restore(kda_engine *e, int id, int snap_id, const int32_t *tokens, int n_tokens, char *err,
                    size_t errlen)
{
    flight_settle(e);
    if (!live(e, id) || e->seqs[id].failed || e->seqs[id].pos != 0) {
        snprintf(err, errlen, "sequence %d is not a live empty sequence", id);
        return KDA_EINVAL;
    }
    if (!snap_live(e, snap_id)) {
        snprintf(err, errlen, "no snapshot %d", snap_id);
        return KDA_EINVAL;
    }
    const snap_entry *sn = &e->snaps[snap_id];
    if (!tokens || n_tokens < sn->len || memcmp(tokens, sn->tokens, (size_t)sn->len * sizeof *tokens)) {
        snprintf(err, errlen, "snapshot %d (%d tokens) is not a prefix of the given %d tokens", snap_id, sn->len,
                 n_tokens);
        return KDA_EINVAL;
    }
    int32_t *h = e->hist + (size_t)id * e->info.max_seq_len;
    int rc = e->be->snap_restore(e->be, snap_id, id, sn->len, sn->tokens, err, errlen);
    if (rc) {
        if (rc != KDA_ENOMEM) e->seqs[id].failed = 1;
        return rc;
    }
    memcpy(h, sn->tokens, (size_t)sn->len * sizeof *h);
    e->seqs[id].pos = sn->len;
    return 0;
}

void kda_snapshot_drop(kda_engine *e, int snap_id)
{
    flight_settle(e);
    if (!snap_live(e, snap_id)) return;
    e->be->snap_drop(e->be, snap_id);
    e->snaps[snap_id].in_use = 0;
}

int kda_snapshot_len(const kda_engine *e, int snap_id) { return snap_live(e, snap_id) ? e->snaps[snap_id].len : KDA_EINVAL; }

int kda_snapshots_free(const kda_engine *e)
{
    int n = 0;
    for (int i = 0; i < e->n_snaps; i++) n += !e->snaps[i].in_use;
    return n;
}

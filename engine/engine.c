/*
 * engine.c - engine.h on top of a backend: opens the checkpoint, owns the
 * sequence table (ids, positions), validates every step before any backend
 * work so a bad request never advances or corrupts a sequence.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "safetensors.h"

typedef struct {
    int in_use;
    int pos;     /* tokens consumed */
} seq_entry;

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
    int n_kda = 0, n_gqa = 0;
    for (int l = 0; l < c->n_layers; l++) {
        in->layer_kind[l] = c->kind[l];
        n_kda += c->kind[l] == KDA_LAYER_KDA;
        n_gqa += c->kind[l] == KDA_LAYER_GQA;
    }
    in->state_bytes_per_seq = (size_t)n_kda * 4 *
        ((size_t)c->kda_h * c->kda_k * c->kda_v + (size_t)(c->conv_size - 1) * (2 * c->kda_h * c->kda_k + c->kda_h * c->kda_v));
    in->kv_bytes_per_token = (size_t)n_gqa * 2 * c->gqa_kvh * c->gqa_hd * 4;
}

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
    int rc = config_load(&e->cfg, o->model_dir, err, errlen);
    if (rc) goto fail;
    rc = st_open_dir(&e->st, o->model_dir, err, errlen);
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
    if (!e->seqs || !e->items || !e->seen) {
        snprintf(err, errlen, "out of memory");
        rc = KDA_ENOMEM;
        goto fail;
    }

    backend_params bp = {
        .cfg = &e->cfg, .w = &e->w, .max_seqs = e->max_seqs, .max_seq_len = cap,
        .threads = o->threads, .gpu_mem_fraction = o->gpu_mem_fraction > 0 ? o->gpu_mem_fraction : 0.9,
        .verbose = o->verbose,
    };
    const char *dev = o->device ? o->device : "cpu";
    if (!strcmp(dev, "auto")) dev = cuda_device_available() ? "cuda" : "cpu";
    if (!strcmp(dev, "cpu")) {
        rc = cpu_backend_create(&e->be, &bp, err, errlen);
    } else if (!strcmp(dev, "cuda")) {
        rc = cuda_backend_create(&e->be, &bp, err, errlen);
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
    if (e->be->kv_bytes_per_token) e->info.kv_bytes_per_token = e->be->kv_bytes_per_token;
    *out = e;
    return 0;
fail:
    kda_engine_close(e);
    return rc;
}

void kda_engine_close(kda_engine *e)
{
    if (!e) return;
    if (e->be) e->be->destroy(e->be);
    weights_free(&e->w);
    st_close(e->st);
    free(e->seqs);
    free(e->items);
    free(e->seen);
    free(e);
}

const kda_model_info *kda_engine_info(const kda_engine *e) { return &e->info; }

int kda_seq_new(kda_engine *e, int *seq_id, char *err, size_t errlen)
{
    for (int i = 0; i < e->max_seqs; i++) {
        if (e->seqs[i].in_use) continue;
        int rc = e->be->seq_reset(e->be, i, err, errlen);
        if (rc) return rc;
        e->seqs[i].in_use = 1;
        e->seqs[i].pos = 0;
        *seq_id = i;
        return 0;
    }
    snprintf(err, errlen, "all %d sequence slots are in use", e->max_seqs);
    return KDA_ENOMEM;
}

void kda_seq_free(kda_engine *e, int id)
{
    if (id < 0 || id >= e->max_seqs || !e->seqs[id].in_use) return;
    e->seqs[id].in_use = 0;
    if (e->be->seq_release) e->be->seq_release(e->be, id);
}

int kda_seq_len(const kda_engine *e, int id)
{
    if (id < 0 || id >= e->max_seqs || !e->seqs[id].in_use) return KDA_EINVAL;
    return e->seqs[id].pos;
}

int kda_seq_reserve(kda_engine *e, int id, int n_tokens, char *err, size_t errlen)
{
    if (id < 0 || id >= e->max_seqs || !e->seqs[id].in_use) {
        snprintf(err, errlen, "no live sequence %d", id);
        return KDA_EINVAL;
    }
    if (n_tokens > e->info.max_seq_len) {
        snprintf(err, errlen, "%d tokens exceed the context capacity %d", n_tokens, e->info.max_seq_len);
        return KDA_ECTX;
    }
    return e->be->seq_reserve ? e->be->seq_reserve(e->be, id, n_tokens, err, errlen) : 0;
}

int kda_seqs_free_slots(const kda_engine *e)
{
    int n = 0;
    for (int i = 0; i < e->max_seqs; i++) n += !e->seqs[i].in_use;
    return n;
}

int kda_engine_step(kda_engine *e, kda_batch_item *items, int n, char *err, size_t errlen)
{
    if (n <= 0 || n > e->max_seqs || !items) {
        snprintf(err, errlen, "a step takes 1..%d items (got %d)", e->max_seqs, n);
        return KDA_EINVAL;
    }
    if (++e->stamp == 0) {
        memset(e->seen, 0, (size_t)e->max_seqs * sizeof *e->seen);
        e->stamp = 1;
    }
    for (int i = 0; i < n; i++) {
        const kda_batch_item *it = &items[i];
        if (it->seq < 0 || it->seq >= e->max_seqs || !e->seqs[it->seq].in_use) {
            snprintf(err, errlen, "item %d: no live sequence %d", i, it->seq);
            return KDA_EINVAL;
        }
        if (e->seen[it->seq] == e->stamp) {
            snprintf(err, errlen, "item %d: sequence %d appears twice in one step", i, it->seq);
            return KDA_EINVAL;
        }
        e->seen[it->seq] = e->stamp;
        if (it->n_tokens <= 0 || !it->tokens) {
            snprintf(err, errlen, "item %d: no tokens", i);
            return KDA_EINVAL;
        }
        for (int t = 0; t < it->n_tokens; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= e->cfg.vocab) {
                snprintf(err, errlen, "item %d: token %d is outside the vocabulary [0, %d)", i, it->tokens[t],
                         e->cfg.vocab);
                return KDA_EINVAL;
            }
        if (e->seqs[it->seq].pos + it->n_tokens > e->info.max_seq_len) {
            snprintf(err, errlen, "sequence %d: %d + %d tokens exceeds the context capacity %d", it->seq,
                     e->seqs[it->seq].pos, it->n_tokens, e->info.max_seq_len);
            return KDA_ECTX;
        }
        if (it->n_top < 0 || it->n_top > 64) {
            snprintf(err, errlen, "item %d: n_top must be in [0, 64]", i);
            return KDA_EINVAL;
        }
        e->items[i] = (step_item){.slot = it->seq, .pos = e->seqs[it->seq].pos, .it = it};
    }
    int rc = e->be->step(e->be, e->items, n, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < n; i++) e->seqs[items[i].seq].pos += items[i].n_tokens;
    return 0;
}

/*
 * weights.c - binds checkpoint tensors to the model's weight views.
 *
 * The engine asks for every tensor by its canonical (fla-style) name, e.g.
 * "model.layers.3.attn.q_proj.weight". A name map rewrites canonical names
 * into the checkpoint's: the HF scheme is a built-in map, and any other layout
 * is a map file in configs/ (format in configs/README.md):
 *
 *     # canonical pattern                 checkpoint pattern
 *     model.embeddings.weight               model.embed_tokens.weight
 *     model.layers.{N}.attn.{*}            model.layers.{N}.self_attn.{*}
 *
 * {N} matches a layer number, {*} the rest of the name. First matching rule
 * wins; a name no rule matches is used as is. Every tensor is checked for
 * presence, dtype and shape before any math runs; the first bad one is named.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kda_file.h"
#include "model.h"
#include "safetensors.h"

typedef struct {
    char canon[256];
    char ckpt[256];
} name_rule;

typedef struct {
    name_rule *rules;
    int n;
} name_map;

static const name_rule hf_rules[] = {
    {"model.embeddings.weight", "model.embed_tokens.weight"},
    {"model.layers.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"},
    {"model.layers.{N}.mlp_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"model.layers.{N}.attn.{*}", "model.layers.{N}.self_attn.{*}"},
};

/* Matches name against pattern; on success captures {N} and {*}. */
static int pattern_match(const char *pat, const char *name, char *num, char *rest)
{
    num[0] = rest[0] = 0;
    while (*pat) {
        if (!strncmp(pat, "{N}", 3)) {
            int k = 0;
            while (isdigit((unsigned char)*name) && k < 15) num[k++] = *name++;
            num[k] = 0;
            if (!k) return 0;
            pat += 3;
        } else if (!strncmp(pat, "{*}", 3)) {
            if (pat[3]) return 0; /* {*} only at the end */
            snprintf(rest, 256, "%s", name);
            return 1;
        } else {
            if (*pat++ != *name++) return 0;
        }
    }
    return *name == 0;
}

static void pattern_fill(const char *pat, const char *num, const char *rest, char *out, size_t n)
{
    size_t o = 0;
    while (*pat && o + 1 < n) {
        const char *sub = NULL;
        if (!strncmp(pat, "{N}", 3)) sub = num;
        else if (!strncmp(pat, "{*}", 3)) sub = rest;
        if (sub) {
            o += (size_t)snprintf(out + o, n - o, "%s", sub);
            if (o >= n) o = n - 1;
            pat += 3;
        } else {
            out[o++] = *pat++;
        }
    }
    out[o] = 0;
}

static void map_name(const name_rule *rules, int n, const char *canon, char *out, size_t outn)
{
    char num[16], rest[256];
    for (int i = 0; i < n; i++)
        if (pattern_match(rules[i].canon, canon, num, rest)) {
            pattern_fill(rules[i].ckpt, num, rest, out, outn);
            return;
        }
    snprintf(out, outn, "%s", canon);
}

/* Name-map file: one rule per line, "canonical checkpoint", '#' comments. */
static int name_map_load(name_map *m, const char *path, char *err, size_t errlen)
{
    struct stat st;
    char why[512];
    int fd = kda_file_open(path, &st, why, sizeof why);
    if (fd >= 0 && st.st_size > (off_t)KDA_MAX_MAP_BYTES) {
        snprintf(why, sizeof why, "%s: larger than %u MiB", path, KDA_MAX_MAP_BYTES >> 20);
        close(fd);
        fd = -1;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) {
            snprintf(why, sizeof why, "%s: out of memory", path);
            close(fd);
        }
        snprintf(err, errlen, "name map %s", why);
        return KDA_EIO;
    }
    char line[1024];
    int lineno = 0, cap = 0;
    m->rules = NULL;
    m->n = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char a[256], b[256], extra[8];
        int k = sscanf(line, "%255s %255s %7s", a, b, extra);
        if (k <= 0) continue;
        if (k != 2 || strlen(a) >= 255 || strlen(b) >= 255) { /* 255 = may have been cut */
            snprintf(err, errlen, "name map %s:%d: expected \"canonical-name checkpoint-name\"", path, lineno);
            fclose(f);
            free(m->rules);
            return KDA_EFORMAT;
        }
        if (m->n == cap) {
            cap = cap ? cap * 2 : 16;
            name_rule *r = realloc(m->rules, (size_t)cap * sizeof *r);
            if (!r) {
                fclose(f);
                free(m->rules);
                snprintf(err, errlen, "out of memory");
                return KDA_ENOMEM;
            }
            m->rules = r;
        }
        snprintf(m->rules[m->n].canon, 256, "%s", a);
        snprintf(m->rules[m->n].ckpt, 256, "%s", b);
        m->n++;
    }
    fclose(f);
    return 0;
}

typedef struct {
    const st_set *st;
    const name_rule *rules;
    int n_rules;
    int64_t n_params;
    size_t bytes;
    char *err;
    size_t errlen;
} binder;

static int to_dtype(st_dtype t, dtype_t *out)
{
    switch (t) {
    case ST_F32: *out = DT_F32; return 1;
    case ST_F16: *out = DT_F16; return 1;
    case ST_BF16: *out = DT_BF16; return 1;
    default: return 0;
    }
}

static const char *shape_str(const int64_t *s, int nd, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && o < n; i++) o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* Finds canonical name `canon`, requires the given shape (ndim dims), fills v. */
static int bind(binder *b, tensor_view *v, const char *canon, int optional, int ndim, int64_t d0,
                int64_t d1, int64_t d2)
{
    char name[512];
    map_name(b->rules, b->n_rules, canon, name, sizeof name);
    const st_tensor *t = st_find(b->st, name);
    memset(v, 0, sizeof *v);
    if (!t) {
        if (optional) return 0;
        if (strcmp(name, canon))
            snprintf(b->err, b->errlen, "missing tensor \"%s\" (canonical name \"%s\")", name, canon);
        else
            snprintf(b->err, b->errlen, "missing tensor \"%s\"", name);
        return KDA_EFORMAT;
    }
    if (!to_dtype(t->dtype, &v->dtype)) {
        snprintf(b->err, b->errlen, "tensor \"%s\": dtype %s not supported (need BF16, F16 or F32)", name,
                 st_dtype_name(t->dtype));
        return KDA_EUNSUP;
    }
    /* The format allows any offset; the math reads elements in place, so a
     * tensor must sit at a multiple of its element size (writers that pad the
     * header to 8 bytes, as the reference and HF tools do, guarantee it). */
    if ((uintptr_t)t->data % dtype_size(v->dtype)) {
        snprintf(b->err, b->errlen, "tensor \"%s\": data not aligned to its %zu-byte %s elements (re-save the "
                 "checkpoint with an 8-byte padded header)", name, dtype_size(v->dtype), st_dtype_name(t->dtype));
        return KDA_EUNSUP;
    }
    int64_t want[3] = {d0, d1, d2};
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char s1[128], s2[128];
        snprintf(b->err, b->errlen, "tensor \"%s\": shape %s, expected %s", name, shape_str(t->shape, t->ndim, s1, sizeof s1),
                 shape_str(want, ndim, s2, sizeof s2));
        return KDA_EFORMAT;
    }
    v->data = t->data;
    v->name = t->name;
    if (ndim == 1) {
        v->rows = 1;
        v->cols = d0;
    } else if (ndim == 2) {
        v->rows = d0;
        v->cols = d1;
    } else { /* [C, 1, taps] conv weight: one row of taps per channel */
        v->rows = d0;
        v->cols = d1 * d2;
    }
    v->group_rows = v->rows;
    v->group_stride = v->rows;
    b->n_params += t->numel;
    b->bytes += t->nbytes;
    return 0;
}

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int bind_kda(binder *b, kda_layer *L, const model_config *c, const char *pre)
{
    char n[512];
    const int64_t D = c->d, H = c->kda_h, HV = c->kda_hv, K = c->kda_k, V = c->kda_v, HK = H * K, HVK = HV * K,
                  HVV = HV * V;
#define NM(s) (snprintf(n, sizeof n, "%s%s", pre, s), n)
    TRY(bind(b, &L->q, NM("q_proj.weight"), 0, 2, HK, D, 0));
    TRY(bind(b, &L->k, NM("k_proj.weight"), 0, 2, HK, D, 0));
    TRY(bind(b, &L->v, NM("v_proj.weight"), 0, 2, HVV, D, 0));
    if (c->short_conv) {
        TRY(bind(b, &L->q_conv, NM("q_conv1d.weight"), 0, 3, HK, 1, c->conv_size));
        TRY(bind(b, &L->k_conv, NM("k_conv1d.weight"), 0, 3, HK, 1, c->conv_size));
        TRY(bind(b, &L->v_conv, NM("v_conv1d.weight"), 0, 3, HVV, 1, c->conv_size));
    }
    if (c->short_conv && c->conv_bias) {
        TRY(bind(b, &L->q_conv_bias, NM("q_conv1d.bias"), 0, 1, HK, 0, 0));
        TRY(bind(b, &L->k_conv_bias, NM("k_conv1d.bias"), 0, 1, HK, 0, 0));
        TRY(bind(b, &L->v_conv_bias, NM("v_conv1d.bias"), 0, 1, HVV, 0, 0));
    }
    TRY(bind(b, &L->f0, NM("f_proj.0.weight"), 0, 2, V, D, 0));
    TRY(bind(b, &L->f1, NM("f_proj.1.weight"), 0, 2, HVK, V, 0));
    TRY(bind(b, &L->b, NM("b_proj.weight"), 0, 2, HV, D, 0));
    TRY(bind(b, &L->A_log, NM("A_log"), 0, 1, HV, 0, 0));
    TRY(bind(b, &L->dt_bias, NM("dt_bias"), 0, 1, HVK, 0, 0));
    TRY(bind(b, &L->g0, NM("g_proj.0.weight"), 0, 2, V, D, 0));
    TRY(bind(b, &L->g1, NM("g_proj.1.weight"), 0, 2, HVV, V, 0));
    TRY(bind(b, &L->g1_bias, NM("g_proj.1.bias"), 0, 1, HVV, 0, 0));
    TRY(bind(b, &L->o_norm, NM("o_norm.weight"), 0, 1, V, 0, 0));
    TRY(bind(b, &L->o, NM("o_proj.weight"), 0, 2, D, HVV, 0));
#undef NM
    return 0;
}

static int bind_gqa(binder *b, gqa_layer *L, const model_config *c, const char *pre)
{
    char n[512];
    const int D = c->d, Hq = c->gqa_h, Hkv = c->gqa_kvh, hd = c->gqa_hd;
#define NM(s) (snprintf(n, sizeof n, "%s%s", pre, s), n)
    TRY(bind(b, &L->k, NM("k_proj.weight"), 0, 2, (int64_t)Hkv * hd, D, 0));
    TRY(bind(b, &L->v, NM("v_proj.weight"), 0, 2, (int64_t)Hkv * hd, D, 0));
    TRY(bind(b, &L->o, NM("o_proj.weight"), 0, 2, D, (int64_t)Hq * hd, 0));
    if (c->qkv_bias) {
        TRY(bind(b, &L->q_bias, NM("q_proj.bias"), 0, 1, (int64_t)Hq * hd, 0, 0));
        TRY(bind(b, &L->k_bias, NM("k_proj.bias"), 0, 1, (int64_t)Hkv * hd, 0, 0));
        TRY(bind(b, &L->v_bias, NM("v_proj.bias"), 0, 1, (int64_t)Hkv * hd, 0, 0));
    }
    if (c->o_bias) TRY(bind(b, &L->o_bias, NM("o_proj.bias"), 0, 1, D, 0, 0));
    if (c->qk_norm) {
        TRY(bind(b, &L->q_norm, NM("q_norm.weight"), 0, 1, hd, 0, 0));
        TRY(bind(b, &L->k_norm, NM("k_norm.weight"), 0, 1, hd, 0, 0));
    }
    if (!c->output_gate) {
        TRY(bind(b, &L->q, NM("q_proj.weight"), 0, 2, (int64_t)Hq * hd, D, 0));
        return 0;
    }
    TRY(bind(b, &L->gate, NM("g_proj.weight"), 1, 2, (int64_t)Hq * hd, D, 0));
    if (L->gate.data) {
        TRY(bind(b, &L->q, NM("q_proj.weight"), 0, 2, (int64_t)Hq * hd, D, 0));
        return 0;
    }
    /* No g_proj: the gate must be interleaved in a [2*Hq*hd, D] q_proj,
     * rows 2*hd*h .. +hd-1 = query head h, the next hd rows = its gate. */
    char name[512];
    map_name(b->rules, b->n_rules, NM("q_proj.weight"), name, sizeof name);
    const st_tensor *t = st_find(b->st, name);
    if (t && t->ndim == 2 && t->shape[0] == (int64_t)Hq * hd) {
        snprintf(b->err, b->errlen, "missing tensor \"%sg_proj.weight\" (the output gate: config says output_gate "
                 "and q_proj.weight is [%d, %d], not the fused [%d, %d] q|gate form)", pre, Hq * hd, D, 2 * Hq * hd, D);
        return KDA_EFORMAT;
    }
    TRY(bind(b, &L->q, NM("q_proj.weight"), 0, 2, 2 * (int64_t)Hq * hd, D, 0));
#undef NM
    L->gate = L->q;
    L->q.rows = L->gate.rows = (int64_t)Hq * hd;
    L->q.group_rows = L->gate.group_rows = hd;
    L->q.group_stride = L->gate.group_stride = 2 * hd;
    L->gate.data = (const char *)L->q.data + (size_t)hd * D * dtype_size(L->q.dtype);
    return 0;
}

/* fla attnres: PREFIX_proj.weight [1, D] (the pseudo-query), PREFIX_norm.weight [D] */
static int bind_attnres(binder *b, attnres_weights *a, const model_config *c, const char *prefix)
{
    char n[512];
    snprintf(n, sizeof n, "%s_proj.weight", prefix);
    TRY(bind(b, &a->query, n, 0, 2, 1, c->d, 0));
    snprintf(n, sizeof n, "%s_norm.weight", prefix);
    TRY(bind(b, &a->norm, n, 0, 1, c->d, 0, 0));
    return 0;
}

int weights_bind(model_weights *w, const model_config *c, st_set *st, const char *name_map_path,
                 char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    name_map user = {0};
    binder b = {.st = st, .err = err, .errlen = errlen};
    if (name_map_path) {
        int rc = name_map_load(&user, name_map_path, err, errlen);
        if (rc) return rc;
        b.rules = user.rules;
        b.n_rules = user.n;
    } else if (st_find(st, "model.embed_tokens.weight") && !st_find(st, "model.embeddings.weight")) {
        b.rules = hf_rules;
        b.n_rules = (int)(sizeof hf_rules / sizeof hf_rules[0]);
    }
    int rc = 0;
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) {
        snprintf(err, errlen, "out of memory");
        rc = KDA_ENOMEM;
        goto out;
    }
    const int D = c->d;
#define CHK(x) do { if ((rc = (x))) goto out; } while (0)
    CHK(bind(&b, &w->embed, "model.embeddings.weight", 0, 2, c->vocab, D, 0));
    CHK(bind(&b, &w->final_norm, "model.norm.weight", 0, 1, D, 0, 0));
    if (c->tie_embeddings) {
        w->lm_head = w->embed;
    } else {
        CHK(bind(&b, &w->lm_head, "lm_head.weight", 0, 2, c->vocab, D, 0));
    }
    for (int i = 0; i < c->n_layers; i++) {
        layer_weights *L = &w->layers[i];
        char pre[128], n[256];
        L->kind = c->kind[i];
        snprintf(n, sizeof n, "model.layers.%d.attn_norm.weight", i);
        CHK(bind(&b, &L->attn_norm, n, 0, 1, D, 0, 0));
        snprintf(n, sizeof n, "model.layers.%d.mlp_norm.weight", i);
        CHK(bind(&b, &L->mlp_norm, n, 0, 1, D, 0, 0));
        /* llama_kda keeps a KDA layer's tensors one level deeper, under self_attn.kda. */
        if (L->kind == KDA_LAYER_KDA) {
            snprintf(pre, sizeof pre, "model.layers.%d.attn.%s", i, c->family == KDA_FAMILY_LLAMA_KDA ? "kda." : "");
            CHK(bind_kda(&b, &L->kda, c, pre));
        } else {
            snprintf(pre, sizeof pre, "model.layers.%d.attn.", i);
            CHK(bind_gqa(&b, &L->gqa, c, pre));
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", i);
        CHK(bind(&b, &L->mlp.gate, n, 0, 2, c->ffn, D, 0));
        snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.weight", i);
        CHK(bind(&b, &L->mlp.up, n, 0, 2, c->ffn, D, 0));
        snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", i);
        CHK(bind(&b, &L->mlp.down, n, 0, 2, D, c->ffn, 0));
        if (c->mlp_bias) {
            snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.bias", i);
            CHK(bind(&b, &L->mlp.gate_bias, n, 0, 1, c->ffn, 0, 0));
            snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.bias", i);
            CHK(bind(&b, &L->mlp.up_bias, n, 0, 1, c->ffn, 0, 0));
            snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.bias", i);
            CHK(bind(&b, &L->mlp.down_bias, n, 0, 1, D, 0, 0));
        }
        if (c->attnres_block) {
            snprintf(pre, sizeof pre, "model.layers.%d.attn_res", i);
            CHK(bind_attnres(&b, &L->attn_res, c, pre));
            snprintf(pre, sizeof pre, "model.layers.%d.mlp_res", i);
            CHK(bind_attnres(&b, &L->mlp_res, c, pre));
        }
    }
    if (c->attnres_block) CHK(bind_attnres(&b, &w->res, c, "model.res"));
#undef CHK
    w->n_params = b.n_params;
    w->bytes = b.bytes;
out:
    free(user.rules);
    if (rc) {
        free(w->layers);
        w->layers = NULL;
    }
    return rc;
}

void weights_free(model_weights *w)
{
    if (!w) return;
    free(w->layers);
    w->layers = NULL;
}

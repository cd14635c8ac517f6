/*
 * config.c - config.json for the two families (MODEL_SPEC §5, §6).
 *
 * Every key is either used, checked for a supported value, or on an explicit
 * list of keys that do not change inference (training toggles, provenance).
 * Anything else is an error naming the key: a checkpoint whose config we do
 * not understand must not be served with guessed math.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define FAIL(...) do { snprintf(err, errlen, "config.json: " __VA_ARGS__); return KDA_EFORMAT; } while (0)
#define UNSUP(...) do { snprintf(err, errlen, "config.json: " __VA_ARGS__); return KDA_EUNSUP; } while (0)

/* Keys with no effect on the forward pass, for either family. */
static const char *const ignored_keys[] = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "initializer_range", "pad_token_id", "auto_map", "tokenizer", "_name_or_path",
    /* fla kernel/training switches: which kernel computes the same math, loss fusion */
    "fuse_norm", "fuse_swiglu", "fuse_cross_entropy", "fuse_linear_cross_entropy", "attn_mode",
    "use_l2warp", "attention_dropout", "pretraining_tp", NULL,
};

static int in_list(const char *k, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

/* Integer field: must be an integral JSON number within [lo, hi]. Missing:
 * *out = def, or an error when def == INT_MIN_REQ. */
#define REQUIRED (-2147483647 - 1)
static int get_int(const cJSON *o, const char *key, int def, int lo, int hi, int *out, char *err,
                   size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (def == REQUIRED) FAIL("missing required key \"%s\"", key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        FAIL("\"%s\" must be an integer in [%d, %d]", key, lo, hi);
    *out = (int)v->valuedouble;
    return 0;
}

static int get_num(const cJSON *o, const char *key, double def, double lo, double hi, double *out,
                   char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (isnan(def)) FAIL("missing required key \"%s\"", key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        FAIL("\"%s\" must be a number in [%g, %g]", key, lo, hi);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *key, int def, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) FAIL("\"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Optional special token id: null or absent = -1 (none). */
static int get_token_id(const cJSON *o, const char *key, int def, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && cJSON_IsNull(v)) {
        *out = -1;
        return 0;
    }
    if (v && cJSON_IsArray(v)) { /* HF allows a list of eos ids: the first is the one we stop on */
        v = cJSON_GetArrayItem(v, 0);
        if (!v) FAIL("\"%s\" is an empty list", key);
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
            FAIL("\"%s\" must be a non-negative integer", key);
        *out = (int)v->valuedouble;
        return 0;
    }
    return get_int(o, key, def, 0, 1 << 30, out, err, errlen);
}

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

static int check_keys(const cJSON *o, const char *const *known, const char *where, char *err,
                      size_t errlen)
{
    for (const cJSON *it = o->child; it; it = it->next)
        if (!in_list(it->string, known) && !in_list(it->string, ignored_keys)) {
            snprintf(err, errlen, "config.json: unknown key \"%s%s%s\" (not supported by this engine)",
                     where, *where ? "." : "", it->string);
            return KDA_EUNSUP;
        }
    return 0;
}

static int parse_tokenizer(const cJSON *root, model_config *c, char *err, size_t errlen)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    c->byte_tokenizer = 0;
    if (!t || cJSON_IsNull(t)) return 0;
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "bytes")) {
        c->byte_tokenizer = 1;
        return 0;
    }
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "sentencepiece")) return 0;
    UNSUP("\"tokenizer\" must be \"bytes\" or \"sentencepiece\"");
}

static int parse_kda_family(const cJSON *root, model_config *c, char *err, size_t errlen)
{
    static const char *const known[] = {
        "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "expand_v", "use_short_conv",
        "conv_size", "intermediate_size", "hidden_ratio", "hidden_act", "norm_eps", "vocab_size",
        "tie_word_embeddings", "bos_token_id", "eos_token_id", "max_position_embeddings",
        "allow_neg_eigval", "safe_gate", "lower_bound", "num_v_heads", "attn", "conv_bias", NULL,
    };
    static const char *const attn_known[] = {
        "layers", "num_heads", "num_kv_heads", "head_dim", "qkv_bias", "qk_norm", "rope_theta",
        "partial_rotary_factor", "rope_dim", "output_gate", "window_size", NULL,
    };
    TRY(check_keys(root, known, "", err, errlen));
    TRY(get_int(root, "hidden_size", REQUIRED, 1, 1 << 16, &c->d, err, errlen));
    TRY(get_int(root, "num_hidden_layers", REQUIRED, 1, KDA_MAX_LAYERS, &c->n_layers, err, errlen));
    TRY(get_int(root, "num_heads", REQUIRED, 1, 1024, &c->kda_h, err, errlen));
    TRY(get_int(root, "head_dim", REQUIRED, 1, 1024, &c->kda_k, err, errlen));
    TRY(get_int(root, "vocab_size", REQUIRED, 1, 1 << 24, &c->vocab, err, errlen));
    TRY(get_int(root, "conv_size", 4, 1, 64, &c->conv_size, err, errlen));
    TRY(get_int(root, "max_position_embeddings", 2048, 1, 1 << 24, &c->max_pos, err, errlen));
    TRY(get_token_id(root, "bos_token_id", 1, &c->bos_id, err, errlen));
    TRY(get_token_id(root, "eos_token_id", 2, &c->eos_id, err, errlen));
    TRY(get_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, err, errlen));
    double d;
    TRY(get_num(root, "norm_eps", 1e-6, 0, 1, &d, err, errlen));
    c->norm_eps = (float)d;
    TRY(get_num(root, "expand_v", 1.0, 0.01, 64, &d, err, errlen));
    c->kda_v = (int)lround(c->kda_k * d);
    if (fabs(c->kda_v - c->kda_k * d) > 1e-9 || c->kda_v < 1)
        UNSUP("\"expand_v\" = %g gives a non-integer value head width", d);

    int b;
    TRY(get_bool(root, "use_short_conv", 1, &b, err, errlen));
    if (!b) UNSUP("\"use_short_conv\": false is not supported (the engine implements the short-conv KDA)");
    TRY(get_bool(root, "conv_bias", 0, &b, err, errlen));
    if (b) UNSUP("\"conv_bias\": true is not supported");
    TRY(get_bool(root, "allow_neg_eigval", 0, &b, err, errlen));
    if (b) UNSUP("\"allow_neg_eigval\": true is not supported");
    TRY(get_bool(root, "safe_gate", 0, &b, err, errlen));
    if (b) UNSUP("\"safe_gate\": true is not supported");
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "lower_bound");
    if (lb && !cJSON_IsNull(lb)) UNSUP("\"lower_bound\" must be null (gate lower bound is not supported)");
    const cJSON *nv = cJSON_GetObjectItemCaseSensitive(root, "num_v_heads");
    if (nv && !cJSON_IsNull(nv) && !(cJSON_IsNumber(nv) && nv->valuedouble == c->kda_h))
        UNSUP("\"num_v_heads\" must be null or equal to num_heads");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && (!strcmp(act->valuestring, "swish") || !strcmp(act->valuestring, "silu"))))
        UNSUP("\"hidden_act\" must be \"swish\" or \"silu\"");

    /* FFN width: intermediate_size, or fla's GatedMLP rule from hidden_ratio */
    const cJSON *is = cJSON_GetObjectItemCaseSensitive(root, "intermediate_size");
    if (is && !cJSON_IsNull(is)) {
        TRY(get_int(root, "intermediate_size", REQUIRED, 1, 1 << 20, &c->ffn, err, errlen));
    } else {
        int ratio;
        TRY(get_int(root, "hidden_ratio", 4, 1, 64, &ratio, err, errlen));
        int f = (int)((double)c->d * ratio * 2 / 3);
        c->ffn = 256 * ((f + 255) / 256);
    }

    for (int i = 0; i < c->n_layers; i++) c->kind[i] = KDA_LAYER_KDA;
    c->gqa_h = c->gqa_kvh = c->gqa_hd = c->rope_dim = 0;
    c->rope_theta = 10000.0;
    c->qk_norm = 0;
    c->output_gate = 0;
    const cJSON *attn = cJSON_GetObjectItemCaseSensitive(root, "attn");
    if (attn && !cJSON_IsNull(attn)) {
        if (!cJSON_IsObject(attn)) FAIL("\"attn\" must be an object or null");
        TRY(check_keys(attn, attn_known, "attn", err, errlen));
        const cJSON *layers = cJSON_GetObjectItemCaseSensitive(attn, "layers");
        if (!cJSON_IsArray(layers)) FAIL("\"attn.layers\" must be a list of layer indices");
        for (const cJSON *l = layers->child; l; l = l->next) {
            if (!cJSON_IsNumber(l) || l->valuedouble != floor(l->valuedouble) || l->valuedouble < 0 ||
                l->valuedouble >= c->n_layers)
                FAIL("\"attn.layers\" entries must be integers in [0, %d)", c->n_layers);
            c->kind[(int)l->valuedouble] = KDA_LAYER_GQA;
        }
        TRY(get_int(attn, "num_heads", REQUIRED, 1, 1024, &c->gqa_h, err, errlen));
        TRY(get_int(attn, "num_kv_heads", c->gqa_h, 1, 1024, &c->gqa_kvh, err, errlen));
        if (c->gqa_h % c->gqa_kvh)
            UNSUP("\"attn.num_heads\" (%d) must be a multiple of \"attn.num_kv_heads\" (%d)", c->gqa_h, c->gqa_kvh);
        TRY(get_int(attn, "head_dim", c->d / c->gqa_h, 2, 1024, &c->gqa_hd, err, errlen));
        TRY(get_num(attn, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, err, errlen));
        const cJSON *rd = cJSON_GetObjectItemCaseSensitive(attn, "rope_dim");
        if (rd && !cJSON_IsNull(rd)) {
            TRY(get_int(attn, "rope_dim", REQUIRED, 0, c->gqa_hd, &c->rope_dim, err, errlen));
        } else {
            TRY(get_num(attn, "partial_rotary_factor", 1.0, 0.0, 1.0, &d, err, errlen));
            c->rope_dim = (int)lround(c->gqa_hd * d);
        }
        if (c->rope_dim % 2) UNSUP("rotary dims (%d) must be even", c->rope_dim);
        TRY(get_bool(attn, "qk_norm", 0, &c->qk_norm, err, errlen));
        TRY(get_bool(attn, "output_gate", 0, &c->output_gate, err, errlen));
        TRY(get_bool(attn, "qkv_bias", 0, &b, err, errlen));
        if (b) UNSUP("\"attn.qkv_bias\": true is not supported");
        const cJSON *ws = cJSON_GetObjectItemCaseSensitive(attn, "window_size");
        if (ws && !cJSON_IsNull(ws)) UNSUP("\"attn.window_size\" must be null (sliding windows are not supported)");
    }
    return 0;
}

static int parse_llama_kda(const cJSON *root, model_config *c, char *err, size_t errlen)
{
    static const char *const known[] = {
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
        "max_position_embeddings", "bos_token_id", "eos_token_id", "hidden_act", "kda_layer_types",
        "kda_num_heads", "kda_head_dim", "kda_conv_size", "qk_norm", "attention_bias", "mlp_bias",
        "rope_scaling", NULL,
    };
    TRY(check_keys(root, known, "", err, errlen));
    TRY(get_int(root, "hidden_size", REQUIRED, 1, 1 << 16, &c->d, err, errlen));
    TRY(get_int(root, "num_hidden_layers", REQUIRED, 1, KDA_MAX_LAYERS, &c->n_layers, err, errlen));
    TRY(get_int(root, "num_attention_heads", REQUIRED, 1, 1024, &c->gqa_h, err, errlen));
    TRY(get_int(root, "num_key_value_heads", c->gqa_h, 1, 1024, &c->gqa_kvh, err, errlen));
    if (c->gqa_h % c->gqa_kvh)
        UNSUP("\"num_attention_heads\" (%d) must be a multiple of \"num_key_value_heads\" (%d)", c->gqa_h, c->gqa_kvh);
    TRY(get_int(root, "head_dim", c->d / c->gqa_h, 2, 1024, &c->gqa_hd, err, errlen));
    TRY(get_int(root, "intermediate_size", REQUIRED, 1, 1 << 20, &c->ffn, err, errlen));
    TRY(get_int(root, "vocab_size", REQUIRED, 1, 1 << 24, &c->vocab, err, errlen));
    TRY(get_num(root, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta, err, errlen));
    double d;
    TRY(get_num(root, "rms_norm_eps", 1e-6, 0, 1, &d, err, errlen));
    c->norm_eps = (float)d;
    TRY(get_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, err, errlen));
    TRY(get_int(root, "max_position_embeddings", 2048, 1, 1 << 24, &c->max_pos, err, errlen));
    TRY(get_token_id(root, "bos_token_id", 1, &c->bos_id, err, errlen));
    TRY(get_token_id(root, "eos_token_id", 2, &c->eos_id, err, errlen));
    TRY(get_int(root, "kda_num_heads", REQUIRED, 1, 1024, &c->kda_h, err, errlen));
    TRY(get_int(root, "kda_head_dim", REQUIRED, 1, 1024, &c->kda_k, err, errlen));
    c->kda_v = c->kda_k;
    TRY(get_int(root, "kda_conv_size", 4, 1, 64, &c->conv_size, err, errlen));
    TRY(get_bool(root, "qk_norm", 0, &c->qk_norm, err, errlen));
    int b;
    TRY(get_bool(root, "attention_bias", 0, &b, err, errlen));
    if (b) UNSUP("\"attention_bias\": true is not supported");
    TRY(get_bool(root, "mlp_bias", 0, &b, err, errlen));
    if (b) UNSUP("\"mlp_bias\": true is not supported");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) UNSUP("\"rope_scaling\" must be null (RoPE scaling is not supported)");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && (!strcmp(act->valuestring, "silu") || !strcmp(act->valuestring, "swish"))))
        UNSUP("\"hidden_act\" must be \"silu\"");
    c->rope_dim = c->gqa_hd;   /* full RoPE */
    c->output_gate = 0;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "kda_layer_types");
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers)
        FAIL("\"kda_layer_types\" must be a list of %d strings (\"kda\" or \"full\")", c->n_layers);
    int i = 0;
    for (const cJSON *t = types->child; t; t = t->next, i++) {
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "kda")) c->kind[i] = KDA_LAYER_KDA;
        else if (cJSON_IsString(t) && !strcmp(t->valuestring, "full")) c->kind[i] = KDA_LAYER_GQA;
        else FAIL("\"kda_layer_types\"[%d] must be \"kda\" or \"full\"", i);
    }
    return 0;
}

int config_parse(model_config *c, const char *json, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        snprintf(err, errlen, "config.json: not valid JSON (near \"%.20s\")", at ? at : "");
        return KDA_EFORMAT;
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "config.json: top level must be an object");
        rc = KDA_EFORMAT;
        goto out;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) {
        snprintf(err, errlen, "config.json: missing \"model_type\" (expected \"kda\" or \"llama_kda\")");
        rc = KDA_EFORMAT;
        goto out;
    }
    if (!strcmp(mt->valuestring, "kda")) {
        c->family = KDA_FAMILY_KDA;
        rc = parse_kda_family(root, c, err, errlen);
    } else if (!strcmp(mt->valuestring, "llama_kda")) {
        c->family = KDA_FAMILY_LLAMA_KDA;
        rc = parse_llama_kda(root, c, err, errlen);
    } else {
        snprintf(err, errlen, "config.json: \"model_type\" \"%s\" is not supported (expected \"kda\" or \"llama_kda\")",
                 mt->valuestring);
        rc = KDA_EUNSUP;
    }
    if (!rc) rc = parse_tokenizer(root, c, err, errlen);
    if (!rc && c->byte_tokenizer && c->vocab < 256) {
        snprintf(err, errlen, "config.json: \"tokenizer\": \"bytes\" needs vocab_size >= 256 (got %d)", c->vocab);
        rc = KDA_EFORMAT;
    }
    if (!rc) {
        int has_gqa = 0;
        for (int i = 0; i < c->n_layers; i++) has_gqa |= c->kind[i] == KDA_LAYER_GQA;
        if (has_gqa && c->gqa_h == 0) {
            snprintf(err, errlen, "config.json: GQA layers listed but no attention heads configured");
            rc = KDA_EFORMAT;
        }
        if (c->bos_id >= c->vocab || c->eos_id >= c->vocab) {
            snprintf(err, errlen, "config.json: bos/eos token id outside vocab_size %d", c->vocab);
            rc = KDA_EFORMAT;
        }
    }
out:
    cJSON_Delete(root);
    return rc;
}

int config_load(model_config *c, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return KDA_EIO;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (16 << 20)) {
        fclose(f);
        snprintf(err, errlen, "%s: unreasonable size", path);
        return KDA_EFORMAT;
    }
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        snprintf(err, errlen, "out of memory");
        return KDA_ENOMEM;
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    int rc = config_parse(c, buf, err, errlen);
    free(buf);
    return rc;
}

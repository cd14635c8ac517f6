/*
 * config.c - config.json for the two families (MODEL_SPEC §5, §5a, §6), as
 * the real tools write them: fla 0.5.x KDAConfig (every key save_pretrained
 * writes, null or not) and Mercity's LlamaKDAConfig on top of transformers'
 * LlamaConfig in its 4.x (rope_theta / rope_scaling, torch_dtype) and 5.x
 * (rope_parameters, dtype) forms.
 *
 * Every key is either used, checked for a supported value, or on an explicit
 * list of keys that do not change inference (training toggles, provenance).
 * Anything else is an error naming the key: a checkpoint whose config we do
 * not understand must not be served with guessed math. Numbers are range-
 * checked as doubles before any conversion to int.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kda_file.h"
#include "model.h"

#define FAIL(...) do { snprintf(err, errlen, "config.json: " __VA_ARGS__); return KDA_EFORMAT; } while (0)
#define UNSUP(...) do { snprintf(err, errlen, "config.json: " __VA_ARGS__); return KDA_EUNSUP; } while (0)
#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

/* Keys with no effect on the forward pass, for either family. */
static const char *const ignored_keys[] = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "initializer_range", "pad_token_id", "auto_map", "tokenizer", "_name_or_path",
    /* fla kernel/training switches: which kernel computes the same math, loss fusion,
     * the l2 warp of the training loss */
    "fuse_norm", "fuse_swiglu", "fuse_cross_entropy", "fuse_linear_cross_entropy", "attn_mode",
    "use_l2warp",
    /* transformers LlamaConfig: dropout is off at inference; pretraining_tp > 1 only
     * splits the same matmuls into slices */
    "attention_dropout", "pretraining_tp", NULL,
};

static int in_list(const char *k, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

static int is_set(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* v is an integral JSON number in [lo, hi]: compared as a double first, so a
 * value outside int range (1e10, inf) never reaches the conversion. */
static int json_int_in(const cJSON *v, double lo, double hi, int *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double x = v->valuedouble;
    if (!(x >= lo && x <= hi) || x != floor(x)) return 0;
    *out = (int)x;
    return 1;
}

/* Integer field within [lo, hi]. Missing or null: *out = def, or an error when
 * def == REQUIRED. */
#define REQUIRED (-2147483647 - 1)
static int get_int(const cJSON *o, const char *key, int def, int lo, int hi, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!is_set(v)) {
        if (def == REQUIRED) FAIL("missing required key \"%s\"", key);
        *out = def;
        return 0;
    }
    if (!json_int_in(v, lo, hi, out)) FAIL("\"%s\" must be an integer in [%d, %d]", key, lo, hi);
    return 0;
}

/* get_int for a key whose default is derived from other keys (head_dim =
 * hidden_size / num_heads): the default must meet the same range, or a
 * config that never names the key could set any value (fuzz_config found a
 * 2,556-wide attention head past the RoPE table). */
static int get_int_derived(const cJSON *o, const char *key, int def, int lo, int hi, int *out, char *err,
                           size_t errlen)
{
    TRY(get_int(o, key, def, lo, hi, out, err, errlen));
    if (*out < lo || *out > hi)
        FAIL("\"%s\" is not set and its default from the other keys (%d) is outside [%d, %d]", key, *out, lo, hi);
    return 0;
}

static int get_num(const cJSON *o, const char *key, double def, double lo, double hi, double *out, char *err,
                   size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!is_set(v)) {
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
    if (!is_set(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) FAIL("\"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Optional special token id: null = -1 (none); a list (HF allows several eos
 * ids) = its first entry, the one we stop on. */
static int get_token_id(const cJSON *o, const char *key, int def, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && cJSON_IsNull(v)) {
        *out = -1;
        return 0;
    }
    if (v && cJSON_IsArray(v)) {
        if (!v->child) FAIL("\"%s\" is an empty list", key);
        int i = 0, id;
        for (const cJSON *e = v->child; e; e = e->next, i++)   /* every entry checked, though only the first is used */
            if (!json_int_in(e, 0, 1 << 30, i ? &id : out))
                FAIL("\"%s\"[%d] must be an integer in [0, %d]", key, i, 1 << 30);
        return 0;
    }
    return get_int(o, key, def, 0, 1 << 30, out, err, errlen);
}

static int check_keys(const cJSON *o, const char *const *known, const char *where, char *err, size_t errlen)
{
    for (const cJSON *it = o->child; it; it = it->next)
        if (!in_list(it->string, known) && !in_list(it->string, ignored_keys)) {
            snprintf(err, errlen, "config.json: unknown key \"%s%s%s\" (not supported by this engine)", where,
                     *where ? "." : "", it->string);
            return KDA_EUNSUP;
        }
    return 0;
}

static int parse_tokenizer(const cJSON *root, model_config *c, char *err, size_t errlen)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    c->byte_tokenizer = 0;
    if (!is_set(t)) return 0;
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "bytes")) {
        c->byte_tokenizer = 1;
        return 0;
    }
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "sentencepiece")) return 0;
    UNSUP("\"tokenizer\" must be \"bytes\" or \"sentencepiece\"");
}

static int check_act(const cJSON *root, char *err, size_t errlen)
{
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (is_set(act) && !(cJSON_IsString(act) && (!strcmp(act->valuestring, "swish") || !strcmp(act->valuestring, "silu"))))
        UNSUP("\"hidden_act\" must be \"swish\" or \"silu\" (the SwiGLU MLP)");
    return 0;
}

/* ---- the KDA mixer's options, shared by both families (key names differ) ---- */

typedef struct {
    const char *num_heads, *num_v_heads, *head_dim, *expand_v, *short_conv, *conv_size, *conv_bias,
        *neg_eigval, *safe_gate, *lower_bound;
} kda_keys;

/* head_dim_def, heads_def: REQUIRED, or the default; heads_def 0 = d / head_dim. */
static int parse_kda_options(const cJSON *root, const kda_keys *k, int head_dim_def, int heads_def, model_config *c,
                             char *err, size_t errlen)
{
    TRY(get_int_derived(root, k->head_dim, head_dim_def, 1, KDA_MAX_HEAD_DIM, &c->kda_k, err, errlen));
    if (heads_def == 0) {
        heads_def = c->d / c->kda_k;
        if (heads_def < 1 && !is_set(cJSON_GetObjectItemCaseSensitive(root, k->num_heads)))
            FAIL("\"%s\" is null and hidden_size / %s is 0", k->num_heads, k->head_dim);
    }
    TRY(get_int_derived(root, k->num_heads, heads_def, 1, 1024, &c->kda_h, err, errlen));
    TRY(get_int(root, k->num_v_heads, c->kda_h, 1, 4096, &c->kda_hv, err, errlen));
    if (c->kda_hv < c->kda_h || c->kda_hv % c->kda_h)
        UNSUP("\"%s\" (%d) must be a multiple of \"%s\" (%d) (grouped value heads)", k->num_v_heads, c->kda_hv,
              k->num_heads, c->kda_h);
    double ev;
    TRY(get_num(root, k->expand_v, 1.0, 0.01, 64, &ev, err, errlen));
    double v = c->kda_k * ev;
    if (!(v >= 1 && v <= KDA_MAX_HEAD_DIM))
        UNSUP("\"%s\" x \"%s\" = %g: the value head width must be in [1, %d]", k->head_dim, k->expand_v, v,
              KDA_MAX_HEAD_DIM);
    c->kda_v = (int)lround(v);
    if (fabs(c->kda_v - v) > 1e-9) UNSUP("\"%s\" = %g gives a non-integer value head width (%g)", k->expand_v, ev, v);
    TRY(get_bool(root, k->short_conv, 1, &c->short_conv, err, errlen));
    TRY(get_int(root, k->conv_size, 4, 1, 64, &c->conv_size, err, errlen));
    TRY(get_bool(root, k->conv_bias, 0, &c->conv_bias, err, errlen));
    if (!c->short_conv) c->conv_bias = 0; /* fla builds no conv at all then */
    int neg;
    TRY(get_bool(root, k->neg_eigval, 0, &neg, err, errlen));
    c->beta_scale = neg ? 2.0f : 1.0f;
    TRY(get_bool(root, k->safe_gate, 0, &c->safe_gate, err, errlen));
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, k->lower_bound);
    c->gate = KDA_GATE_SOFTPLUS;
    if (is_set(lb)) {
        if (!cJSON_IsNumber(lb) || !(lb->valuedouble >= -1e4 && lb->valuedouble < 0))
            FAIL("\"%s\" must be null or a number in [-1e4, 0) (the gate's lower bound in log space)", k->lower_bound);
        c->gate = KDA_GATE_LOWER_BOUND;
        c->gate_lower_bound = (float)lb->valuedouble;
    } else if (c->safe_gate) {
        FAIL("\"%s\": true needs \"%s\" (fla refuses it too; recommended -5)", k->safe_gate, k->lower_bound);
    }
    return 0;
}

/* ---- RoPE: the frequency table for every schedule we implement ---- */

static void rope_fill(model_config *c)
{
    const int dim = c->rope_dim;
    for (int i = 0; i < dim / 2; i++) {
        double f = pow(c->rope_theta, -2.0 * i / dim);
        if (c->rope_kind == KDA_ROPE_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_kind == KDA_ROPE_LLAMA3) {
            /* transformers _compute_llama3_parameters: wavelengths above
             * orig/low are slowed by factor, below orig/high kept, the band
             * between interpolated */
            const double wavelen = 2 * M_PI / f, lo_wl = c->rope_orig_max_pos / c->rope_low_freq_factor,
                         hi_wl = c->rope_orig_max_pos / c->rope_high_freq_factor;
            if (wavelen > lo_wl) {
                f /= c->rope_factor;
            } else if (!(wavelen < hi_wl)) {
                const double s = (c->rope_orig_max_pos / wavelen - c->rope_low_freq_factor) /
                                 (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - s) * f / c->rope_factor + s * f;
            }
        }
        c->rope_inv_freq[i] = f;
    }
}

/* The rope settings of a LlamaConfig: "rope_parameters" (5.x) or "rope_theta" +
 * "rope_scaling" (4.x). `where` names the object for messages. */
static int parse_rope_params(const cJSON *rp, const char *where, double theta_default, model_config *c, char *err,
                             size_t errlen)
{
    static const char *const known[] = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor",
                                        "high_freq_factor", "original_max_position_embeddings",
                                        "partial_rotary_factor", NULL};
    for (const cJSON *it = rp->child; it; it = it->next)
        if (!in_list(it->string, known))
            UNSUP("unknown key \"%s.%s\" (this engine implements RoPE types default, linear and llama3)", where,
                  it->string);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (!is_set(ty)) ty = cJSON_GetObjectItemCaseSensitive(rp, "type");
    const char *type = "default";
    if (is_set(ty)) {
        if (!cJSON_IsString(ty)) FAIL("\"%s.rope_type\" must be a string", where);
        type = ty->valuestring;
    }
    TRY(get_num(rp, "rope_theta", theta_default, 1.0, 1e12, &c->rope_theta, err, errlen));
    double prf;
    TRY(get_num(rp, "partial_rotary_factor", 1.0, 0.0, 1.0, &prf, err, errlen));
    if (prf != 1.0) UNSUP("\"%s.partial_rotary_factor\" must be 1 (llama rotates every head dim)", where);
    if (!strcmp(type, "default")) {
        c->rope_kind = KDA_ROPE_DEFAULT;
        return 0;
    }
    if (!strcmp(type, "linear")) {
        c->rope_kind = KDA_ROPE_LINEAR;
        TRY(get_num(rp, "factor", NAN, 1e-6, 1e6, &c->rope_factor, err, errlen));
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        c->rope_kind = KDA_ROPE_LLAMA3;
        TRY(get_num(rp, "factor", NAN, 1e-6, 1e6, &c->rope_factor, err, errlen));
        TRY(get_num(rp, "low_freq_factor", NAN, 1e-6, 1e6, &c->rope_low_freq_factor, err, errlen));
        TRY(get_num(rp, "high_freq_factor", NAN, 1e-6, 1e6, &c->rope_high_freq_factor, err, errlen));
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            FAIL("\"%s\": high_freq_factor must be greater than low_freq_factor", where);
        TRY(get_num(rp, "original_max_position_embeddings", c->max_pos, 1, 1 << 24, &c->rope_orig_max_pos, err,
                    errlen));
        return 0;
    }
    UNSUP("\"%s\": RoPE type \"%s\" is not supported (this engine implements default, linear and llama3)", where,
          type);
}

/* ---- fla KDAConfig ---- */

/* One spec of fla's `attn` (a dict, or one entry of a list of dicts). */
typedef struct {
    int gqa_h, gqa_kvh, gqa_hd, rope_dim, qk_norm, output_gate, qkv_bias, window;
    double rope_theta;
} attn_spec;

static int parse_attn_spec(const cJSON *a, const char *where, model_config *c, attn_spec *s, char *err, size_t errlen)
{
    static const char *const known[] = {
        "layers", "num_heads", "num_kv_heads", "head_dim", "qkv_bias", "qk_norm", "rope_theta",
        "partial_rotary_factor", "rope_dim", "output_gate", "window_size", NULL,
    };
    if (!cJSON_IsObject(a)) FAIL("\"%s\" must be an object", where);
    TRY(check_keys(a, known, where, err, errlen));
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(a, "layers");
    if (!cJSON_IsArray(layers)) FAIL("\"%s.layers\" must be a list of layer indices", where);
    for (const cJSON *l = layers->child; l; l = l->next) {
        int li;
        if (!json_int_in(l, 0, c->n_layers - 1, &li))
            FAIL("\"%s.layers\" entries must be integers in [0, %d)", where, c->n_layers);
        if (c->kind[li] == KDA_LAYER_GQA) FAIL("\"%s.layers\": layer %d is listed twice", where, li);
        c->kind[li] = KDA_LAYER_GQA;
    }
    /* fla's Attention: head_dim = hidden_size / num_heads, full RoPE, no qk-norm,
     * no output gate; head_dim, partial_rotary_factor / rope_dim, qk_norm and
     * output_gate describe the DM card's layout of the same family. */
    TRY(get_int(a, "num_heads", REQUIRED, 1, 1024, &s->gqa_h, err, errlen));
    TRY(get_int(a, "num_kv_heads", s->gqa_h, 1, 1024, &s->gqa_kvh, err, errlen));
    if (s->gqa_h % s->gqa_kvh)
        UNSUP("\"%s.num_heads\" (%d) must be a multiple of \"%s.num_kv_heads\" (%d)", where, s->gqa_h, where, s->gqa_kvh);
    TRY(get_int_derived(a, "head_dim", c->d / s->gqa_h, 2, KDA_MAX_HEAD_DIM, &s->gqa_hd, err, errlen));
    TRY(get_num(a, "rope_theta", 10000.0, 1.0, 1e12, &s->rope_theta, err, errlen));
    const cJSON *rd = cJSON_GetObjectItemCaseSensitive(a, "rope_dim");
    if (is_set(rd)) {
        TRY(get_int(a, "rope_dim", REQUIRED, 0, s->gqa_hd, &s->rope_dim, err, errlen));
    } else {
        double f;
        TRY(get_num(a, "partial_rotary_factor", 1.0, 0.0, 1.0, &f, err, errlen));
        s->rope_dim = (int)lround(s->gqa_hd * f);
    }
    if (s->rope_dim % 2) UNSUP("\"%s\": rotary dims (%d) must be even", where, s->rope_dim);
    TRY(get_bool(a, "qk_norm", 0, &s->qk_norm, err, errlen));
    TRY(get_bool(a, "output_gate", 0, &s->output_gate, err, errlen));
    TRY(get_bool(a, "qkv_bias", 0, &s->qkv_bias, err, errlen));
    TRY(get_int(a, "window_size", 0, 1, 1 << 30, &s->window, err, errlen));
    return 0;
}

static int parse_attn(const cJSON *attn, model_config *c, char *err, size_t errlen)
{
    attn_spec s = {0}, first = {0};
    if (cJSON_IsObject(attn)) {
        TRY(parse_attn_spec(attn, "attn", c, &s, err, errlen));
    } else if (cJSON_IsArray(attn)) {
        /* fla allows a list of specs, each for its own layers; the engine has one
         * attention layout, so they must agree on everything but the layers */
        int i = 0;
        char where[32];
        for (const cJSON *a = attn->child; a; a = a->next, i++) {
            snprintf(where, sizeof where, "attn[%d]", i);
            TRY(parse_attn_spec(a, where, c, &s, err, errlen));
            if (i == 0) first = s;
            else if (memcmp(&s, &first, sizeof s))
                UNSUP("\"attn\": specs with different settings per layer group are not supported (attn[%d] differs "
                      "from attn[0] in more than its layers)", i);
        }
        if (!i) return 0;
    } else {
        FAIL("\"attn\" must be an object, a list of objects, or null");
    }
    c->gqa_h = s.gqa_h, c->gqa_kvh = s.gqa_kvh, c->gqa_hd = s.gqa_hd, c->rope_dim = s.rope_dim;
    c->rope_theta = s.rope_theta, c->qk_norm = s.qk_norm, c->output_gate = s.output_gate;
    c->qkv_bias = s.qkv_bias, c->window = s.window;
    return 0;
}

static int parse_kda_family(const cJSON *root, model_config *c, char *err, size_t errlen)
{
    static const char *const known[] = {
        "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "expand_v", "use_short_conv",
        "conv_size", "intermediate_size", "hidden_ratio", "hidden_act", "norm_eps", "vocab_size",
        "tie_word_embeddings", "bos_token_id", "eos_token_id", "max_position_embeddings",
        "allow_neg_eigval", "safe_gate", "lower_bound", "num_v_heads", "attn", "conv_bias",
        "attnres_block_size", NULL,
    };
    static const kda_keys keys = {"num_heads", "num_v_heads", "head_dim", "expand_v", "use_short_conv",
                                  "conv_size", "conv_bias", "allow_neg_eigval", "safe_gate", "lower_bound"};
    TRY(check_keys(root, known, "", err, errlen));
    TRY(get_int(root, "hidden_size", REQUIRED, 1, 1 << 16, &c->d, err, errlen));
    TRY(get_int(root, "num_hidden_layers", REQUIRED, 1, KDA_MAX_LAYERS, &c->n_layers, err, errlen));
    TRY(get_int(root, "vocab_size", REQUIRED, 1, 1 << 24, &c->vocab, err, errlen));
    TRY(get_int(root, "max_position_embeddings", 2048, 1, 1 << 24, &c->max_pos, err, errlen));
    TRY(get_token_id(root, "bos_token_id", 1, &c->bos_id, err, errlen));
    TRY(get_token_id(root, "eos_token_id", 2, &c->eos_id, err, errlen));
    TRY(get_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, err, errlen));
    double d;
    TRY(get_num(root, "norm_eps", 1e-6, 0, 1, &d, err, errlen));
    c->norm_eps = c->qk_norm_eps = (float)d;
    TRY(parse_kda_options(root, &keys, REQUIRED, REQUIRED, c, err, errlen));
    TRY(check_act(root, err, errlen));
    /* attnres_block_size: null = off, 1 = every sub-layer its own block, else even */
    TRY(get_int(root, "attnres_block_size", 0, 1, 2 * KDA_MAX_LAYERS, &c->attnres_block, err, errlen));
    if (c->attnres_block > 1 && c->attnres_block % 2)
        FAIL("\"attnres_block_size\" must be null, 1 or an even number (fla's rule), got %d", c->attnres_block);

    /* FFN width: intermediate_size, or fla's GatedMLP rule from hidden_ratio */
    const cJSON *is = cJSON_GetObjectItemCaseSensitive(root, "intermediate_size");
    if (is_set(is)) {
        TRY(get_int(root, "intermediate_size", REQUIRED, 1, 1 << 20, &c->ffn, err, errlen));
    } else {
        int ratio;
        TRY(get_int(root, "hidden_ratio", 4, 1, 64, &ratio, err, errlen));
        int f = (int)((double)c->d * ratio * 2 / 3);
        c->ffn = 256 * ((f + 255) / 256);
    }

    for (int i = 0; i < c->n_layers; i++) c->kind[i] = KDA_LAYER_KDA;
    c->rope_theta = 10000.0;
    c->rope_kind = KDA_ROPE_DEFAULT;
    const cJSON *attn = cJSON_GetObjectItemCaseSensitive(root, "attn");
    if (is_set(attn)) TRY(parse_attn(attn, c, err, errlen));
    return 0;
}

/* ---- Mercity llama_kda (LlamaKDAConfig on transformers' LlamaConfig) ---- */

static int set_full(model_config *c, int i, const char *key, char *err, size_t errlen)
{
    if (i < 0 || i >= c->n_layers)
        FAIL("\"%s\": full-attention layer %d is out of range for num_hidden_layers %d", key, i, c->n_layers);
    c->kind[i] = KDA_LAYER_GQA;
    return 0;
}

/* Which layers are softmax attention ("full"). An explicit kda_layer_types (what
 * Mercity's model writes after building) wins; otherwise Mercity's
 * resolve_kda_layer_types order: kda_full_attn_layers > kda_full_attn_range
 * [start, end) > kda_full_attn_every (the last layer of every block of n) >
 * kda_every (KDA only where i % n == kda_offset); none set: all KDA. */
static int parse_llama_layout(const cJSON *root, model_config *c, char *err, size_t errlen)
{
    const int n = c->n_layers;
    for (int i = 0; i < n; i++) c->kind[i] = KDA_LAYER_KDA;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "kda_layer_types");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "kda_full_attn_layers");
    const cJSON *range = cJSON_GetObjectItemCaseSensitive(root, "kda_full_attn_range");
    int every, kda_every, offset;
    TRY(get_int(root, "kda_full_attn_every", 0, 0, 1 << 20, &every, err, errlen));
    TRY(get_int(root, "kda_every", 0, 0, 1 << 20, &kda_every, err, errlen));
    TRY(get_int(root, "kda_offset", 0, -(1 << 20), 1 << 20, &offset, err, errlen));
    if (is_set(types)) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n)
            FAIL("\"kda_layer_types\" must be a list of %d strings (\"kda\" or \"full\")", n);
        int i = 0;
        for (const cJSON *t = types->child; t; t = t->next, i++) {
            if (cJSON_IsString(t) && !strcmp(t->valuestring, "kda")) c->kind[i] = KDA_LAYER_KDA;
            else if (cJSON_IsString(t) && !strcmp(t->valuestring, "full")) c->kind[i] = KDA_LAYER_GQA;
            else FAIL("\"kda_layer_types\"[%d] must be \"kda\" or \"full\"", i);
        }
    } else if (is_set(list)) {
        if (!cJSON_IsArray(list)) FAIL("\"kda_full_attn_layers\" must be a list of layer indices");
        for (const cJSON *l = list->child; l; l = l->next) {
            int li;
            if (!json_int_in(l, -(1 << 20), 1 << 20, &li)) FAIL("\"kda_full_attn_layers\" entries must be integers");
            TRY(set_full(c, li, "kda_full_attn_layers", err, errlen));
        }
    } else if (is_set(range)) {
        int a, b;
        if (!cJSON_IsArray(range) || cJSON_GetArraySize(range) != 2 ||
            !json_int_in(cJSON_GetArrayItem(range, 0), -(1 << 20), 1 << 20, &a) ||
            !json_int_in(cJSON_GetArrayItem(range, 1), -(1 << 20), 1 << 20, &b))
            FAIL("\"kda_full_attn_range\" must be [start, end] (integers; end exclusive)");
        for (int i = a; i < b; i++) TRY(set_full(c, i, "kda_full_attn_range", err, errlen));
    } else if (every) {
        for (int i = 0; i < n; i++)
            if ((i + 1) % every == 0) c->kind[i] = KDA_LAYER_GQA;
    } else if (kda_every) {
        const int off = ((offset % kda_every) + kda_every) % kda_every; /* Python's % */
        for (int i = 0; i < n; i++) c->kind[i] = i % kda_every == off ? KDA_LAYER_KDA : KDA_LAYER_GQA;
    }
    return 0;
}

static int parse_llama_kda(const cJSON *root, model_config *c, char *err, size_t errlen)
{
    static const char *const known[] = {
        /* transformers LlamaConfig (4.x and 5.x) */
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps",
        "tie_word_embeddings", "max_position_embeddings", "bos_token_id", "eos_token_id", "hidden_act",
        "attention_bias", "mlp_bias",
        /* Mercity LlamaKDAConfig */
        "kda_layer_types", "kda_full_attn_layers", "kda_full_attn_every", "kda_full_attn_range", "kda_every",
        "kda_offset", "kda_head_dim", "kda_num_heads", "kda_num_v_heads", "kda_expand_v", "kda_use_short_conv",
        "kda_conv_size", "kda_conv_bias", "kda_allow_neg_eigval", "kda_lower_bound", "kda_safe_gate", "qk_norm",
        "qk_norm_eps", NULL,
    };
    static const kda_keys keys = {"kda_num_heads", "kda_num_v_heads", "kda_head_dim", "kda_expand_v",
                                  "kda_use_short_conv", "kda_conv_size", "kda_conv_bias", "kda_allow_neg_eigval",
                                  "kda_safe_gate", "kda_lower_bound"};
    TRY(check_keys(root, known, "", err, errlen));
    TRY(get_int(root, "hidden_size", REQUIRED, 1, 1 << 16, &c->d, err, errlen));
    TRY(get_int(root, "num_hidden_layers", REQUIRED, 1, KDA_MAX_LAYERS, &c->n_layers, err, errlen));
    TRY(get_int(root, "num_attention_heads", REQUIRED, 1, 1024, &c->gqa_h, err, errlen));
    TRY(get_int(root, "num_key_value_heads", c->gqa_h, 1, 1024, &c->gqa_kvh, err, errlen));
    if (c->gqa_h % c->gqa_kvh)
        UNSUP("\"num_attention_heads\" (%d) must be a multiple of \"num_key_value_heads\" (%d)", c->gqa_h, c->gqa_kvh);
    TRY(get_int_derived(root, "head_dim", c->d / c->gqa_h, 2, KDA_MAX_HEAD_DIM, &c->gqa_hd, err, errlen));
    if (c->gqa_hd % 2) UNSUP("\"head_dim\" (%d) must be even (RoPE pairs)", c->gqa_hd);
    TRY(get_int(root, "intermediate_size", REQUIRED, 1, 1 << 20, &c->ffn, err, errlen));
    TRY(get_int(root, "vocab_size", REQUIRED, 1, 1 << 24, &c->vocab, err, errlen));
    TRY(get_int(root, "max_position_embeddings", 2048, 1, 1 << 24, &c->max_pos, err, errlen));
    double d;
    TRY(get_num(root, "rms_norm_eps", 1e-6, 0, 1, &d, err, errlen));
    c->norm_eps = (float)d;
    TRY(get_num(root, "qk_norm_eps", d, 0, 1, &d, err, errlen));
    c->qk_norm_eps = (float)d;
    TRY(get_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, err, errlen));
    TRY(get_token_id(root, "bos_token_id", 1, &c->bos_id, err, errlen));
    TRY(get_token_id(root, "eos_token_id", 2, &c->eos_id, err, errlen));
    TRY(check_act(root, err, errlen));
    TRY(get_bool(root, "qk_norm", 0, &c->qk_norm, err, errlen));
    TRY(get_bool(root, "attention_bias", 0, &c->qkv_bias, err, errlen));
    c->o_bias = c->qkv_bias; /* LlamaAttention: one flag for q, k, v and o */
    TRY(get_bool(root, "mlp_bias", 0, &c->mlp_bias, err, errlen));

    /* KDA: Mercity's defaults (head_dim 128, heads = hidden_size / head_dim);
     * the layer's norm eps is rms_norm_eps */
    TRY(parse_kda_options(root, &keys, 128, 0, c, err, errlen));

    /* RoPE: full head, 5.x rope_parameters or 4.x rope_theta + rope_scaling */
    c->rope_dim = c->gqa_hd;
    c->output_gate = 0;
    double theta;
    TRY(get_num(root, "rope_theta", 10000.0, 1.0, 1e12, &theta, err, errlen));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (is_set(rp) && is_set(rs)) FAIL("both \"rope_parameters\" and \"rope_scaling\" are set (give one)");
    c->rope_theta = theta;
    c->rope_kind = KDA_ROPE_DEFAULT;
    if (is_set(rp) || is_set(rs)) {
        const cJSON *p = is_set(rp) ? rp : rs;
        if (!cJSON_IsObject(p)) FAIL("\"%s\" must be an object or null", is_set(rp) ? "rope_parameters" : "rope_scaling");
        TRY(parse_rope_params(p, is_set(rp) ? "rope_parameters" : "rope_scaling", theta, c, err, errlen));
    }
    return parse_llama_layout(root, c, err, errlen);
}

/* ---- entry points ---- */

static int parse_root(model_config *c, const cJSON *root, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "config.json: top level must be an object");
        return KDA_EFORMAT;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) {
        snprintf(err, errlen, "config.json: missing \"model_type\" (expected \"kda\" or \"llama_kda\")");
        return KDA_EFORMAT;
    }
    int rc;
    if (!strcmp(mt->valuestring, "kda")) {
        c->family = KDA_FAMILY_KDA;
        rc = parse_kda_family(root, c, err, errlen);
    } else if (!strcmp(mt->valuestring, "llama_kda")) {
        c->family = KDA_FAMILY_LLAMA_KDA;
        rc = parse_llama_kda(root, c, err, errlen);
    } else {
        snprintf(err, errlen, "config.json: \"model_type\" \"%s\" is not supported (expected \"kda\" or \"llama_kda\"; "
                 "another layout can be described by a config map, configs/README.md)", mt->valuestring);
        return KDA_EUNSUP;
    }
    if (rc) return rc;
    TRY(parse_tokenizer(root, c, err, errlen));
    if (c->byte_tokenizer && c->vocab < 256) {
        snprintf(err, errlen, "config.json: \"tokenizer\": \"bytes\" needs vocab_size >= 256 (got %d)", c->vocab);
        return KDA_EFORMAT;
    }
    int has_gqa = 0;
    for (int i = 0; i < c->n_layers; i++) has_gqa |= c->kind[i] == KDA_LAYER_GQA;
    if (has_gqa && c->gqa_h == 0) {
        snprintf(err, errlen, "config.json: GQA layers listed but no attention heads configured");
        return KDA_EFORMAT;
    }
    if (c->bos_id >= c->vocab || c->eos_id >= c->vocab) {
        snprintf(err, errlen, "config.json: bos/eos token id outside vocab_size %d", c->vocab);
        return KDA_EFORMAT;
    }
    if (c->qk_norm_eps == 0) c->qk_norm_eps = c->norm_eps;
    if (c->beta_scale == 0) c->beta_scale = 1.0f;
    if (c->gqa_h) rope_fill(c);
    return 0;
}

static int parse_text(const char *json, cJSON **out, char *err, size_t errlen)
{
    *out = cJSON_Parse(json);
    if (!*out) {
        const char *at = cJSON_GetErrorPtr();
        snprintf(err, errlen, "config.json: not valid JSON (near \"%.20s\")", at ? at : "");
        return KDA_EFORMAT;
    }
    return 0;
}

int config_parse(model_config *c, const char *json, char *err, size_t errlen)
{
    return config_parse_mapped(c, json, NULL, err, errlen);
}

int config_parse_mapped(model_config *c, const char *json, const char *map_path, char *err, size_t errlen)
{
    cJSON *root;
    memset(c, 0, sizeof *c);
    TRY(parse_text(json, &root, err, errlen));
    int applied = 0, rc = 0;
    if (map_path) rc = config_map_apply(root, map_path, &applied, err, errlen);
    if (!rc) {
        rc = parse_root(c, root, err, errlen);
        if (rc && applied) { /* say where the keys came from */
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s", err);
            snprintf(err, errlen, "%s (after config map %s)", tmp, map_path);
        }
    }
    cJSON_Delete(root);
    return rc;
}

int config_load(model_config *c, const char *dir, const char *config_map, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *buf = kda_file_read(path, KDA_MAX_CONFIG_BYTES, NULL, err, errlen);
    if (!buf) return errno == ENOMEM ? KDA_ENOMEM : errno == EFBIG ? KDA_EFORMAT : KDA_EIO;
    int rc = config_parse_mapped(c, buf, config_map, err, errlen);
    free(buf);
    return rc;
}

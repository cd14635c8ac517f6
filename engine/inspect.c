/*
 * inspect.c - kda_inspect(): what a model directory holds and whether it
 * binds, without creating a backend. Used by `kda-cli inspect`.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model.h"
#include "safetensors.h"

static int is_bound(const model_weights *w, const model_config *c, const void *data)
{
#define HIT(v) if ((v).data == data) return 1
    HIT(w->embed); HIT(w->final_norm); HIT(w->lm_head); HIT(w->res.query); HIT(w->res.norm);
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *L = &w->layers[l];
        HIT(L->attn_norm); HIT(L->mlp_norm); HIT(L->mlp.gate); HIT(L->mlp.up); HIT(L->mlp.down);
        HIT(L->mlp.gate_bias); HIT(L->mlp.up_bias); HIT(L->mlp.down_bias);
        HIT(L->attn_res.query); HIT(L->attn_res.norm); HIT(L->mlp_res.query); HIT(L->mlp_res.norm);
        if (L->kind == KDA_LAYER_KDA) {
            const kda_layer *k = &L->kda;
            HIT(k->q); HIT(k->k); HIT(k->v); HIT(k->q_conv); HIT(k->k_conv); HIT(k->v_conv); HIT(k->f0);
            HIT(k->q_conv_bias); HIT(k->k_conv_bias); HIT(k->v_conv_bias);
            HIT(k->f1); HIT(k->b); HIT(k->A_log); HIT(k->dt_bias); HIT(k->g0); HIT(k->g1); HIT(k->g1_bias);
            HIT(k->o_norm); HIT(k->o);
        } else {
            const gqa_layer *g = &L->gqa;
            HIT(g->q); HIT(g->gate); HIT(g->k); HIT(g->v); HIT(g->o); HIT(g->q_norm); HIT(g->k_norm);
            HIT(g->q_bias); HIT(g->k_bias); HIT(g->v_bias); HIT(g->o_bias);
        }
    }
#undef HIT
    return 0;
}

static const char *rope_name(kda_rope_kind k)
{
    return k == KDA_ROPE_LINEAR ? "linear" : k == KDA_ROPE_LLAMA3 ? "llama3" : "default";
}

int kda_inspect(const char *dir, const char *name_map, const char *config_map, int json, FILE *out, char *err,
                size_t errlen)
{
    model_config c;
    int rc = config_load(&c, dir, config_map, err, errlen);
    if (rc) return rc;
    st_set *st = NULL;
    rc = st_open_dir(&st, dir, err, errlen);
    if (rc) return rc;
    model_weights w;
    char bind_err[512] = "";
    int bind_rc = weights_bind(&w, &c, st, name_map, bind_err, sizeof bind_err);

    int64_t total = 0;
    int unused = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        total += st->tensors[i].numel;
        if (!bind_rc && !is_bound(&w, &c, st->tensors[i].data)) unused++;
    }
    char layers[KDA_MAX_LAYERS + 1];
    for (int l = 0; l < c.n_layers; l++) layers[l] = c.kind[l] == KDA_LAYER_KDA ? 'K' : 'G';
    layers[c.n_layers] = 0;
    const char *fam = c.family == KDA_FAMILY_KDA ? "kda" : "llama_kda";

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "family", fam);
        cJSON_AddNumberToObject(o, "hidden_size", c.d);
        cJSON_AddNumberToObject(o, "num_layers", c.n_layers);
        cJSON_AddStringToObject(o, "layers", layers);
        cJSON_AddNumberToObject(o, "vocab_size", c.vocab);
        cJSON_AddNumberToObject(o, "intermediate_size", c.ffn);
        cJSON_AddNumberToObject(o, "kda_heads", c.kda_h);
        cJSON_AddNumberToObject(o, "kda_head_k", c.kda_k);
        cJSON_AddNumberToObject(o, "kda_head_v", c.kda_v);
        cJSON_AddNumberToObject(o, "kda_v_heads", c.kda_hv);
        cJSON_AddBoolToObject(o, "kda_short_conv", c.short_conv);
        cJSON_AddBoolToObject(o, "kda_conv_bias", c.conv_bias);
        cJSON_AddStringToObject(o, "kda_gate", c.gate == KDA_GATE_LOWER_BOUND ? "lower_bound" : "softplus");
        if (c.gate == KDA_GATE_LOWER_BOUND) cJSON_AddNumberToObject(o, "kda_lower_bound", c.gate_lower_bound);
        cJSON_AddNumberToObject(o, "kda_beta_scale", c.beta_scale);
        cJSON_AddNumberToObject(o, "attnres_block_size", c.attnres_block);
        cJSON_AddBoolToObject(o, "mlp_bias", c.mlp_bias);
        cJSON_AddNumberToObject(o, "gqa_heads", c.gqa_h);
        cJSON_AddNumberToObject(o, "gqa_kv_heads", c.gqa_kvh);
        cJSON_AddNumberToObject(o, "gqa_head_dim", c.gqa_hd);
        cJSON_AddNumberToObject(o, "rope_dim", c.rope_dim);
        cJSON_AddStringToObject(o, "rope_type", rope_name(c.rope_kind));
        cJSON_AddNumberToObject(o, "gqa_window", c.window);
        cJSON_AddBoolToObject(o, "gqa_qkv_bias", c.qkv_bias);
        cJSON_AddBoolToObject(o, "gqa_o_bias", c.o_bias);
        cJSON_AddNumberToObject(o, "n_params", (double)(bind_rc ? total : w.n_params));
        cJSON_AddNumberToObject(o, "n_params_in_files", (double)total);
        cJSON_AddBoolToObject(o, "ok", bind_rc == 0);
        if (bind_rc) cJSON_AddStringToObject(o, "error", bind_err);
        cJSON *tt = cJSON_AddArrayToObject(o, "tensors");
        for (int i = 0; i < st->n_tensors; i++) {
            const st_tensor *t = &st->tensors[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", t->name);
            cJSON_AddStringToObject(e, "dtype", st_dtype_name(t->dtype));
            cJSON *sh = cJSON_AddArrayToObject(e, "shape");
            for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
            if (!bind_rc) cJSON_AddBoolToObject(e, "used", is_bound(&w, &c, t->data));
            cJSON_AddItemToArray(tt, e);
        }
        char *s = cJSON_Print(o);
        fprintf(out, "%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        fprintf(out, "family      %s\nlayers      %d  %s\nwidth       d=%d ffn=%d vocab=%d\n", fam, c.n_layers, layers,
                c.d, c.ffn, c.vocab);
        fprintf(out, "KDA         %d q/k heads, %d value heads, K=%d V=%d, ", c.kda_h, c.kda_hv, c.kda_k, c.kda_v);
        if (c.short_conv) fprintf(out, "conv %d%s", c.conv_size, c.conv_bias ? " +bias" : "");
        else fprintf(out, "no conv");
        if (c.gate == KDA_GATE_LOWER_BOUND) fprintf(out, ", gate lower bound %g", c.gate_lower_bound);
        if (c.beta_scale != 1.0f) fprintf(out, ", beta x%g", c.beta_scale);
        fprintf(out, "\n");
        if (c.gqa_h) {
            fprintf(out, "GQA         %d/%d heads of %d, rope %d dims theta %g (%s), qk_norm %d, output_gate %d", c.gqa_h,
                    c.gqa_kvh, c.gqa_hd, c.rope_dim, c.rope_theta, rope_name(c.rope_kind), c.qk_norm, c.output_gate);
            if (c.window) fprintf(out, ", window %d", c.window);
            if (c.qkv_bias) fprintf(out, ", qkv bias%s", c.o_bias ? " + o bias" : "");
            fprintf(out, "\n");
        }
        if (c.mlp_bias) fprintf(out, "MLP         with biases\n");
        if (c.attnres_block) fprintf(out, "attnres     block size %d\n", c.attnres_block);
        fprintf(out, "tensors     %d in %d file(s)\n", st->n_tensors, st->n_files);
        for (int i = 0; i < st->n_tensors; i++) {
            const st_tensor *t = &st->tensors[i];
            fprintf(out, "  %-60s %-5s [", t->name, st_dtype_name(t->dtype));
            for (int d = 0; d < t->ndim; d++) fprintf(out, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            fprintf(out, "]%s\n", !bind_rc && !is_bound(&w, &c, t->data) ? "  (unused)" : "");
        }
        if (bind_rc) {
            fprintf(out, "ERROR       %s\n", bind_err);
        } else {
            /* thousands separators by hand: locale-independent */
            char num[32], sep[48];
            snprintf(num, sizeof num, "%lld", (long long)w.n_params);
            int len = (int)strlen(num), o = 0;
            for (int i = 0; i < len; i++) {
                sep[o++] = num[i];
                if ((len - i - 1) % 3 == 0 && i != len - 1) sep[o++] = ',';
            }
            sep[o] = 0;
            fprintf(out, "parameters  %s\n", sep);
            if (unused) fprintf(out, "note        %d tensor(s) in the files are not used by the model\n", unused);
        }
    }
    if (!bind_rc) weights_free(&w);
    st_close(st);
    if (bind_rc) snprintf(err, errlen, "%s", bind_err);
    return bind_rc;
}

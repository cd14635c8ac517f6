/*
 * cuda_config.c - which config options the CUDA backend computes. Its
 * kernels implement the configs MODEL_SPEC §3-4 describe (softplus gate,
 * sigmoid beta, one value head per q/k head, the short conv without bias,
 * full causal attention with default RoPE, bias-free projections); a model
 * using anything else must be refused by name on --device cuda rather than
 * computed wrongly. The CPU backend implements all of them.
 *
 * Plain C, compiled into every build (also the no-CUDA stub build), so the
 * engine tests check it without a GPU. cuda_backend_create calls it first.
 * When a kernel learns an option, delete its line here and extend
 * tests/engine/test_config.c's cuda check.
 */
#include <stdio.h>

#include "model.h"

#define REFUSE(...) do { snprintf(err, errlen, "CUDA backend: " __VA_ARGS__); return KDA_EUNSUP; } while (0)

int cuda_config_check(const model_config *c, char *err, size_t errlen)
{
    int n_kda = 0, n_gqa = 0;
    for (int l = 0; l < c->n_layers; l++) {
        n_kda += c->kind[l] == KDA_LAYER_KDA;
        n_gqa += c->kind[l] == KDA_LAYER_GQA;
    }
    if (c->attnres_block)
        REFUSE("\"attnres_block_size\" (attention residuals) is not implemented; use --device cpu");
    if (c->mlp_bias) REFUSE("\"mlp_bias\" (MLP projection biases) is not implemented; use --device cpu");
    if (n_kda) {
        if (c->kda_hv != c->kda_h)
            REFUSE("\"num_v_heads\" %d > num_heads %d (grouped value heads) is not implemented; use --device cpu",
                   c->kda_hv, c->kda_h);
        if (!c->short_conv) REFUSE("\"use_short_conv\": false is not implemented; use --device cpu");
        if (c->conv_bias) REFUSE("\"conv_bias\" (short-conv biases) is not implemented; use --device cpu");
        if (c->gate == KDA_GATE_LOWER_BOUND)
            REFUSE("\"lower_bound\" (the safe_gate / lower-bound decay gate) is not implemented; use --device cpu");
        if (c->beta_scale != 1.0f) REFUSE("\"allow_neg_eigval\" (beta x 2) is not implemented; use --device cpu");
    }
    if (n_gqa) {
        if (c->window) REFUSE("\"attn.window_size\" (sliding-window attention) is not implemented; use --device cpu");
        if (c->qkv_bias || c->o_bias)
            REFUSE("attention projection biases (\"qkv_bias\" / \"attention_bias\") are not implemented; use --device cpu");
        if (c->rope_kind != KDA_ROPE_DEFAULT)
            REFUSE("RoPE scaling (\"rope_scaling\" / \"rope_parameters\" type %s) is not implemented; use --device cpu",
                   c->rope_kind == KDA_ROPE_LINEAR ? "linear" : "llama3");
        if (c->qk_norm && c->qk_norm_eps != c->norm_eps)
            REFUSE("\"qk_norm_eps\" different from the norm eps is not implemented; use --device cpu");
    }
    return 0;
}

/*
 * cuda_config.c - which config options the CUDA backend computes. Its
 * kernels implement MODEL_SPEC §3-4 and the fla / llama options of §5a:
 * both KDA gates, beta x 2, grouped value heads, short convs with or without
 * bias or none, sliding-window attention, q/k/v/o and MLP biases, the
 * default / linear / llama3 RoPE schedules, a q/k norm eps of its own. A
 * model using anything else must be refused by name on --device cuda rather
 * than computed wrongly. The CPU backend implements all of them.
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
    if (c->attnres_block)
        REFUSE("\"attnres_block_size\" (attention residuals) is not implemented; use --device cpu");
    return 0;
}

/* The chunked prompt kernel (kernels/ops_kda_chunk.cu) computes the softplus
 * gate, sigmoid beta, one value head per q/k head and the bias-free short
 * conv only; the per-token kernel computes the rest. */
const char *cuda_kda_chunk_lacks(const model_config *c)
{
    if (c->kda_hv != c->kda_h) return "\"num_v_heads\" > num_heads (grouped value heads)";
    if (c->gate == KDA_GATE_LOWER_BOUND) return "\"lower_bound\" (the lower-bound decay gate)";
    if (c->beta_scale != 1.0f) return "\"allow_neg_eigval\" (beta x 2)";
    if (!c->short_conv) return "\"use_short_conv\": false";
    if (c->conv_bias) return "\"conv_bias\"";
    return NULL;
}

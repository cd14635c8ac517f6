/* config.json parsing: what is accepted, and that every rejection names its key. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model.h"

#define KDA_BASE                                                                                         \
    "\"model_type\":\"kda\",\"hidden_size\":64,\"num_hidden_layers\":4,\"num_heads\":2,\"head_dim\":16,"  \
    "\"vocab_size\":256,\"intermediate_size\":128"
#define ATTN "\"attn\":{\"layers\":[3],\"num_heads\":4,\"num_kv_heads\":2,\"head_dim\":16,\"qk_norm\":true," \
             "\"rope_theta\":10000,\"partial_rotary_factor\":0.5,\"output_gate\":true,\"window_size\":null}"

static void expect_error(const char *json, int code, const char *needle)
{
    model_config c;
    char err[512] = "";
    int rc = config_parse(&c, json, err, sizeof err);
    if (rc != code || !strstr(err, needle)) fail_msg("json %s: rc %d, err \"%s\" (wanted %d, \"%s\")", json, rc, err, code, needle);
}

static void test_fla_config_with_attn_block_parses(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    assert_int_equal(config_parse(&c, "{" KDA_BASE ",\"norm_eps\":1e-5,\"expand_v\":2," ATTN "}", err, sizeof err), 0);
    assert_int_equal(c.family, KDA_FAMILY_KDA);
    assert_int_equal(c.d, 64);
    assert_int_equal(c.kda_h, 2);
    assert_int_equal(c.kda_k, 16);
    assert_int_equal(c.kda_v, 32);
    assert_int_equal(c.conv_size, 4);
    assert_int_equal(c.bos_id, 1);
    assert_int_equal(c.eos_id, 2);
    assert_true(c.norm_eps == 1e-5f);
    assert_int_equal(c.kind[0], KDA_LAYER_KDA);
    assert_int_equal(c.kind[2], KDA_LAYER_KDA);
    assert_int_equal(c.kind[3], KDA_LAYER_GQA);
    assert_int_equal(c.gqa_h, 4);
    assert_int_equal(c.gqa_kvh, 2);
    assert_int_equal(c.rope_dim, 8);
    assert_true(c.qk_norm && c.output_gate);
}

static void test_hidden_ratio_follows_fla_gated_mlp_rule(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    /* fla GatedMLP: int(d * ratio * 2/3) rounded up to a multiple of 256: 2048*4*2/3 = 5461 -> 5632 */
    assert_int_equal(config_parse(&c, "{\"model_type\":\"kda\",\"hidden_size\":2048,\"num_hidden_layers\":2,"
                                      "\"num_heads\":16,\"head_dim\":128,\"vocab_size\":32000,\"hidden_ratio\":4}",
                                  err, sizeof err), 0);
    assert_int_equal(c.ffn, 5632);
}

static void test_llama_kda_config_parses(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    const char *j = "{\"model_type\":\"llama_kda\",\"hidden_size\":64,\"num_hidden_layers\":3,"
                    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,\"intermediate_size\":96,"
                    "\"vocab_size\":300,\"rope_theta\":1e6,\"rms_norm_eps\":1e-6,\"tie_word_embeddings\":true,"
                    "\"kda_layer_types\":[\"kda\",\"full\",\"kda\"],\"kda_num_heads\":2,\"kda_head_dim\":32,"
                    "\"kda_conv_size\":4,\"qk_norm\":true,\"architectures\":[\"X\"],\"torch_dtype\":\"bfloat16\"}";
    assert_int_equal(config_parse(&c, j, err, sizeof err), 0);
    assert_int_equal(c.family, KDA_FAMILY_LLAMA_KDA);
    assert_int_equal(c.kind[1], KDA_LAYER_GQA);
    assert_int_equal(c.rope_dim, 16); /* full RoPE */
    assert_int_equal(c.output_gate, 0);
    assert_int_equal(c.kda_v, 32);
}

static void test_unknown_key_is_named(void **st)
{
    (void)st;
    expect_error("{" KDA_BASE ",\"use_magic\":true}", KDA_EUNSUP, "\"use_magic\"");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[1],\"num_heads\":4,\"sliding\":3}}", KDA_EUNSUP, "attn.sliding");
}

static void test_missing_required_key_is_named(void **st)
{
    (void)st;
    expect_error("{\"model_type\":\"kda\",\"hidden_size\":64,\"num_hidden_layers\":4,\"num_heads\":2,"
                 "\"vocab_size\":256,\"intermediate_size\":128}", KDA_EFORMAT, "\"head_dim\"");
    expect_error("{\"hidden_size\":64}", KDA_EFORMAT, "model_type");
    expect_error("{" KDA_BASE ",\"attn\":{\"num_heads\":4}}", KDA_EFORMAT, "attn.layers");
}

static void test_wrong_types_are_rejected(void **st)
{
    (void)st;
    expect_error("{\"model_type\":\"kda\",\"hidden_size\":\"64\",\"num_hidden_layers\":4,\"num_heads\":2,"
                 "\"head_dim\":16,\"vocab_size\":256,\"intermediate_size\":128}", KDA_EFORMAT, "\"hidden_size\"");
    expect_error("{" KDA_BASE ",\"norm_eps\":\"small\"}", KDA_EFORMAT, "\"norm_eps\"");
    expect_error("{" KDA_BASE ",\"tie_word_embeddings\":1}", KDA_EFORMAT, "\"tie_word_embeddings\"");
    expect_error("{\"model_type\":\"kda\",\"hidden_size\":64.5,\"num_hidden_layers\":4,\"num_heads\":2,"
                 "\"head_dim\":16,\"vocab_size\":256,\"intermediate_size\":128}", KDA_EFORMAT, "\"hidden_size\"");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[9],\"num_heads\":4}}", KDA_EFORMAT, "attn.layers");
    expect_error("[1,2]", KDA_EFORMAT, "object");
    expect_error("{not json", KDA_EFORMAT, "not valid JSON");
}

static void test_unsupported_values_are_named(void **st)
{
    (void)st;
    expect_error("{" KDA_BASE ",\"hidden_act\":\"gelu\"}", KDA_EUNSUP, "hidden_act");
    expect_error("{" KDA_BASE ",\"num_v_heads\":3}", KDA_EUNSUP, "num_v_heads");
    expect_error("{" KDA_BASE ",\"num_v_heads\":1}", KDA_EUNSUP, "num_v_heads");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[3],\"num_heads\":4,\"num_kv_heads\":3}}", KDA_EUNSUP, "num_kv_heads");
    expect_error("{" KDA_BASE ",\"tokenizer\":\"tiktoken\"}", KDA_EUNSUP, "tokenizer");
    expect_error("{\"model_type\":\"mamba\"}", KDA_EUNSUP, "mamba");
    /* fla's own rules */
    expect_error("{" KDA_BASE ",\"safe_gate\":true}", KDA_EFORMAT, "lower_bound");
    expect_error("{" KDA_BASE ",\"lower_bound\":2}", KDA_EFORMAT, "lower_bound");
    expect_error("{" KDA_BASE ",\"attnres_block_size\":3}", KDA_EFORMAT, "attnres_block_size");
    expect_error("{" KDA_BASE ",\"attnres_block_size\":0}", KDA_EFORMAT, "attnres_block_size");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[3],\"num_heads\":4,\"window_size\":0}}", KDA_EFORMAT,
                 "window_size");
    expect_error("{" KDA_BASE ",\"attn\":[{\"layers\":[1],\"num_heads\":4},{\"layers\":[3],\"num_heads\":4,"
                 "\"window_size\":64}]}", KDA_EUNSUP, "attn[1]");
    expect_error("{" KDA_BASE ",\"attn\":[{\"layers\":[1],\"num_heads\":4},{\"layers\":[1],\"num_heads\":4}]}",
                 KDA_EFORMAT, "layer 1 is listed twice");
}

/* issue #11: V = head_dim * expand_v wider than the ops' per-head scratch
 * (KDA_MAX_HEAD_DIM) overflowed the stack in kda_step_f32; now refused here. */
static void test_head_widths_above_the_engine_limit_are_refused(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    expect_error("{\"model_type\":\"kda\",\"hidden_size\":64,\"num_hidden_layers\":1,\"num_heads\":1,"
                 "\"head_dim\":64,\"expand_v\":32,\"vocab_size\":256,\"intermediate_size\":128}", KDA_EUNSUP,
                 "value head width");
    expect_error("{\"model_type\":\"kda\",\"hidden_size\":64,\"num_hidden_layers\":1,\"num_heads\":1,"
                 "\"head_dim\":2048,\"vocab_size\":256,\"intermediate_size\":128}", KDA_EFORMAT, "\"head_dim\"");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[3],\"num_heads\":4,\"head_dim\":2048}}", KDA_EFORMAT,
                 "head_dim");
    /* head_dim left out: its default hidden_size / num_heads meets the same limit (fuzz_config found
     * a 40,896-wide model with 16 attention heads writing past the RoPE table) */
    expect_error("{\"model_type\":\"kda\",\"hidden_size\":40896,\"num_hidden_layers\":4,\"num_heads\":16,"
                 "\"head_dim\":128,\"vocab_size\":256,\"intermediate_size\":128,"
                 "\"attn\":{\"layers\":[3],\"num_heads\":16}}", KDA_EFORMAT, "default from the other keys (2556)");
    /* the widest allowed still parses */
    assert_int_equal(config_parse(&c, "{\"model_type\":\"kda\",\"hidden_size\":64,\"num_hidden_layers\":1,"
                                      "\"num_heads\":1,\"head_dim\":64,\"expand_v\":16,\"vocab_size\":256,"
                                      "\"intermediate_size\":128}", err, sizeof err), 0);
    assert_int_equal(c.kda_v, KDA_MAX_HEAD_DIM);
}

/* issue #19 item 9: numbers are range-checked as doubles before conversion */
static void test_out_of_range_numbers_never_reach_int(void **st)
{
    (void)st;
    expect_error("{" KDA_BASE ",\"eos_token_id\":[1e10]}", KDA_EFORMAT, "eos_token_id");
    expect_error("{" KDA_BASE ",\"eos_token_id\":[-3]}", KDA_EFORMAT, "eos_token_id");
    expect_error("{" KDA_BASE ",\"eos_token_id\":[2, 1e10]}", KDA_EFORMAT, "\"eos_token_id\"[1]");
    expect_error("{" KDA_BASE ",\"eos_token_id\":[2, \"x\"]}", KDA_EFORMAT, "\"eos_token_id\"[1]");
    expect_error("{" KDA_BASE ",\"eos_token_id\":-1}", KDA_EFORMAT, "eos_token_id");
    expect_error("{" KDA_BASE ",\"bos_token_id\":1e10}", KDA_EFORMAT, "bos_token_id");
    expect_error("{" KDA_BASE ",\"eos_token_id\":[1e999]}", KDA_EFORMAT, "eos_token_id");
    expect_error("{\"model_type\":\"kda\",\"hidden_size\":1e300,\"num_hidden_layers\":4,\"num_heads\":2,"
                 "\"head_dim\":16,\"vocab_size\":256,\"intermediate_size\":128}", KDA_EFORMAT, "hidden_size");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[-1e12],\"num_heads\":4}}", KDA_EFORMAT, "attn.layers");
}

/* Every option fla 0.5.2's KDAConfig offers lands in the config fields. */
static void test_fla_options_are_parsed(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    assert_int_equal(config_parse(&c, "{" KDA_BASE ",\"num_v_heads\":4,\"safe_gate\":true,\"lower_bound\":-5,"
                                      "\"allow_neg_eigval\":true,\"attnres_block_size\":2,\"conv_bias\":true,"
                                      "\"attn\":{\"layers\":[1,3],\"num_heads\":4,\"num_kv_heads\":2,\"qkv_bias\":true,"
                                      "\"window_size\":8,\"rope_theta\":500000}}", err, sizeof err), 0);
    assert_int_equal(c.kda_h, 2);
    assert_int_equal(c.kda_hv, 4);
    assert_int_equal(c.gate, KDA_GATE_LOWER_BOUND);
    assert_true(c.gate_lower_bound == -5.0f);
    assert_true(c.beta_scale == 2.0f);
    assert_int_equal(c.attnres_block, 2);
    assert_int_equal(c.conv_bias, 1);
    assert_int_equal(c.short_conv, 1);
    assert_int_equal(c.kind[1], KDA_LAYER_GQA);
    assert_int_equal(c.kind[2], KDA_LAYER_KDA);
    assert_int_equal(c.qkv_bias, 1);
    assert_int_equal(c.o_bias, 0);  /* fla's Attention: o_proj has no bias */
    assert_int_equal(c.window, 8);
    /* fla's Attention: head_dim = hidden / heads, full RoPE, no gate, no qk-norm */
    assert_int_equal(c.gqa_hd, 16);
    assert_int_equal(c.rope_dim, 16);
    assert_int_equal(c.output_gate, 0);
    assert_int_equal(c.qk_norm, 0);
    /* fla picks the lower-bound gate whenever lower_bound is set, safe_gate or not */
    assert_int_equal(config_parse(&c, "{" KDA_BASE ",\"lower_bound\":-3}", err, sizeof err), 0);
    assert_int_equal(c.gate, KDA_GATE_LOWER_BOUND);
    assert_int_equal(config_parse(&c, "{" KDA_BASE ",\"use_short_conv\":false,\"conv_bias\":true}", err, sizeof err), 0);
    assert_int_equal(c.short_conv, 0);
    assert_int_equal(c.conv_bias, 0); /* no conv at all */
    /* attn as a list of agreeing specs */
    assert_int_equal(config_parse(&c, "{" KDA_BASE ",\"attn\":[{\"layers\":[0],\"num_heads\":4},{\"layers\":[2],"
                                      "\"num_heads\":4}]}", err, sizeof err), 0);
    assert_int_equal(c.kind[0], KDA_LAYER_GQA);
    assert_int_equal(c.kind[2], KDA_LAYER_GQA);
    assert_int_equal(c.kind[1], KDA_LAYER_KDA);
}

/* The config.json fla's own KDAConfig writes (transformers 5.17 save_pretrained,
 * tests/fixtures/configs/fla-kda-hybrid.json): every key it writes, null or not. */
static void test_config_written_by_fla_parses(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    const char *j =
        "{\"allow_neg_eigval\":false,\"architectures\":[\"KDAForCausalLM\"],\"attn\":{\"layers\":[3],\"num_heads\":4,"
        "\"num_kv_heads\":2,\"qkv_bias\":false,\"rope_theta\":10000.0,\"window_size\":null},\"attn_mode\":\"chunk\","
        "\"attnres_block_size\":null,\"bos_token_id\":1,\"conv_size\":4,\"dtype\":\"bfloat16\",\"eos_token_id\":2,"
        "\"expand_v\":1.0,\"fuse_cross_entropy\":true,\"fuse_norm\":true,\"fuse_swiglu\":true,\"head_dim\":16,"
        "\"hidden_act\":\"swish\",\"hidden_ratio\":4,\"hidden_size\":64,\"initializer_range\":0.02,"
        "\"intermediate_size\":128,\"lower_bound\":null,\"max_position_embeddings\":2048,\"model_type\":\"kda\","
        "\"norm_eps\":1e-06,\"num_heads\":2,\"num_hidden_layers\":4,\"num_v_heads\":null,\"pad_token_id\":null,"
        "\"safe_gate\":false,\"tie_word_embeddings\":true,\"transformers_version\":\"5.17.0\",\"use_cache\":true,"
        "\"use_l2warp\":false,\"use_short_conv\":true,\"vocab_size\":256}";
    assert_int_equal(config_parse(&c, j, err, sizeof err), 0);
    assert_int_equal(c.kda_hv, 2);
    assert_int_equal(c.gate, KDA_GATE_SOFTPLUS);
    assert_int_equal(c.attnres_block, 0);
    assert_int_equal(c.window, 0);
    assert_int_equal(c.kind[3], KDA_LAYER_GQA);
}

#define LLAMA_BASE                                                                                            \
    "\"model_type\":\"llama_kda\",\"hidden_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,"      \
    "\"num_key_value_heads\":2,\"head_dim\":16,\"intermediate_size\":96,\"vocab_size\":300,"                  \
    "\"kda_num_heads\":2,\"kda_head_dim\":16"

/* transformers 5: rope_parameters and dtype; llama3 and linear RoPE scaling. */
static void test_llama_rope_forms_and_scaling(void **st)
{
    (void)st;
    model_config c, d;
    char err[512];
    assert_int_equal(config_parse(&c, "{" LLAMA_BASE ",\"dtype\":\"bfloat16\",\"rope_parameters\":{\"rope_theta\":"
                                      "1e6,\"rope_type\":\"default\"}}", err, sizeof err), 0);
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(c.rope_kind, KDA_ROPE_DEFAULT);
    /* 4.x form gives the same numbers */
    assert_int_equal(config_parse(&d, "{" LLAMA_BASE ",\"torch_dtype\":\"bfloat16\",\"rope_theta\":1e6,"
                                      "\"rope_scaling\":null}", err, sizeof err), 0);
    assert_memory_equal(c.rope_inv_freq, d.rope_inv_freq, sizeof c.rope_inv_freq);
    /* linear: every frequency / factor */
    assert_int_equal(config_parse(&d, "{" LLAMA_BASE ",\"rope_theta\":1e6,\"rope_scaling\":{\"type\":\"linear\","
                                      "\"rope_type\":\"linear\",\"factor\":4.0}}", err, sizeof err), 0);
    assert_int_equal(d.rope_kind, KDA_ROPE_LINEAR);
    for (int i = 0; i < 8; i++) assert_true(fabs(d.rope_inv_freq[i] * 4 - c.rope_inv_freq[i]) < 1e-15);
    /* llama3 (orig 16, low 1, high 4): wavelengths > 16 scaled by 1/factor, < 4 kept */
    assert_int_equal(config_parse(&d, "{" LLAMA_BASE ",\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":"
                                      "\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                                      "\"original_max_position_embeddings\":16}}", err, sizeof err), 0);
    assert_int_equal(d.rope_kind, KDA_ROPE_LLAMA3);
    for (int i = 0; i < 8; i++) {
        double wl = 2 * M_PI / c.rope_inv_freq[i];
        if (wl < 4) assert_true(d.rope_inv_freq[i] == c.rope_inv_freq[i]);
        else if (wl > 16) assert_true(fabs(d.rope_inv_freq[i] * 8 - c.rope_inv_freq[i]) < 1e-15);
        else assert_true(d.rope_inv_freq[i] < c.rope_inv_freq[i] && d.rope_inv_freq[i] > c.rope_inv_freq[i] / 8);
    }
    expect_error("{" LLAMA_BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", KDA_EUNSUP, "yarn");
    expect_error("{" LLAMA_BASE ",\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":4}}", KDA_EUNSUP,
                 "dynamic");
    expect_error("{" LLAMA_BASE ",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4,\"beta_fast\":32}}",
                 KDA_EUNSUP, "rope_parameters.beta_fast");
    expect_error("{" LLAMA_BASE ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8}}", KDA_EFORMAT,
                 "low_freq_factor");
    expect_error("{" LLAMA_BASE ",\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.5}}",
                 KDA_EUNSUP, "partial_rotary_factor");
}

/* Mercity's LlamaKDAConfig: every key, its defaults, its layout order. */
static void test_mercity_llama_kda_keys_and_layout_order(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    assert_int_equal(config_parse(&c, "{" LLAMA_BASE ",\"kda_num_v_heads\":4,\"kda_expand_v\":2,"
                                      "\"kda_use_short_conv\":true,\"kda_conv_size\":3,\"kda_conv_bias\":true,"
                                      "\"kda_allow_neg_eigval\":true,\"kda_lower_bound\":-4,\"kda_safe_gate\":true,"
                                      "\"qk_norm\":true,\"qk_norm_eps\":1e-5,\"rms_norm_eps\":1e-6,"
                                      "\"attention_bias\":true,\"mlp_bias\":true,\"pretraining_tp\":2,"
                                      "\"attention_dropout\":0.0}", err, sizeof err), 0);
    assert_int_equal(c.kda_hv, 4);
    assert_int_equal(c.kda_v, 32);
    assert_int_equal(c.conv_size, 3);
    assert_int_equal(c.conv_bias, 1);
    assert_true(c.beta_scale == 2.0f);
    assert_int_equal(c.gate, KDA_GATE_LOWER_BOUND);
    assert_true(c.qk_norm_eps == 1e-5f && c.norm_eps == 1e-6f);
    assert_int_equal(c.qkv_bias, 1);
    assert_int_equal(c.o_bias, 1); /* LlamaAttention: attention_bias covers o_proj */
    assert_int_equal(c.mlp_bias, 1);
    for (int i = 0; i < 4; i++) assert_int_equal(c.kind[i], KDA_LAYER_KDA); /* no layout key: all KDA */
    /* defaults: kda_head_dim 128, kda_num_heads = hidden / head_dim */
    assert_int_equal(config_parse(&c, "{\"model_type\":\"llama_kda\",\"hidden_size\":256,\"num_hidden_layers\":2,"
                                      "\"num_attention_heads\":4,\"intermediate_size\":96,\"vocab_size\":300,"
                                      "\"kda_num_heads\":null}", err, sizeof err), 0);
    assert_int_equal(c.kda_k, 128);
    assert_int_equal(c.kda_h, 2);
    /* layout: explicit kda_layer_types > kda_full_attn_layers > range > every > kda_every */
#define LAYOUT(keys, k0, k1, k2, k3)                                                                        \
    do {                                                                                                    \
        assert_int_equal(config_parse(&c, "{" LLAMA_BASE "," keys "}", err, sizeof err), 0);                \
        const int want[4] = {k0, k1, k2, k3};                                                               \
        for (int i = 0; i < 4; i++)                                                                         \
            if ((int)c.kind[i] != want[i]) fail_msg("%s: layer %d", keys, i);                              \
    } while (0)
    enum { K = KDA_LAYER_KDA, G = KDA_LAYER_GQA };
    LAYOUT("\"kda_layer_types\":[\"full\",\"kda\",\"kda\",\"kda\"],\"kda_full_attn_layers\":[1],"
           "\"kda_full_attn_range\":[1,3],\"kda_full_attn_every\":2,\"kda_every\":4", G, K, K, K);
    LAYOUT("\"kda_full_attn_layers\":[0],\"kda_full_attn_range\":[1,3],\"kda_full_attn_every\":2,\"kda_every\":4",
           G, K, K, K);
    LAYOUT("\"kda_full_attn_range\":[1,3],\"kda_full_attn_every\":2,\"kda_every\":4", K, G, G, K);
    LAYOUT("\"kda_full_attn_every\":2,\"kda_every\":4", K, G, K, G);
    LAYOUT("\"kda_every\":2,\"kda_offset\":1", G, K, G, K);
    LAYOUT("\"kda_every\":3,\"kda_offset\":-1", G, G, K, G); /* Python's %: -1 % 3 = 2 */
    LAYOUT("\"kda_full_attn_every\":0,\"kda_layer_types\":null", K, K, K, K);
#undef LAYOUT
    expect_error("{" LLAMA_BASE ",\"kda_full_attn_layers\":[4]}", KDA_EFORMAT, "out of range");
    expect_error("{" LLAMA_BASE ",\"kda_full_attn_range\":[2,9]}", KDA_EFORMAT, "out of range");
    expect_error("{" LLAMA_BASE ",\"kda_layer_types\":[\"kda\"]}", KDA_EFORMAT, "kda_layer_types");
    expect_error("{" LLAMA_BASE ",\"kda_safe_gate\":true}", KDA_EFORMAT, "kda_lower_bound");
    expect_error("{" LLAMA_BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2},\"rope_parameters\":"
                 "{\"rope_type\":\"default\"}}", KDA_EFORMAT, "both");
}

/* The CUDA backend computes every fla / llama option but attention residuals,
 * which it refuses by name; the KDA options its chunked prompt kernel lacks
 * are named by cuda_kda_chunk_lacks (those models' prompts take the per-token
 * kernel), and no other option is. */
static void test_cuda_check_names_each_option_it_lacks(void **st)
{
    (void)st;
    static const struct { const char *extra, *chunk_needle; } cases[] = {
        {",\"num_v_heads\":4", "num_v_heads"},
        {",\"lower_bound\":-5", "lower_bound"},
        {",\"safe_gate\":true,\"lower_bound\":-5", "lower_bound"},
        {",\"allow_neg_eigval\":true", "allow_neg_eigval"},
        {",\"use_short_conv\":false", "use_short_conv"},
        {",\"conv_bias\":true", "conv_bias"},
        {",\"attn\":{\"layers\":[3],\"num_heads\":4,\"window_size\":8}", NULL},
        {",\"attn\":{\"layers\":[3],\"num_heads\":4,\"qkv_bias\":true}", NULL},
    };
    model_config c;
    char err[512], json[1024];
    assert_int_equal(config_parse(&c, "{" KDA_BASE "," ATTN "}", err, sizeof err), 0);
    assert_int_equal(cuda_config_check(&c, err, sizeof err), 0);
    assert_null(cuda_kda_chunk_lacks(&c));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, "{" KDA_BASE "%s}", cases[i].extra);
        assert_int_equal(config_parse(&c, json, err, sizeof err), 0);
        err[0] = 0;
        if (cuda_config_check(&c, err, sizeof err) != 0) fail_msg("%s: refused: \"%s\"", cases[i].extra, err);
        const char *lack = cuda_kda_chunk_lacks(&c);
        if (cases[i].chunk_needle ? !lack || !strstr(lack, cases[i].chunk_needle) : lack != NULL)
            fail_msg("%s: chunk kernel lacks \"%s\"", cases[i].extra, lack ? lack : "(nothing)");
    }
    snprintf(json, sizeof json, "{" KDA_BASE ",\"attnres_block_size\":2}");
    assert_int_equal(config_parse(&c, json, err, sizeof err), 0);
    err[0] = 0;
    assert_int_equal(cuda_config_check(&c, err, sizeof err), KDA_EUNSUP);
    assert_non_null(strstr(err, "attnres_block_size"));
    static const char *const llama[] = {
        ",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2}",
        ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
        "\"high_freq_factor\":4,\"original_max_position_embeddings\":64}",
        ",\"mlp_bias\":true",
        ",\"attention_bias\":true",
        ",\"qk_norm\":true,\"qk_norm_eps\":1e-3",
        "",
    };
    for (size_t i = 0; i < sizeof llama / sizeof llama[0]; i++) {
        snprintf(json, sizeof json, "{" LLAMA_BASE ",\"kda_full_attn_every\":2%s}", llama[i]);
        assert_int_equal(config_parse(&c, json, err, sizeof err), 0);
        err[0] = 0;
        int rc = cuda_config_check(&c, err, sizeof err);
        if (rc != 0) fail_msg("%s: rc %d \"%s\"", llama[i], rc, err);
        if (cuda_kda_chunk_lacks(&c)) fail_msg("%s: chunk kernel lacks \"%s\"", llama[i], cuda_kda_chunk_lacks(&c));
    }
}

/* Config maps: a foreign config.json through configs/bqalm.configmap.json (the
 * worked example) parses to the same config as the engine's own form. */
static void test_config_map_rewrites_a_foreign_config(void **st)
{
    (void)st;
    const char *src = getenv("KDA_SRC");
    if (!src) src = "..";
    char map[1024], dir[1024], foreign[1024];
    snprintf(map, sizeof map, "%s/configs/bqalm.configmap.json", src);
    snprintf(dir, sizeof dir, "%s/configs", src);
    snprintf(foreign, sizeof foreign, "%s/tests/fixtures/configmap/bqalm-config.json", src);
    FILE *f = fopen(foreign, "rb");
    assert_non_null(f);
    static char json[1 << 16];
    json[fread(json, 1, sizeof json - 1, f)] = 0;
    fclose(f);
    model_config want, got, viadir;
    char err[512];
    assert_int_equal(config_parse(&want, "{" KDA_BASE ",\"tie_word_embeddings\":true,\"tokenizer\":\"bytes\"," ATTN
                                         "}", err, sizeof err), 0);
    want.attnres_block = 0;
    if (config_parse_mapped(&got, json, map, err, sizeof err)) fail_msg("%s", err);
    assert_memory_equal(&got, &want, sizeof got);
    if (config_parse_mapped(&viadir, json, dir, err, sizeof err)) fail_msg("%s", err);
    assert_memory_equal(&viadir, &want, sizeof got);
    /* without the map: refused, pointing at config maps */
    expect_error(json, KDA_EUNSUP, "config map");
    /* a foreign key the map does not list is still named, with the map */
    char extra[1 << 16];
    snprintf(extra, sizeof extra, "{\"weird_switch\":1,%s", strchr(json, '{') + 1);
    assert_int_not_equal(config_parse_mapped(&got, extra, map, err, sizeof err), 0);
    if (!strstr(err, "\"weird_switch\"") || !strstr(err, "bqalm.configmap.json")) fail_msg("%s", err);
    /* a value the map has no translation for */
    char *act = strstr(json, "\"silu\"");
    assert_non_null(act);
    memcpy(act, "\"gelu\"", 6);
    assert_int_not_equal(config_parse_mapped(&got, json, map, err, sizeof err), 0);
    if (!strstr(err, "\"activation\" = \"gelu\"")) fail_msg("%s", err);
    /* a map for another model_type, given as a file: refused; the kda family through a folder: untouched */
    assert_int_equal(config_parse_mapped(&got, "{" KDA_BASE "}", map, err, sizeof err), KDA_EINVAL);
    if (!strstr(err, "bqalm")) fail_msg("%s", err);
    assert_int_equal(config_parse_mapped(&got, "{" KDA_BASE "}", dir, err, sizeof err), 0);
}

/* The map's own format errors are named. */
static void test_config_map_format_errors_are_named(void **st)
{
    (void)st;
    static const struct { const char *map, *needle; } cases[] = {
        {"{\"model_type\":\"x\",\"engine_model_type\":\"kda\",\"colour\":1}", "\"colour\""},
        {"{\"model_type\":\"x\",\"engine_model_type\":\"mamba\"}", "engine_model_type"},
        {"{\"engine_model_type\":\"kda\"}", "\"model_type\""},
        {"{\"model_type\":\"x\",\"engine_model_type\":\"kda\",\"keys\":{\"a\":{\"to\":\"b\",\"scale\":2}}}", "keys.a"},
        {"{\"model_type\":\"x\",\"engine_model_type\":\"kda\",\"keys\":{\"a\":\"hidden_size\",\"b\":\"hidden_size\"}}",
         "written twice"},
        {"not json", "not valid JSON"},
    };
    char path[] = "/tmp/kda-cmap-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        fputs(cases[i].map, f);
        fclose(f);
        model_config c;
        char err[512] = "";
        int rc = config_parse_mapped(&c, "{\"model_type\":\"x\",\"a\":64,\"b\":64}", path, err, sizeof err);
        if (rc == 0 || !strstr(err, cases[i].needle)) fail_msg("map %s: rc %d \"%s\"", cases[i].map, rc, err);
    }
    unlink(path);
}

static void test_token_ids_may_be_null_or_list(void **st)
{
    (void)st;
    model_config c;
    char err[512];
    assert_int_equal(config_parse(&c, "{" KDA_BASE ",\"bos_token_id\":null,\"eos_token_id\":[7,8]}", err, sizeof err), 0);
    assert_int_equal(c.bos_id, -1);
    assert_int_equal(c.eos_id, 7);
    expect_error("{" KDA_BASE ",\"eos_token_id\":999}", KDA_EFORMAT, "vocab_size");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fla_config_with_attn_block_parses),
        cmocka_unit_test(test_hidden_ratio_follows_fla_gated_mlp_rule),
        cmocka_unit_test(test_llama_kda_config_parses),
        cmocka_unit_test(test_unknown_key_is_named),
        cmocka_unit_test(test_missing_required_key_is_named),
        cmocka_unit_test(test_wrong_types_are_rejected),
        cmocka_unit_test(test_unsupported_values_are_named),
        cmocka_unit_test(test_token_ids_may_be_null_or_list),
        cmocka_unit_test(test_head_widths_above_the_engine_limit_are_refused),
        cmocka_unit_test(test_out_of_range_numbers_never_reach_int),
        cmocka_unit_test(test_fla_options_are_parsed),
        cmocka_unit_test(test_config_written_by_fla_parses),
        cmocka_unit_test(test_llama_rope_forms_and_scaling),
        cmocka_unit_test(test_mercity_llama_kda_keys_and_layout_order),
        cmocka_unit_test(test_cuda_check_names_each_option_it_lacks),
        cmocka_unit_test(test_config_map_rewrites_a_foreign_config),
        cmocka_unit_test(test_config_map_format_errors_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* config.json parsing: what is accepted, and that every rejection names its key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

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
    expect_error("{" KDA_BASE ",\"allow_neg_eigval\":true}", KDA_EUNSUP, "allow_neg_eigval");
    expect_error("{" KDA_BASE ",\"safe_gate\":true}", KDA_EUNSUP, "safe_gate");
    expect_error("{" KDA_BASE ",\"lower_bound\":-5}", KDA_EUNSUP, "lower_bound");
    expect_error("{" KDA_BASE ",\"use_short_conv\":false}", KDA_EUNSUP, "use_short_conv");
    expect_error("{" KDA_BASE ",\"hidden_act\":\"gelu\"}", KDA_EUNSUP, "hidden_act");
    expect_error("{" KDA_BASE ",\"num_v_heads\":4}", KDA_EUNSUP, "num_v_heads");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[3],\"num_heads\":4,\"window_size\":512}}", KDA_EUNSUP, "window_size");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[3],\"num_heads\":4,\"num_kv_heads\":3}}", KDA_EUNSUP, "num_kv_heads");
    expect_error("{" KDA_BASE ",\"attn\":{\"layers\":[3],\"num_heads\":4,\"qkv_bias\":true}}", KDA_EUNSUP, "qkv_bias");
    expect_error("{" KDA_BASE ",\"tokenizer\":\"tiktoken\"}", KDA_EUNSUP, "tokenizer");
    expect_error("{\"model_type\":\"mamba\"}", KDA_EUNSUP, "mamba");
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

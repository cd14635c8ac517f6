"""Generator: parameter arithmetic of the 1.7B preset (MODEL_SPEC 1, without
writing 3.3 GB), what lands on disk matches what it reports, config keys."""
import json
import os
import re

from pyref_common import gen, run_tests, script
import safetensors_io as st


def table(*args):
    out = script("gen_checkpoint.py", "--dry-run", *args)
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4 and f[0].startswith(("model.", "lm_head")):
            rows[f[0]] = (f[1], tuple(int(x) for x in f[2].split("x")), int(f[3]))
    count = int(re.search(r"parameters: ([\d,]+)", out).group(1).replace(",", ""))
    return rows, count


def layer_sum(rows, i):
    p = "model.layers.%d." % i
    return sum(n for name, (_, _, n) in rows.items()
               if name.startswith(p) and ".attn." in name.replace("self_attn", "attn"))


def test_1p7b_preset_matches_the_model_card():
    rows, count = table("--preset", "1.7b")
    d, F, V, L = 2048, 8064, 32000, 24
    # MODEL_SPEC 1: KDA layer 17,887,376 and GQA layer 14,680,320 mixer parameters
    kda = 3 * d * d + 3 * d * 4 + (d * 128 + 128 * d) + 16 * d + 16 + d + (d * 128 + 128 * d + d) + 128 + d * d
    gqa = 3 * d * d + 2 * 512 * d + 2 * 128
    assert kda == 17887376 and gqa == 14680320
    assert layer_sum(rows, 0) == kda, layer_sum(rows, 0)
    assert layer_sum(rows, 3) == gqa, layer_sum(rows, 3)
    want = V * d + L * (3 * d * F + 2 * d) + d + 18 * kda + 6 * gqa
    assert want == 1664776224
    assert count == want, count
    assert sum(n for _, _, n in rows.values()) == count
    assert "lm_head.weight" not in rows  # tied
    gqa_layers = sorted({int(n.split(".")[2]) for n in rows if n.endswith("attn.g_proj.weight")})
    assert gqa_layers == [3, 7, 11, 15, 19, 23], gqa_layers
    assert all(dt == "BF16" for dt, _, _ in rows.values())


def test_untied_adds_the_head_and_interleaving_keeps_the_count():
    _, tied = table("--preset", "1.7b")
    rows, untied = table("--preset", "1.7b", "--untied")
    assert untied == tied + 32000 * 2048 and rows["lm_head.weight"][1] == (32000, 2048)
    rows, inter = table("--preset", "1.7b", "--gate", "interleaved")
    assert inter == tied
    assert rows["model.layers.3.attn.q_proj.weight"][1] == (4096, 2048)
    assert "model.layers.3.attn.g_proj.weight" not in rows


def test_written_headers_hold_exactly_the_reported_parameters():
    d = gen("sharded", "--preset", "small", "--shards", "3", "--dtype", "mixed", "--untied")
    rows, count = table("--preset", "small", "--dtype", "mixed", "--untied")
    with open(os.path.join(d, "model.safetensors.index.json")) as fh:
        idx = json.load(fh)
    shards = sorted(set(idx["weight_map"].values()))
    assert shards == ["model-%05d-of-00003.safetensors" % i for i in (1, 2, 3)], shards
    seen, nbytes = {}, 0
    for f in shards:
        hdr, base = st.read_header(os.path.join(d, f))
        assert base % 8 == 0  # header padded: every tensor aligned to its dtype
        end = 0
        for name, e in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            assert e["data_offsets"][0] == end, name  # contiguous, no holes or overlaps
            end = e["data_offsets"][1]
            assert idx["weight_map"][name] == f, name
            assert name not in seen
            seen[name] = (e["dtype"], tuple(e["shape"]))
            nbytes += end - e["data_offsets"][0]
        assert os.path.getsize(os.path.join(d, f)) == base + end
    assert set(seen) == set(rows) == set(idx["weight_map"])
    assert sum(st.numel(s) for _, s in seen.values()) == count
    assert idx["metadata"]["total_size"] == nbytes
    assert {dt for dt, _ in seen.values()} == {"F32", "F16", "BF16"}
    assert all(seen[n] == (dt, sh) for n, (dt, sh, _) in rows.items())


def test_config_json_uses_only_the_spec_keys():
    d = gen("cfg-kda", "--preset", "tiny")
    with open(os.path.join(d, "config.json")) as fh:
        c = json.load(fh)
    spec = {"hidden_size", "num_hidden_layers", "num_heads", "head_dim", "expand_v", "use_short_conv",
            "conv_size", "intermediate_size", "hidden_act", "norm_eps", "vocab_size",
            "tie_word_embeddings", "bos_token_id", "eos_token_id", "max_position_embeddings",
            "allow_neg_eigval", "safe_gate", "lower_bound", "attn", "model_type", "tokenizer"}
    assert set(c) == spec, set(c) ^ spec
    assert c["model_type"] == "kda" and c["tokenizer"] == "bytes" and c["hidden_act"] == "swish"
    assert set(c["attn"]) == {"layers", "num_heads", "num_kv_heads", "head_dim", "qkv_bias", "qk_norm",
                              "rope_theta", "partial_rotary_factor", "output_gate", "window_size"}
    assert c["attn"]["layers"] == [3] and c["attn"]["partial_rotary_factor"] == 0.5
    d = gen("cfg-llama", "--preset", "llama-tiny", "--layers", "8", "--pattern", "KG")
    with open(os.path.join(d, "config.json")) as fh:
        c = json.load(fh)
    assert c["model_type"] == "llama_kda" and c["hidden_act"] == "silu"
    assert c["kda_layer_types"] == ["kda", "full"] * 4
    for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps",
              "kda_num_heads", "kda_head_dim", "kda_conv_size", "qk_norm", "tie_word_embeddings"):
        assert k in c, k
    hdr, _ = st.read_header(os.path.join(d, "model.safetensors"))
    assert "model.layers.0.self_attn.kda.A_log" in hdr
    assert "model.layers.1.self_attn.q_norm.weight" in hdr
    assert not any("g_proj.weight" in n and "kda" not in n for n in hdr)  # no output gate


def test_same_seed_same_bytes_other_seed_other_bytes():
    a = gen("s0a", "--preset", "tiny", "--seed", "5")
    b = gen("s0b", "--preset", "tiny", "--seed", "5")
    c = gen("s1", "--preset", "tiny", "--seed", "6")
    rd = lambda d: open(os.path.join(d, "model.safetensors"), "rb").read()  # noqa: E731
    assert rd(a) == rd(b) and rd(a) != rd(c)


if __name__ == "__main__":
    run_tests(globals())

#!/usr/bin/env python3
"""write_tool_configs.py - writes tests/fixtures/configs/*.json with the real
tools' own config classes, so the parser is tested on what they write rather
than on what we think they write:

  fla-*.json        fla 0.5.2's KDAConfig (its configuration_kda.py and
                    models/hybrid.py, loaded on their own: the kernels need a GPU)
                    saved by transformers 5.17's save_pretrained, plus the two
                    keys a model's save adds (architectures, dtype)
  llama-kda-tf5.json  transformers 5.17 LlamaConfig carrying the keys of
                    Mercity's LlamaKDAConfig (defaults as in its signature)
  llama-kda-tf4.json  the same with transformers 4.57 (rope_theta + rope_scaling)

Each file matches the tensors scripts/gen_checkpoint.py writes with the
arguments in tests/fixtures/configs/README.md, which the CI test uses.

    python write_tool_configs.py OUTDIR --fla-src DIR   # DIR holds fla/ (the 0.5.2 wheel unpacked)

Needs transformers (either major version; run once per version for the llama
file). Not run in CI: its outputs are committed.
"""
import argparse
import importlib.util
import json
import os
import sys
import types


def load_fla_config(src):
    for name in ("fla", "fla.models", "fla.models.kda"):  # stub packages: skip fla/__init__ (kernels)
        m = types.ModuleType(name)
        m.__path__ = []
        sys.modules[name] = m

    def load(modname, path):
        spec = importlib.util.spec_from_file_location(modname, os.path.join(src, path))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        return mod

    load("fla.models.hybrid", "fla/models/hybrid.py")
    return load("fla.models.kda.configuration_kda", "fla/models/kda/configuration_kda.py").KDAConfig


# Mercity's LlamaKDAConfig keys and their defaults (its __init__ signature)
MERCITY = dict(kda_full_attn_layers=None, kda_full_attn_every=None, kda_full_attn_range=None, kda_every=None,
               kda_offset=0, kda_head_dim=128, kda_num_heads=None, kda_num_v_heads=None, kda_expand_v=1.0,
               kda_use_short_conv=True, kda_conv_size=4, kda_conv_bias=False, kda_allow_neg_eigval=False,
               kda_lower_bound=None, kda_safe_gate=False, qk_norm=False, qk_norm_eps=None)


def save(cfg, out, name, **model_keys):
    d = os.path.join(out, "_tmp")
    cfg.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as fh:
        j = json.load(fh)
    j.update(model_keys)
    with open(os.path.join(out, name), "w") as fh:
        json.dump(dict(sorted(j.items())), fh, indent=2)
        fh.write("\n")
    os.remove(os.path.join(d, "config.json"))
    os.rmdir(d)
    print("wrote", name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--fla-src", help="folder holding fla/ of flash-linear-attention 0.5.2")
    a = ap.parse_args()
    import transformers
    from transformers import LlamaConfig
    major = int(transformers.__version__.split(".")[0])
    os.makedirs(a.out, exist_ok=True)
    if a.fla_src and major >= 5:
        KDAConfig = load_fla_config(a.fla_src)
        model = dict(architectures=["KDAForCausalLM"], dtype="bfloat16")
        save(KDAConfig(hidden_size=64, num_hidden_layers=4, num_heads=2, head_dim=16, vocab_size=256,
                       intermediate_size=128, tie_word_embeddings=True,
                       attn={"layers": [3], "num_heads": 4, "num_kv_heads": 2}),
             a.out, "fla-kda-hybrid.json", **model)
        save(KDAConfig(hidden_size=64, num_hidden_layers=4, num_heads=2, num_v_heads=4, head_dim=16,
                       vocab_size=256, hidden_ratio=4, tie_word_embeddings=True, safe_gate=True, lower_bound=-5.0,
                       allow_neg_eigval=True, attnres_block_size=2,
                       attn={"layers": [1, 3], "num_heads": 4, "num_kv_heads": 2, "qkv_bias": True,
                             "window_size": 8}),
             a.out, "fla-kda-options.json", **model)
    llama = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=256, intermediate_size=128, tie_word_embeddings=True)
    kda = dict(MERCITY, kda_full_attn_every=4, kda_head_dim=16, kda_num_heads=2, qk_norm=True)

    class LlamaKDALike(LlamaConfig):  # only the model_type: the keys are set below
        model_type = "llama_kda"

    if major >= 5:
        c = LlamaKDALike(**llama, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 16})
        name = "llama-kda-tf5.json"
    else:
        c = LlamaKDALike(**llama, rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 4.0})
        name = "llama-kda-tf4.json"
    for k, v in kda.items():
        setattr(c, k, v)
    # what Mercity's LlamaKDA writes after resolving the layout
    c.kda_layer_types = ["kda", "kda", "kda", "full"]
    save(c, a.out, name, architectures=["LlamaKDA"], **({"dtype": "bfloat16"} if major >= 5 else
                                                      {"torch_dtype": "bfloat16"}))


if __name__ == "__main__":
    main()

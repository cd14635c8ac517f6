"""The config options of fla's KDAConfig and Mercity's LlamaKDAConfig (MODEL_SPEC
5a, 6): kda-cli (C, fp32 CPU backend) against scripts/reference.py (the
independent float64 PyTorch reference, which implements each option from fla's
and transformers' code, not from ours) on generated checkpoints, one per option
and a few combined, including configs written with every key the real tools
write (--config-style tools). Each case scores a 24-token prompt (longer where
the option only shows past some position: the attention window, the chunked
prefill of grouped value heads) and decodes 8 greedy tokens through the
recurrent state and KV cache.

Tolerance: per-token log-prob |diff| <= 2e-4 nats and identical greedy tokens,
as tests/engine/test_vs_reference.py. Each option must also change the result
(against the same weights without it), so a case cannot pass by ignoring it.
Run: /usr/bin/python3 tests/engine/test_options_vs_reference.py
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_vs_reference import CLI, PY, SRC, TOL, compare, run  # noqa: E402

# (name, generator args, prompt length, the same without the option or None)
CASES = [
    ("kda GVA: 4 value heads on 2 q/k heads", "--preset tiny --v-heads 4 --seed 11", 24, None),
    ("kda GVA, chunked prefill", "--preset tiny --v-heads 4 --seed 11", 150, None),
    ("kda lower-bound gate, safe_gate", "--preset tiny --lower-bound -5 --safe-gate --seed 12", 24, None),
    ("kda lower-bound gate without safe_gate", "--preset tiny --lower-bound -3 --seed 13", 24, None),
    ("kda allow_neg_eigval (beta x 2)", "--preset tiny --neg-eigval --seed 14", 24, "--preset tiny --seed 14"),
    ("kda use_short_conv false", "--preset tiny --no-short-conv --seed 15", 24, None),
    ("kda conv_bias", "--preset tiny --conv-bias --seed 16", 24, None),
    ("kda fla attention + window 6 + qkv_bias", "--preset tiny --attn-style fla --window 6 --qkv-bias --seed 17",
     40, "--preset tiny --attn-style fla --qkv-bias --seed 17"),
    ("kda attnres_block_size 2", "--preset tiny --attnres 2 --seed 18", 24, None),
    ("kda attnres_block_size 1, KGKG", "--preset tiny --attnres 1 --pattern KG --seed 19", 24, None),
    ("kda every fla key, f32, all options", "--preset tiny --config-style tools --dtype f32 --v-heads 4 "
     "--lower-bound -5 --safe-gate --neg-eigval --conv-bias --attn-style fla --window 9 --qkv-bias --seed 20", 40,
     None),
    ("llama_kda transformers-5 config, llama3 RoPE", "--preset llama-tiny --config-style tools --rope-type llama3 "
     "--rope-factor 8 --rope-orig 16 --rope-theta 500000 --seed 21", 40,
     "--preset llama-tiny --config-style tools --rope-theta 500000 --seed 21"),
    ("llama_kda linear RoPE, attention/mlp bias, qk_norm_eps", "--preset llama-tiny --rope-type linear "
     "--rope-factor 4 --qkv-bias --mlp-bias --qk-norm-eps 1e-2 --seed 22", 24, None),
    ("llama_kda GVA + lower bound + no conv, kda_full_attn_every 2", "--preset llama-tiny --v-heads 4 "
     "--lower-bound -5 --safe-gate --no-short-conv --layout every:2 --seed 23", 24, None),
    ("llama_kda kda_every 3 offset 1 (KDA sparse)", "--preset llama-tiny --layers 6 --layout kda_every:3:1 "
     "--seed 24", 24, None),
    ("llama_kda kda_full_attn_range [1, 3)", "--preset llama-tiny --layout range:1:3 --config-style tools "
     "--seed 25", 24, None),
    ("llama_kda kda_full_attn_layers, no qk_norm", "--preset llama-tiny --layout list --pattern KGGK "
     "--no-qk-norm --seed 26", 24, None),
]


# config.json files written by fla / transformers themselves (tests/fixtures/configs/README.md),
# with generated weights of their shapes
TOOL_CONFIGS = [
    ("fla-kda-hybrid.json", "--preset tiny --attn-style fla"),
    ("fla-kda-options.json", "--preset tiny --pattern KG --ffn 256 --v-heads 4 --lower-bound -5 --safe-gate "
     "--neg-eigval --attn-style fla --window 8 --qkv-bias --attnres 2"),
    ("llama-kda-tf5.json", "--preset llama-tiny"),
    ("llama-kda-tf4.json", "--preset llama-tiny"),
]


def scores(ckpt, toks):
    return json.loads(run([CLI, "score", ckpt, "--tokens", ",".join(map(str, toks)), "--json"]))["token_logprobs"]


def main():
    if not os.path.exists(CLI):
        print(f"kda-cli not built at {CLI}")
        return 1
    rnd = random.Random(7)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, args, length, without) in enumerate(CASES):
            d = os.path.join(tmp, f"o{i}")
            run([PY, os.path.join(SRC, "scripts", "gen_checkpoint.py"), d] + args.split())
            vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
            toks = [1] + [rnd.randrange(vocab) for _ in range(length - 1)]
            ok &= compare(name, d, toks)
            if without:  # the option must matter on these weights
                base = os.path.join(tmp, f"o{i}-without")
                run([PY, os.path.join(SRC, "scripts", "gen_checkpoint.py"), base] + without.split())
                moved = max(abs(a - b) for a, b in zip(scores(d, toks), scores(base, toks)))
                good = moved > 100 * TOL
                print(f"{'  ... and it changes the result':45s} by {moved:.2e} {'ok' if good else 'FAIL'}")
                ok &= good
        for name, args in TOOL_CONFIGS:
            d = os.path.join(tmp, name)
            run([PY, os.path.join(SRC, "scripts", "gen_checkpoint.py"), d] + args.split())
            shutil.copy(os.path.join(SRC, "tests", "fixtures", "configs", name), os.path.join(d, "config.json"))
            ok &= compare("tool-written " + name, d, [1] + [rnd.randrange(256) for _ in range(39)])
        ok &= config_map_case(tmp, rnd)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def config_map_case(tmp, rnd):
    """configs/README.md's worked example: the foreign config.json through the shipped
    config map, with the weights of the native layout, gives the native log-probs."""
    native = os.path.join(tmp, "native")
    run([PY, os.path.join(SRC, "scripts", "gen_checkpoint.py"), native, "--preset", "tiny", "--seed", "30"])
    foreign = os.path.join(tmp, "bqalm")
    os.makedirs(foreign)
    shutil.copy(os.path.join(native, "model.safetensors"), foreign)
    shutil.copy(os.path.join(SRC, "tests", "fixtures", "configmap", "bqalm-config.json"),
                os.path.join(foreign, "config.json"))
    toks = ",".join(map(str, [1] + [rnd.randrange(256) for _ in range(30)]))
    want = json.loads(run([CLI, "score", native, "--tokens", toks, "--json"]))["token_logprobs"]
    got = json.loads(run([CLI, "score", foreign, "--tokens", toks, "--json", "--config-map",
                          os.path.join(SRC, "configs")]))["token_logprobs"]
    r = subprocess.run([CLI, "score", foreign, "--tokens", toks, "--json"], capture_output=True, text=True)
    refused = r.returncode != 0 and "bqalm" in r.stderr and "config map" in r.stderr
    good = got == want and refused
    print(f"{'config map (configs/bqalm.configmap.json)':45s} identical={got == want} "
          f"unmapped-refused={refused} {'ok' if good else 'FAIL'}")
    return good


if __name__ == "__main__":
    sys.exit(main())

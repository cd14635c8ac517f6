"""scripts/import_pt.py: a torch.save({'model': state_dict, 'config': {...}})
checkpoint in a trainer's own names becomes a canonical checkpoint through a
name map, with the same numbers; torch.load runs with weights_only=True (a
pickled object is refused); tensors it cannot place or that are missing are
named and nothing is written."""
import json
import os

import numpy as np
import torch

from pyref_common import TMP, gen, run_tests, script
from ref_model import RefModel
import safetensors_io as st

TOKS = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]

# a small trainer's names -> canonical: the map kda-cli --name-map would take
MAP = """# canonical                  trainer checkpoint
model.embeddings.weight        tok_emb.weight
model.norm.weight              final_ln.weight
model.layers.{N}.attn_norm.weight  blocks.{N}.ln1.weight
model.layers.{N}.mlp_norm.weight   blocks.{N}.ln2.weight
model.layers.{N}.attn.{*}      blocks.{N}.mix.{*}
model.layers.{N}.mlp.{*}       blocks.{N}.ffn.{*}
"""


def trainer_name(canon):
    return (canon.replace("model.embeddings.", "tok_emb.").replace("model.norm.", "final_ln.")
            .replace("model.layers.", "blocks.").replace(".attn_norm.", ".ln1.").replace(".mlp_norm.", ".ln2.")
            .replace(".attn.", ".mix.").replace(".mlp.", ".ffn."))


class NotWeights:  # pickling this needs code: weights_only must refuse it
    pass


def ints_only(j):
    """The config with its numbers as ints: Debian's torch 1.13 weights-only loader
    cannot read pickled floats (torch >= 2.0 can). norm_eps 1e-6 is the default."""
    if isinstance(j, dict):
        return {k: ints_only(v) for k, v in j.items() if not (k == "norm_eps" and v == 1e-6)}
    if isinstance(j, list):
        return [ints_only(v) for v in j]
    if isinstance(j, float):
        assert j == int(j), j
        return int(j)
    return j


def make_pt(name, extra=None, drop=None, wrap="module."):
    src = gen("pt-src", "--preset", "tiny", "--seed", "8", "--lower-bound", "-5", "--v-heads", "4")
    s = st.TensorStore(src)
    sd = {}
    for n in s.names():
        if n == drop:
            continue
        a = torch.from_numpy(np.array(s.get(n), dtype=np.float32))
        sd[wrap + trainer_name(n)] = a.to(torch.bfloat16) if s.dtype(n) == "BF16" else a
    sd.update(extra or {})
    with open(os.path.join(src, "config.json")) as fh:
        cfg = json.load(fh)
    a = cfg["attn"]  # rope_dim instead of the float partial_rotary_factor
    a["rope_dim"] = int(a.pop("partial_rotary_factor") * a["head_dim"])
    cfg = ints_only(cfg)
    path = os.path.join(TMP, name + ".pt")
    torch.save({"model": sd, "config": cfg, "step": 1200}, path)
    mp = os.path.join(TMP, "trainer.map")
    with open(mp, "w") as fh:
        fh.write(MAP)
    return src, path, mp


def test_trainer_checkpoint_imports_with_the_same_numbers():
    src, pt, mp = make_pt("ok")
    out = os.path.join(TMP, "imported")
    script("import_pt.py", pt, out, "--name-map", mp)
    names = st.TensorStore(out).names()
    assert "model.layers.0.attn.q_proj.weight" in names and "model.embeddings.weight" in names
    assert st.TensorStore(out).dtype("model.layers.0.attn.q_proj.weight") == "BF16"  # kept as stored
    want = RefModel(src).forward(TOKS)[0]
    got = RefModel(out).forward(TOKS)[0]
    assert torch.equal(got, want)


def test_pickled_code_is_refused():
    path = os.path.join(TMP, "evil.pt")
    torch.save({"model": {"w": torch.zeros(2)}, "config": NotWeights()}, path)
    r = script("import_pt.py", path, os.path.join(TMP, "evil-out"), check=False)
    assert r.returncode != 0 and "weights_only" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(TMP, "evil-out"))


def test_unplaced_and_missing_tensors_are_named():
    _, pt, mp = make_pt("extra", extra={"module.blocks.0.mix.lora_A": torch.zeros(4, 4)},
                        drop="model.layers.1.attn.A_log")
    out = os.path.join(TMP, "extra-out")
    r = script("import_pt.py", pt, out, "--name-map", mp, check=False)
    assert r.returncode != 0
    assert "blocks.0.mix.lora_A" in r.stderr and "could not place" in r.stderr, r.stderr
    assert "model.layers.1.attn.A_log" in r.stderr and "missing" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(out, "model.safetensors"))


def test_allow_unused_leaves_extras_out():
    src, pt, mp = make_pt("extra2", extra={"module.blocks.0.mix.lora_A": torch.zeros(4, 4)}, wrap="")
    out = os.path.join(TMP, "extra2-out")
    r = script("import_pt.py", pt, out, "--name-map", mp, "--allow-unused", "--dtype", "f32")
    assert "left out 1" in r
    assert not any("lora" in n for n in st.TensorStore(out).names())
    assert st.TensorStore(out).dtype("model.layers.0.attn.q_proj.weight") == "F32"
    assert torch.equal(RefModel(out).forward(TOKS)[0], RefModel(src).forward(TOKS)[0])


if __name__ == "__main__":
    run_tests(globals())

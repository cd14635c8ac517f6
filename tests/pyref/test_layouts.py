"""Checkpoint layouts: the same random weights under the fla and HF name
schemes, a separate or interleaved GQA gate, one file or shards, give the
same logits; a wrongly interleaved gate does not."""
import os

import numpy as np
import torch

from pyref_common import TMP, gen, rel, run_tests
from ref_model import RefModel
import safetensors_io as st

TOKS = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 72, 105]


def logits(d):
    return RefModel(d).forward(TOKS)[0]


def test_name_schemes_gate_layouts_and_shards_agree():
    base = gen("fla-sep", "--preset", "tiny", "--seed", "3")
    ref = logits(base)
    assert float(ref.std()) > 0.5  # not degenerate
    for args in (["--scheme", "hf"], ["--gate", "interleaved"], ["--scheme", "hf", "--gate", "interleaved"],
                 ["--shards", "3"], ["--scheme", "hf", "--gate", "interleaved", "--shards", "4"]):
        d = gen("v-" + "-".join(a.strip("-") for a in args), "--preset", "tiny", "--seed", "3", *args)
        names = st.TensorStore(d).names()
        if "hf" in args:
            assert "model.embed_tokens.weight" in names and "model.layers.0.input_layernorm.weight" in names
        if "interleaved" in args:
            assert not any(n.endswith("self_attn.g_proj.weight") or n.endswith("attn.g_proj.weight")
                           for n in names if ".layers.3." in n)
        assert torch.equal(logits(d), ref), args


def test_llama_kda_sharded_equals_single_file():
    a = gen("llama-1", "--preset", "llama-tiny", "--seed", "4")
    b = gen("llama-3", "--preset", "llama-tiny", "--seed", "4", "--shards", "3")
    assert os.path.exists(os.path.join(b, "model.safetensors.index.json"))
    assert torch.equal(logits(a), logits(b))


def rewrite_gate(src, name, fuse):
    """Copies checkpoint src with layer 3's q_proj/g_proj fused by `fuse` (done
    here, independently of the generator)."""
    s = st.TensorStore(src)
    m = "model.layers.3.attn."
    tensors = {n: ("F32", s.get(n)) for n in s.names() if n not in (m + "q_proj.weight", m + "g_proj.weight")}
    tensors[m + "q_proj.weight"] = ("F32", fuse(s.get(m + "q_proj.weight"), s.get(m + "g_proj.weight")))
    d = os.path.join(TMP, name)
    os.makedirs(d)
    st.save(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(src, "config.json")) as fi, open(os.path.join(d, "config.json"), "w") as fo:
        fo.write(fi.read())
    return d


def test_interleaved_gate_is_per_head_not_stacked():
    src = gen("gate-src", "--preset", "tiny", "--seed", "5", "--dtype", "f32")
    hd, Hq = 16, 4

    def per_head(q, g):
        return np.stack([q.reshape(Hq, hd, -1), g.reshape(Hq, hd, -1)], axis=1).reshape(2 * Hq * hd, -1)

    good = rewrite_gate(src, "gate-good", per_head)
    bad = rewrite_gate(src, "gate-bad", lambda q, g: np.concatenate([q, g], axis=0))
    ref = logits(src)
    assert rel(logits(good), ref) < 1e-14
    assert rel(logits(bad), ref) > 1e-3


def test_mixed_dtypes_load_and_untied_head_is_used():
    d = gen("mixed", "--preset", "tiny", "--dtype", "mixed")
    assert {st.TensorStore(d).dtype(n) for n in st.TensorStore(d).names()} == {"F32", "F16", "BF16"}
    assert torch.isfinite(logits(d)).all()
    t = gen("tied", "--preset", "tiny", "--seed", "9")
    u = gen("untied", "--preset", "tiny", "--seed", "9", "--untied")
    lt, lu = logits(t), logits(u)
    assert rel(lu, lt) > 0.1
    # untied logits are exactly the final hidden state times lm_head: swap in the embedding
    s = st.TensorStore(u)
    tensors = {n: (s.dtype(n), s.get(n)) for n in s.names()}
    tensors["lm_head.weight"] = tensors["model.embeddings.weight"]
    d2 = os.path.join(TMP, "untied-as-tied")
    os.makedirs(d2)
    st.save(os.path.join(d2, "model.safetensors"), tensors)
    with open(os.path.join(u, "config.json")) as fi, open(os.path.join(d2, "config.json"), "w") as fo:
        fo.write(fi.read())
    assert torch.equal(logits(d2), lt)


if __name__ == "__main__":
    run_tests(globals())

"""A few CPU training steps on a tiny config lower the loss, and the run
exports a checkpoint directory in the canonical form (MODEL_SPEC 5)."""
import json
import math
import os

from trainer_common import TINY, TMP, corpus, logged_losses, run_tests, train
import kda_torch as kt

DATA = corpus()
RUN = os.path.join(TMP, "steps")


def test_loss_falls_and_export_is_canonical():
    out = train("--data", DATA, "--out", RUN, *TINY, "--ctx", "32", "--batch", "8", "--steps", "40",
                "--warmup", "5", "--lr", "3e-3", "--log-every", "5", "--eval-every", "0", "--export-dtype", "f32",
                "--sample-len", "8")
    losses = logged_losses(out)
    assert len(losses) == 8, out
    # uniform over 256 bytes is ln 256 = 5.55; the toy grammar is learnable in 40 steps
    assert losses[0] > 4.0 and losses[-1] < losses[0] - 1.5, losses
    res = json.load(open(os.path.join(RUN, "result.json")))
    assert res["heldout"]["nats_per_token"] < math.log(256) - 1.5, res["heldout"]

    exp = os.path.join(RUN, "export")
    cfg = json.load(open(os.path.join(exp, "config.json")))
    assert cfg["model_type"] == "kda" and cfg["tokenizer"] == "bytes"
    assert cfg["attn"]["layers"] == [2] and cfg["bos_token_id"] is None
    for key, want in (("use_short_conv", True), ("hidden_act", "swish"), ("allow_neg_eigval", False),
                      ("safe_gate", False), ("lower_bound", None)):
        assert cfg[key] == want, key
    for key, want in (("qkv_bias", False), ("qk_norm", True), ("output_gate", True), ("window_size", None)):
        assert cfg["attn"][key] == want, key
    sd = kt.load_safetensors(os.path.join(exp, "model.safetensors"))
    assert tuple(sd["model.layers.0.attn.q_conv1d.weight"].shape) == (32, 1, 4)
    assert tuple(sd["model.layers.0.attn.f_proj.0.weight"].shape) == (16, 32)    # [V, D]
    assert tuple(sd["model.layers.0.attn.f_proj.1.weight"].shape) == (32, 16)    # [H*K, V]
    assert tuple(sd["model.layers.0.attn.A_log"].shape) == (2,)
    assert tuple(sd["model.layers.0.attn.g_proj.1.bias"].shape) == (32,)
    assert tuple(sd["model.layers.2.attn.k_proj.weight"].shape) == (16, 32)      # one KV head of 16
    assert tuple(sd["model.layers.2.attn.q_norm.weight"].shape) == (16,)
    assert "lm_head.weight" not in sd   # tied
    assert not [k for k in sd if not k.startswith("model.")]


def test_bf16_export_rounds_to_nearest_even():
    import numpy as np
    import torch
    a = np.array([1.0, 1.00390625, 1.01171875, -2.5], dtype=np.float32)
    # 1+2^-8 is a tie -> even (1.0); 1+3*2^-8 is a tie -> even (1+2^-6)
    b = kt.bf16_bits_to_f32(kt.f32_to_bf16_bits(a))
    assert list(b) == [1.0, 1.0, 1.015625, -2.5], b
    # and agrees with PyTorch's own float -> bfloat16 conversion on wide-range values, denormals included
    r = (np.random.RandomState(0).standard_normal(100000) * 10.0 ** np.random.RandomState(1).uniform(-42, 38, 100000))
    r = r.astype(np.float32)
    want = torch.from_numpy(r).to(torch.bfloat16).float().numpy()
    got = kt.bf16_bits_to_f32(kt.f32_to_bf16_bits(r))
    assert np.array_equal(got, want)


if __name__ == "__main__":
    run_tests(globals())

"""export -> kda-cli score gives the trainer model's own per-token log-probs.

Tolerance 1e-4 nats per token (absolute). Both sides compute in fp32 from the
same stored weights; they differ only in summation order (BLAS vs the
engine's loops) and in the KDA form (chunked here, per-token recurrence in
the engine), which moves log-probs by ~1e-6 (observed max 6e-6). Real
disagreements in the math move them far more: tried by hand on this model,
interleaved instead of NeoX RoPE pairs 0.6, o_norm eps 1e-4 instead of 1e-6
2.6, L2-norm eps 1e-3 instead of 1e-6 2e-3. So 1e-4 has margin both ways.
The model is randomly initialised and then sharpened (larger weights, varied
decays) so the log-probs spread over several nats instead of sitting at
ln(1/256).
"""
import os
import sys

import torch
import torch.nn.functional as F

from trainer_common import TMP, cli_score, kda_cli, run_tests
import kda_torch as kt

CLI = kda_cli()
if CLI is None:
    print("SKIP: kda-cli not built (set KDA_BUILD)")
    sys.exit(77)

TOL = 1e-4


def sharp_model(seed=0, **over):
    torch.manual_seed(seed)
    kw = dict(hidden_size=64, num_hidden_layers=4, num_heads=2, head_dim=32, intermediate_size=96,
              attn={"layers": [1, 3], "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                    "partial_rotary_factor": 0.5, "rope_theta": 500.0})
    kw.update(over)
    m = kt.KDAForCausalLM(kt.KDAConfig(**kw))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))       # norms that are not all ones
            elif name.endswith(("dt_bias", "A_log", "g_proj.1.bias")):
                p.add_(0.5 * torch.randn_like(p))
            elif p.dim() == 2:
                p.mul_(8.0 if "embeddings" in name else 4.0)
    return m


def torch_logprobs(m, ids):
    with torch.no_grad():
        lp = F.log_softmax(m(torch.tensor([ids]))[0].double(), -1)
    return lp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def check(m, d, dtype, ids):
    kt.export_model(m, d, dtype=dtype)
    ref = torch_logprobs(kt.load_exported(d), ids)      # the weights exactly as stored
    got = torch.tensor(cli_score(CLI, d, ids), dtype=torch.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert ref.std() > 0.5, "model too flat for a meaningful comparison: %s" % ref.std()
    err = (got - ref).abs().max().item()
    print("    %s: %d tokens, max |dlogprob| %.2e, mean logprob %.3f" % (dtype, len(ids) - 1, err, ref.mean()))
    assert err < TOL, err


def test_f32_export_scores_like_the_trainer():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (150,), generator=g).tolist()   # longer than a KDA chunk of 64
    check(sharp_model(), os.path.join(TMP, "f32"), "F32", ids)


def test_bf16_export_scores_like_the_rounded_model():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 256, (90,), generator=g).tolist()
    check(sharp_model(seed=3), os.path.join(TMP, "bf16"), "BF16", ids)


def test_untied_head_and_pattern_variants():
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 256, (70,), generator=g).tolist()
    m = sharp_model(seed=5, tie_word_embeddings=False, num_hidden_layers=3, expand_v=2.0,
                    attn={"layers": [0], "num_heads": 2, "num_kv_heads": 2, "head_dim": 32,
                          "partial_rotary_factor": 0.25, "rope_theta": 10000.0})
    check(m, os.path.join(TMP, "untied"), "F32", ids)


if __name__ == "__main__":
    run_tests(globals())

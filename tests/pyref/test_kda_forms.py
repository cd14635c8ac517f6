"""KDA: the per-token recurrence means what MODEL_SPEC 3.6 says, and the
chunked WY form computes the same function (fp64, rel err < 1e-10)."""
import torch

from pyref_common import gen, rel, run_tests
from ref_model import RefModel, kda_chunked, kda_recurrent, l2_norm

f64 = torch.float64


def inputs(seed, T, H, K, V, decay=2.0, s0=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)  # noqa: E731
    q = l2_norm(r(T, H, K)) * K ** -0.5
    k = l2_norm(r(T, H, K))
    v = r(T, H, V)
    gk = -torch.rand(T, H, K, generator=g, dtype=f64) * decay
    beta = torch.sigmoid(r(T, H))
    S0 = r(H, K, V) if s0 else torch.zeros(H, K, V, dtype=f64)
    return q, k, v, gk, beta, S0


def test_one_token_from_zero_state_reads_its_own_write():
    q, k, v, gk, beta, S0 = inputs(1, 1, 2, 4, 3, s0=False)
    o, S = kda_recurrent(q, k, v, gk, beta, S0)
    # S = k (beta v)^T, o = S^T q = beta (k . q) v
    want = beta[0][:, None] * (k[0] * q[0]).sum(-1)[:, None] * v[0]
    assert rel(o[0], want) < 1e-14
    assert rel(S, k[0][:, :, None] * (beta[0][:, None] * v[0])[:, None, :]) < 1e-14


def test_zero_beta_only_decays_the_state():
    q, k, v, gk, beta, S0 = inputs(2, 3, 2, 4, 3)
    o, S = kda_recurrent(q, k, v, gk, torch.zeros_like(beta), S0)
    want = S0 * torch.exp(gk.sum(0))[:, :, None]
    assert rel(S, want) < 1e-14
    assert rel(o[2], torch.einsum("hk,hkv->hv", q[2], want)) < 1e-14


def test_beta_one_stores_v_exactly_for_a_unit_key():
    # with beta = 1 and |k| = 1 the delta rule overwrites: S^T k = v after the write
    q, k, v, gk, beta, S0 = inputs(3, 1, 2, 8, 5)
    kn = k[0] / k[0].norm(dim=-1, keepdim=True)
    o, S = kda_recurrent(q, kn[None], v, gk, torch.ones_like(beta), S0)
    assert rel(torch.einsum("hk,hkv->hv", kn, S), v[0]) < 1e-12


def test_chunked_equals_recurrent_on_random_inputs():
    worst = 0.0
    for seed, T, H, K, V, decay, chunk in [(0, 1, 2, 8, 8, 2.0, 64), (1, 5, 3, 16, 8, 2.0, 64),
                                           (2, 63, 2, 16, 16, 1.0, 64), (3, 64, 2, 16, 16, 1.0, 64),
                                           (4, 65, 2, 16, 24, 1.0, 64), (5, 200, 4, 32, 16, 0.5, 64),
                                           (6, 150, 2, 16, 16, 20.0, 64),   # near-total decay
                                           (7, 150, 2, 16, 16, 1e-4, 64),   # almost no decay
                                           (8, 100, 2, 16, 16, 1.0, 16)]:
        args = inputs(seed, T, H, K, V, decay)
        o1, s1 = kda_recurrent(*args)
        o2, s2 = kda_chunked(*args, chunk=chunk)
        worst = max(worst, rel(o2, o1), rel(s2, s1))
        assert torch.isfinite(o2).all()
    assert worst < 1e-10, worst


def test_model_logits_same_with_chunked_kda():
    for preset in ("tiny", "llama-tiny"):
        d = gen("forms-" + preset, "--preset", preset)
        toks = [(i * 37 + 11) % 256 for i in range(150)]  # > 2 chunks of 64
        a, _ = RefModel(d).forward(toks)
        b, _ = RefModel(d, kda_mode="chunked").forward(toks)
        assert rel(b, a) < 1e-10, (preset, rel(b, a))


if __name__ == "__main__":
    run_tests(globals())

"""The chunked KDA that training runs is the same function as the per-token
recurrence of MODEL_SPEC 3.6 (float64, tiny sizes), values and gradients,
also under decay strong enough that exp(-cumulative decay) would overflow."""
import torch

from trainer_common import run_tests
import kda_torch as kt


def inputs(B=2, H=3, T=37, K=8, V=5, decay=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    q = kt.l2_norm(r(B, H, T, K)) * K ** -0.5
    k = kt.l2_norm(r(B, H, T, K))
    v = r(B, H, T, V)
    gk = -torch.rand(B, H, T, K, generator=g, dtype=torch.float64) * decay
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    return q, k, v, gk, beta


def test_chunked_equals_per_token_for_every_chunk_length():
    x = inputs()
    o_ref, s_ref = kt.kda_recurrent(*x)
    for chunk in (1, 3, 8, 16, 64):   # 37 tokens: partial last chunk, and one chunk longer than T
        o, s = kt.kda_chunked(*x, chunk=chunk)
        assert (o - o_ref).abs().max() < 1e-12, (chunk, (o - o_ref).abs().max())
        assert (s - s_ref).abs().max() < 1e-12, (chunk, (s - s_ref).abs().max())


def test_chunked_continues_from_a_given_state():
    x = inputs(T=20)
    _, s0 = kt.kda_recurrent(*(t[:, :, :7] for t in x))
    o_ref, _ = kt.kda_recurrent(*(t[:, :, 7:] for t in x), state=s0.clone())
    o, _ = kt.kda_chunked(*(t[:, :, 7:] for t in x), chunk=4, state=s0.clone())
    assert (o - o_ref).abs().max() < 1e-12


def test_strong_decay_stays_finite_and_exact():
    # cumulative decay reaches -30 * 64 per chunk: exp(+Gam) would be inf even in float64
    x = inputs(T=64, decay=30.0)
    o_ref, _ = kt.kda_recurrent(*x)
    o, _ = kt.kda_chunked(*x, chunk=64)
    assert torch.isfinite(o).all()
    assert (o - o_ref).abs().max() < 1e-12


def test_gradients_match_per_token():
    def grads(fn):
        x = [t.clone().requires_grad_(True) for t in inputs(T=21)]
        o, s = fn(*x)
        (o.pow(2).sum() + s.sum()).backward()
        return [t.grad for t in x]
    g_ref = grads(kt.kda_recurrent)
    g_chk = grads(lambda *x: kt.kda_chunked(*x, chunk=8))
    for a, b in zip(g_ref, g_chk):
        assert (a - b).abs().max() < 1e-10, (a - b).abs().max()


def test_model_forward_same_with_either_form():
    c = kt.KDAConfig(hidden_size=32, num_hidden_layers=2, num_heads=2, head_dim=16, intermediate_size=64,
                     attn={"layers": [1], "num_heads": 2, "num_kv_heads": 1, "head_dim": 16})
    torch.manual_seed(0)
    m = kt.KDAForCausalLM(c).double()
    x = torch.randint(0, 256, (2, 45))
    m.set_kda_impl("recurrent")
    a = m(x)
    m.set_kda_impl("chunked", 16)
    b = m(x)
    assert (a - b).abs().max() < 1e-10


if __name__ == "__main__":
    run_tests(globals())

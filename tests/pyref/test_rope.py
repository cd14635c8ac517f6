"""RoPE: the reference's vectorised rotation against a hand-written one
(MODEL_SPEC 4: NeoX half split inside the first rope_dim dims)."""
import math

import torch

from pyref_common import run_tests
from ref_model import rope


def by_hand(x, pos, rope_dim, theta):
    T, H, hd = x.shape
    y = x.clone()
    half = rope_dim // 2
    for t in range(T):
        for h in range(H):
            for i in range(half):
                a = pos[t] * theta ** (-2.0 * i / rope_dim)
                c, s = math.cos(a), math.sin(a)
                x0, x1 = float(x[t, h, i]), float(x[t, h, i + half])
                y[t, h, i] = x0 * c - x1 * s
                y[t, h, i + half] = x1 * c + x0 * s
    return y


def test_matches_hand_rotation_partial_and_full():
    g = torch.Generator().manual_seed(0)
    for hd, rd, theta, pos in [(16, 8, 1e4, list(range(7))), (128, 32, 1e7, [0, 1, 5, 8191]),
                               (16, 16, 1e6, [3, 100, 4095])]:
        x = torch.randn(len(pos), 3, hd, generator=g, dtype=torch.float64)
        got = rope(x, torch.tensor(pos), rd, theta)
        want = by_hand(x, pos, rd, theta)
        assert float((got - want).abs().max()) < 1e-12, (hd, rd)
        assert torch.equal(got[..., rd:], x[..., rd:])  # pass-through dims untouched


def test_position_zero_is_identity_and_norms_are_kept():
    x = torch.randn(4, 2, 16, dtype=torch.float64)
    assert torch.allclose(rope(x, torch.zeros(4, dtype=torch.long), 8, 1e4), x, atol=0, rtol=0)
    y = rope(x, torch.arange(4), 8, 1e4)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-12)


def test_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 32, generator=g, dtype=torch.float64).expand(6, 1, 32)
    k = torch.randn(1, 1, 32, generator=g, dtype=torch.float64).expand(6, 1, 32)
    qa = rope(q, torch.tensor([5, 10, 105, 7, 12, 107]), 32, 1e4)
    ka = rope(k, torch.tensor([2, 7, 102, 2, 7, 102]), 32, 1e4)
    s = (qa * ka).sum(-1).flatten()
    assert torch.allclose(s[:3], s[0].expand(3), atol=1e-10)  # offset 3 everywhere
    assert not torch.allclose(s[0], s[3], atol=1e-6)           # offset 5 differs


if __name__ == "__main__":
    run_tests(globals())

"""The CPU-side pieces of scripts/make_fla_fixtures.py, whose output is the
truth tests/fixtures/fla/ holds: the stand-in for flash-attn (fla's attention
needs it; the GPU machine lacks it) must compute flash_attn_func's semantics,
and the written kda_layer_types must follow Mercity's layout order, as
ref_model (and config.c) read it."""
import math
import types

import torch

from pyref_common import run_tests
import make_fla_fixtures as F
from ref_model import Config


def naive_attention(q, k, v, window):
    """Causal softmax attention by the definition, GQA groups, bottom-right aligned,
    keys t - window + 1 .. t (window None: all)."""
    B, Tq, H, d = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    out = torch.zeros_like(q)
    for t in range(Tq):
        pos = t + Tk - Tq
        lo = 0 if window is None else max(0, pos - window + 1)
        for h in range(H):
            kh = h // (H // Hkv)
            s = torch.stack([q[0, t, h] @ k[0, j, kh] for j in range(lo, pos + 1)]) / math.sqrt(d)
            p = torch.softmax(s, 0)
            out[0, t, h] = sum(p[i] * v[0, lo + i, kh] for i in range(len(p)))
    return out


def test_attention_stand_in_matches_flash_attn_semantics():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 19, n, 8, generator=g, dtype=torch.float64) for n in (4, 2, 2))
    for window in (None, 1, 5):
        ws = (-1, -1) if window is None else (window - 1, 0)   # how fla.layers.attn passes it
        got = F.flash_attn_sdpa(q, k, v, causal=True, window_size=ws)
        assert float((got - naive_attention(q, k, v, window)).abs().max()) < 1e-12, window
        # decoding: the last query against all keys gives the last row
        last = F.flash_attn_sdpa(q[:, -1:], k, v, causal=True, window_size=ws)
        assert float((last[0, 0] - got[0, -1]).abs().max()) < 1e-12, window


def test_written_layout_is_the_one_mercity_and_ref_model_resolve():
    layouts = [dict(kda_full_attn_every=2), dict(kda_full_attn_every=3), dict(kda_full_attn_layers=[0, 5]),
               dict(kda_full_attn_range=[2, 4]), dict(kda_every=3, kda_offset=1), dict(kda_every=2, kda_offset=-1),
               dict(kda_full_attn_every=2, kda_every=3), {}]
    for lay in layouts:
        c = types.SimpleNamespace(num_hidden_layers=6, **dict(F.MERCITY, **lay))
        types_written = F.resolve_layout(c)
        j = dict(F.LLAMA, num_hidden_layers=6, model_type="llama_kda", **dict(F.MERCITY, **lay))
        j.pop("kda_layer_types", None)
        want = ["full" if k == "G" else "kda" for k in Config(j).kinds]
        assert types_written == want, (lay, types_written, want)


if __name__ == "__main__":
    run_tests(globals())

"""ref_model.py - an independent reference forward pass for hybrid KDA/GQA
checkpoints, written from /work/shared/MODEL_SPEC.md alone (never from the
engine's C code), in float64 torch by default so it can judge the fp32
engine. Both families (kda, llama_kda), both name schemes (fla, HF), both
GQA gate layouts (separate g_proj, interleaved in q_proj), tied or untied
head, single file or shards, any mix of BF16/F16/F32 tensors.

    m = RefModel("ckpt/")                       # float64
    logits, state = m.forward([1, 5, 7])        # [T, vocab], state for continuing
    logits2, state = m.forward([9], state)      # one more token (decode)

KDA runs the exact per-token recurrence (MODEL_SPEC 3.6); `kda_mode="chunked"`
runs the chunked WY form (3, chunk 64), which the tests show is the same
function.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

# Weights are decoded once and kept: in the compute dtype when that fits in
# FULL_CACHE bytes, else as float32 (upcast per use) when that fits in F32_CACHE
# (the 1.7B: 6.7 GB), else decoded from the mapping on every use.
FULL_CACHE = 2 << 30
F32_CACHE = 10 << 30


# ---- config -------------------------------------------------------------------

class Config:
    """The numbers the forward pass needs, from either family's config.json."""

    def __init__(self, j):
        self.raw = j
        mt = j.get("model_type")
        if mt == "kda":
            self.family = "kda"
            for k in ("allow_neg_eigval", "safe_gate"):
                if j.get(k):
                    raise ValueError("config.json: %s = true is unsupported" % k)
            if j.get("lower_bound") is not None:
                raise ValueError("config.json: lower_bound is unsupported")
            if not j.get("use_short_conv", True):
                raise ValueError("config.json: use_short_conv = false is unsupported")
            self.d, self.n_layers = j["hidden_size"], j["num_hidden_layers"]
            self.kda_h, self.kda_k = j["num_heads"], j["head_dim"]
            self.kda_v = int(round(self.kda_k * j.get("expand_v", 1)))
            self.conv = j.get("conv_size", 4)
            self.eps = j.get("norm_eps", 1e-6)
            a = j.get("attn") or {"layers": []}
            attn_layers = set(a["layers"])
            self.kinds = ["G" if i in attn_layers else "K" for i in range(self.n_layers)]
            if attn_layers:
                if a.get("qkv_bias"):
                    raise ValueError("config.json: attn.qkv_bias = true is unsupported")
                if a.get("window_size") is not None:
                    raise ValueError("config.json: attn.window_size is unsupported")
                self.gqa_h, self.gqa_kvh = a["num_heads"], a["num_kv_heads"]
                self.gqa_hd = a.get("head_dim") or self.d // self.gqa_h
                self.rope_dim = int(round(self.gqa_hd * a.get("partial_rotary_factor", 1.0)))
                self.rope_theta = float(a.get("rope_theta", 10000.0))
                self.qk_norm = bool(a.get("qk_norm", False))
                self.output_gate = bool(a.get("output_gate", False))
        elif mt == "llama_kda":
            self.family = "llama_kda"
            self.d, self.n_layers = j["hidden_size"], j["num_hidden_layers"]
            self.kda_h, self.kda_k = j["kda_num_heads"], j["kda_head_dim"]
            self.kda_v = self.kda_k
            self.conv = j.get("kda_conv_size", 4)
            self.eps = j.get("rms_norm_eps", 1e-6)
            self.kinds = [{"kda": "K", "full": "G"}[t] for t in j["kda_layer_types"]]
            if len(self.kinds) != self.n_layers:
                raise ValueError("config.json: kda_layer_types has %d entries for %d layers"
                                 % (len(self.kinds), self.n_layers))
            self.gqa_h, self.gqa_kvh = j["num_attention_heads"], j["num_key_value_heads"]
            self.gqa_hd = j.get("head_dim") or self.d // self.gqa_h
            self.rope_dim = self.gqa_hd
            self.rope_theta = float(j.get("rope_theta", 10000.0))
            self.qk_norm = bool(j.get("qk_norm", False))
            self.output_gate = False
        else:
            raise ValueError("config.json: model_type %r is not kda or llama_kda" % mt)
        self.vocab = j["vocab_size"]
        self.ffn = j["intermediate_size"]
        self.tied = bool(j.get("tie_word_embeddings", False))
        self.bos, self.eos = j.get("bos_token_id", 1), j.get("eos_token_id", 2)


# ---- math pieces (module level so tests can call them) -------------------------------

def rms_norm(x, w, eps):
    """x * rsqrt(mean(x^2) + eps) * w over the last dim."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def l2_norm(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def rope(x, pos, rope_dim, theta):
    """GPT-NeoX half-split RoPE on the first rope_dim dims of x [T, heads, hd];
    pos [T] absolute positions. Pair (i, i + rope_dim/2), inv_freq theta^(-2i/rope_dim)."""
    half = rope_dim // 2
    i = torch.arange(half, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / rope_dim)
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]          # [T, half]
    cos = torch.cos(ang).to(x.dtype)[:, None, :]
    sin = torch.sin(ang).to(x.dtype)[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:rope_dim], x[..., rope_dim:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def short_conv(x, w, tail):
    """Causal depthwise conv + SiLU. x [T, C] raw inputs, w [C, 1, n] (w[:, 0, n-1]
    multiplies the current token), tail [n-1, C] the previous raw inputs (zeros at
    sequence start). Returns (y [T, C], new tail)."""
    n = w.shape[-1]
    xe = torch.cat([tail, x], dim=0)                                  # [n-1+T, C]
    T = x.shape[0]
    y = sum(w[:, 0, i] * xe[i:i + T] for i in range(n))
    return torch.nn.functional.silu(y), xe[xe.shape[0] - (n - 1):]


def kda_recurrent(q, k, v, g, beta, S):
    """Exact per-token KDA. q, k [T, H, K] (normalised, q scaled); v [T, H, V];
    g [T, H, K] log decay (<= 0); beta [T, H]; S [H, K, V]. Returns (o [T, H, V], S)."""
    T = q.shape[0]
    o = torch.empty(v.shape, dtype=v.dtype)
    for t in range(T):
        S = S * torch.exp(g[t])[:, :, None]                           # decay row d
        kS = torch.einsum("hk,hkv->hv", k[t], S)
        u = beta[t][:, None] * (v[t] - kS)                            # delta-rule correction
        S = S + k[t][:, :, None] * u[:, None, :]                      # rank-1 write
        o[t] = torch.einsum("hk,hkv->hv", q[t], S)                    # read after the write
    return o, S


def kda_chunked(q, k, v, g, beta, S, chunk=64):
    """The same function in chunked WY form (MODEL_SPEC 3). Only non-positive
    numbers are exponentiated: Gam and Gam_r - Gam_s with s <= r."""
    T, H, K = q.shape
    o = torch.empty(v.shape, dtype=v.dtype)
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        n = c1 - c0
        qc, kc, vc = q[c0:c1].transpose(0, 1), k[c0:c1].transpose(0, 1), v[c0:c1].transpose(0, 1)
        bc = beta[c0:c1].transpose(0, 1)                              # [H, n]
        Gam = torch.cumsum(g[c0:c1].transpose(0, 1), dim=1)           # [H, n, K]
        diff = Gam[:, :, None, :] - Gam[:, None, :, :]                # [H, r, s, K]
        incl = torch.tril(torch.ones(n, n, dtype=torch.bool))         # s <= r
        strict = torch.tril(torch.ones(n, n, dtype=torch.bool), -1)   # s < r
        E = torch.exp(diff.masked_fill(~incl[None, :, :, None], float("-inf")))
        KK = torch.einsum("hrd,hsd,hrsd->hrs", kc, kc, E)
        L = bc[:, :, None] * KK * strict[None]
        I = torch.eye(n, dtype=q.dtype).expand(H, n, n)
        A = torch.linalg.solve_triangular(I + L, I, upper=False, unitriangular=True)
        W = A @ (bc[:, :, None] * kc * torch.exp(Gam))                # [H, n, K]
        U = A @ (bc[:, :, None] * vc)                                 # [H, n, V]
        Vnew = U - W @ S
        QK = torch.einsum("hrd,hsd,hrsd->hrs", qc, kc, E)             # incl. diagonal
        O = (qc * torch.exp(Gam)) @ S + QK @ Vnew
        last = Gam[:, -1:, :]                                         # [H, 1, K]
        S = torch.exp(last).transpose(1, 2) * S + (kc * torch.exp(last - Gam)).transpose(1, 2) @ Vnew
        o[c0:c1] = O.transpose(0, 1)
    return o, S


# ---- the model ------------------------------------------------------------------

class RefModel:
    def __init__(self, d, dtype=torch.float64, kda_mode="recurrent", bf16_act=False):
        """bf16_act: round activations to bf16 where the CUDA backend stores them
        (GEMM inputs after RMSNorm, the KDA and GQA mixer outputs, the SwiGLU
        product, K/V as cached) -- the scale of difference bf16 storage alone makes."""
        with open(os.path.join(d, "config.json")) as fh:
            self.cfg = Config(json.load(fh))
        self.dtype, self.kda_mode, self.bf16_act = dtype, kda_mode, bf16_act
        self.store = st.TensorStore(d)
        self.scheme = self._detect_scheme()
        c = self.cfg
        n = self.n_params()
        esize = torch.tensor([], dtype=dtype).element_size()
        self.cache = {}
        self.cache_dtype = dtype if n * esize <= FULL_CACHE else torch.float32 if n * 4 <= F32_CACHE else None
        self._check_shapes()

    def act(self, x):
        """x, rounded to bf16 (round to nearest even) when emulating bf16 storage"""
        return x.to(torch.bfloat16).to(x.dtype) if self.bf16_act else x

    # names ------------------------------------------------------------------------
    def _detect_scheme(self):
        if "model.embeddings.weight" in self.store:
            return "fla"
        if "model.embed_tokens.weight" in self.store:
            return "hf"
        raise ValueError("no embedding tensor (model.embeddings.weight / model.embed_tokens.weight)")

    def name(self, role, layer=None):
        fla = self.scheme == "fla"
        if role == "embed":
            return "model.embeddings.weight" if fla else "model.embed_tokens.weight"
        if role == "final_norm":
            return "model.norm.weight"
        if role == "lm_head":
            return "lm_head.weight"
        p = "model.layers.%d." % layer
        if role == "attn_norm":
            return p + ("attn_norm.weight" if fla else "input_layernorm.weight")
        if role == "mlp_norm":
            return p + ("mlp_norm.weight" if fla else "post_attention_layernorm.weight")
        if role == "mlp":
            return p + "mlp."
        if role == "mixer":
            mix = p + ("attn." if fla else "self_attn.")
            if self.cfg.family == "llama_kda" and self.cfg.kinds[layer] == "K":
                mix += "kda."
            return mix
        raise KeyError(role)

    def _check_shapes(self):
        c = self.cfg
        D, F = c.d, c.ffn
        want = {self.name("embed"): (c.vocab, D), self.name("final_norm"): (D,)}
        if not c.tied:
            want[self.name("lm_head")] = (c.vocab, D)
        for i, kind in enumerate(c.kinds):
            want[self.name("attn_norm", i)] = (D,)
            want[self.name("mlp_norm", i)] = (D,)
            mp = self.name("mlp", i)
            want.update({mp + "gate_proj.weight": (F, D), mp + "up_proj.weight": (F, D),
                         mp + "down_proj.weight": (D, F)})
            m = self.name("mixer", i)
            if kind == "K":
                H, K, V = c.kda_h, c.kda_k, c.kda_v
                want.update({
                    m + "q_proj.weight": (H * K, D), m + "k_proj.weight": (H * K, D),
                    m + "v_proj.weight": (H * V, D),
                    m + "q_conv1d.weight": (H * K, 1, c.conv), m + "k_conv1d.weight": (H * K, 1, c.conv),
                    m + "v_conv1d.weight": (H * V, 1, c.conv),
                    m + "f_proj.0.weight": (V, D), m + "f_proj.1.weight": (H * K, V),
                    m + "b_proj.weight": (H, D), m + "A_log": (H,), m + "dt_bias": (H * K,),
                    m + "g_proj.0.weight": (V, D), m + "g_proj.1.weight": (H * V, V),
                    m + "g_proj.1.bias": (H * V,), m + "o_norm.weight": (V,),
                    m + "o_proj.weight": (D, H * V)})
            else:
                Hq, Hkv, hd = c.gqa_h, c.gqa_kvh, c.gqa_hd
                qrows = Hq * hd
                if c.output_gate and m + "g_proj.weight" not in self.store:
                    qrows = 2 * Hq * hd  # interleaved q|gate
                elif c.output_gate:
                    want[m + "g_proj.weight"] = (Hq * hd, D)
                want.update({m + "q_proj.weight": (qrows, D), m + "k_proj.weight": (Hkv * hd, D),
                             m + "v_proj.weight": (Hkv * hd, D), m + "o_proj.weight": (D, Hq * hd)})
                if c.qk_norm:
                    want.update({m + "q_norm.weight": (hd,), m + "k_norm.weight": (hd,)})
        for n, shape in want.items():
            if n not in self.store:
                raise ValueError("missing tensor %s" % n)
            if tuple(self.store.shape(n)) != tuple(shape):
                raise ValueError("tensor %s has shape %s, expected %s" % (n, self.store.shape(n), shape))

    def W(self, n):
        t = self.cache.get(n)
        if t is None:
            t = torch.from_numpy(np.array(self.store.get(n), dtype=np.float32))
            if self.cache_dtype is not None:
                t = t.to(self.cache_dtype)
                self.cache[n] = t
        return t.to(self.dtype)

    def n_params(self):
        return sum(st.numel(self.store.shape(n)) for n in self.store.names())

    # state ----------------------------------------------------------------------
    def new_state(self):
        c = self.cfg
        z = lambda *s: torch.zeros(*s, dtype=self.dtype)  # noqa: E731
        layers = []
        for kind in c.kinds:
            if kind == "K":
                H, K, V = c.kda_h, c.kda_k, c.kda_v
                layers.append({"q": z(c.conv - 1, H * K), "k": z(c.conv - 1, H * K),
                               "v": z(c.conv - 1, H * V), "S": z(H, K, V)})
            else:
                layers.append({"k": z(c.gqa_kvh, 0, c.gqa_hd), "v": z(c.gqa_kvh, 0, c.gqa_hd)})
        return {"pos": 0, "layers": layers}

    # layers ---------------------------------------------------------------------
    def kda(self, i, a, s):
        c, m = self.cfg, self.name("mixer", i)
        W = lambda n: self.W(m + n)  # noqa: E731
        T, H, K, V = a.shape[0], c.kda_h, c.kda_k, c.kda_v
        q, s["q"] = short_conv(a @ W("q_proj.weight").T, W("q_conv1d.weight"), s["q"])
        k, s["k"] = short_conv(a @ W("k_proj.weight").T, W("k_conv1d.weight"), s["k"])
        v, s["v"] = short_conv(a @ W("v_proj.weight").T, W("v_conv1d.weight"), s["v"])
        graw = (a @ W("f_proj.0.weight").T) @ W("f_proj.1.weight").T
        sp = torch.nn.functional.softplus(graw + W("dt_bias"), beta=1.0, threshold=20.0)
        g = (-torch.exp(W("A_log"))[:, None] * sp.view(T, H, K))      # [T, H, K], <= 0
        beta = torch.sigmoid(a @ W("b_proj.weight").T)                 # [T, H]
        q = l2_norm(q.view(T, H, K)) * (K ** -0.5)
        k = l2_norm(k.view(T, H, K))
        v = v.view(T, H, V)
        run = kda_recurrent if self.kda_mode == "recurrent" else kda_chunked
        o, s["S"] = run(q, k, v, g, beta, s["S"])
        G = (a @ W("g_proj.0.weight").T) @ W("g_proj.1.weight").T + W("g_proj.1.bias")
        y = rms_norm(o, W("o_norm.weight"), c.eps) * torch.sigmoid(G.view(T, H, V))
        return self.act(y.reshape(T, H * V)) @ W("o_proj.weight").T

    def gqa(self, i, a, s, pos):
        c, m = self.cfg, self.name("mixer", i)
        W = lambda n: self.W(m + n)  # noqa: E731
        T, Hq, Hkv, hd = a.shape[0], c.gqa_h, c.gqa_kvh, c.gqa_hd
        wq = W("q_proj.weight")
        gate = None
        if c.output_gate:
            if m + "g_proj.weight" in self.store:
                wg = W("g_proj.weight")
            else:  # rows 2*hd*h .. +hd: query head h, the next hd: its gate
                both = wq.view(Hq, 2, hd, -1)
                wq, wg = both[:, 0].reshape(Hq * hd, -1), both[:, 1].reshape(Hq * hd, -1)
            gate = torch.sigmoid(a @ wg.T)
        q = (a @ wq.T).view(T, Hq, hd)
        k = (a @ W("k_proj.weight").T).view(T, Hkv, hd)
        v = (a @ W("v_proj.weight").T).view(T, Hkv, hd)
        if c.qk_norm:
            q = rms_norm(q, W("q_norm.weight"), c.eps)
            k = rms_norm(k, W("k_norm.weight"), c.eps)
        p = torch.arange(pos, pos + T)
        q = rope(q, p, c.rope_dim, c.rope_theta)
        k = rope(k, p, c.rope_dim, c.rope_theta)
        k, v = self.act(k), self.act(v)                                # as cached
        s["k"] = torch.cat([s["k"], k.transpose(0, 1)], dim=1)         # [Hkv, pos+T, hd]
        s["v"] = torch.cat([s["v"], v.transpose(0, 1)], dim=1)
        rep = Hq // Hkv                                                # query head h uses KV head h // rep
        Kc = s["k"].repeat_interleave(rep, dim=0)                      # [Hq, N, hd]
        Vc = s["v"].repeat_interleave(rep, dim=0)
        sc = torch.einsum("thd,hnd->htn", q, Kc) / math.sqrt(hd)
        N = Kc.shape[1]
        mask = torch.arange(N)[None, :] > (p[:, None])                 # key after query
        sc = sc.masked_fill(mask[None], float("-inf"))
        o = torch.einsum("htn,hnd->thd", torch.softmax(sc, dim=-1), Vc).reshape(T, Hq * hd)
        if gate is not None:
            o = o * gate
        return self.act(o) @ W("o_proj.weight").T

    def forward(self, tokens, state=None):
        """tokens: list of ids. Returns (logits [T, vocab] in the compute dtype, state)."""
        c = self.cfg
        if state is None:
            state = self.new_state()
        toks = torch.tensor(list(tokens), dtype=torch.long)
        if len(toks) == 0:
            return torch.zeros(0, c.vocab, dtype=self.dtype), state
        if int(toks.min()) < 0 or int(toks.max()) >= c.vocab:
            raise ValueError("token id out of range 0..%d" % (c.vocab - 1))
        pos = state["pos"]
        h = self.W(self.name("embed"))[toks]
        for i, kind in enumerate(c.kinds):
            a = self.act(rms_norm(h, self.W(self.name("attn_norm", i)), c.eps))
            if kind == "K":
                h = h + self.kda(i, a, state["layers"][i])
            else:
                h = h + self.gqa(i, a, state["layers"][i], pos)
            mm = self.act(rms_norm(h, self.W(self.name("mlp_norm", i)), c.eps))
            mp = self.name("mlp", i)
            act = torch.nn.functional.silu(mm @ self.W(mp + "gate_proj.weight").T) * \
                (mm @ self.W(mp + "up_proj.weight").T)
            h = h + self.act(act) @ self.W(mp + "down_proj.weight").T
        h = self.act(rms_norm(h, self.W(self.name("final_norm")), c.eps))
        head = self.W(self.name("embed") if c.tied else self.name("lm_head"))
        state["pos"] = pos + len(toks)
        return h @ head.T, state


def _self_test():
    """recurrent vs chunked on random inputs (quick manual check; tests/pyref has the real ones)."""
    g = torch.Generator().manual_seed(0)
    T, H, K, V = 150, 3, 16, 8
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k = l2_norm(r(T, H, K)) * K ** -0.5, l2_norm(r(T, H, K))
    v, gk = r(T, H, V), -torch.rand(T, H, K, generator=g, dtype=torch.float64) * 2
    beta, S0 = torch.sigmoid(r(T, H)), r(H, K, V)
    o1, s1 = kda_recurrent(q, k, v, gk, beta, S0)
    o2, s2 = kda_chunked(q, k, v, gk, beta, S0)
    e = max(float((o1 - o2).norm() / o1.norm()), float((s1 - s2).norm() / s1.norm()))
    print("recurrent vs chunked: rel err %.3g" % e)
    return 0 if e < 1e-10 else 1


if __name__ == "__main__":
    sys.exit(_self_test())

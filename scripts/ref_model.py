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

def rope_inv_freq(dim, theta, kind="default", factor=1.0, low=1.0, high=4.0, orig=8192):
    """inv_freq[dim/2] of a RoPE schedule, float64. default: theta^(-2i/dim);
    linear: all divided by factor; llama3 (Llama 3.1): wavelengths 2 pi / f longer
    than orig/low divided by factor, shorter than orig/high kept, in between
    f * ((1 - s) / factor + s) with s = (orig / wavelen - low) / (high - low)."""
    i = torch.arange(dim // 2, dtype=torch.float64)
    f = theta ** (-2.0 * i / dim)
    if kind == "linear":
        return f / factor
    if kind == "llama3":
        wl = 2 * math.pi / f
        s = (orig / wl - low) / (high - low)
        mid = (1 - s) * f / factor + s * f
        return torch.where(wl > orig / low, f / factor, torch.where(wl < orig / high, f, mid))
    return f


class Config:
    """The numbers the forward pass needs, from either family's config.json:
    fla's KDAConfig (MODEL_SPEC 5, 5a) or Mercity's LlamaKDAConfig on transformers'
    LlamaConfig, 4.x or 5.x form (MODEL_SPEC 6)."""

    def __init__(self, j):
        self.raw = j
        mt = j.get("model_type")
        self.rope_kind, self.rope_args = "default", {}
        self.qkv_bias = self.o_bias = self.mlp_bias = False
        self.window = 0
        self.output_gate = self.qk_norm = False
        self.attnres = 0
        if mt == "kda":
            self.family = "kda"
            self.d, self.n_layers = j["hidden_size"], j["num_hidden_layers"]
            self._kda(j, "num_heads", "num_v_heads", "head_dim", "expand_v", "use_short_conv", "conv_size",
                      "conv_bias", "allow_neg_eigval", "safe_gate", "lower_bound")
            self.eps = self.qk_eps = j.get("norm_eps", 1e-6)
            self.attnres = j.get("attnres_block_size") or 0
            a = j.get("attn") or {"layers": []}
            specs = a if isinstance(a, list) else [a]
            attn_layers = set(l for sp in specs for l in sp["layers"])
            self.kinds = ["G" if i in attn_layers else "K" for i in range(self.n_layers)]
            if attn_layers:
                a = specs[0]  # the engine takes one attention layout; specs must agree
                self.gqa_h = a["num_heads"]
                self.gqa_kvh = a.get("num_kv_heads") or self.gqa_h
                self.gqa_hd = a.get("head_dim") or self.d // self.gqa_h      # fla: hidden / heads
                rd = a.get("rope_dim")
                self.rope_dim = rd if rd is not None else int(round(self.gqa_hd * a.get("partial_rotary_factor", 1.0)))
                self.rope_theta = float(a.get("rope_theta", 10000.0))
                self.qk_norm = bool(a.get("qk_norm", False))
                self.output_gate = bool(a.get("output_gate", False))
                self.qkv_bias = bool(a.get("qkv_bias", False))             # fla Attention: q, k, v biases
                self.window = a.get("window_size") or 0
            ffn = j.get("intermediate_size")
            if ffn is None:  # fla GatedMLP: 2/3 * ratio * d, up to a multiple of 256
                f = int(self.d * (j.get("hidden_ratio") or 4) * 2 / 3)
                ffn = 256 * ((f + 255) // 256)
            self.ffn = ffn
        elif mt == "llama_kda":
            self.family = "llama_kda"
            self.d, self.n_layers = j["hidden_size"], j["num_hidden_layers"]
            if j.get("kda_head_dim") is None:
                j = dict(j, kda_head_dim=128)
            if j.get("kda_num_heads") is None:
                j = dict(j, kda_num_heads=self.d // j["kda_head_dim"])
            self._kda(j, "kda_num_heads", "kda_num_v_heads", "kda_head_dim", "kda_expand_v", "kda_use_short_conv",
                      "kda_conv_size", "kda_conv_bias", "kda_allow_neg_eigval", "kda_safe_gate", "kda_lower_bound")
            self.eps = j.get("rms_norm_eps", 1e-6)
            self.qk_eps = j.get("qk_norm_eps") if j.get("qk_norm_eps") is not None else self.eps
            self.kinds = self._llama_layout(j)
            self.gqa_h = j["num_attention_heads"]
            self.gqa_kvh = j.get("num_key_value_heads") or self.gqa_h
            self.gqa_hd = j.get("head_dim") or self.d // self.gqa_h
            self.rope_dim = self.gqa_hd
            self.qk_norm = bool(j.get("qk_norm", False))
            self.qkv_bias = self.o_bias = bool(j.get("attention_bias", False))
            self.mlp_bias = bool(j.get("mlp_bias", False))
            rp = j.get("rope_parameters") or j.get("rope_scaling") or {}
            self.rope_theta = float(rp.get("rope_theta", j.get("rope_theta", 10000.0)))
            self.rope_kind = rp.get("rope_type", rp.get("type", "default"))
            if self.rope_kind not in ("default", "linear", "llama3"):
                raise ValueError("config.json: RoPE type %r is not implemented" % self.rope_kind)
            self.rope_args = {"factor": rp.get("factor", 1.0), "low": rp.get("low_freq_factor", 1.0),
                              "high": rp.get("high_freq_factor", 4.0),
                              "orig": rp.get("original_max_position_embeddings",
                                             j.get("max_position_embeddings", 2048))}
            self.ffn = j["intermediate_size"]
        else:
            raise ValueError("config.json: model_type %r is not kda or llama_kda" % mt)
        self.vocab = j["vocab_size"]
        self.tied = bool(j.get("tie_word_embeddings", False))
        self.bos, self.eos = j.get("bos_token_id", 1), j.get("eos_token_id", 2)
        if "G" in self.kinds:
            self.inv_freq = rope_inv_freq(self.rope_dim, self.rope_theta, self.rope_kind, **self.rope_args)

    def _kda(self, j, heads, vheads, hdim, ev, conv, csize, cbias, neg, safe, lb):
        self.kda_h, self.kda_k = j[heads], j[hdim]
        self.kda_hv = j.get(vheads) or self.kda_h          # GVA: value heads, a multiple of heads
        self.kda_v = int(round(self.kda_k * (j.get(ev) or 1)))
        self.short_conv = j.get(conv, True) is not False
        self.conv = j.get(csize) or 4
        self.conv_bias = bool(j.get(cbias, False)) and self.short_conv
        self.beta_scale = 2.0 if j.get(neg) else 1.0         # allow_neg_eigval
        self.lower_bound = j.get(lb)                         # set: the lower-bound gate (safe_gate: same math)
        if j.get(safe) and self.lower_bound is None:
            raise ValueError("config.json: safe_gate needs lower_bound")

    def _llama_layout(self, j):
        """kda_layer_types if given, else Mercity's order: kda_full_attn_layers >
        kda_full_attn_range [start, end) > kda_full_attn_every (last of every n) >
        kda_every (KDA where i % n == kda_offset)."""
        n = self.n_layers
        if j.get("kda_layer_types") is not None:
            kinds = [{"kda": "K", "full": "G"}[t] for t in j["kda_layer_types"]]
            if len(kinds) != n:
                raise ValueError("config.json: kda_layer_types has %d entries for %d layers" % (len(kinds), n))
            return kinds
        if j.get("kda_full_attn_layers") is not None:
            full = set(int(i) for i in j["kda_full_attn_layers"])
        elif j.get("kda_full_attn_range") is not None:
            a, b = j["kda_full_attn_range"]
            full = set(range(int(a), int(b)))
        elif j.get("kda_full_attn_every"):
            e = int(j["kda_full_attn_every"])
            full = {i for i in range(n) if (i + 1) % e == 0}
        elif j.get("kda_every"):
            e = int(j["kda_every"])
            off = int(j.get("kda_offset") or 0) % e
            full = {i for i in range(n) if i % e != off}
        else:
            full = set()
        if any(not 0 <= i < n for i in full):
            raise ValueError("config.json: full-attention layer out of range")
        return ["G" if i in full else "K" for i in range(n)]


# ---- math pieces (module level so tests can call them) -------------------------------

def rms_norm(x, w, eps):
    """x * rsqrt(mean(x^2) + eps) * w over the last dim."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def l2_norm(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def rope(x, pos, rope_dim, theta=None, inv_freq=None):
    """GPT-NeoX half-split RoPE on the first rope_dim dims of x [T, heads, hd];
    pos [T] absolute positions. Pair (i, i + rope_dim/2), inv_freq theta^(-2i/rope_dim)
    unless given (a scaled schedule, rope_inv_freq)."""
    half = rope_dim // 2
    if inv_freq is None:
        i = torch.arange(half, dtype=torch.float64)
        inv_freq = theta ** (-2.0 * i / rope_dim)
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]          # [T, half]
    cos = torch.cos(ang).to(x.dtype)[:, None, :]
    sin = torch.sin(ang).to(x.dtype)[:, None, :]
    x1, x2, rest = x[..., :half], x[..., half:rope_dim], x[..., rope_dim:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def short_conv(x, w, tail, bias=None):
    """Causal depthwise conv + SiLU. x [T, C] raw inputs, w [C, 1, n] (w[:, 0, n-1]
    multiplies the current token), tail [n-1, C] the previous raw inputs (zeros at
    sequence start), bias [C] added before the SiLU. Returns (y [T, C], new tail)."""
    n = w.shape[-1]
    xe = torch.cat([tail, x], dim=0)                                  # [n-1+T, C]
    T = x.shape[0]
    y = sum(w[:, 0, i] * xe[i:i + T] for i in range(n))
    if bias is not None:
        y = y + bias
    return torch.nn.functional.silu(y), xe[xe.shape[0] - (n - 1):]


def attnres(query, sources, norm_w, eps):
    """fla attention residuals for rows: sources a list of [T, D]; softmax over the
    sources of RMSNorm(source; norm_w) . query, then the weighted sum of the raw sources."""
    v = torch.stack(sources)                                          # [L, T, D]
    logits = (rms_norm(v, norm_w, eps) * query).sum(-1)               # [L, T]
    p = torch.softmax(logits, dim=0)
    return (p[:, :, None] * v).sum(0)


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


def tensor_name(c, scheme, role, layer=None):
    """The checkpoint name of a tensor role under the fla or HF scheme (MODEL_SPEC 5)."""
    fla = scheme == "fla"
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
        if c.family == "llama_kda" and c.kinds[layer] == "K":
            mix += "kda."
        return mix
    raise KeyError(role)


def expected_tensors(c, scheme, present=lambda n: False):
    """{name: shape} of every tensor config c needs under the scheme. present(name)
    tells whether a separate GQA g_proj exists (else the gate is fused into q_proj)."""
    name = lambda role, layer=None: tensor_name(c, scheme, role, layer)  # noqa: E731
    D, F = c.d, c.ffn
    want = {name("embed"): (c.vocab, D), name("final_norm"): (D,)}
    if not c.tied:
        want[name("lm_head")] = (c.vocab, D)
    if c.attnres:
        want.update({"model.res_proj.weight": (1, D), "model.res_norm.weight": (D,)})
    for i, kind in enumerate(c.kinds):
        want[name("attn_norm", i)] = (D,)
        want[name("mlp_norm", i)] = (D,)
        mp = name("mlp", i)
        want.update({mp + "gate_proj.weight": (F, D), mp + "up_proj.weight": (F, D),
                     mp + "down_proj.weight": (D, F)})
        if c.mlp_bias:
            want.update({mp + "gate_proj.bias": (F,), mp + "up_proj.bias": (F,), mp + "down_proj.bias": (D,)})
        if c.attnres:
            p = "model.layers.%d." % i
            want.update({p + "attn_res_proj.weight": (1, D), p + "attn_res_norm.weight": (D,),
                         p + "mlp_res_proj.weight": (1, D), p + "mlp_res_norm.weight": (D,)})
        m = name("mixer", i)
        if kind == "K":
            H, HV, K, V = c.kda_h, c.kda_hv, c.kda_k, c.kda_v
            want.update({
                m + "q_proj.weight": (H * K, D), m + "k_proj.weight": (H * K, D),
                m + "v_proj.weight": (HV * V, D),
                m + "f_proj.0.weight": (V, D), m + "f_proj.1.weight": (HV * K, V),
                m + "b_proj.weight": (HV, D), m + "A_log": (HV,), m + "dt_bias": (HV * K,),
                m + "g_proj.0.weight": (V, D), m + "g_proj.1.weight": (HV * V, V),
                m + "g_proj.1.bias": (HV * V,), m + "o_norm.weight": (V,),
                m + "o_proj.weight": (D, HV * V)})
            if c.short_conv:
                want.update({m + "q_conv1d.weight": (H * K, 1, c.conv), m + "k_conv1d.weight": (H * K, 1, c.conv),
                             m + "v_conv1d.weight": (HV * V, 1, c.conv)})
            if c.conv_bias:
                want.update({m + "q_conv1d.bias": (H * K,), m + "k_conv1d.bias": (H * K,),
                             m + "v_conv1d.bias": (HV * V,)})
        else:
            Hq, Hkv, hd = c.gqa_h, c.gqa_kvh, c.gqa_hd
            qrows = Hq * hd
            if c.output_gate and not present(m + "g_proj.weight"):
                qrows = 2 * Hq * hd  # interleaved q|gate
            elif c.output_gate:
                want[m + "g_proj.weight"] = (Hq * hd, D)
            want.update({m + "q_proj.weight": (qrows, D), m + "k_proj.weight": (Hkv * hd, D),
                         m + "v_proj.weight": (Hkv * hd, D), m + "o_proj.weight": (D, Hq * hd)})
            if c.qk_norm:
                want.update({m + "q_norm.weight": (hd,), m + "k_norm.weight": (hd,)})
            if c.qkv_bias:
                want.update({m + "q_proj.bias": (Hq * hd,), m + "k_proj.bias": (Hkv * hd,),
                             m + "v_proj.bias": (Hkv * hd,)})
            if c.o_bias:
                want[m + "o_proj.bias"] = (D,)
    return want


# ---- the model ------------------------------------------------------------------

class RefModel:
    def __init__(self, d, dtype=torch.float64, kda_mode="recurrent", bf16_act=False):
        """bf16_act: round activations to bf16 where the CUDA backend stores them
        (GEMM inputs after RMSNorm, the KDA and GQA mixer outputs, the MLP's gate
        and up projections without MLP biases, the SwiGLU product, K/V as cached) -- the scale of difference bf16 storage alone makes."""
        with open(os.path.join(d, "config.json")) as fh:
            self.cfg = Config(json.load(fh))
        self.dtype, self.kda_mode, self.bf16_act = dtype, kda_mode, bf16_act
        self.trace, self._layer = None, None   # forward(trace={}): intermediates by "L<i>.<name>"
        self.store = st.TensorStore(d)
        self.scheme = self._detect_scheme()
        c = self.cfg
        n = self.n_params()
        esize = torch.tensor([], dtype=dtype).element_size()
        self.cache = {}
        self.cache_dtype = dtype if n * esize <= FULL_CACHE else torch.float32 if n * 4 <= F32_CACHE else None
        self._check_shapes()

    def tr(self, name, x):
        """Records an intermediate when tracing (scripts/make_fla_fixtures.py compares
        them layer by layer with fla's)."""
        if self.trace is not None:
            self.trace["L%d.%s" % (self._layer, name) if self._layer is not None else name] = x.detach().clone()

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
        return tensor_name(self.cfg, self.scheme, role, layer)

    def _check_shapes(self):
        want = expected_tensors(self.cfg, self.scheme, lambda n: n in self.store)
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
                H, HV, K, V = c.kda_h, c.kda_hv, c.kda_k, c.kda_v
                layers.append({"q": z(c.conv - 1, H * K), "k": z(c.conv - 1, H * K),
                               "v": z(c.conv - 1, HV * V), "S": z(HV, K, V)})
            else:
                layers.append({"k": z(c.gqa_kvh, 0, c.gqa_hd), "v": z(c.gqa_kvh, 0, c.gqa_hd)})
        return {"pos": 0, "layers": layers}

    # layers ---------------------------------------------------------------------
    def kda(self, i, a, s):
        c, m = self.cfg, self.name("mixer", i)
        W = lambda n: self.W(m + n)  # noqa: E731
        T, H, HV, K, V = a.shape[0], c.kda_h, c.kda_hv, c.kda_k, c.kda_v
        qr, kr, vr = a @ W("q_proj.weight").T, a @ W("k_proj.weight").T, a @ W("v_proj.weight").T
        if c.short_conv:
            bias = (lambda n: W(n + "_conv1d.bias")) if c.conv_bias else (lambda n: None)  # noqa: E731
            q, s["q"] = short_conv(qr, W("q_conv1d.weight"), s["q"], bias("q"))
            k, s["k"] = short_conv(kr, W("k_conv1d.weight"), s["k"], bias("k"))
            v, s["v"] = short_conv(vr, W("v_conv1d.weight"), s["v"], bias("v"))
        else:  # fla use_short_conv=False: SiLU of the projections
            silu = torch.nn.functional.silu
            q, k, v = silu(qr), silu(kr), silu(vr)
        self.tr("q_conv", q), self.tr("k_conv", k), self.tr("v_conv", v)
        f = (a @ W("f_proj.0.weight").T) @ W("f_proj.1.weight").T
        self.tr("graw", f)
        graw = (f + W("dt_bias")).view(T, HV, K)
        A = torch.exp(W("A_log"))[:, None]                              # per value head
        if c.lower_bound is None:
            sp = torch.nn.functional.softplus(graw, beta=1.0, threshold=20.0)
            g = -A * sp                                                 # [T, HV, K], <= 0
        else:  # fla lower-bound gate: in [lower_bound, 0)
            g = c.lower_bound * torch.sigmoid(A * graw)
        braw = a @ W("b_proj.weight").T
        self.tr("braw", braw)
        self.tr("gate", g)
        beta = c.beta_scale * torch.sigmoid(braw)                       # [T, HV]
        q = l2_norm(q.view(T, H, K)) * (K ** -0.5)
        k = l2_norm(k.view(T, H, K))
        # GVA: value head j reads q/k head j // (HV / H)
        q, k = q.repeat_interleave(HV // H, dim=1), k.repeat_interleave(HV // H, dim=1)
        v = v.view(T, HV, V)
        run = kda_recurrent if self.kda_mode == "recurrent" else kda_chunked
        o, s["S"] = run(q, k, v, g, beta, s["S"])
        self.tr("o_kernel", o)
        G = (a @ W("g_proj.0.weight").T) @ W("g_proj.1.weight").T + W("g_proj.1.bias")
        y = rms_norm(o, W("o_norm.weight"), c.eps) * torch.sigmoid(G.view(T, HV, V))
        self.tr("o_gated", y)
        return self.act(y.reshape(T, HV * V)) @ W("o_proj.weight").T

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
        q, k, v = a @ wq.T, a @ W("k_proj.weight").T, a @ W("v_proj.weight").T
        if c.qkv_bias:
            q, k, v = q + W("q_proj.bias"), k + W("k_proj.bias"), v + W("v_proj.bias")
        q, k, v = q.view(T, Hq, hd), k.view(T, Hkv, hd), v.view(T, Hkv, hd)
        if c.qk_norm:
            q = rms_norm(q, W("q_norm.weight"), c.qk_eps)
            k = rms_norm(k, W("k_norm.weight"), c.qk_eps)
        p = torch.arange(pos, pos + T)
        q = rope(q, p, c.rope_dim, inv_freq=c.inv_freq)
        k = rope(k, p, c.rope_dim, inv_freq=c.inv_freq)
        k, v = self.act(k), self.act(v)                                # as cached
        s["k"] = torch.cat([s["k"], k.transpose(0, 1)], dim=1)         # [Hkv, pos+T, hd]
        s["v"] = torch.cat([s["v"], v.transpose(0, 1)], dim=1)
        rep = Hq // Hkv                                                # query head h uses KV head h // rep
        Kc = s["k"].repeat_interleave(rep, dim=0)                      # [Hq, N, hd]
        Vc = s["v"].repeat_interleave(rep, dim=0)
        sc = torch.einsum("thd,hnd->htn", q, Kc) / math.sqrt(hd)
        N = Kc.shape[1]
        key = torch.arange(N)[None, :]
        mask = key > p[:, None]                                        # key after query
        if c.window:                                                   # sliding window: the last W positions
            mask = mask | (key <= p[:, None] - c.window)
        sc = sc.masked_fill(mask[None], float("-inf"))
        o = torch.einsum("htn,hnd->thd", torch.softmax(sc, dim=-1), Vc).reshape(T, Hq * hd)
        if gate is not None:
            o = o * gate
        out = self.act(o) @ W("o_proj.weight").T
        return out + W("o_proj.bias") if c.o_bias else out

    def mlp(self, i, mm):
        c, mp = self.cfg, self.name("mlp", i)
        B = (lambda n: self.W(mp + n + ".bias")) if c.mlp_bias else (lambda n: 0)  # noqa: E731
        gate = mm @ self.W(mp + "gate_proj.weight").T + B("gate_proj")
        up = mm @ self.W(mp + "up_proj.weight").T + B("up_proj")
        if not c.mlp_bias:  # the CUDA backend's bf16 gate|up GEMM output (tuning gu_bf16)
            gate, up = self.act(gate), self.act(up)
        return self.act(torch.nn.functional.silu(gate) * up) @ self.W(mp + "down_proj.weight").T + B("down_proj")

    def forward(self, tokens, state=None, trace=None):
        """tokens: list of ids. Returns (logits [T, vocab] in the compute dtype, state).
        trace: a dict to fill with the intermediates (see tr)."""
        c = self.cfg
        self.trace, self._layer = trace, None
        if state is None:
            state = self.new_state()
        toks = torch.tensor(list(tokens), dtype=torch.long)
        if len(toks) == 0:
            return torch.zeros(0, c.vocab, dtype=self.dtype), state
        if int(toks.min()) < 0 or int(toks.max()) >= c.vocab:
            raise ValueError("token id out of range 0..%d" % (c.vocab - 1))
        pos = state["pos"]
        h = self.W(self.name("embed"))[toks]
        mixer = lambda i, a: (self.kda(i, a, state["layers"][i]) if c.kinds[i] == "K"  # noqa: E731
                              else self.gqa(i, a, state["layers"][i], pos))
        if c.attnres:
            h = self._attnres_layers(h, mixer)
        else:
            for i in range(c.n_layers):
                self._layer = i
                a = self.act(rms_norm(h, self.W(self.name("attn_norm", i)), c.eps))
                self.tr("a", a)
                y = mixer(i, a)
                self.tr("mixer_out", y)
                h = h + y
                mm = self.act(rms_norm(h, self.W(self.name("mlp_norm", i)), c.eps))
                y = self.mlp(i, mm)
                self.tr("mlp_out", y)
                h = h + y
                self.tr("h_out", h)
            self._layer = None
        h = self.act(rms_norm(h, self.W(self.name("final_norm")), c.eps))
        head = self.W(self.name("embed") if c.tied else self.name("lm_head"))
        state["pos"] = pos + len(toks)
        return h @ head.T, state


    def _attnres_layers(self, h, mixer):
        """fla's KDAModel with attnres_block_size B: before each sub-layer (2i the
        mixer, 2i+1 the MLP) its input is the RMSNorm (the sub-layer's own norm
        weight) of attnres over `blocks` (completed block sums, the embedding the
        first) plus the running partial sum; a sub-layer whose index is a multiple
        of B closes the partial sum into `blocks` first and starts a new one. The
        final norm reads attnres over blocks + the last partial sum."""
        c, B = self.cfg, self.cfg.attnres
        blocks, partial = [], h
        for i in range(c.n_layers):
            p, self._layer = "model.layers.%d." % i, i
            for sub, (proj, run) in enumerate((("attn_res", mixer), ("mlp_res", self.mlp))):
                srcs = blocks + [partial]
                norm_w = self.W(self.name("attn_norm" if sub == 0 else "mlp_norm", i))
                x = rms_norm(attnres(self.W(p + proj + "_proj.weight")[0], srcs,
                                     self.W(p + proj + "_norm.weight"), c.eps), norm_w, c.eps)
                if (2 * i + sub) % B == 0:
                    blocks, partial = srcs, None
                y = run(i, x)
                partial = y if partial is None else partial + y
        self._layer = None
        return attnres(self.W("model.res_proj.weight")[0], blocks + [partial], self.W("model.res_norm.weight"), c.eps)


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

"""kda_torch.py - the hybrid KDA:GQA model in PyTorch, for training and for
checking the engine (MODEL_SPEC.md sections 2-5 are the contract).

What lives here: the config (fla-style config.json in and out), the model
(nn.Modules named so that state_dict() keys ARE the checkpoint's tensor
names), the KDA recurrence in two exact forms (per-token loop: the oracle;
chunked: what training runs), and a dependency-free safetensors reader and
writer (json + numpy; Debian's python has no `safetensors`).

Works with Debian's python3-torch 1.13 on the CPU and with a current PyTorch
on CUDA. On CUDA, when flash-linear-attention is importable, KDA runs fla's
chunked Triton kernel instead of the PyTorch chunked form.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

# ----------------------------------------------------------------------------
# config

# Defaults are the demo model's shape; every key is what config.json carries.
DEFAULT_CONFIG = {
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "num_heads": 4,           # KDA heads
    "head_dim": 64,           # KDA key width K
    "expand_v": 1.0,          # KDA value width V = K * expand_v
    "conv_size": 4,
    "intermediate_size": 704,
    "norm_eps": 1e-6,
    "vocab_size": 256,
    "tie_word_embeddings": True,
    "bos_token_id": None,
    "eos_token_id": None,
    "max_position_embeddings": 2048,
    "tokenizer": "bytes",     # "bytes" or "sentencepiece" (tokenizer.model beside config.json)
    "attn": {
        "layers": [3, 7],
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 64,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    },
}


def layer_pattern_to_attn_layers(pattern, n_layers):
    """'KKKG' repeated over n_layers -> indices of the GQA layers."""
    pattern = pattern.upper()
    if not pattern or any(c not in "KG" for c in pattern):
        raise ValueError("layer pattern must be a string of K (KDA) and G (GQA), got %r" % pattern)
    return [i for i in range(n_layers) if pattern[i % len(pattern)] == "G"]


class KDAConfig:
    """Plain attribute bag over the config.json keys (fla naming)."""

    def __init__(self, **kw):
        c = json.loads(json.dumps(DEFAULT_CONFIG))
        attn = kw.pop("attn", None)
        c.update(kw)
        if attn:
            c["attn"].update(attn)
        self.__dict__.update(c)
        self.key_dim = self.num_heads * self.head_dim
        self.head_v_dim = int(self.head_dim * self.expand_v)
        self.value_dim = self.num_heads * self.head_v_dim
        a = self.attn
        if a["num_heads"] % a["num_kv_heads"]:
            raise ValueError("attn.num_heads must be a multiple of attn.num_kv_heads")
        self.rope_dim = int(a["head_dim"] * a["partial_rotary_factor"])
        if self.rope_dim % 2:
            raise ValueError("rotated dims (head_dim * partial_rotary_factor) must be even")
        for i in a["layers"]:
            if not 0 <= i < self.num_hidden_layers:
                raise ValueError("attn.layers has %d, outside 0..%d" % (i, self.num_hidden_layers - 1))

    def is_gqa(self, i):
        return i in self.attn["layers"]

    def to_json_dict(self):
        """The canonical fla-form config.json (MODEL_SPEC section 5)."""
        a = self.attn
        d = {
            "model_type": "kda",
            "architectures": ["KDAForCausalLM"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "expand_v": self.expand_v,
            "use_short_conv": True,
            "conv_size": self.conv_size,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "swish",
            "norm_eps": self.norm_eps,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "max_position_embeddings": self.max_position_embeddings,
            "allow_neg_eigval": False,
            "safe_gate": False,
            "lower_bound": None,
            "attn": {
                "layers": list(a["layers"]),
                "num_heads": a["num_heads"],
                "num_kv_heads": a["num_kv_heads"],
                "head_dim": a["head_dim"],
                "qkv_bias": False,
                "qk_norm": True,
                "rope_theta": a["rope_theta"],
                "partial_rotary_factor": a["partial_rotary_factor"],
                "output_gate": True,
                "window_size": None,
            },
        }
        if self.tokenizer == "bytes":
            d["tokenizer"] = "bytes"
        return d

    @classmethod
    def from_json_dict(cls, d):
        """Reads what to_json_dict writes; refuses variants this model does not compute."""
        d = dict(d)
        if d.get("model_type") != "kda":
            raise ValueError("model_type must be 'kda'")
        for key, want in (("use_short_conv", True), ("hidden_act", "swish"), ("allow_neg_eigval", False),
                          ("safe_gate", False), ("lower_bound", None)):
            if key in d and d[key] != want:
                raise ValueError("unsupported %s=%r" % (key, d[key]))
        a = dict(d.get("attn") or {})
        for key, want in (("qkv_bias", False), ("qk_norm", True), ("output_gate", True), ("window_size", None)):
            if key in a and a[key] != want:
                raise ValueError("unsupported attn.%s=%r" % (key, a[key]))
        keep = {k: d[k] for k in DEFAULT_CONFIG if k in d and k != "attn"}
        keep["tokenizer"] = "bytes" if d.get("tokenizer") == "bytes" else "sentencepiece"
        keep["attn"] = {k: a[k] for k in DEFAULT_CONFIG["attn"] if k in a}
        return cls(**keep)


# ----------------------------------------------------------------------------
# building blocks (all norms in fp32, weight applied as w, never 1 + w)

def f32(x):
    """At least fp32: half types are widened, fp64 (the tests' oracle runs) is kept."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def rms_norm(x, w, eps):
    xf = f32(x)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * f32(w)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps).type_as(x)


def l2_norm(x, eps=1e-6):
    # eps inside the sqrt, as fla's l2norm: x / sqrt(sum x^2 + eps)
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class ShortConv(nn.Module):
    """Causal depthwise conv + SiLU; weight [C, 1, taps], tap taps-1 is the current token."""

    def __init__(self, channels, taps):
        super().__init__()
        self.taps = taps
        self.weight = nn.Parameter(torch.empty(channels, 1, taps))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Conv1d's default

    def forward(self, x):  # x [B, T, C]
        T = x.shape[1]
        y = F.conv1d(x.transpose(1, 2), self.weight.to(x.dtype), padding=self.taps - 1, groups=x.shape[2])
        return F.silu(y[..., :T].transpose(1, 2))


# ----------------------------------------------------------------------------
# KDA recurrence. Inputs in the [B, H, T, *] layout:
#   q, k [B,H,T,K] (q already L2-normalised and scaled, k L2-normalised),
#   v [B,H,T,V], g [B,H,T,K] log-decay (<= 0), beta [B,H,T].
# Returns o [B,H,T,V] and the final state [B,H,K,V].

def kda_recurrent(q, k, v, g, beta, state=None):
    """Exact per-token recurrence, MODEL_SPEC 3.6. The oracle; slow (Python loop over T)."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    S = q.new_zeros(B, H, K, V) if state is None else state
    out = []
    for t in range(T):
        S = torch.exp(g[:, :, t]).unsqueeze(-1) * S                       # decay row d
        kt = k[:, :, t]
        u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
        S = S + kt.unsqueeze(-1) * u.unsqueeze(-2)                         # rank-1 write
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))          # read after write
    return torch.stack(out, 2), S


def kda_chunked(q, k, v, g, beta, chunk=16, state=None):
    """The chunked (WY) form of MODEL_SPEC section 3, exact in real arithmetic.

    Only non-positive numbers are ever exponentiated: cumulative decays Gam and
    differences Gam_r - Gam_s with s <= r (the rest are masked to -inf first),
    so nothing overflows however strong the decay. The intra-chunk pairwise
    decay is materialised per key channel ([..., C, C, K]); memory is
    O(T * chunk * K) per head, hence a small default chunk.
    """
    B, H, T, K = q.shape
    V = v.shape[-1]
    C = chunk
    pad = (-T) % C
    if pad:  # zero k, v, beta and zero decay leave the state untouched
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    N = (T + pad) // C
    q, k, g = (x.reshape(B, H, N, C, K) for x in (q, k, g))
    v = v.reshape(B, H, N, C, V)
    beta = beta.reshape(B, H, N, C)

    gam = g.cumsum(-2)                                              # [B,H,N,C,K]
    idx = torch.arange(C, device=q.device)
    incl = idx[:, None] >= idx[None, :]                             # s <= r
    diff = gam.unsqueeze(-2) - gam.unsqueeze(-3)                    # [..,r,s,K] = Gam_r - Gam_s
    decay = torch.exp(diff.masked_fill(~incl[:, :, None], float("-inf")))
    kd = k.unsqueeze(-3) * decay                                    # k_s * exp(Gam_r - Gam_s)
    Aqk = (q.unsqueeze(-2) * kd).sum(-1)                            # [..,r,s], s <= r
    Akk = (k.unsqueeze(-2) * kd).sum(-1) * beta.unsqueeze(-1)
    L = Akk.masked_fill(~(idx[:, None] > idx[None, :]), 0.0)        # strictly lower
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    rhs = torch.cat([beta.unsqueeze(-1) * k * torch.exp(gam), beta.unsqueeze(-1) * v], -1)
    WU = torch.linalg.solve_triangular(eye + L, rhs, upper=False, unitriangular=True)
    W, U = WU[..., :K], WU[..., K:]                                 # A(beta k e^Gam), A(beta v)
    qg = q * torch.exp(gam)
    glast = gam[..., -1:, :]                                        # [..,1,K]
    kg = k * torch.exp(glast - gam)

    S = q.new_zeros(B, H, K, V) if state is None else state
    outs = []
    for n in range(N):
        vnew = U[:, :, n] - W[:, :, n] @ S
        outs.append(qg[:, :, n] @ S + Aqk[:, :, n] @ vnew)
        S = torch.exp(glast[:, :, n]).transpose(-1, -2) * S + kg[:, :, n].transpose(-1, -2) @ vnew
    o = torch.stack(outs, 2).reshape(B, H, N * C, V)
    return o[:, :, :T], S


_fla_chunk_kda = None
_fla_checked = False


def fla_kernel():
    """fla's chunk_kda if flash-linear-attention is installed (CUDA only), else None."""
    global _fla_chunk_kda, _fla_checked
    if not _fla_checked:
        _fla_checked = True
        if os.environ.get("KDA_NO_FLA") != "1":
            try:
                from fla.ops.kda import chunk_kda
                _fla_chunk_kda = chunk_kda
            except Exception:
                _fla_chunk_kda = None
    return _fla_chunk_kda


# ----------------------------------------------------------------------------
# layers

class KDAMixer(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, H, K, Vh = c.hidden_size, c.num_heads, c.head_dim, c.head_v_dim
        self.H, self.K, self.V, self.eps = H, K, Vh, c.norm_eps
        self.kda_impl = "auto"   # "auto", "chunked", "recurrent", "fla"
        self.chunk = 16
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, H * K, bias=False)
        self.v_proj = nn.Linear(D, H * Vh, bias=False)
        self.q_conv1d = ShortConv(H * K, c.conv_size)
        self.k_conv1d = ShortConv(H * K, c.conv_size)
        self.v_conv1d = ShortConv(H * Vh, c.conv_size)
        self.f_proj = nn.Sequential(nn.Linear(D, Vh, bias=False), nn.Linear(Vh, H * K, bias=False))
        self.b_proj = nn.Linear(D, H, bias=False)
        # fla's init: A in [1, 16], dt in [1e-3, 1e-1] log-uniform stored as softplus^-1(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        dt = torch.exp(torch.rand(H * K) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.g_proj = nn.Sequential(nn.Linear(D, Vh, bias=False), nn.Linear(Vh, H * Vh, bias=True))
        self.o_norm = nn.Module()
        self.o_norm.weight = nn.Parameter(torch.ones(Vh))
        self.o_proj = nn.Linear(H * Vh, D, bias=False)

    def forward(self, a):
        B, T, _ = a.shape
        H, K, V = self.H, self.K, self.V
        q = self.q_conv1d(self.q_proj(a))
        k = self.k_conv1d(self.k_proj(a))
        v = self.v_conv1d(self.v_proj(a))
        graw = f32(self.f_proj(a))
        gk = -torch.exp(f32(self.A_log)).repeat_interleave(K) * F.softplus(graw + f32(self.dt_bias))
        beta = torch.sigmoid(f32(self.b_proj(a)))
        q = l2_norm(f32(q).view(B, T, H, K)) * (K ** -0.5)
        k = l2_norm(f32(k).view(B, T, H, K))
        v = f32(v).view(B, T, H, V)
        gk = gk.view(B, T, H, K)
        impl = self.kda_impl
        fla = fla_kernel() if impl in ("auto", "fla") and a.is_cuda else None
        if impl == "fla" and fla is None:
            raise RuntimeError("kda_impl='fla' but flash-linear-attention is not available on this device")
        if fla is not None:
            # fla takes [B,T,H,*]; q is already normalised and scaled, so scale=1
            o, _ = fla(q, k, v, gk, beta, scale=1.0, initial_state=None, output_final_state=False)
        else:
            with _no_autocast(a):
                args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), gk.transpose(1, 2),
                        beta.transpose(1, 2))
                if impl == "recurrent":
                    o, _ = kda_recurrent(*args)
                else:
                    o, _ = kda_chunked(*args, chunk=self.chunk)
            o = o.transpose(1, 2)                                   # [B,T,H,V]
        G = f32(self.g_proj(a)).view(B, T, H, V)
        y = rms_norm(f32(o), self.o_norm.weight, self.eps) * torch.sigmoid(G)
        return self.o_proj(y.reshape(B, T, H * V).type_as(a))


def _no_autocast(x):
    if x.is_cuda:
        return torch.autocast(device_type="cuda", enabled=False)
    return _Null()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def rope_tables(rope_dim, theta, T, device):
    inv = theta ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64, device=device) / rope_dim)
    ang = torch.arange(T, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()   # [T, rope_dim/2]


def apply_rope(x, cos, sin, rope_dim):
    """NeoX half-split rotation of the first rope_dim dims of each head; x [B,T,H,hd]."""
    half = rope_dim // 2
    x1, x2, rest = x[..., :half], x[..., half:rope_dim], x[..., rope_dim:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], -1)


class GQAMixer(nn.Module):
    def __init__(self, c):
        super().__init__()
        a = c.attn
        D = c.hidden_size
        self.Hq, self.Hkv, self.hd = a["num_heads"], a["num_kv_heads"], a["head_dim"]
        self.rope_dim, self.theta, self.eps = c.rope_dim, float(a["rope_theta"]), c.norm_eps
        self.q_proj = nn.Linear(D, self.Hq * self.hd, bias=False)
        self.k_proj = nn.Linear(D, self.Hkv * self.hd, bias=False)
        self.v_proj = nn.Linear(D, self.Hkv * self.hd, bias=False)
        self.g_proj = nn.Linear(D, self.Hq * self.hd, bias=False)
        self.o_proj = nn.Linear(self.Hq * self.hd, D, bias=False)
        self.q_norm = RMSNorm(self.hd, c.norm_eps)
        self.k_norm = RMSNorm(self.hd, c.norm_eps)

    def forward(self, a):
        B, T, _ = a.shape
        Hq, Hkv, hd = self.Hq, self.Hkv, self.hd
        q = rms_norm(self.q_proj(a).view(B, T, Hq, hd), self.q_norm.weight, self.eps)
        k = rms_norm(self.k_proj(a).view(B, T, Hkv, hd), self.k_norm.weight, self.eps)
        v = self.v_proj(a).view(B, T, Hkv, hd)
        cos, sin = (t.to(q.dtype) for t in rope_tables(self.rope_dim, self.theta, T, a.device))
        q = apply_rope(q, cos, sin, self.rope_dim).type_as(v).transpose(1, 2)
        k = apply_rope(k, cos, sin, self.rope_dim).type_as(v).transpose(1, 2)
        v = v.transpose(1, 2)
        rep = Hq // Hkv                                              # query head h uses kv head h // rep
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13
            s = (q @ k.transpose(-1, -2)).float() / math.sqrt(hd)
            mask = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
            o = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).type_as(v) @ v
        o = o.transpose(1, 2).reshape(B, T, Hq * hd)
        return self.o_proj(o * torch.sigmoid(self.g_proj(a)))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.attn_norm = RMSNorm(c.hidden_size, c.norm_eps)
        self.attn = GQAMixer(c) if c.is_gqa(i) else KDAMixer(c)
        self.mlp_norm = RMSNorm(c.hidden_size, c.norm_eps)
        self.mlp = MLP(c)
        self.dropout = 0.0   # residual dropout, training only (set by the trainer)

    def forward(self, h):
        h = h + F.dropout(self.attn(self.attn_norm(h)), self.dropout, self.training)
        return h + F.dropout(self.mlp(self.mlp_norm(h)), self.dropout, self.training)


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Block(c, i) for i in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.norm_eps)


class KDAForCausalLM(nn.Module):
    """state_dict() keys are exactly the fla-style checkpoint names."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        if not c.tie_word_embeddings:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self):
        # fla's initializer_range 0.02; residual outputs scaled by 1/sqrt(2 L) (GPT-2 style)
        resid = 0.02 / math.sqrt(2 * self.config.num_hidden_layers)
        for name, m in self.named_modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                std = resid if name.endswith(("o_proj", "down_proj")) else 0.02
                nn.init.normal_(m.weight, 0.0, std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def set_kda_impl(self, impl, chunk=None):
        for m in self.modules():
            if isinstance(m, KDAMixer):
                m.kda_impl = impl
                if chunk:
                    m.chunk = chunk

    def forward(self, idx):
        """idx [B, T] -> logits [B, T, vocab] (fp32)."""
        h = self.model.embeddings(idx)
        for blk in self.model.layers:
            h = blk(h)
        h = self.model.norm(h)
        w = self.model.embeddings.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return f32(F.linear(h, w.type_as(h)))

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


# ----------------------------------------------------------------------------
# safetensors: scripts/safetensors_io.py (json + numpy, no external package)

f32_to_bf16_bits = st.f32_to_bf16_bits
bf16_bits_to_f32 = st.bf16_bits_to_f32


def save_safetensors(path, tensors, dtype="F32", metadata=None):
    """tensors: name -> torch tensor or numpy array, stored as `dtype` (F32, F16 or BF16)."""
    arrays = {n: (dtype, t.detach().cpu().float().numpy() if torch.is_tensor(t) else np.asarray(t, dtype=np.float32))
              for n, t in tensors.items()}
    st.save(path, arrays, metadata)


def load_safetensors(path):
    """-> dict name -> float32 torch tensor (a single-file checkpoint)."""
    d, f = os.path.split(path)
    store = st.TensorStore(d or ".") if f == "model.safetensors" else None
    if store is None:
        raise ValueError("%s: expected a model.safetensors file" % path)
    return {n: torch.from_numpy(np.array(store.get(n))) for n in store.names()}


# ----------------------------------------------------------------------------
# checkpoint directory (MODEL_SPEC section 5)

def export_model(model, out_dir, dtype="F32", tokenizer_model=None, metadata=None):
    """Writes config.json + model.safetensors (+ tokenizer.model) that kda-server loads."""
    os.makedirs(out_dir, exist_ok=True)
    c = model.config
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c.to_json_dict(), f, indent=2)
        f.write("\n")
    sd = {k: v for k, v in model.state_dict().items()}
    save_safetensors(os.path.join(out_dir, "model.safetensors"), sd, dtype=dtype, metadata=metadata)
    if tokenizer_model:
        with open(tokenizer_model, "rb") as src, open(os.path.join(out_dir, "tokenizer.model"), "wb") as dst:
            dst.write(src.read())


def load_exported(model_dir, device="cpu"):
    """The inverse of export_model: a float32 KDAForCausalLM from a checkpoint directory."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = KDAConfig.from_json_dict(json.load(f))
    m = KDAForCausalLM(c)
    sd = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    missing = set(m.state_dict()) - set(sd)
    extra = set(sd) - set(m.state_dict())
    if missing or extra:
        raise ValueError("checkpoint tensors differ: missing %s, unexpected %s" % (sorted(missing)[:3], sorted(extra)[:3]))
    m.load_state_dict(sd)
    return m.to(device)

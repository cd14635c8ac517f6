#!/usr/bin/env python3
"""make_fla_fixtures.py - RUN ON THE GPU MACHINE (torch + CUDA, transformers 5,
flash-linear-attention 0.5.2 from .whl/, see scripts/gpu-fixtures.sh). Writes
checkpoints with the real tools and their reference outputs, for
tests/fixtures/fla/ and tests/engine/test_fla_fixtures.py:

* one small checkpoint per option (MODEL_SPEC 5a, 6), written by fla's own
  KDAForCausalLM.save_pretrained (or, for llama_kda, transformers'
  LlamaForCausalLM with fla's KimiDeltaAttention in the KDA layers, the way
  Mercity's LlamaKDA builds it), d = 64, vocab 256, 2-4 layers, weights stored in
  bf16 (plain: fp32) -- fla computes in fp32 on exactly the stored values;
* fla's fp32 log-probs over 256 tokens with KDA in fused_recurrent mode (the
  exact per-token kernel), and in chunk mode as a second column; 32 greedy
  tokens after a 48-token prompt (full re-forward per step, fused_recurrent)
  with the top-1/top-2 logit margin of each step;
* for the plain KDA config, the gap analysis (analysis.txt): fla's per-layer
  and per-op intermediates against scripts/ref_model.py (float64, which the
  engine matches to ~1e-6 in CI) by position bucket, and the KDA kernels run
  alone on fla's own kernel inputs (fused_recurrent, chunk, and chunk with
  IEEE fp32 dots in a subprocess) against float64 -- to locate where a
  position-dependent gap comes from;
* if .carry/build/cli/kda-cli exists (scripts/gpu-prepare.sh), kda-cli's CPU
  log-probs on every fixture, so the comparison is in the first report.

fla's hybrid attention needs flash-attn, which is absent there: its
flash_attn_func is replaced by an fp32 softmax attention with the same
semantics (GQA head groups, bottom-right causal alignment, window (W-1, 0)).

Robust by design (it runs blind): every fixture and every analysis step is
in its own try/except with the traceback logged; a time budget
(KDA_FIXTURE_BUDGET_S, default 480 s) skips what would not finish; the
tarball $OUT/fla-fixtures.tgz is rewritten after every fixture.

    python3 scripts/make_fla_fixtures.py [--out DIR] [--only NAME,...]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import time
import traceback

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

T_SCORE = 256          # tokens scored per fixture
PROMPT, N_GREEDY = 48, 32
VOCAB = 256
START = time.time()
BUDGET = float(os.environ.get("KDA_FIXTURE_BUDGET_S", "480"))
LOG = []


def log(*a):
    msg = " ".join(str(x) for x in a)
    print("[%6.1fs] %s" % (time.time() - START, msg), flush=True)
    LOG.append("[%6.1fs] %s" % (time.time() - START, msg))


def left():
    return BUDGET - (time.time() - START)


def guarded(what, fn, *a, **k):
    """fn(*a, **k), or None with the traceback logged: one failure never stops the rest."""
    try:
        return fn(*a, **k)
    except Exception:
        log("FAILED %s:\n%s" % (what, traceback.format_exc()))
        return None


# ---- environment ------------------------------------------------------------------

def setup_precision():
    """fp32 everywhere we control: no TF32 in cuBLAS / cuDNN. Triton kernels (fla)
    pick their own dot precision; we record what is known about it."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "env": {k: v for k, v in os.environ.items() if k.startswith(("FLA_", "TRITON_"))}}
    for mod, attr in (("transformers", "__version__"), ("triton", "__version__"), ("fla", "__version__")):
        try:
            info[mod] = getattr(__import__(mod), attr)
        except Exception as e:  # noqa: BLE001
            info[mod] = "unavailable: %s" % e
    try:
        import fla.utils as fu
        info["fla.IS_TF32_SUPPORTED"] = bool(getattr(fu, "IS_TF32_SUPPORTED", None))
    except Exception as e:  # noqa: BLE001
        info["fla.IS_TF32_SUPPORTED"] = "unknown: %s" % e
    return info


def flash_attn_sdpa(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), **kw):
    """flash_attn_func's semantics in fp32 torch: q [B, Tq, H, d], k/v [B, Tk, Hkv, d];
    query head h reads KV head h // (H / Hkv); causal aligned bottom-right (query i is
    position i + Tk - Tq); window (left, right): keys within [pos - left, pos + right]."""
    B, Tq, H, d = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=2)
        v = v.repeat_interleave(H // Hkv, dim=2)
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    ct = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # fp32 at least
    qf, kf, vf = (x.to(ct).transpose(1, 2) for x in (q, k, v))        # [B, H, T, d]
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale                  # [B, H, Tq, Tk]
    qi = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
    kj = torch.arange(Tk, device=q.device)[None, :]
    allow = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
    if causal:
        allow &= kj <= qi
    left_w, right_w = window_size
    if left_w is not None and left_w >= 0:
        allow &= kj >= qi - left_w
    if right_w is not None and right_w >= 0 and not causal:
        allow &= kj <= qi + right_w
    s = s.masked_fill(~allow, float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1), vf)
    return o.transpose(1, 2).to(q.dtype)


def install_attention_shim():
    import fla.layers.attn as A
    A.flash_attn_func = flash_attn_sdpa
    log("fla.layers.attn.flash_attn_func -> fp32 softmax attention (flash-attn absent)")


# ---- weights: fla's init makes near-uniform logits; give them a trained model's scale ----

@torch.no_grad()
def perturb(model, seed, lower_bound=None):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(shape, std):
        return (torch.randn(shape, generator=g) * std).to(torch.float32)

    for name, p in model.named_parameters():
        shape, leaf = tuple(p.shape), name.rsplit(".", 1)[-1]
        if name.endswith("A_log"):
            if lower_bound is not None:  # fla initialises it to 0 with the lower-bound gate
                p.copy_(randn(shape, 0.5))
            continue
        if name.endswith("dt_bias"):
            continue  # fla's init: softplus^-1 of dt in [1e-3, 1e-1]
        if "embed" in name or name.startswith("lm_head"):
            p.copy_(randn(shape, 3.0 / math.sqrt(shape[-1])))
        elif "norm" in name and leaf == "weight":
            p.copy_(1.0 + randn(shape, 0.1))
        elif "conv1d" in name and leaf == "weight":
            p.copy_(randn(shape, 0.3))
        elif "res_proj" in name:
            p.copy_(randn(shape, 2.0 / math.sqrt(shape[-1])))
        elif leaf == "bias":
            p.copy_(randn(shape, 0.2))
        elif p.dim() == 2:
            scale = 1.5 if ("o_proj" in name or "down_proj" in name) else 1.0
            p.copy_(randn(shape, scale / math.sqrt(shape[1])))
        else:
            p.copy_(randn(shape, 0.1))


# ---- the fixtures -----------------------------------------------------------------

BASE = dict(hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=16, vocab_size=VOCAB, intermediate_size=128,
            max_position_embeddings=2048, bos_token_id=1, eos_token_id=2)
ATTN = {"layers": [1], "num_heads": 4, "num_kv_heads": 2}

FLA_CASES = [
    # name, KDAConfig kwargs, extras
    # plain: fp32 weights, 3 layers, the FFN width from fla's hidden_ratio rule
    ("plain", {"num_hidden_layers": 3, "intermediate_size": None}, {"analyse": True, "fp32": True}),
    ("hybrid_attn", {"attn": ATTN}, {"analyse": True}),
    ("attn_window", {"attn": dict(ATTN, window_size=24)}, {}),
    ("attn_qkv_bias", {"attn": dict(ATTN, qkv_bias=True)}, {}),
    ("attn_list", {"num_hidden_layers": 4, "attn": [dict(ATTN, layers=[1]), dict(ATTN, layers=[3])]}, {}),
    ("safe_gate", {"safe_gate": True, "lower_bound": -5.0}, {"lower_bound": -5.0}),
    ("lower_bound_only", {"lower_bound": -3.0}, {"lower_bound": -3.0}),
    ("neg_eigval", {"allow_neg_eigval": True}, {}),
    ("gva", {"num_heads": 2, "num_v_heads": 4}, {"analyse_kernels": True}),
    ("no_short_conv", {"use_short_conv": False}, {}),
    ("conv_bias", {}, {"conv_bias": True}),
    ("expand_v2", {"expand_v": 2.0}, {}),
    ("attnres2", {"attnres_block_size": 2, "attn": ATTN}, {}),
    ("attnres1", {"attnres_block_size": 1}, {}),
    ("tied", {"attn": ATTN, "tie_word_embeddings": True}, {}),
]

LLAMA = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-6,
             bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
MERCITY = dict(kda_full_attn_layers=None, kda_full_attn_every=None, kda_full_attn_range=None, kda_every=None,
               kda_offset=0, kda_head_dim=16, kda_num_heads=4, kda_num_v_heads=None, kda_expand_v=1.0,
               kda_use_short_conv=True, kda_conv_size=4, kda_conv_bias=False, kda_allow_neg_eigval=False,
               kda_lower_bound=None, kda_safe_gate=False, qk_norm=False, qk_norm_eps=None)
LLAMA_CASES = [
    ("llama_kda_llama3", dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 64}),
     dict(kda_full_attn_every=2, qk_norm=True)),
    ("llama_kda_linear_bias", dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
                                   attention_bias=True, mlp_bias=True),
     dict(kda_full_attn_layers=[1, 2], qk_norm=True, qk_norm_eps=1e-5)),
    ("llama_kda_options", {}, dict(kda_every=2, kda_offset=1, kda_num_heads=2, kda_num_v_heads=4,
                                   kda_lower_bound=-5.0, kda_safe_gate=True, kda_use_short_conv=False,
                                   kda_allow_neg_eigval=True)),
]


def kda_modules(model):
    from fla.layers.kda import KimiDeltaAttention
    return [m for m in model.modules() if isinstance(m, KimiDeltaAttention)]


def set_kda_mode(model, mode):
    for m in kda_modules(model):
        m.mode = mode


def build_fla(kw, extra):
    from fla.models import KDAConfig, KDAForCausalLM
    # fla 0.5.2 declares its tied weights as a list; transformers 5.x expects a
    # mapping {tied key: source key} (seen on the H200 with 5.17: post_init
    # fails with "'list' object has no attribute 'keys'"): give it the mapping
    if isinstance(getattr(KDAForCausalLM, "_tied_weights_keys", None), list):
        KDAForCausalLM._tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}
    cfg = KDAConfig(**dict(BASE, **kw))
    model = KDAForCausalLM(cfg)
    if extra.get("conv_bias"):
        # fla's KDABlock does not pass conv_bias to KimiDeltaAttention; its layer has
        # the option: rebuild the convs with a bias and record the key in the config
        from fla.modules import ShortConvolution
        for m in kda_modules(model):
            for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
                old = getattr(m, n)
                setattr(m, n, ShortConvolution(hidden_size=old.hidden_size, kernel_size=old.kernel_size[0],
                                               bias=True, activation="silu"))
        cfg.conv_bias = True
    return model


class MercityKDA(torch.nn.Module):
    """A LlamaDecoderLayer's self_attn holding fla's KimiDeltaAttention under `kda`, run
    stateless (the layout of Mercity's LlamaKDAAttention, written from its description)."""

    def __init__(self, c, layer_idx):
        super().__init__()
        from fla.layers.kda import KimiDeltaAttention
        self.kda = KimiDeltaAttention(
            hidden_size=c.hidden_size, expand_v=c.kda_expand_v, head_dim=c.kda_head_dim,
            num_heads=c.kda_num_heads or c.hidden_size // c.kda_head_dim, num_v_heads=c.kda_num_v_heads,
            mode="fused_recurrent", use_short_conv=c.kda_use_short_conv, conv_size=c.kda_conv_size,
            conv_bias=c.kda_conv_bias, allow_neg_eigval=c.kda_allow_neg_eigval, safe_gate=c.kda_safe_gate,
            lower_bound=c.kda_lower_bound, layer_idx=layer_idx, norm_eps=c.rms_norm_eps)

    def forward(self, hidden_states, *args, **kwargs):
        o, _, _ = self.kda(hidden_states=hidden_states, past_key_values=None, use_cache=False)
        return o, None


def add_qk_norm(attn, head_dim, eps):
    """Per-head RMSNorm of q and k before RoPE on a transformers LlamaAttention, as
    q_norm / k_norm submodules applied by hooks on q_proj / k_proj outputs."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    attn.q_norm = LlamaRMSNorm(head_dim, eps=eps)
    attn.k_norm = LlamaRMSNorm(head_dim, eps=eps)

    def hook(norm):
        def f(mod, inp, out):
            sh = out.shape
            return norm(out.view(*sh[:-1], -1, head_dim)).reshape(sh)
        return f
    attn.q_proj.register_forward_hook(hook(attn.q_norm))
    attn.k_proj.register_forward_hook(hook(attn.k_norm))


def resolve_layout(c):
    """Mercity's resolve_kda_layer_types order (for the written kda_layer_types)."""
    n = c.num_hidden_layers
    if c.kda_full_attn_layers is not None:
        full = set(c.kda_full_attn_layers)
    elif c.kda_full_attn_range is not None:
        full = set(range(*c.kda_full_attn_range))
    elif c.kda_full_attn_every:
        full = {i for i in range(n) if (i + 1) % c.kda_full_attn_every == 0}
    elif c.kda_every:
        full = {i for i in range(n) if i % c.kda_every != (c.kda_offset or 0) % c.kda_every}
    else:
        full = set()
    return ["full" if i in full else "kda" for i in range(n)]


def build_llama(kw, mercity):
    from transformers import LlamaConfig, LlamaForCausalLM

    class LlamaKDAConfigLike(LlamaConfig):
        model_type = "llama_kda"

    c = LlamaKDAConfigLike(**dict(LLAMA, **kw))
    for k, v in dict(MERCITY, **mercity).items():
        setattr(c, k, v)
    c.kda_layer_types = resolve_layout(c)
    model = LlamaForCausalLM(c)
    hd = c.head_dim
    for i, layer in enumerate(model.model.layers):
        if c.kda_layer_types[i] == "kda":
            layer.self_attn = MercityKDA(c, i)
        elif c.qk_norm:
            add_qk_norm(layer.self_attn, hd, c.qk_norm_eps if c.qk_norm_eps is not None else c.rms_norm_eps)
    return model


# ---- running fla ------------------------------------------------------------------

@torch.no_grad()
def logits_of(model, tokens):
    ids = torch.tensor([tokens], device="cuda")
    out = model(input_ids=ids, use_cache=False)
    return out.logits[0].float()


def logprobs(model, tokens, mode):
    set_kda_mode(model, mode)
    lg = logits_of(model, tokens)
    lp = torch.log_softmax(lg.double(), dim=-1)
    return [float(lp[i, tokens[i + 1]]) for i in range(len(tokens) - 1)]


def greedy(model, prompt, n):
    set_kda_mode(model, "fused_recurrent")
    toks, out, margins = list(prompt), [], []
    for _ in range(n):
        last = logits_of(model, toks)[-1]
        top = torch.topk(last, 2)
        t = int(top.indices[0])
        out.append(t)
        margins.append(float(top.values[0] - top.values[1]))
        toks.append(t)
    return out, margins


@torch.no_grad()
def save(model, d, family, bf16):
    """save_pretrained, in bf16 unless fp32: the fp32 model's parameters are rounded
    to bf16 first, so fla computes (in fp32) on exactly the stored values. The
    outputs come from this in-memory model: transformers would rebuild a plain Llama
    from the llama_kda config, and fla's KDABlock drops conv_bias. A reload of fla
    checkpoints checks the weights read back equal."""
    import copy
    os.makedirs(d, exist_ok=True)
    if bf16:
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d)
    else:
        model.save_pretrained(d)
    how = "the in-memory fp32 model whose parameters were saved (%s)" % ("bf16" if bf16 else "fp32")
    if family == "kda":
        from fla.models import KDAForCausalLM
        try:
            try:
                m = KDAForCausalLM.from_pretrained(d, dtype=torch.float32)
            except TypeError:
                m = KDAForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
            sd = m.state_dict()
            mine = {k: v for k, v in model.state_dict().items() if "inv_freq" not in k}
            worst = max((float((sd[k].float().cpu() - v.float().cpu()).abs().max()) for k, v in mine.items()
                         if k in sd), default=float("nan"))
            lost = sorted(k for k in mine if k not in sd)
            how += "; fla's from_pretrained reads it back with max |weight diff| %.3g" % worst
            if lost:  # conv_bias: fla's KDABlock builds no conv bias, so its reload drops them
                how += " and without %d tensors (%s, ...)" % (len(lost), lost[0])
        except Exception as e:  # noqa: BLE001
            how += "; reload check failed: %s" % str(e)[:200]
    return how


def kda_cli():
    exe = os.path.join(ROOT, ".carry", "build", "cli", "kda-cli")
    return exe if os.path.exists(exe) else None


def ours_logprobs(d, tokens):
    """kda-cli (CPU, fp32) if carried, and the float64 reference (ref_model)."""
    res = {}
    exe = kda_cli()
    if exe:
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ROOT, ".carry", "lib"))
        r = subprocess.run([exe, "score", d, "--tokens", ",".join(map(str, tokens)), "--json"], capture_output=True,
                           text=True, env=env, timeout=120)
        if r.returncode == 0:
            res["kda_cli"] = json.loads(r.stdout)["token_logprobs"]
        else:
            res["kda_cli_error"] = r.stderr.strip()[-400:]
    from ref_model import RefModel
    m = RefModel(d)
    lg = m.forward(tokens)[0]
    lp = torch.log_softmax(lg, dim=-1)
    res["ref_f64"] = [float(lp[i, tokens[i + 1]]) for i in range(len(tokens) - 1)]
    return res


def max_diff(a, b, lo=0, hi=None):
    if not a or not b:
        return None
    hi = len(a) if hi is None else hi
    return max(abs(x - y) for x, y in zip(a[lo:hi], b[lo:hi]))


def make_fixture(name, family, kw, extra, root):
    seed = 1000 + sum(map(ord, name))
    torch.manual_seed(seed)
    model = (build_fla(kw, extra) if family == "kda" else build_llama(kw, extra)).float()
    perturb(model, seed, extra.get("lower_bound") if family == "kda" else extra.get("kda_lower_bound"))
    fla_model = model.cuda().eval()
    d = os.path.join(root, "fixtures", name)
    how = save(fla_model, d, family, bf16=not extra.get("fp32"))
    log("%s: %s" % (name, how))
    g = torch.Generator().manual_seed(seed)
    tokens = [1] + torch.randint(0, VOCAB, (T_SCORE - 1,), generator=g).tolist()
    exp = {"name": name, "family": family, "tokens": tokens, "computed_from": how,
           "config_kwargs": {k: v for k, v in kw.items()}, "extra": extra}
    exp["logprobs_fused_recurrent"] = logprobs(fla_model, tokens, "fused_recurrent")
    if left() > 60:
        exp["logprobs_chunk"] = guarded(name + " chunk mode", logprobs, fla_model, tokens, "chunk")
    else:
        log("%s: chunk column skipped (time budget)" % name)
    exp["greedy_prompt"] = tokens[:PROMPT]
    exp["greedy"], exp["greedy_margins"] = greedy(fla_model, tokens[:PROMPT], N_GREEDY)
    with open(os.path.join(d, "expected.json"), "w") as fh:
        json.dump(exp, fh)
    ours = guarded(name + " ours", ours_logprobs, d, tokens) or {}
    row = {"name": name, "fr": exp["logprobs_fused_recurrent"], "chunk": exp.get("logprobs_chunk")}
    row.update(ours)
    if extra.get("analyse") and left() > 90:
        guarded(name + " analysis", analyse, fla_model, d, tokens, root, name)
    elif extra.get("analyse_kernels") and left() > 60:
        guarded(name + " kernel analysis", analyse, fla_model, d, tokens, root, name, kernels_only=True)
    return row


# ---- the gap analysis -----------------------------------------------------------------

BUCKETS = [(0, 16), (16, 64), (64, 128), (128, 256)]


def rel_by_bucket(a, b):
    """a, b [T, ...] -> {bucket: max over positions of |a_t - b_t| / |b_t|}"""
    a = a.reshape(a.shape[0], -1).double().cpu()
    b = b.reshape(b.shape[0], -1).double().cpu()
    r = (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)
    return {"%d-%d" % (lo, hi): float(r[lo:hi].max()) for lo, hi in BUCKETS if lo < r.shape[0]}


class Capture:
    """fla's intermediates: module outputs by hook, and the KDA kernels' inputs and
    outputs by wrapping fla.layers.kda's fused_recurrent_kda / chunk_kda."""

    def __init__(self, model):
        import fla.layers.kda as L
        self.L, self.data, self.calls, self.hooks = L, {}, [], []
        self.orig = (L.fused_recurrent_kda, L.chunk_kda)
        names = dict(model.named_modules())
        for n, m in names.items():
            leaf = n.rsplit(".", 1)[-1]
            if leaf in ("attn_norm", "q_conv1d", "k_conv1d", "v_conv1d", "f_proj", "b_proj", "o_norm", "attn",
                        "mlp", "q_proj", "k_proj", "v_proj") or n.count(".") == 2 and n.startswith("model.layers"):
                self.hooks.append(m.register_forward_hook(self.hook(n)))

        def wrap(fn, kind):
            def f(*a, **k):
                out = fn(*a, **k)
                # fla.layers.kda passes everything by keyword; positional q, k, v, g, beta too
                kw = dict(zip(("q", "k", "v", "g", "beta"), a), **k)
                self.calls.append({"kind": kind, "kwargs": kw, "o": out[0].detach().clone()})
                return out
            return f
        L.fused_recurrent_kda, L.chunk_kda = wrap(self.orig[0], "fused_recurrent"), wrap(self.orig[1], "chunk")

    def hook(self, name):
        def f(mod, inp, out):
            o = out[0] if isinstance(out, tuple) else out
            self.data[name] = o.detach().float().clone()
            if name.endswith("o_norm"):
                self.data[name + ".in"] = inp[0].detach().float().clone()
        return f

    def close(self):
        for h in self.hooks:
            h.remove()
        self.L.fused_recurrent_kda, self.L.chunk_kda = self.orig


def ref_kda_from_inputs(kw):
    """float64 KDA on the kernel's own inputs (ref_model's math, MODEL_SPEC 3)."""
    from ref_model import kda_recurrent, l2_norm
    q, k, v, g, beta = [kw[n][0].double().cpu() for n in ("q", "k", "v", "g", "beta")]  # batch 1
    A = kw["A_log"].double().cpu()
    dt = kw["dt_bias"].double().cpu()
    T, H, K = q.shape
    HV = v.shape[1]
    graw = g + dt.view(HV, K)
    lb = kw.get("lower_bound")
    if lb is None:
        gk = -torch.exp(A)[:, None] * torch.nn.functional.softplus(graw)
    else:
        gk = lb * torch.sigmoid(torch.exp(A)[:, None] * graw)
    b = torch.sigmoid(beta) * (2.0 if kw.get("allow_neg_eigval") else 1.0)
    q = l2_norm(q) * K ** -0.5
    k = l2_norm(k)
    q, k = q.repeat_interleave(HV // H, dim=1), k.repeat_interleave(HV // H, dim=1)
    o, _ = kda_recurrent(q, k, v, gk, b, torch.zeros(HV, K, v.shape[-1], dtype=torch.float64))
    return o


def analyse(model, d, tokens, root, name, kernels_only=False):
    """Where does fla (fp32) depart from float64, and does it grow with position?"""
    from ref_model import RefModel
    out_dir = os.path.join(root, "analysis")
    os.makedirs(out_dir, exist_ok=True)
    rep = {"fixture": name, "buckets": [list(b) for b in BUCKETS]}
    lines = ["# %s: relative error (max over positions in each bucket) against float64" % name]

    cap = Capture(model)
    try:
        set_kda_mode(model, "fused_recurrent")
        logits_of(model, tokens)
    finally:
        cap.close()
    # 1. the kernels alone, on fla's own inputs
    kern = []
    import fla.ops.kda as K
    for li, call in enumerate(c for c in cap.calls if c["kind"] == "fused_recurrent"):
        kw = dict(call["kwargs"])
        ref = ref_kda_from_inputs(kw)
        row = {"layer": li, "fused_recurrent": rel_by_bucket(call["o"][0], ref)}
        ckw = {k: v for k, v in kw.items() if k not in ("inplace_final_state",)}
        ckw["safe_gate"] = bool(getattr(model.config, "safe_gate", False) or getattr(model.config, "kda_safe_gate",
                                                                                    False))
        try:
            with torch.no_grad():
                oc = K.chunk_kda(**ckw)[0]
            row["chunk"] = rel_by_bucket(oc[0], ref)
        except Exception as e:  # noqa: BLE001
            row["chunk"] = "failed: %s" % e
        kern.append(row)
        torch.save({"kwargs": {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in ckw.items()},
                    "ref": ref}, os.path.join(out_dir, "%s_kernel_inputs_L%d.pt" % (name, li)))
    rep["kernels"] = kern
    lines.append("## KDA kernels alone on fla's inputs (rel err of o vs float64 from the same inputs)")
    for r in kern:
        lines.append("  layer %d  fused_recurrent %s" % (r["layer"], fmt(r["fused_recurrent"])))
        lines.append("           chunk           %s" % fmt(r["chunk"]))
    if kernels_only:
        finish_analysis(out_dir, name, rep, lines)
        return
    # 2. layer by layer: fla's intermediates against ref_model float64 on the saved checkpoint
    tr = {}
    m = RefModel(d)
    m.forward(tokens, trace=tr)
    pairs = []
    for n, t in cap.data.items():
        parts = n.split(".")
        if len(parts) < 3 or parts[1] != "layers":
            continue
        li = int(parts[2])
        sub = ".".join(parts[3:])
        key = {"": "h_out", "attn_norm": "a", "attn.q_conv1d": "q_conv", "attn.k_conv1d": "k_conv",
               "attn.v_conv1d": "v_conv", "attn.f_proj": "graw", "attn.b_proj": "braw", "attn.o_norm.in": "o_kernel",
               "attn.o_norm": "o_gated", "attn": "mixer_out", "mlp": "mlp_out"}.get(sub)
        if key and ("L%d.%s" % (li, key)) in tr:
            pairs.append((li, key, t[0], tr["L%d.%s" % (li, key)]))
    order = ["a", "q_conv", "k_conv", "v_conv", "graw", "braw", "o_kernel", "o_gated", "mixer_out", "mlp_out",
             "h_out"]
    pairs.sort(key=lambda p: (p[0], order.index(p[1])))
    rep["layers"] = [{"layer": li, "op": key, "rel": rel_by_bucket(a, b)} for li, key, a, b in pairs]
    lines.append("## fla fp32 (fused_recurrent) vs ref_model float64, layer by layer")
    for r in rep["layers"]:
        lines.append("  L%d %-10s %s" % (r["layer"], r["op"], fmt(r["rel"])))
    dtypes = sorted({str(t.dtype) for t in cap.data.values()})
    rep["captured_dtypes"] = dtypes
    lines.append("captured dtypes: %s" % dtypes)
    finish_analysis(out_dir, name, rep, lines)


def fmt(r):
    if not isinstance(r, dict):
        return str(r)
    return "  ".join("%s: %.2e" % (k, v) for k, v in r.items())


def finish_analysis(out_dir, name, rep, lines):
    with open(os.path.join(out_dir, name + ".json"), "w") as fh:
        json.dump(rep, fh, indent=1)
    with open(os.path.join(out_dir, name + ".txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    for ln in lines:
        log(ln)


# ---- chunk mode with IEEE fp32 dots (a subprocess: Triton reads the setting at compile) ----

def ieee_worker(paths, out):
    """Runs chunk_kda on saved kernel inputs with every Triton dot in IEEE fp32
    (TRITON_F32_DEFAULT=ieee and fla's solve_tril precision set to ieee before the
    first compile), writes the rel errors against the saved float64 outputs."""
    import triton.language as tl
    import fla.ops.kda.chunk_intra as ci
    ci.SOLVE_TRIL_DOT_PRECISION = tl.constexpr("ieee")
    import fla.ops.kda as K
    res = {}
    for p in paths:
        s = torch.load(p, weights_only=False)
        kw = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in s["kwargs"].items()}
        with torch.no_grad():
            o = K.chunk_kda(**kw)[0]
        res[os.path.basename(p)] = rel_by_bucket(o[0], s["ref"])
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


def run_ieee(root):
    d = os.path.join(root, "analysis")
    paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".pt")) if os.path.isdir(d) else []
    if not paths:
        return
    out = os.path.join(d, "chunk_ieee.json")
    env = dict(os.environ, TRITON_F32_DEFAULT="ieee", TRITON_CACHE_DIR="/tmp/triton-ieee-cache")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--ieee-worker", out] + paths, env=env,
                       capture_output=True, text=True, timeout=max(30, int(left())))
    if r.returncode:
        log("chunk-ieee worker failed:\n" + r.stderr[-3000:])
        return
    with open(out) as fh:
        res = json.load(fh)
    log("## chunk_kda with IEEE fp32 dots (TRITON_F32_DEFAULT=ieee), rel err of o vs float64")
    for k, v in res.items():
        log("  %-40s %s" % (k, fmt(v)))
    for p in paths:
        os.remove(p)  # inputs are big; the json keeps the result


# ---- packing ------------------------------------------------------------------------

def summary_lines(rows, env):
    out = ["# fla fixtures: max |logprob diff| (nats) over the 255 scored positions [positions 0-39 | 200-254]",
           "env: " + json.dumps(env)]
    for r in rows:
        if r is None:
            continue
        cols = []
        for a, b, label in (("fr", "ref_f64", "fla fused_recurrent vs ref f64"), ("fr", "kda_cli", "vs kda-cli"),
                            ("chunk", "fr", "fla chunk vs fused_recurrent"), ("chunk", "ref_f64", "chunk vs ref")):
            x, y = r.get(a), r.get(b)
            if x and y:
                cols.append("%s %.2e [%.2e | %.2e]" % (label, max_diff(x, y), max_diff(x, y, 0, 40),
                                                       max_diff(x, y, 200)))
        if r.get("kda_cli_error"):
            cols.append("kda-cli error: " + r["kda_cli_error"])
        out.append("%-22s %s" % (r["name"], "; ".join(cols)))
    return out


def pack(root, out_dir, rows, env):
    lines = summary_lines(rows, env)
    with open(os.path.join(root, "summary.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(os.path.join(root, "log.txt"), "w") as fh:
        fh.write("\n".join(LOG) + "\n")
    with open(os.path.join(root, "env.json"), "w") as fh:
        json.dump(env, fh, indent=1)
    tgz = os.path.join(out_dir, "fla-fixtures.tgz")
    with tarfile.open(tgz + ".tmp", "w:gz") as tf:
        tf.add(root, arcname="fla-fixtures")
    os.replace(tgz + ".tmp", tgz)
    with open(os.path.join(out_dir, "summary.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "analysis.txt"), "w") as fh:
        fh.write(analysis_text(root))


def analysis_text(root):
    d = os.path.join(root, "analysis")
    parts = []
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if f.endswith(".txt"):
            with open(os.path.join(d, f)) as fh:
                parts.append(fh.read())
    p = os.path.join(d, "chunk_ieee.json")
    if os.path.exists(p):
        with open(p) as fh:
            res = json.load(fh)
        parts.append("## chunk_kda with IEEE fp32 dots, rel err of o vs float64\n" +
                     "\n".join("  %-40s %s" % (k, fmt(v)) for k, v in res.items()) + "\n")
    return "\n".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kda-out"))
    ap.add_argument("--only", help="comma-separated fixture names")
    ap.add_argument("--ieee-worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ieee_worker:
        ieee_worker(a.ieee_worker[1:], a.ieee_worker[0])
        return 0
    os.makedirs(a.out, exist_ok=True)
    root = "/tmp/fla-fixtures"
    subprocess.run(["rm", "-rf", root])
    os.makedirs(os.path.join(root, "fixtures"))
    env = setup_precision()
    log("environment: " + json.dumps(env))
    guarded("attention shim", install_attention_shim)
    only = set(a.only.split(",")) if a.only else None
    cases = [(n, "kda", kw, ex) for n, kw, ex in FLA_CASES] + [(n, "llama_kda", kw, ex) for n, kw, ex in LLAMA_CASES]
    rows = []
    for name, family, kw, extra in cases:
        if only and name not in only:
            continue
        if left() < 40:
            log("%s: skipped (time budget)" % name)
            continue
        t0 = time.time()
        row = guarded("fixture " + name, make_fixture, name, family, kw, extra, root)
        rows.append(row)
        if row:
            log("%s done in %.1fs: %s" % (name, time.time() - t0, summary_lines([row], {})[-1]))
        guarded("pack", pack, root, a.out, rows, env)
    if left() > 45:
        guarded("chunk ieee", run_ieee, root)
    guarded("pack", pack, root, a.out, rows, env)
    print(analysis_text(root))
    print("\n".join(summary_lines(rows, env)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""gen_checkpoint.py - write a random checkpoint in the exact layout of
MODEL_SPEC sections 5 and 6 (config.json + safetensors [+ tokenizer]).

    gen_checkpoint.py OUTDIR --preset tiny            # 4-layer KKKG kda model, byte tokenizer
    gen_checkpoint.py OUTDIR --preset llama-tiny      # same size, llama_kda family
    gen_checkpoint.py OUTDIR --preset 1.7b --tokenizer spm:/work/shared/data/llama2-tokenizer.model
    gen_checkpoint.py OUTDIR --preset 1.7b --dry-run  # tensor table + parameter count only
    gen_checkpoint.py OUTDIR --preset tiny --v-heads 4 --lower-bound -5 --safe-gate --window 8
                                                      # the fla options (MODEL_SPEC 5a), see --help

Weights are random but shaped like a trained model's so logits are not
degenerate: projections ~ N(0, 1/fan_in), output projections 1.5x that
scale, norm weights ~ 1 + 0.1 N(0,1), A_log and dt_bias as fla initialises
them. Every tensor is seeded from (seed, its canonical name) -- the fla name
with a separate gate -- so the same seed gives the same numbers whichever
name scheme, gate layout or sharding is written: tests compare those.

Big tensors (>= 1M elements) are not drawn from a normal distribution (too
slow for 1.66e9 values): their bf16 bit patterns come straight from random
bits with a random sign, a random 7-bit mantissa and one of four exponents
chosen so the RMS matches the wanted sigma within a factor of about 1.2.
"""
import argparse
import json
import math
import os
import shutil
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402

FAST_MIN = 1 << 20      # tensors at least this big use the bit-pattern generator
CHUNK = 1 << 22         # elements generated and written at a time
# Output projections (o_proj, down_proj) at 1.5/sqrt(fan_in): with a tied head the
# residual must outweigh the token's own embedding, or every position predicts
# its input token and greedy decoding repeats one token forever (0.5 did).
OUT_SCALE = 1.5

PRESETS = {
    "tiny": dict(family="kda", d=64, layers=4, pattern="KKKG", heads=2, head_dim=16, expand_v=1,
                 ffn=128, vocab=256, gqa_heads=4, gqa_kv_heads=2, gqa_head_dim=16, rope_dim=8,
                 rope_theta=10000.0, tied=True, dtype="bf16", max_pos=2048, tokenizer="bytes"),
    "small": dict(family="kda", d=256, layers=8, pattern="KKKG", heads=4, head_dim=64, expand_v=1,
                  ffn=768, vocab=256, gqa_heads=4, gqa_kv_heads=2, gqa_head_dim=64, rope_dim=16,
                  rope_theta=10000.0, tied=True, dtype="bf16", max_pos=4096, tokenizer="bytes"),
    "1.7b": dict(family="kda", d=2048, layers=24, pattern="KKKG", heads=16, head_dim=128, expand_v=1,
                 ffn=8064, vocab=32000, gqa_heads=16, gqa_kv_heads=4, gqa_head_dim=128, rope_dim=32,
                 rope_theta=1e7, tied=True, dtype="bf16", max_pos=8192, tokenizer=None),
    "llama-tiny": dict(family="llama_kda", d=64, layers=4, pattern="KKKG", heads=2, head_dim=16,
                       expand_v=1, ffn=128, vocab=256, gqa_heads=4, gqa_kv_heads=2, gqa_head_dim=16,
                       rope_dim=16, rope_theta=10000.0, tied=True, dtype="bf16", max_pos=2048,
                       tokenizer="bytes"),
    # Mercity pretrain-kda-1b. Assumed (not public): the KDA heads (12 x 128) and the
    # layer pattern (KKKG); everything else is section 6 of MODEL_SPEC.
    "llama-1b": dict(family="llama_kda", d=1536, layers=32, pattern="KKKG", heads=12, head_dim=128,
                     expand_v=1, ffn=5120, vocab=32000, gqa_heads=12, gqa_kv_heads=6, gqa_head_dim=128,
                     rope_dim=128, rope_theta=1e6, tied=True, dtype="bf16", max_pos=4096, tokenizer=None),
}
DEFAULTS = dict(PRESETS["tiny"], scheme="fla", gate="separate", shards=1, seed=0, conv_size=4,
                norm_eps=1e-6, bos=1, eos=2,
                # options of fla's KDAConfig / Mercity's LlamaKDAConfig (off by default)
                v_heads=None, no_short_conv=False, conv_bias=False, lower_bound=None, safe_gate=False,
                neg_eigval=False, qkv_bias=False, window=0, attnres=0, mlp_bias=False, attn_style="dm",
                no_qk_norm=False, qk_norm_eps=None, rope_type="default", rope_factor=2.0, rope_low=1.0,
                rope_high=4.0, rope_orig=16, config_style="engine", layout="types")


# ---- the tensor table -------------------------------------------------------

class T:
    """One stored tensor. `parts` lists the canonical (seeded) tensors it is
    made of: one, or q and gate for an interleaved GQA q_proj."""

    def __init__(self, name, shape, init, canon=None, parts=None):
        self.name, self.shape, self.init = name, tuple(shape), init
        self.canon = canon or name
        self.parts = parts
        self.dtype = None

    @property
    def numel(self):
        return st.numel(self.shape)


def lin(fan_in, scale=1.0):
    return ("normal", scale / math.sqrt(fan_in))


def tensor_table(c):
    """Every tensor of the model described by args `c`, in model order."""
    out = []
    D, F = c.d, c.ffn
    H, K = c.heads, c.head_dim
    HVh = c.v_heads or H                     # value heads (GVA when > H)
    V = int(round(c.head_dim * c.expand_v))
    HK, HV, HVK = H * K, HVh * V, HVh * K
    Hq, Hkv, hd = c.gqa_heads, c.gqa_kv_heads, c.gqa_head_dim
    emb_sigma = min(0.5, 3.0 / math.sqrt(D))  # tied head: logits ~ 3 * |normed h| / sqrt(D)
    llama = c.family == "llama_kda"
    hf = llama or c.scheme == "hf"

    def add(name, shape, init, canon):
        out.append(T(name, shape, init, canon))

    fla_emb = "model.embeddings.weight" if not llama else "model.embed_tokens.weight"
    add("model.embed_tokens.weight" if hf else "model.embeddings.weight", (c.vocab, D),
        ("normal", emb_sigma), fla_emb)
    kinds = layer_kinds(c)
    for i in range(c.layers):
        kind = kinds[i]
        p = "model.layers.%d." % i
        cp = p  # canonical (seed) names: fla scheme for kda, HF for llama_kda
        n_attn_norm = "input_layernorm" if hf else "attn_norm"
        n_mlp_norm = "post_attention_layernorm" if hf else "mlp_norm"
        c_attn_norm = "input_layernorm" if llama else "attn_norm"
        c_mlp_norm = "post_attention_layernorm" if llama else "mlp_norm"
        mix = p + ("self_attn." if hf else "attn.")
        cmix = cp + ("self_attn." if llama else "attn.")
        add(p + n_attn_norm + ".weight", (D,), ("norm",), cp + c_attn_norm + ".weight")
        if kind == "K":
            m, cm = (mix + "kda.", cmix + "kda.") if llama else (mix, cmix)
            kda = [("q_proj.weight", (HK, D), lin(D)),
                   ("k_proj.weight", (HK, D), lin(D)),
                   ("v_proj.weight", (HV, D), lin(D))]
            if not c.no_short_conv:
                kda += [("q_conv1d.weight", (HK, 1, c.conv_size), ("normal", 0.3)),
                        ("k_conv1d.weight", (HK, 1, c.conv_size), ("normal", 0.3)),
                        ("v_conv1d.weight", (HV, 1, c.conv_size), ("normal", 0.3))]
                if c.conv_bias:
                    kda += [("q_conv1d.bias", (HK,), ("normal", 0.2)), ("k_conv1d.bias", (HK,), ("normal", 0.2)),
                            ("v_conv1d.bias", (HV,), ("normal", 0.2))]
            kda += [("f_proj.0.weight", (V, D), lin(D)),
                   ("f_proj.1.weight", (HVK, V), lin(V)),
                   ("b_proj.weight", (HVh, D), lin(D)),
                   # lower-bound gate: fla initialises A_log to 0; spread it a little
                   ("A_log", (HVh,), ("normal", 0.5) if c.lower_bound is not None else ("alog",)),
                   ("dt_bias", (HVK,), ("dtbias",)),
                   ("g_proj.0.weight", (V, D), lin(D)),
                   ("g_proj.1.weight", (HV, V), lin(V)),
                   ("g_proj.1.bias", (HV,), ("normal", 0.1)),
                   ("o_norm.weight", (V,), ("norm",)),
                   ("o_proj.weight", (D, HV), lin(HV, OUT_SCALE))]
            for n, sh, init in kda:
                add(m + n, sh, init, cm + n)
        elif kind == "G":
            gate = not llama and c.attn_style == "dm"
            qk_norm = not c.no_qk_norm and (llama or c.attn_style == "dm")
            if gate and c.gate == "interleaved":
                t = T(mix + "q_proj.weight", (2 * Hq * hd, D), None,
                      parts=[T(mix + "q", (Hq * hd, D), lin(D), cmix + "q_proj.weight"),
                             T(mix + "g", (Hq * hd, D), lin(D), cmix + "g_proj.weight")])
                t.canon = cmix + "q_proj.weight"
                out.append(t)
            else:
                add(mix + "q_proj.weight", (Hq * hd, D), lin(D), cmix + "q_proj.weight")
            add(mix + "k_proj.weight", (Hkv * hd, D), lin(D), cmix + "k_proj.weight")
            add(mix + "v_proj.weight", (Hkv * hd, D), lin(D), cmix + "v_proj.weight")
            if gate and c.gate == "separate":
                add(mix + "g_proj.weight", (Hq * hd, D), lin(D), cmix + "g_proj.weight")
            add(mix + "o_proj.weight", (D, Hq * hd), lin(Hq * hd, OUT_SCALE), cmix + "o_proj.weight")
            if c.qkv_bias:
                for n, rows in (("q", Hq * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
                    add(mix + n + "_proj.bias", (rows,), ("normal", 0.3), cmix + n + "_proj.bias")
                if llama:  # LlamaAttention's attention_bias covers o_proj too
                    add(mix + "o_proj.bias", (D,), ("normal", 0.1), cmix + "o_proj.bias")
            if qk_norm:
                add(mix + "q_norm.weight", (hd,), ("norm",), cmix + "q_norm.weight")
                add(mix + "k_norm.weight", (hd,), ("norm",), cmix + "k_norm.weight")
        else:
            raise SystemExit("--pattern: unknown layer kind %r (use K for KDA, G for attention)" % kind)
        add(p + n_mlp_norm + ".weight", (D,), ("norm",), cp + c_mlp_norm + ".weight")
        for n, sh, init in [("gate_proj", (F, D), lin(D)), ("up_proj", (F, D), lin(D)),
                            ("down_proj", (D, F), lin(F, OUT_SCALE))]:
            add(p + "mlp." + n + ".weight", sh, init, p + "mlp." + n + ".weight")
            if c.mlp_bias:
                add(p + "mlp." + n + ".bias", sh[:1], ("normal", 0.1), p + "mlp." + n + ".bias")
        if c.attnres:  # fla attention residuals: pseudo-queries and key norms per sub-layer
            for n in ("attn_res", "mlp_res"):
                add(p + n + "_proj.weight", (1, D), lin(D, 2.0), p + n + "_proj.weight")
                add(p + n + "_norm.weight", (D,), ("norm",), p + n + "_norm.weight")
    if c.attnres:
        add("model.res_proj.weight", (1, D), lin(D, 2.0), "model.res_proj.weight")
        add("model.res_norm.weight", (D,), ("norm",), "model.res_norm.weight")
    add("model.norm.weight", (D,), ("norm",), "model.norm.weight")
    if not c.tied:
        add("lm_head.weight", (c.vocab, D), ("normal", emb_sigma), "lm_head.weight")

    dt = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
    for i, t in enumerate(sorted(out, key=lambda t: t.name)):
        t.dtype = dt[c.dtype] if c.dtype != "mixed" else ("BF16", "F16", "F32")[i % 3]
    return out


# ---- random values ----------------------------------------------------------

def rng_for(seed, canon):
    return np.random.default_rng([seed, zlib.crc32(canon.encode("utf-8"))])


def fast_bits(rng, n, sigma):
    """n bf16 bit patterns: random sign and mantissa, exponent E..E-3 with
    2^E ~ sigma / 0.88 (the RMS of (1+m) 2^(E-k), k uniform in 0..3)."""
    e = int(round(math.log2(sigma / 0.88))) + 127
    raw = rng.bit_generator.random_raw((n + 3) // 4)
    r = raw.view(np.uint16)[:n]
    expo = np.uint16(e << 7) - (r & np.uint16(0x0180))
    return (r & np.uint16(0x807F)) | expo


def gen_chunks(t, seed):
    """Yields float32 arrays ('f', a) or bf16 bit arrays ('b', bits) that make
    up canonical tensor t in row-major order."""
    rng = rng_for(seed, t.canon)
    kind = t.init[0]
    n = t.numel
    if kind == "normal" and n >= FAST_MIN:
        for s in range(0, n, CHUNK):
            # draws are sequential, so the values do not depend on CHUNK
            yield "b", fast_bits(rng, min(CHUNK, n - s), t.init[1])
        return
    if kind == "normal":
        a = rng.standard_normal(n, dtype=np.float32) * np.float32(t.init[1])
    elif kind == "norm":
        a = 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)
    elif kind == "alog":       # fla: A = U(1, 16), stored as log
        a = np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)
    elif kind == "dtbias":     # fla: dt = exp(U(log 1e-3, log 1e-1)), dt_bias = softplus^-1(dt)
        dtv = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), n))
        a = (dtv + np.log(-np.expm1(-dtv))).astype(np.float32)
    else:
        raise ValueError(kind)
    yield "f", a.astype(np.float32)


def convert(kind, a, dtype):
    if kind == "b":
        if dtype == "BF16":
            return a
        a = st.bf16_bits_to_f32(a)
    return st.to_dtype_bytes(a, dtype)


def as_f32(kind, a):
    return st.bf16_bits_to_f32(a) if kind == "b" else a


def fill_tensor(t, seed, hd=None):
    """Yields t's bytes in t.dtype."""
    if t.parts is None:
        for kind, a in gen_chunks(t, seed):
            yield convert(kind, a, t.dtype)
        return
    # interleaved q|gate: rows 2*hd*h .. +hd = query head h, the next hd = its gate
    q, g = [np.concatenate([as_f32(k, a) for k, a in gen_chunks(p, seed)]).reshape(p.shape)
            for p in t.parts]
    D = q.shape[1]
    fused = np.stack([q.reshape(-1, hd, D), g.reshape(-1, hd, D)], axis=1).reshape(-1, D)
    yield st.to_dtype_bytes(fused, t.dtype)


# ---- config.json ------------------------------------------------------------

def num(x):
    return int(x) if float(x).is_integer() else float(x)


def layer_kinds(c):
    """K/G per layer: the pattern repeated, or (llama_kda --layout every/range/kda_every)
    what Mercity's layout rule gives."""
    n = c.layers
    kind, *arg = c.layout.split(":")
    if kind == "every":
        return ["G" if (i + 1) % int(arg[0]) == 0 else "K" for i in range(n)]
    if kind == "range":
        return ["G" if int(arg[0]) <= i < int(arg[1]) else "K" for i in range(n)]
    if kind == "kda_every":
        e, off = int(arg[0]), int(arg[1]) if len(arg) > 1 else 0
        return ["K" if i % e == off % e else "G" for i in range(n)]
    return [c.pattern[i % len(c.pattern)] for i in range(n)]


def make_config(c):
    kinds = layer_kinds(c)
    tools = c.config_style == "tools"
    if c.family == "llama_kda":
        cfg = {
            "model_type": "llama_kda",
            "hidden_size": c.d, "num_hidden_layers": c.layers,
            "num_attention_heads": c.gqa_heads, "num_key_value_heads": c.gqa_kv_heads,
            "head_dim": c.gqa_head_dim, "intermediate_size": c.ffn, "vocab_size": c.vocab,
            "rope_theta": float(c.rope_theta), "rms_norm_eps": c.norm_eps,
            "tie_word_embeddings": bool(c.tied), "max_position_embeddings": c.max_pos,
            "bos_token_id": c.bos, "eos_token_id": c.eos, "hidden_act": "silu",
            "kda_layer_types": ["kda" if k == "K" else "full" for k in kinds],
            "kda_num_heads": c.heads, "kda_head_dim": c.head_dim, "kda_conv_size": c.conv_size,
            "qk_norm": not c.no_qk_norm,
        }
        opts = {"kda_num_v_heads": c.v_heads, "kda_expand_v": num(c.expand_v) if c.expand_v != 1 else None,
                "kda_use_short_conv": False if c.no_short_conv else None, "kda_conv_bias": c.conv_bias or None,
                "kda_allow_neg_eigval": c.neg_eigval or None, "kda_lower_bound": c.lower_bound,
                "kda_safe_gate": c.safe_gate or None, "qk_norm_eps": c.qk_norm_eps,
                "attention_bias": c.qkv_bias or None, "mlp_bias": c.mlp_bias or None}
        if c.rope_type != "default":
            rs = {"rope_type": c.rope_type, "factor": c.rope_factor}
            if c.rope_type == "llama3":
                rs.update(low_freq_factor=c.rope_low, high_freq_factor=c.rope_high,
                          original_max_position_embeddings=c.rope_orig)
            opts["rope_scaling"] = rs
        if tools:  # what transformers 5 + Mercity's LlamaKDAConfig write: every key, the 5.x rope form
            rp = dict(opts.pop("rope_scaling", None) or {"rope_type": "default"}, rope_theta=float(c.rope_theta))
            del cfg["rope_theta"]
            cfg.update({"architectures": ["LlamaKDA"], "attention_bias": False, "attention_dropout": 0.0,
                        "dtype": {"bf16": "bfloat16", "f16": "float16"}.get(c.dtype, "float32"),
                        "initializer_range": 0.02, "mlp_bias": False, "pad_token_id": None,
                        "pretraining_tp": 1, "rope_parameters": rp, "transformers_version": "5.17.0",
                        "use_cache": True, "kda_full_attn_layers": None, "kda_full_attn_every": None,
                        "kda_full_attn_range": None, "kda_every": None, "kda_offset": 0, "kda_num_v_heads": None,
                        "kda_expand_v": 1.0, "kda_use_short_conv": True, "kda_conv_bias": False,
                        "kda_allow_neg_eigval": False, "kda_lower_bound": None, "kda_safe_gate": False,
                        "qk_norm_eps": None})
        cfg.update({k: v for k, v in opts.items() if v is not None})
        kind, *arg = c.layout.split(":")
        if kind != "types":  # the layout keys instead of the resolved list
            del cfg["kda_layer_types"]
            if kind == "every":
                cfg["kda_full_attn_every"] = int(arg[0])
            elif kind == "range":
                cfg["kda_full_attn_range"] = [int(arg[0]), int(arg[1])]
            elif kind == "kda_every":
                cfg["kda_every"], cfg["kda_offset"] = int(arg[0]), int(arg[1]) if len(arg) > 1 else 0
            elif kind == "list":
                cfg["kda_full_attn_layers"] = [i for i, k in enumerate(kinds) if k == "G"]
    else:
        dm = c.attn_style == "dm"
        attn = {
            "layers": [i for i, k in enumerate(kinds) if k == "G"],
            "num_heads": c.gqa_heads, "num_kv_heads": c.gqa_kv_heads,
            "qkv_bias": bool(c.qkv_bias), "rope_theta": float(c.rope_theta),
            "window_size": c.window or None,
        }
        if dm:  # the DM card's layout: explicit head_dim, qk-norm, partial RoPE, output gate
            attn.update({"head_dim": c.gqa_head_dim, "qk_norm": not c.no_qk_norm,
                         "partial_rotary_factor": num(c.rope_dim / c.gqa_head_dim), "output_gate": True})
        cfg = {
            "model_type": "kda",
            "hidden_size": c.d, "num_hidden_layers": c.layers,
            "num_heads": c.heads, "head_dim": c.head_dim, "expand_v": num(c.expand_v),
            "use_short_conv": not c.no_short_conv, "conv_size": c.conv_size,
            "intermediate_size": c.ffn, "hidden_act": "swish", "norm_eps": c.norm_eps,
            "vocab_size": c.vocab, "tie_word_embeddings": bool(c.tied),
            "bos_token_id": c.bos, "eos_token_id": c.eos, "max_position_embeddings": c.max_pos,
            "allow_neg_eigval": bool(c.neg_eigval), "safe_gate": bool(c.safe_gate), "lower_bound": c.lower_bound,
            "attn": attn if attn["layers"] or not tools else None,
        }
        opts = {"num_v_heads": c.v_heads, "conv_bias": c.conv_bias or None, "attnres_block_size": c.attnres or None}
        if tools:  # every key fla 0.5.2's KDAForCausalLM.save_pretrained writes (transformers 5.17)
            cfg.update({"architectures": ["KDAForCausalLM"], "attn_mode": "chunk", "attnres_block_size": None,
                        "dtype": {"bf16": "bfloat16", "f16": "float16"}.get(c.dtype, "float32"),
                        "fuse_cross_entropy": True, "fuse_norm": True, "fuse_swiglu": True, "hidden_ratio": 4,
                        "initializer_range": 0.02, "num_v_heads": None, "pad_token_id": None,
                        "transformers_version": "5.17.0", "use_cache": True, "use_l2warp": False})
        cfg.update({k: v for k, v in opts.items() if v is not None})
    if c.tokenizer == "bytes":
        cfg["tokenizer"] = "bytes"
    return cfg


# ---- CLI --------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--family", choices=["kda", "llama_kda"])
    ap.add_argument("--d", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--pattern", help="layer kinds repeated over the layers: K = KDA, G = attention")
    ap.add_argument("--heads", type=int, help="KDA heads")
    ap.add_argument("--head-dim", type=int, help="KDA key width per head")
    ap.add_argument("--expand-v", type=float, help="KDA value width = head-dim * expand-v")
    ap.add_argument("--conv-size", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--gqa-heads", type=int)
    ap.add_argument("--gqa-kv-heads", type=int)
    ap.add_argument("--gqa-head-dim", type=int)
    ap.add_argument("--rope-dim", type=int, help="rotated dims per head (llama_kda: all)")
    ap.add_argument("--rope-theta", type=float)
    ap.add_argument("--norm-eps", type=float)
    ap.add_argument("--scheme", choices=["fla", "hf"], help="tensor names (kda family)")
    ap.add_argument("--gate", choices=["separate", "interleaved"], help="GQA output gate layout")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tied", dest="tied", action="store_true", default=None)
    g.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32", "mixed"])
    ap.add_argument("--shards", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--tokenizer", help="bytes | spm:PATH | none")
    ap.add_argument("--max-pos", type=int)
    o = ap.add_argument_group("fla KDAConfig / Mercity LlamaKDAConfig options (MODEL_SPEC 5a, 6)")
    o.add_argument("--v-heads", type=int, help="KDA value heads (GVA: a multiple of --heads)")
    o.add_argument("--no-short-conv", action="store_const", const=True, help="use_short_conv false")
    o.add_argument("--conv-bias", action="store_const", const=True, help="short convs with a bias")
    o.add_argument("--lower-bound", type=float, help="the lower-bound decay gate (e.g. -5)")
    o.add_argument("--safe-gate", action="store_const", const=True, help="safe_gate true (needs --lower-bound)")
    o.add_argument("--neg-eigval", action="store_const", const=True, help="allow_neg_eigval: beta x 2")
    o.add_argument("--qkv-bias", action="store_const", const=True,
                   help="attention q/k/v biases (llama_kda: attention_bias, o_proj too)")
    o.add_argument("--window", type=int, help="sliding attention window (kda family)")
    o.add_argument("--attnres", type=int, help="attnres_block_size (1 or even; kda family)")
    o.add_argument("--mlp-bias", action="store_const", const=True, help="MLP biases (llama_kda)")
    o.add_argument("--attn-style", choices=["dm", "fla"],
                   help="kda attention: dm (gate, qk-norm, partial RoPE) or fla's own (none; hd = d/heads)")
    o.add_argument("--no-qk-norm", action="store_const", const=True)
    o.add_argument("--qk-norm-eps", type=float, help="llama_kda qk_norm_eps")
    o.add_argument("--rope-type", choices=["default", "linear", "llama3"], help="llama_kda RoPE scaling")
    o.add_argument("--rope-factor", type=float)
    o.add_argument("--rope-low", type=float, help="llama3 low_freq_factor")
    o.add_argument("--rope-high", type=float, help="llama3 high_freq_factor")
    o.add_argument("--rope-orig", type=int, help="llama3 original_max_position_embeddings")
    o.add_argument("--config-style", choices=["engine", "tools"],
                   help="tools: every key fla / transformers 5 write, as they write them")
    o.add_argument("--layout", help="llama_kda layout keys: types | list | every:N | range:A:B | kda_every:N[:OFF]")
    ap.add_argument("--dry-run", action="store_true", help="print the tensor table and count, write nothing")
    a = ap.parse_args(argv)

    c = dict(DEFAULTS)
    if a.preset:
        c.update(PRESETS[a.preset])
    explicit = {k: v for k, v in vars(a).items() if v is not None and k in DEFAULTS}
    c.update(explicit)
    c["outdir"], c["dry_run"], c["preset"] = a.outdir, a.dry_run, a.preset
    c = argparse.Namespace(**c)
    if c.family == "llama_kda":
        if "rope_dim" in explicit and c.rope_dim != c.gqa_head_dim:
            ap.error("llama_kda rotates all head dims: --rope-dim must equal --gqa-head-dim")
        c.rope_dim = c.gqa_head_dim
        if c.expand_v != 1:
            ap.error("llama_kda: KDA value width = kda_head_dim (expand-v 1)")
        if explicit.get("scheme") == "fla":
            ap.error("llama_kda has HF names only (no --scheme)")
        if "gate" in explicit:
            ap.error("llama_kda attention has no output gate (no --gate)")
    if c.tokenizer == "none":
        c.tokenizer = None
    if c.family == "kda" and c.attn_style == "fla":  # fla's Attention: hd = d / heads, full RoPE
        c.gqa_head_dim = c.d // c.gqa_heads
        c.rope_dim = c.gqa_head_dim
    if c.v_heads and c.v_heads % c.heads:
        ap.error("--v-heads must be a multiple of --heads")
    if c.safe_gate and c.lower_bound is None:
        ap.error("--safe-gate needs --lower-bound")
    if c.attnres and c.attnres != 1 and c.attnres % 2:
        ap.error("--attnres must be 1 or even")
    if c.family == "kda" and (c.mlp_bias or c.rope_type != "default"):
        ap.error("--mlp-bias and --rope-type are llama_kda options")
    if c.family == "llama_kda" and (c.window or c.attnres):
        ap.error("--window and --attnres are kda-family options")
    if not c.outdir and not c.dry_run:
        ap.error("OUTDIR is required unless --dry-run")
    if c.rope_dim % 2 or c.rope_dim > c.gqa_head_dim:
        ap.error("--rope-dim must be even and <= --gqa-head-dim")
    if c.gqa_heads % c.gqa_kv_heads:
        ap.error("--gqa-heads must be a multiple of --gqa-kv-heads")
    if c.tokenizer == "bytes" and c.vocab < 256:
        ap.error("byte tokenizer needs --vocab >= 256")
    if c.tokenizer and c.tokenizer != "bytes" and not c.tokenizer.startswith("spm:"):
        ap.error("--tokenizer must be bytes, spm:PATH or none")
    return c


def split_shards(tensors, n):
    """Contiguous groups of roughly equal bytes, none empty."""
    n = max(1, min(n, len(tensors)))
    sizes = [t.numel * st.ITEMSIZE[t.dtype] for t in tensors]
    total = float(sum(sizes))
    groups, cum = [[] for _ in range(n)], 0
    for i, (t, s) in enumerate(zip(tensors, sizes)):
        k = min(n - 1, int(cum / total * n))
        k = max(k, n - (len(tensors) - i))  # leave at least one tensor per remaining shard
        k = max(k, max((j for j in range(n) if groups[j]), default=0))
        groups[k].append(t)
        cum += s
    return [g for g in groups if g]


def main(argv=None):
    c = parse_args(sys.argv[1:] if argv is None else argv)
    tensors = tensor_table(c)
    n_params = sum(t.numel for t in tensors)
    nbytes = sum(t.numel * st.ITEMSIZE[t.dtype] for t in tensors)
    if c.dry_run:
        for t in tensors:
            print("%-56s %-5s %-18s %12d" % (t.name, t.dtype, "x".join(map(str, t.shape)), t.numel))
        print("parameters: {:,}".format(n_params))
        print("bytes: {:,}".format(nbytes))
        return 0

    t0 = time.time()
    os.makedirs(c.outdir, exist_ok=True)
    for f in os.listdir(c.outdir):  # stale files of an earlier layout would confuse loaders
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".index.json")):
            os.remove(os.path.join(c.outdir, f))
    if c.tokenizer and c.tokenizer.startswith("spm:"):
        src = c.tokenizer[4:]
        try:
            import sentencepiece as spm
            nv = spm.SentencePieceProcessor(model_file=src).get_piece_size()
            if nv != c.vocab:
                raise SystemExit("%s has %d pieces but --vocab is %d" % (src, nv, c.vocab))
        except ImportError:
            pass
        shutil.copyfile(src, os.path.join(c.outdir, "tokenizer.model"))
    with open(os.path.join(c.outdir, "config.json"), "w") as fh:
        json.dump(make_config(c), fh, indent=2)
        fh.write("\n")

    by_name = {t.name: t for t in tensors}
    hd = c.gqa_head_dim

    def fill(name, dtype, shape):
        return fill_tensor(by_name[name], c.seed, hd)

    groups = split_shards(tensors, c.shards)
    if len(groups) == 1:
        st.write_file(os.path.join(c.outdir, "model.safetensors"),
                      [(t.name, t.dtype, t.shape) for t in tensors], fill)
    else:
        wmap, n = {}, len(groups)
        for i, g in enumerate(groups):
            fname = "model-%05d-of-%05d.safetensors" % (i + 1, n)
            st.write_file(os.path.join(c.outdir, fname), [(t.name, t.dtype, t.shape) for t in g], fill)
            for t in g:
                wmap[t.name] = fname
        with open(os.path.join(c.outdir, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": nbytes},
                       "weight_map": dict(sorted(wmap.items()))}, fh, indent=2)
            fh.write("\n")
    print("wrote %s: %d tensors in %d file(s), %s bytes, %.1f s" %
          (c.outdir, len(tensors), len(groups), "{:,}".format(nbytes), time.time() - t0))
    print("parameters: {:,}".format(n_params))
    return 0


if __name__ == "__main__":
    sys.exit(main())

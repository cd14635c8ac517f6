#!/usr/bin/env python3
"""reference.py - teacher-forced log-probs, perplexity and greedy tokens from
the independent float64 reference (ref_model.py).

    reference.py CKPT --tokens 1,72,101,108 --greedy 8 --json
    reference.py CKPT --text "Hello" --json           # byte or SentencePiece tokenizer, BOS first
    reference.py CKPT --tokens 1,2,3 --logits-out /tmp/l.f32   # [T, vocab] raw little-endian fp32

token_logprobs[i] = log p(tokens[i+1] | tokens[0..i]); nll = mean(-token_logprobs);
ppl = exp(nll); greedy = N argmax tokens continuing the input (lowest id on ties,
decoded with the recurrent state and KV cache, no EOS stop).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_model import RefModel  # noqa: E402


def encode_text(ckpt, cfg, text):
    if cfg.raw.get("tokenizer") == "bytes":
        return [cfg.bos] + list(text.encode("utf-8"))
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(ckpt, "tokenizer.model"))
    return [cfg.bos] + sp.encode(text)


def argmax_lowest(row):
    """Index of the maximum; numpy returns the first (lowest id) on ties."""
    return int(np.argmax(row.detach().cpu().numpy()))


def run(ckpt, tokens=None, text=None, greedy=0, fp32=False, chunked=False, logits_out=None, bf16_act=False):
    m = RefModel(ckpt, dtype=torch.float32 if fp32 else torch.float64,
                 kda_mode="chunked" if chunked else "recurrent", bf16_act=bf16_act)
    if text is not None:
        tokens = encode_text(ckpt, m.cfg, text)
    if not tokens:
        raise SystemExit("no tokens")
    logits, state = m.forward(tokens)
    if logits_out:
        logits.to(torch.float32).numpy().astype("<f4").tofile(logits_out)
    lp = torch.log_softmax(logits, dim=-1)
    tlp = [float(lp[i, tokens[i + 1]]) for i in range(len(tokens) - 1)]
    nll = -sum(tlp) / len(tlp) if tlp else None
    out = {"tokens": list(tokens), "token_logprobs": tlp, "nll": nll,
           "ppl": math.exp(nll) if nll is not None else None, "greedy": []}
    last = logits[-1]
    for _ in range(greedy):
        t = argmax_lowest(last)
        out["greedy"].append(t)
        step, state = m.forward([t], state)
        last = step[-1]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="comma-separated token ids")
    src.add_argument("--text", help="text to encode with the checkpoint's tokenizer (BOS prepended)")
    ap.add_argument("--greedy", type=int, default=0, help="greedy tokens to generate after the input")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--fp32", action="store_true", help="compute in float32 instead of float64")
    ap.add_argument("--chunked", action="store_true", help="chunked KDA form instead of per-token")
    ap.add_argument("--logits-out", help="write [T, vocab] teacher-forced logits as raw fp32")
    ap.add_argument("--bf16-act", action="store_true",
                    help="round activations to bf16 where the CUDA backend stores them (kda-cli: --tuning cpu_bf16_act=1)")
    a = ap.parse_args()
    toks = [int(x) for x in a.tokens.split(",") if x.strip()] if a.tokens else None
    out = run(a.ckpt, toks, a.text, a.greedy, a.fp32, a.chunked, a.logits_out, a.bf16_act)
    if a.json:
        print(json.dumps(out))
    else:
        print("tokens:", out["tokens"])
        print("token_logprobs:", " ".join("%.5f" % x for x in out["token_logprobs"]))
        if out["nll"] is not None:
            print("nll %.6f  ppl %.4f" % (out["nll"], out["ppl"]))
        if out["greedy"]:
            print("greedy:", out["greedy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

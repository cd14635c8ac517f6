#!/usr/bin/env python3
"""What storing the KDA state as bf16 costs in fidelity (issue 14,
--kda-state-dtype bf16): the same texts through kda-server with the state in
fp32 and in bf16 on one device, and, as the scale, through the fp32 CPU
reference when --cpu-reference is given (what the CUDA backend's bf16
activations already change).

Per context length L: N texts of L tokens (--text FILE: slices of it,
byte-tokenized models only; otherwise random ids) scored by /score one token
per engine step (--prefill-chunk 1 --step-tokens 1: the state is stored and
read back after every token, as in decode; a prompt in one pass reads its
state once and stores it once, so it would show no difference at all); the
largest and mean |log-prob difference| over all positions, the mean NLL of
each run, and, from a prompt of the first 64 tokens of each text, how many of
--gen greedy tokens the runs share before they first differ. The fp32-state
server scoring each text in one pass is the yardstick: what step boundaries
alone change (the bf16 activations).

  bench_state_dtype.py --server build/server/kda-server --model DIR --device cuda \
      --lengths 512,4096 --texts 4 [--text FILE] [--cpu-reference] --out FILE.json
"""
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefix import Server  # noqa: E402


def texts_of(a, vocab, byte_tok):
    rng = random.Random(11)
    out = {}
    data = open(a.text, "rb").read() if a.text else None
    for L in a.lengths:
        ts = []
        for i in range(a.texts):
            if data and byte_tok and len(data) > L + 1:
                at = rng.randrange(0, len(data) - L)
                ts.append(list(data[at:at + L]))
            else:
                ts.append([rng.randrange(3, vocab) for _ in range(L)])
        out[L] = ts
    return out


def run(a, device, flags, texts, tag, env):
    srv = Server(a.server, a.model, ["--device", device, "--prefix-cache", "off", "--log-level", "warn",
                                     "--max-batch", "8"] + flags,
                 os.path.join(a.log_dir, f"server-{tag}.log"), env)
    try:
        lps, gens = {}, {}
        for L, ts in texts.items():
            lps[L] = [srv.post("/score", {"tokens": t})["token_logprobs"] for t in ts]
            gens[L] = [srv.post("/generate", {"tokens": t[:64], "max_tokens": a.gen, "temperature": 0,
                                              "ignore_eos": True})["tokens"] for t in ts]
        return lps, gens
    finally:
        srv.stop()


def compare(x, y):
    """log-prob differences over all texts, and the shared greedy prefix per text"""
    d = [abs(p - q) for lx, ly in zip(x[0], y[0]) for p, q in zip(lx, ly) if p is not None and q is not None]
    shared = []
    for gx, gy in zip(x[1], y[1]):
        n = 0
        while n < min(len(gx), len(gy)) and gx[n] == gy[n]:
            n += 1
        shared.append(n)
    return {"max_abs_logprob_diff": round(max(d), 5), "mean_abs_logprob_diff": round(sum(d) / len(d), 6),
            "greedy_shared_tokens": shared}


def nll(lps):
    v = [-p for lx in lps for p in lx if p is not None]
    return round(sum(v) / len(v), 5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", default="512,4096")
    ap.add_argument("--texts", type=int, default=4)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--text")
    ap.add_argument("--cpu-reference", action="store_true")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.lengths = [int(x) for x in a.lengths.split(",")]
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    vocab, byte_tok = cfg["vocab_size"], cfg.get("tokenizer") == "bytes"
    env = dict(os.environ)
    if os.environ.get("KDA_LIB_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["KDA_LIB_PATH"]
    if max(a.lengths) > cfg.get("max_position_embeddings", 0):
        raise SystemExit(f"--lengths: the model's max_position_embeddings is {cfg.get('max_position_embeddings')}")
    flags = []
    texts = texts_of(a, vocab, byte_tok)
    t0 = time.time()
    stepped = ["--prefill-chunk", "1", "--step-tokens", "1", "--step-tokens-idle", "1"]
    f32 = run(a, a.device, flags + stepped, texts, "fp32", env)
    b16 = run(a, a.device, flags + stepped + ["--kda-state-dtype", "bf16"], texts, "bf16", env)
    one = run(a, a.device, flags, texts, "fp32-one-pass", env)
    cpu = run(a, "cpu", flags, texts, "cpu", env) if a.cpu_reference else None
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": os.environ.get("KDA_COMMIT"),
           "model": a.model, "device": a.device, "texts": a.texts, "gen": a.gen,
           "text": os.path.basename(a.text) if a.text and byte_tok else "random ids", "lengths": {}}
    for L in a.lengths:
        r = {"bf16_vs_fp32_state": compare((b16[0][L], b16[1][L]), (f32[0][L], f32[1][L])),
             "fp32_stepped_vs_one_pass": compare((f32[0][L], f32[1][L]), (one[0][L], one[1][L])),
             "nll_fp32_state": nll(f32[0][L]), "nll_bf16_state": nll(b16[0][L]), "nll_one_pass": nll(one[0][L])}
        if cpu:
            r["fp32_state_vs_cpu"] = compare((f32[0][L], f32[1][L]), (cpu[0][L], cpu[1][L]))
            r["bf16_state_vs_cpu"] = compare((b16[0][L], b16[1][L]), (cpu[0][L], cpu[1][L]))
            r["nll_cpu"] = nll(cpu[0][L])
        res["lengths"][str(L)] = r
        print(f"L={L}: {json.dumps(r)}", flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    json.dump(res, open(a.out, "w"), indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    sys.exit(main())

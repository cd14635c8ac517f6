#!/usr/bin/env python3
"""Prefix cache benchmark (issue 17): the same three workloads against
kda-server with the prefix cache on and with --prefix-cache off, each server
started fresh by this script, results as JSON (date, machine, commit, figures).

  shared_prompt  N concurrent /generate requests sharing an S-token system
                 prompt, each with its own suffix, greedy, max_tokens M; run
                 twice on the same server (cold: empty cache; warm: the system
                 prompt cached by the first wave): requests/s and generated
                 tokens/s, and how many outputs equal the no-cache run's
  lm_eval        one C-token context, 8 continuations of 1-32 tokens, sent
                 one by one as lm-eval's local-completions sends loglikelihood
                 requests (/v1/completions, echo, logprobs 1, max_tokens 1):
                 prompt tokens computed, wall time, the largest log-prob
                 difference to the no-cache run (0 on the CPU backend); then the same
                 with its own context as lm-eval sends it with batch_size=8 (one
                 request, a list of 8 prompts, longest first) and num_concurrent=8
                 (8 requests at once)
  chat           10 turns resending the history (token ids, so nothing is
                 re-tokenized): TTFT of every turn

Prompts are token ids from a fixed PRNG in [32, vocab) (the random-weight
models do not care; the demo model's bytes are printable). Standard library
only, so it runs on the GPU machine as it is.

  scripts/bench_prefix.py --server build/server/kda-server --model models/demo --out FILE.json
      [--device cuda] [--threads N] [--concurrent 16] [--system-tokens 1000] [--suffix-tokens 32]
      [--max-tokens 16] [--context-tokens 1024] [--server-arg=--gpu-memory-fraction=0.9 ...]
"""
import argparse
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def rng_tokens(seed, n, vocab):
    out, x = [], seed & 0x7FFFFFFF
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(32 + (x >> 4) % (min(vocab, 1 << 20) - 32))
    return out


class Server:
    def __init__(self, binary, model, flags, log_path, env):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([binary, "--model", model, "--port", str(self.port)] + flags,
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 900
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kda-server exited early, see {log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("kda-server never became healthy")

    def post(self, path, body, timeout=3600):
        return self.post_timed(path, body, timeout)[0]

    def post_timed(self, path, body, timeout=3600):
        """post, and where the client's time went (ms): until the response
        headers came (the server's work), reading the body, parsing it."""
        t0 = time.time()
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            t1 = time.time()
            raw = r.read()
        t2 = time.time()
        out = json.loads(raw)
        t3 = time.time()
        return out, {"headers_ms": (t1 - t0) * 1e3, "body_ms": (t2 - t1) * 1e3, "parse_ms": (t3 - t2) * 1e3,
                     "body_bytes": len(raw)}

    def metrics(self):
        """every sample of /metrics, by its name with labels"""
        out = {}
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    k, v = line.rsplit(None, 1)
                    out[k] = float(v)
        return out

    def metric(self, name):
        return next((v for k, v in self.metrics().items() if k == name or k.startswith(name + "{")), 0.0)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


BREAKDOWN = {"steps": "kda_engine_steps_total", "step_tokens": "kda_engine_step_tokens_total",
             "engine_step_ms": "kda_engine_step_seconds_sum", "e2e_ms": "vllm:e2e_request_latency_seconds_sum"}
PHASES = ("idle", "admit", "build", "engine", "wait", "outputs", "wake")


def breakdown(m0, m1):
    """what the server did between two /metrics samples: steps, tokens fed,
    the time of its engine steps and of each scheduler phase (ms)"""
    def get(m, name):  # a sample's value, summed over its labels
        return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))
    d = {}
    for k, name in BREAKDOWN.items():
        v = get(m1, name) - get(m0, name)
        d[k] = round(v * 1e3, 2) if k.endswith("_ms") else int(round(v))
    for ph in PHASES:
        name = f'kda_scheduler_seconds_total{{phase="{ph}"}}'
        d["sched_" + ph + "_ms"] = round((m1.get(name, 0.0) - m0.get(name, 0.0)) * 1e3, 2)
    return d


def lp_max(xs, ys):
    """the largest log-prob difference between two runs' lists of log-prob lists"""
    return max(abs(x - y) for la, lb in zip(xs, ys) for x, y in zip(la, lb) if x is not None and y is not None)


def cached(r):
    return r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)


def shared_prompt(srv, a, vocab):
    system = rng_tokens(1, a.system_tokens, vocab)
    waves = {}
    outs = {}
    for wave in ("cold", "warm"):
        bodies = [{"tokens": system + rng_tokens(1000 + i + (0 if wave == "cold" else 5000), a.suffix_tokens, vocab),
                   "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True} for i in range(a.concurrent)]
        t0 = time.time()
        with ThreadPoolExecutor(a.concurrent) as ex:
            res = list(ex.map(lambda b: srv.post("/generate", b), bodies))
        wall = time.time() - t0
        gen = sum(len(r["tokens"]) for r in res)
        prompt = sum(r["usage"]["prompt_tokens"] for r in res)
        waves[wave] = {"wall_s": round(wall, 3), "requests_per_s": round(len(res) / wall, 3),
                       "generated_tokens_per_s": round(gen / wall, 1), "prompt_tokens": prompt,
                       "prompt_tokens_cached": sum(cached(r) for r in res),
                       "ttft_ms_median": sorted(r["timings"].get("ttft_ms", 0) for r in res)[len(res) // 2]}
        outs[wave] = [r["tokens"] for r in res]
    return waves, outs


def lm_eval(srv, a, vocab, rep=0):
    context = rng_tokens(2 + 100 * rep, a.context_tokens, vocab)
    conts = [rng_tokens(3 + i, n, vocab) for i, n in enumerate([8, 13, 21, 32, 1, 17, 26, 9])]
    # one by one; between two requests (outside the timed part) the server's
    # own e2e time (arrival to finish) is read from /metrics, to show where
    # the client's wall time goes
    res, per = [], []
    for c in conts:
        m0 = srv.metrics()
        t1 = time.time()
        r, ct = srv.post_timed("/v1/completions", {"prompt": context + c, "max_tokens": 1, "logprobs": 1,
                                                  "echo": True, "temperature": 0, "seed": 1234})
        ms = (time.time() - t1) * 1e3
        bd = breakdown(m0, srv.metrics())
        res.append(r)
        per.append({"client_ms": round(ms, 2), "server_e2e_ms": bd["e2e_ms"],
                    "prompt_tokens": r["usage"]["prompt_tokens"], "cached": cached(r),
                    "steps": bd["steps"], "step_tokens": bd["step_tokens"], "engine_step_ms": bd["engine_step_ms"],
                    **{k: round(v, 2) for k, v in ct.items()}})
    wall = sum(p["client_ms"] for p in per) / 1e3
    prompt = sum(r["usage"]["prompt_tokens"] for r in res)
    lps = [r["choices"][0]["logprobs"]["token_logprobs"] for r in res]
    return {"wall_s": round(wall, 3), "prompt_tokens": prompt, "prompt_tokens_computed": prompt - sum(cached(r) for r in res),
            "requests": per}, lps


def lm_eval_together(srv, a, vocab, mode, rep=0):
    """The same workload as lm-eval sends it with batch_size=8 (mode "batch": one request whose
    prompt is the list of the 8 prompts) or num_concurrent=8 (mode "concurrent": 8 requests at
    once), the prompts in lm-eval's order (longest first). Its own context, so that it does not
    hit what the one-by-one workload cached."""
    context = rng_tokens((5 if mode == "batch" else 6) + 100 * rep, a.context_tokens, vocab)
    conts = [rng_tokens(3 + i, n, vocab) for i, n in enumerate([8, 13, 21, 32, 1, 17, 26, 9])]
    prompts = sorted((context + c for c in conts), key=lambda t: (-len(t), tuple(t)))
    body = {"max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234}
    m0 = srv.metrics()
    t1 = time.time()
    client = None
    if mode == "batch":
        r, client = srv.post_timed("/v1/completions", dict(body, prompt=prompts))
        choices, usage = sorted(r["choices"], key=lambda c: c["index"]), [r["usage"]]
    else:
        with ThreadPoolExecutor(len(prompts)) as ex:
            rs = list(ex.map(lambda p: srv.post("/v1/completions", dict(body, prompt=p)), prompts))
        choices, usage = [c for r in rs for c in r["choices"]], [r["usage"] for r in rs]
    wall = time.time() - t1
    bd = breakdown(m0, srv.metrics())
    if client:
        bd.update({"client_" + k: round(v, 2) for k, v in client.items()})
    prompt = sum(u["prompt_tokens"] for u in usage)
    hit = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usage)
    lps = [c["logprobs"]["token_logprobs"] for c in choices]
    return {"wall_s": round(wall, 4), "prompt_tokens": prompt, "prompt_tokens_computed": prompt - hit,
            "server": bd}, lps


def chat(srv, a, vocab):
    history = rng_tokens(4, a.chat_system_tokens, vocab)
    ttft, outs = [], []
    for turn in range(10):
        history = history + rng_tokens(100 + turn, a.chat_user_tokens, vocab)
        r = srv.post("/generate", {"tokens": history, "max_tokens": a.chat_reply_tokens, "temperature": 0,
                                   "ignore_eos": True})
        ttft.append(round(r["timings"].get("ttft_ms", 0), 1))
        outs.append(r["tokens"])
        history = history + r["tokens"]
    return {"ttft_ms": ttft, "turn10_over_turn1": round(ttft[9] / ttft[0], 3)}, outs


def run(a, cache_on, vocab, env, extra=(), tag=None):
    flags = ["--device", a.device, "--max-batch", str(max(a.concurrent, 8)), "--log-level", "info"]
    if a.threads:
        flags += ["--threads", str(a.threads)]
    if not cache_on:
        flags += ["--prefix-cache", "off"]
    flags += a.server_arg + list(extra)
    log = os.path.join(a.log_dir, f"server-{tag or ('cache' if cache_on else 'nocache')}.log")
    srv = Server(a.server, a.model, flags, log, env)
    if a.lm_eval_only:
        try:
            reps = []
            for rep in range(a.repeat):
                le, le_lps = lm_eval(srv, a, vocab, rep)
                lb, lb_lps = lm_eval_together(srv, a, vocab, "batch", rep)
                lc, lc_lps = lm_eval_together(srv, a, vocab, "concurrent", rep)
                reps.append(({"lm_eval": le, "lm_eval_batch8": lb, "lm_eval_concurrent8": lc},
                             (le_lps, lb_lps, lc_lps)))
        finally:
            srv.stop()
        return reps
    try:
        sp, sp_out = shared_prompt(srv, a, vocab)
        le, le_lps = lm_eval(srv, a, vocab)
        lb, lb_lps = lm_eval_together(srv, a, vocab, "batch")
        lc, lc_lps = lm_eval_together(srv, a, vocab, "concurrent")
        ch, ch_out = chat(srv, a, vocab)
        m = {k: srv.metric(k) for k in ("kda_prefix_cache_hits_total", "kda_prefix_cache_hit_tokens_total",
                                         "kda_prefix_cache_bytes", "kda_prefix_cache_evictions_total")}
    finally:
        srv.stop()
    return ({"shared_prompt": sp, "lm_eval": le, "lm_eval_batch8": lb, "lm_eval_concurrent8": lc, "chat": ch,
             "metrics": m}, (sp_out, le_lps, ch_out, lb_lps, lc_lps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--suffix-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--context-tokens", type=int, default=1024)
    ap.add_argument("--chat-system-tokens", type=int, default=300)
    ap.add_argument("--chat-user-tokens", type=int, default=40)
    ap.add_argument("--chat-reply-tokens", type=int, default=24)
    ap.add_argument("--server-arg", action="append", default=[], help="extra kda-server flag (repeatable)")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--note", default="", help="recorded with the results (the machine's conditions)")
    ap.add_argument("--yardstick", default="", metavar="FLAGS",
                    help="also run the no-cache server with these flags (e.g. '--prefill-chunk 64'): how far "
                         "outputs move when only step boundaries change, the scale for the cache's differences "
                         "on a backend whose numbers depend on them (CUDA, bf16)")
    ap.add_argument("--lm-eval-only", action="store_true",
                    help="only the three lm-eval forms, --repeat times each (own contexts), cache on vs off, "
                         "with the server's own breakdown (steps, engine time, scheduler phases); ratios are "
                         "the medians over the repeats")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    a.server_arg = [x for arg in a.server_arg for x in arg.split("=", 1)] if a.server_arg else []
    vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    env = dict(os.environ)
    if os.environ.get("KDA_LIB_PATH"):  # the GPU machine's carried libraries, for kda-server only
        env["LD_LIBRARY_PATH"] = os.environ["KDA_LIB_PATH"]
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    if a.lm_eval_only:
        return lm_eval_only(a, vocab, env)
    on, outs_on = run(a, True, vocab, env)
    off, outs_off = run(a, False, vocab, env)
    # agreement of the cached outputs with the no-cache ones
    sp_same = {w: sum(x == y for x, y in zip(outs_on[0][w], outs_off[0][w])) for w in ("cold", "warm")}
    lp_diff = lp_max(outs_on[1], outs_off[1])
    chat_same = sum(x == y for x, y in zip(outs_on[2], outs_off[2]))
    yard = None
    if a.yardstick:
        _, outs_y = run(a, False, vocab, env, extra=a.yardstick.split(), tag="yardstick")
        yard = {"flags": a.yardstick,
                "shared_prompt_outputs_equal": {w: sum(x == y for x, y in zip(outs_y[0][w], outs_off[0][w]))
                                                for w in ("cold", "warm")},
                "lm_eval_max_abs_logprob_diff": lp_max(outs_y[1], outs_off[1]),
                "chat_turns_equal": sum(x == y for x, y in zip(outs_y[2], outs_off[2]))}
    res = {
        **machine(a),
        "params": {k: getattr(a, k) for k in ("concurrent", "system_tokens", "suffix_tokens", "max_tokens",
                                              "context_tokens", "chat_system_tokens", "chat_user_tokens",
                                              "chat_reply_tokens", "threads")},
        "cache": on, "no_cache": off,
        "ratios": {
            "shared_prompt_throughput_cold": round(on["shared_prompt"]["cold"]["requests_per_s"] /
                                                   off["shared_prompt"]["cold"]["requests_per_s"], 2),
            "shared_prompt_throughput_warm": round(on["shared_prompt"]["warm"]["requests_per_s"] /
                                                   off["shared_prompt"]["warm"]["requests_per_s"], 2),
            "lm_eval_tokens_computed": round(on["lm_eval"]["prompt_tokens_computed"] /
                                             off["lm_eval"]["prompt_tokens_computed"], 4),
            "lm_eval_wall": round(on["lm_eval"]["wall_s"] / off["lm_eval"]["wall_s"], 4),
            # lm-eval's batch_size=8 and num_concurrent=8 forms of the same workload
            **{f"{k}_{q}": round(on[k][f] / off[k][f], 4)
               for k in ("lm_eval_batch8", "lm_eval_concurrent8")
               for q, f in (("tokens_computed", "prompt_tokens_computed"), ("wall", "wall_s"))},
        },
        "exactness": {"shared_prompt_outputs_equal": sp_same, "of": a.concurrent,
                      "lm_eval_max_abs_logprob_diff": lp_diff, "chat_turns_equal": chat_same,
                      "lm_eval_batch8_max_abs_logprob_diff": lp_max(outs_on[3], outs_off[3]),
                      "lm_eval_concurrent8_max_abs_logprob_diff": lp_max(outs_on[4], outs_off[4]),
                      # the no-cache server again with other step boundaries, against the no-cache run
                      "yardstick_no_cache": yard},
    }
    r = res["ratios"]
    res["targets"] = {"lm_eval_tokens_computed<=1/6": r["lm_eval_tokens_computed"] <= 1 / 6,
                      "lm_eval_wall<=1/3": r["lm_eval_wall"] <= 1 / 3,
                      "lm_eval_wall<=1/3 (batch_size=8)": r["lm_eval_batch8_wall"] <= 1 / 3,
                      "lm_eval_wall<=1/3 (num_concurrent=8)": r["lm_eval_concurrent8_wall"] <= 1 / 3,
                      "chat_turn10<=1.5x_turn1": on["chat"]["turn10_over_turn1"] <= 1.5,
                      "shared_prompt_throughput>=3x (cold)": r["shared_prompt_throughput_cold"] >= 3}
    json.dump(res, open(a.out, "w"), indent=1)
    print(json.dumps({"ratios": res["ratios"], "exactness": res["exactness"], "targets": res["targets"],
                      "chat_ttft_cache": on["chat"]["ttft_ms"], "chat_ttft_nocache": off["chat"]["ttft_ms"]},
                     indent=1))
    print("wrote", a.out)


def machine(a):
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return {"date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "device": a.device,
                        "note": a.note},
            "commit": os.environ.get("KDA_COMMIT", commit), "model": os.path.abspath(a.model)}


def lm_eval_only(a, vocab, env):
    on = run(a, True, vocab, env)
    off = run(a, False, vocab, env)
    forms = ("lm_eval", "lm_eval_batch8", "lm_eval_concurrent8")
    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    ratios, diffs = {}, {}
    for i, f in enumerate(forms):
        w = [c[0][f]["wall_s"] / n[0][f]["wall_s"] for c, n in zip(on, off)]
        t = [c[0][f]["prompt_tokens_computed"] / n[0][f]["prompt_tokens_computed"] for c, n in zip(on, off)]
        ratios[f + "_wall"] = round(med(w), 4)
        ratios[f + "_wall_each"] = [round(x, 4) for x in w]
        ratios[f + "_tokens_computed"] = round(med(t), 4)
        diffs[f + "_max_abs_logprob_diff"] = max(lp_max(c[1][i], n[1][i]) for c, n in zip(on, off))
    res = dict(machine(a), params={"context_tokens": a.context_tokens, "threads": a.threads, "repeat": a.repeat,
                                   "server_arg": a.server_arg},
               cache=[c[0] for c in on], no_cache=[n[0] for n in off], ratios=ratios, exactness=diffs)
    res["targets"] = {"lm_eval_wall<=1/3": ratios["lm_eval_wall"] <= 1 / 3,
                      "lm_eval_wall<=1/3 (batch_size=8)": ratios["lm_eval_batch8_wall"] <= 1 / 3,
                      "lm_eval_wall<=1/3 (num_concurrent=8)": ratios["lm_eval_concurrent8_wall"] <= 1 / 3}
    json.dump(res, open(a.out, "w"), indent=1)
    print(json.dumps({"ratios": ratios, "exactness": diffs, "targets": res["targets"]}, indent=1))
    print("wrote", a.out)


if __name__ == "__main__":
    sys.exit(main())

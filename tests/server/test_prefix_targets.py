"""The prefix cache's targets from issue 17 on the shipped demo model (CPU
backend), each against a --prefix-cache off server on the same model:
  - an lm-eval-style scoring workload (one 1,024-token context, 8
    continuations of 1-32 tokens, sent as lm-eval's local-completions sends
    loglikelihood requests: echo, logprobs 1, max_tokens 1): log-probs
    bit-identical, prompt tokens computed <= 1/6, wall time <= 1/3, sent one
    by one and as one batched request;
  - a 10-turn chat resending its history: every turn's output identical,
    TTFT of turn 10 within 1.5x of turn 1's.
Timing checks compare two runs on the same machine in the same process, so
only the ratios mean anything (the CI machine is shared). Not run under the
sanitizers (suite targets): a debug build measures nothing.
"""
import os
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SRC, Server, check, finish  # noqa: E402

demo = os.path.join(SRC, "models", "demo")


def post(u, path, body, timeout=300):
    r = requests.post(u + path, json=body, timeout=timeout)
    assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:300]}"
    return r.json()


def cached(resp):
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


# ---------------------------------------------------------------------------
# lm-eval-style scoring: one 1,024-token context, 8 continuations of 1-32
# tokens, each request as lm-eval's local-completions sends a loglikelihood
# request (echo, logprobs 1, max_tokens 1), one after the other
# ---------------------------------------------------------------------------
shake = os.path.join(os.environ.get("KDA_SHARED", os.path.join(SRC, "..", "shared")), "data", "tinyshakespeare.txt")
if not os.path.exists(shake):
    print(f"SKIP: {shake} not found")
    sys.exit(77)
text = open(shake).read()
context = text[:1024]
starts = [5000, 5210, 7033, 9100, 11400, 13000, 15500, 17777]
lens = [8, 13, 21, 32, 1, 17, 26, 9]
conts = [text[s:s + n] for s, n in zip(starts, lens)]


def lm_eval_run(u, batched=False):
    t0 = time.time()
    payloads = [{"model": "demo", "prompt": context + c, "temperature": 0, "max_tokens": 1, "logprobs": 1,
                 "seed": 1234, "echo": True} for c in conts]
    if batched:
        r = post(u, "/v1/completions", dict(payloads[0], prompt=[p["prompt"] for p in payloads]))
        outs = [r]
        choices = r["choices"]
    else:
        outs = [post(u, "/v1/completions", p) for p in payloads]
        choices = [o["choices"][0] for o in outs]
    wall = time.time() - t0
    lps = [ch["logprobs"]["token_logprobs"] for ch in choices]
    tops = [ch["logprobs"]["top_logprobs"] for ch in choices]
    prompt = sum(o["usage"]["prompt_tokens"] for o in outs)
    computed = prompt - sum(cached(o) for o in outs)
    return wall, lps, tops, prompt, computed


ref = Server(demo, "--prefix-cache", "off")
srv = Server(demo)
w_ref, lp_ref, top_ref, p_ref, c_ref = lm_eval_run(ref.url)
w, lp, top, p, c = lm_eval_run(srv.url)
print(f"lm-eval workload: no cache {c_ref} prompt tokens computed in {w_ref:.2f}s; cache {c} computed "
      f"({p - c} served) in {w:.2f}s: {c_ref / max(c, 1):.1f}x fewer tokens, {w_ref / w:.1f}x faster")
check(lp == lp_ref and top == top_ref, "lm-eval workload: every log-prob and top-1 alternative bit-identical to no cache")
check(c * 6 <= c_ref, "lm-eval workload: prompt tokens computed <= 1/6 of the no-cache run", f"{c} vs {c_ref}")
check(w * 3 <= w_ref, "lm-eval workload: wall time <= 1/3 of the no-cache run", f"{w:.2f}s vs {w_ref:.2f}s")
srv.stop()
srv = Server(demo)  # the 8 requests as one batch: siblings wait for the first one's branch snapshot
wb, lpb, topb, pb, cb = lm_eval_run(srv.url, batched=True)
print(f"lm-eval workload in one request: {cb} computed ({pb - cb} served) in {wb:.2f}s")
check(lpb == lp_ref and topb == top_ref and cb * 6 <= c_ref,
      "lm-eval workload as one batched request: bit-identical, <= 1/6 of the tokens computed", f"{cb}")
srv.stop()

# ---------------------------------------------------------------------------
# a 10-turn chat resending its history: TTFT of turn 10 within 1.5x of turn 1
# ---------------------------------------------------------------------------
srv = Server(demo)
system = "The following is a conversation between two players of a Shakespeare company.\n" + text[30000:30250]
questions = [text[40000 + 97 * i: 40000 + 97 * i + 48] for i in range(10)]


def chat(u):
    history, ttft, outs, hits = system, [], [], []
    for q in questions:
        history += "\nFIRST: " + q + "\nSECOND:"
        r = post(u, "/generate", {"prompt": history, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
        ttft.append(r["timings"]["ttft_ms"])
        outs.append(r["tokens"])
        hits.append(cached(r))
        history += r["text"]
    return ttft, outs, hits


ttft_ref, outs_ref, _ = chat(ref.url)
ttft, outs, hits = chat(srv.url)
print("chat TTFT ms, cache:   ", " ".join(f"{x:.0f}" for x in ttft))
print("chat TTFT ms, no cache:", " ".join(f"{x:.0f}" for x in ttft_ref))
print("chat prompt tokens served from the cache:", hits)
check(outs == outs_ref, "chat: every turn's output equals no cache")
check(all(h > 0 for h in hits[1:]), "chat: every later turn starts from the previous turn's snapshot", str(hits))
check(ttft[9] <= 1.5 * ttft[0], "chat: TTFT of turn 10 within 1.5x of turn 1", f"{ttft[9]:.0f} vs {ttft[0]:.0f} ms")
srv.check_clean_exit()
ref.stop()

finish()

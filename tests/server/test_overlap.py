"""The scheduler's overlapped steps (--step-overlap on) give what steps in turn give.

With overlap the scheduler launches step N+1 before it turns step N's ids into
text, so a sequence that a stop string ends is fed one more token before the
end is seen (its output is dropped), a finished sequence is released one step
later, and the snapshot a finished generation leaves covers what it fed. On the
CPU a request's numbers do not depend on step boundaries or neighbours, so the
two modes must agree exactly. Two servers on the demo model, one per mode, get
the same concurrent mix (8 at a time): greedy and seeded sampling, stop
strings that end generations at different steps, streaming and not, logprobs
with alternatives, echo + logprobs (lm-eval), /score, n = 2, and a chat whose
second turn resends the first reply (a prefix-cache hit on the finished
generation's snapshot). Then, in each server: every response identical to the
other's (text, ids, log-probs, finish reasons), the second chat turn served
from the cache, a client that hangs up mid-stream costs nothing, and the
sequence and KV pools back to zero; /metrics splits the scheduler's time by
phase and the phases add up to no more than the server's uptime.
"""
import concurrent.futures as cf
import json
import os
import re
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SRC, Server, check, finish, sse_events  # noqa: E402

DEMO = os.path.join(SRC, "models", "demo")
PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo, Romeo", "First Citizen:\nBefore we proceed any further",
           "To be, or not to be", "KING RICHARD III:\nNow is the winter"]
STOPS = [["e"], ["\n"], ["the", "and"], [" "], ["Romeo"], ["zzz"]]


def workload():
    """(route, body, stream) of every request, in a fixed order."""
    out = []
    for i, p in enumerate(PROMPTS * 3):
        st = STOPS[i % len(STOPS)]
        out.append(("/generate", {"prompt": p, "max_tokens": 12 + i % 7, "temperature": 0, "stop": st}, False))
        out.append(("/generate", {"prompt": p, "max_tokens": 16, "temperature": 0.9, "seed": 1000 + i,
                                  "stop": st, "logprobs": 3}, i % 2 == 0))
        out.append(("/v1/completions", {"model": "demo", "prompt": p, "max_tokens": 10, "temperature": 1.0,
                                        "seed": 7 + i, "n": 2, "logprobs": 2}, False))
        out.append(("/v1/completions", {"model": "demo", "prompt": p, "max_tokens": 0, "echo": True,
                                        "logprobs": 1, "temperature": 0}, False))
        out.append(("/score", {"text": p + " and more of it"}, False))
    return out


def strip(route, r, seeded):
    """the parts of a response both modes must share (ids and timings vary)"""
    if route == "/generate":
        # an unseeded request echoes the seed the server drew
        return {k: r.get(k) for k in ("text", "tokens", "finish_reason", "logprobs") + (("seed",) if seeded else ())}
    if route == "/score":
        return {k: r.get(k) for k in ("token_logprobs", "nll")}
    return {"choices": [{k: c.get(k) for k in ("text", "finish_reason", "logprobs")} for c in r["choices"]],
            "usage": {k: r["usage"].get(k) for k in ("prompt_tokens", "completion_tokens")}}


def run(url, route, body, stream):
    if not stream:
        r = requests.post(url + route, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return strip(route, r.json(), "seed" in body)
    r = requests.post(url + route, json=dict(body, stream=True), stream=True, timeout=120)
    assert r.status_code == 200, r.text
    data, _ = sse_events(r.iter_lines())
    ev = [json.loads(d) for d in data if d != "[DONE]"]
    return {"text": "".join(e.get("text", "") for e in ev), "finish_reason": ev[-1].get("finish_reason")}


def metrics(url):
    out = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r'kda_scheduler_seconds_total\{phase="([a-z]+)"\}\s+(\S+)$', line)
        if m:
            out["phase:" + m.group(1)] = float(m.group(2))
        m = re.match(r"(kda_[a-z_]+|process_start_time_seconds)\s+(\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def chat(url, stop):
    """two turns, the second resending the first's prompt and reply (and, after a stop string,
    the stop string too): (replies, turn 1's prompt tokens, turn 2's cached prompt tokens)"""
    p1 = "User: Speak of Romeo.\nAssistant:"
    body = {"model": "demo", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    r1 = requests.post(url + "/v1/completions", json=dict(body, prompt=p1, **({"stop": [stop]} if stop else {})),
                       timeout=120).json()
    t1 = r1["choices"][0]["text"]
    p2 = p1 + t1 + (stop or "") + "\nUser: And of Juliet?\nAssistant:"
    r2 = requests.post(url + "/v1/completions", json=dict(body, prompt=p2), timeout=120).json()
    return ((t1, r1["choices"][0]["finish_reason"], r2["choices"][0]["text"]), r1["usage"]["prompt_tokens"],
            r2["usage"]["prompt_tokens_details"]["cached_tokens"])


results = {}
for mode in ("off", "on"):
    srv = Server(DEMO, "--chat-template", "plain", "--max-batch", "8", "--step-overlap", mode)
    check(("steps overlapped" if mode == "on" else "steps in turn") in srv.log(),
          f"--step-overlap {mode}: the startup line says how steps run")
    t0 = time.time()
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda w: run(srv.url, *w), workload()))
    c = [chat(srv.url, None), chat(srv.url, "state")]
    # a client that hangs up mid-stream
    r = requests.post(srv.url + "/generate", json={"prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True,
                                                   "stream": True}, stream=True, timeout=60)
    next(r.iter_lines())
    r.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        m = metrics(srv.url)
        if m.get("kda_state_pool_used_sequences", 1) == 0 and m.get("kda_running_sequences", 1) == 0:
            break
        time.sleep(0.1)
    check(m.get("kda_state_pool_used_sequences") == 0 and m.get("kda_running_sequences") == 0,
          f"overlap {mode}: every sequence released after the hang-up and the mix", m)
    phases = {k[6:]: v for k, v in m.items() if k.startswith("phase:")}
    check(set(phases) == {"idle", "admit", "build", "engine", "wait", "outputs", "wake"},
          f"overlap {mode}: /metrics has the scheduler's seven phases", phases)
    up = time.time() - m.get("process_start_time_seconds", t0)
    busy = sum(v for k, v in phases.items() if k != "idle")
    check(0 < busy and sum(phases.values()) <= up + 0.5 and phases["engine"] + phases["wait"] > 0,
          f"overlap {mode}: phases sum to at most the uptime, the engine's share is counted",
          {"sum": sum(phases.values()), "uptime": up})
    results[mode] = (got, c)
    srv.stop()

off, on = results["off"], results["on"]
diff = [i for i, (a, b) in enumerate(zip(off[0], on[0])) if a != b]
check(len(off[0]) == len(on[0]) and not diff, f"all {len(off[0])} responses identical with and without overlap",
      [(workload()[i][0], off[0][i], on[0][i]) for i in diff[:3]])
reasons = {r.get("finish_reason") for r in off[0] if isinstance(r, dict) and "finish_reason" in r}
check({"stop", "length"} <= reasons, "the mix ends generations by stop strings and by length", reasons)
check([c[0] for c in off[1]] == [c[0] for c in on[1]], "the chats' replies are the same in both modes",
      (off[1], on[1]))
check(off[1][1][0][1] == "stop", "the second chat's first turn ends on its stop string", off[1][1])
for mode, (_, cs) in results.items():
    for (replies, n1, cached), how in zip(cs, ("length", "a stop string")):
        # the first turn's prompt has no snapshot of its own (it is not a scoring request and below
        # the grid): a hit beyond it is the snapshot its finished generation left
        check(cached > n1, f"overlap {mode}: a turn after one ended by {how} starts from that generation's "
              "snapshot", {"turn 1 prompt": n1, "turn 2 cached": cached})
# with overlap the stop string is seen while the next step, which fed the id that completed it, runs:
# that snapshot holds one token more; a length end is known before the next step and holds the same
check(on[1][0][2] == off[1][0][2] and on[1][1][2] == off[1][1][2] + 1,
      "overlap: the end-of-generation snapshot is one token longer exactly when a stop string ended it",
      {"off": [c[2] for c in off[1]], "on": [c[2] for c in on[1]]})
finish()

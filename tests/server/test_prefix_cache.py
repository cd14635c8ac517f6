"""The prefix cache end to end (CPU backend): every request served from the
cache gives bit for bit what a server without the cache gives (the CPU
backend's numbers do not depend on step boundaries), on /score, /generate and
/v1/completions (echo + logprobs through the openai client), including a hit
that ends inside a prompt chunk, one-token continuations, concurrent siblings
and the bypass field; a stress run with a budget far below the working set,
concurrent hits on one entry and disconnects mid-prefill matches the uncached
outputs and gives all memory back. (The issue's speed targets on the demo
model: test_prefix_targets.py.)

Every comparison is against a --prefix-cache off server on the same
checkpoint (JSON floats are printed round-trip exact, so == is bitwise).
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SERVER, Server, check, finish, make_checkpoint, metric  # noqa: E402

tiny = make_checkpoint("tiny-long", "--preset", "tiny", "--tokenizer", "bytes", "--max-pos", "65536")


def post(u, path, body, timeout=120):
    r = requests.post(u + path, json=body, timeout=timeout)
    assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:300]}"
    return r.json()


def metrics(u):
    return requests.get(u + "/metrics").text


def cached(resp):
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


def toks(seed, n):
    """n pseudo-random byte tokens (the tiny model's vocabulary)"""
    out, x = [], seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(32 + (x >> 8) % 90)
    return out


# ---------------------------------------------------------------------------
# exactness on every route (tiny random model, prefill chunk 64, grid 128)
# ---------------------------------------------------------------------------
ref = Server(tiny, "--prefix-cache", "off", "--prefill-chunk", "64")
srv = Server(tiny, "--prefill-chunk", "64", "--prefix-cache-grid", "128")
R, U = ref.url, srv.url

log = srv.log()
check("prefix cache: on" in log and "a snapshot every 128 prompt tokens" in log, "startup reports the prefix cache", log)
check("prefix cache: off" in ref.log(), "--prefix-cache off is reported")

A = toks(1, 300)
a_ref, a = post(R, "/score", {"tokens": A}), post(U, "/score", {"tokens": A})
check(a["token_logprobs"] == a_ref["token_logprobs"] and cached(a) == 0, "score: a fresh prompt computes everything")

B = A[:200] + toks(2, 50)
b = post(U, "/score", {"tokens": B})
check(cached(b) == 128, "score: a prompt sharing 200 tokens starts from the 128-token grid snapshot", str(b["usage"]))
check(b["token_logprobs"] == post(R, "/score", {"tokens": B})["token_logprobs"],
      "score: log-probs after a cache hit are bit-identical to no cache")

# C branches off A after 150 tokens: C snapshots its branch point (149);
# D shares 170 tokens with C and hits there, inside the prompt chunk [128, 192)
C = A[:150] + toks(3, 60)
D = C[:170] + toks(4, 40)
c = post(U, "/score", {"tokens": C})
d = post(U, "/score", {"tokens": D})
check(cached(c) == 128 and cached(d) == 149, "score: a branch point snapshot serves the next sibling (hit at 149, "
      "inside a 64-token chunk)", f"{c['usage']} {d['usage']}")
check(c["token_logprobs"] == post(R, "/score", {"tokens": C})["token_logprobs"] and
      d["token_logprobs"] == post(R, "/score", {"tokens": D})["token_logprobs"],
      "score: hits inside a prompt chunk are bit-identical to no cache")

# one-token continuation: the end-of-prompt snapshot of A's scoring, one token fed
E = A + [77]
g = {"tokens": E, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 3}
e, e_ref = post(U, "/generate", g), post(R, "/generate", g)
check(cached(e) == 300, "generate: a one-token continuation of a scored prompt starts from its end", str(e["usage"]))
check(e["tokens"] == e_ref["tokens"] and e["logprobs"] == e_ref["logprobs"],
      "generate: greedy tokens, log-probs and alternatives after a one-token continuation equal no cache")

# sampling with penalties reads the restored history: same draws for the same seed
F = A[:260] + toks(5, 30)
samp = {"tokens": F, "max_tokens": 24, "temperature": 0.9, "top_p": 0.9, "repetition_penalty": 1.3,
        "presence_penalty": 0.4, "seed": 7, "ignore_eos": True, "logprobs": True}
f, f_ref = post(U, "/generate", samp), post(R, "/generate", samp)
check(cached(f) >= 256 and f["tokens"] == f_ref["tokens"] and f["logprobs"] == f_ref["logprobs"],
      "generate: seeded sampling with penalties after a hit equals no cache", f"{f['usage']}")

# the bypass field: nothing looked up, same output
hits0 = metric(metrics(U), "kda_prefix_cache_hits_total")
byp = post(U, "/generate", dict(samp, cache_prompt=False))
check(cached(byp) == 0 and byp["tokens"] == f_ref["tokens"] and
      metric(metrics(U), "kda_prefix_cache_hits_total") == hits0, "\"cache_prompt\": false bypasses the cache")
r = requests.post(U + "/generate", json=dict(samp, cache_prompt="yes"))
check(r.status_code == 400 and "cache_prompt" in r.json()["error"]["message"], "a bad cache_prompt is a 400 naming it")

# echo + logprobs through the openai client: the cached rows' alternatives come from the index
try:
    import openai
except ImportError:
    openai = None
    print("SKIP openai client checks: pip install openai")
if openai:
    cl, cl_ref = openai.OpenAI(base_url=U + "/v1", api_key="x"), openai.OpenAI(base_url=R + "/v1", api_key="x")
    name = os.path.basename(tiny)
    G1, G2 = bytes(A[:280]).decode() + "first tail", bytes(A[:280]).decode() + "second tail!"
    outs = []
    for cli_ in (cl, cl_ref):
        for p in (G1, G2):
            outs.append(cli_.completions.create(model=name, prompt=p, max_tokens=4, temperature=0, echo=True,
                                                logprobs=3))
    s1, s2, r1, r2 = outs
    check(s2.usage.prompt_tokens_details.cached_tokens >= 256 and
          r2.usage.prompt_tokens_details.cached_tokens == 0,
          "openai: usage.prompt_tokens_details.cached_tokens reports the hit",
          f"{s2.usage} {r2.usage}")
    same = all(x.choices[0].logprobs.token_logprobs == y.choices[0].logprobs.token_logprobs and
               x.choices[0].logprobs.top_logprobs == y.choices[0].logprobs.top_logprobs and
               x.choices[0].text == y.choices[0].text for x, y in ((s1, r1), (s2, r2)))
    check(same, "openai: echoed log-probs and top-3 alternatives of cached rows equal no cache")

# n = 3 choices: the siblings wait for the first one's snapshot, then each feeds one token
H = toks(9, 90)
hits0, tok0 = metric(metrics(U), "kda_prefix_cache_hits_total"), metric(metrics(U), "kda_prefix_cache_hit_tokens_total")
body = {"prompt": H, "n": 3, "max_tokens": 10, "temperature": 0.8, "seed": 11, "logprobs": 2}
h, h_ref = post(U, "/v1/completions", body), post(R, "/v1/completions", body)
m = metrics(U)
check(metric(m, "kda_prefix_cache_hits_total") - hits0 == 2 and
      metric(m, "kda_prefix_cache_hit_tokens_total") - tok0 == 2 * 89,
      "n=3: the other two choices start from the first's snapshot of 89 of the 90 prompt tokens", m[-400:])
check([c_["text"] for c_ in h["choices"]] == [c_["text"] for c_ in h_ref["choices"]] and
      [c_["logprobs"] for c_ in h["choices"]] == [c_["logprobs"] for c_ in h_ref["choices"]],
      "n=3: every choice equals no cache")

m = metrics(U)
check(metric(m, "kda_prefix_cache_hits_total") >= 8 and metric(m, "kda_prefix_cache_bytes") > 0 and
      metric(m, "kda_prefix_cache_snapshots") > 0, "metrics report hits, hit tokens, bytes and snapshots")
check(metric(metrics(R), "kda_prefix_cache_hits_total") == 0, "no hits with --prefix-cache off")
srv.check_clean_exit()
check("engine now holds 0 sequences, 0 KV bytes, 0 snapshots, 0 cache bytes" in srv.log(),
      "at shutdown every snapshot is dropped and the engine's pools are empty", srv.log()[-600:])

# the tail point: with a grid far beyond the prompts (as the 1.7B model's 1,536
# on CUDA), a request branching off late in a long prompt still hits one token
# before the prompt's last multiple of 64 (lm-eval: one context, several
# continuations sent one by one, echo + logprobs)
srv = Server(tiny, "--prefill-chunk", "64", "--prefix-cache-grid", "4096")
U = srv.url
ctx = toks(21, 640)
lm = [{"prompt": ctx + toks(30 + i, n), "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
      for i, n in enumerate((9, 1, 24))]
outs = [post(U, "/v1/completions", b) for b in lm]
outs_ref = [post(R, "/v1/completions", b) for b in lm]
check([cached(o) for o in outs] == [0, 639, 639],
      "tail point: continuations of a 640-token context hit at 639 with a 4096-token grid",
      str([o["usage"] for o in outs]))
check(all(o["choices"][0]["logprobs"] == r_["choices"][0]["logprobs"] and o["choices"][0]["text"] == r_["choices"][0]["text"]
          for o, r_ in zip(outs, outs_ref)), "tail point: echoed log-probs after the hit are bit-identical to no cache")
short = post(U, "/score", {"tokens": toks(40, 200)})
again = post(U, "/score", {"tokens": toks(40, 150) + toks(41, 60)})
check(cached(short) == 0 and cached(again) == 0,
      "tail point: none in a prompt where it would save fewer than 256 tokens", f"{short['usage']} {again['usage']}")
srv.check_clean_exit()
ref.stop()

r = subprocess.run([SERVER, "--model", tiny, "--prefix-cache", "maybe"], capture_output=True, text=True)
check(r.returncode == 2 and "--prefix-cache must be on or off" in r.stderr, "a bad --prefix-cache value is refused")
# the KDA state dtype: bf16 is a CUDA storage option; the CPU reference refuses it by name
r = subprocess.run([SERVER, "--model", tiny, "--kda-state-dtype", "fp16"], capture_output=True, text=True)
check(r.returncode == 2 and "--kda-state-dtype must be fp32 or bf16" in r.stderr, "a bad --kda-state-dtype is refused")
r = subprocess.run([SERVER, "--model", tiny, "--kda-state-dtype", "bf16", "--port", "0"], capture_output=True,
                   text=True, timeout=60)
check(r.returncode != 0 and "--kda-state-dtype bf16 is a CUDA option" in r.stderr,
      "--kda-state-dtype bf16 on the CPU backend stops the server with a message naming the flag", r.stderr[-300:])

# ---------------------------------------------------------------------------
# stress: a budget of ~4 snapshots for a working set of dozens, 24 concurrent
# clients on 4 shared prefixes (identical prompts among them: concurrent hits
# on one entry), long prompts cut off mid-prefill by their clients
# ---------------------------------------------------------------------------
ref = Server(tiny, "--prefix-cache", "off", "--prefill-chunk", "64", "--max-batch", "16")
cfg = json.load(open(os.path.join(tiny, "config.json")))
H, K = cfg["num_heads"], cfg["head_dim"]
n_gqa = len(cfg["attn"]["layers"])
state = (cfg["num_hidden_layers"] - n_gqa) * (H * K * K + (cfg["conv_size"] - 1) * 3 * H * K) * 4
kv_token = n_gqa * 2 * cfg["attn"]["num_kv_heads"] * cfg["attn"]["head_dim"] * 4  # fp32 on the CPU
budget = 2 * (state + 400 * kv_token)  # two snapshots of a family prefix; the working set is dozens
srv = Server(tiny, "--prefill-chunk", "64", "--max-batch", "16", "--prefix-cache-bytes", str(budget))
families = [toks(100 + f, 400) for f in range(4)]
jobs = []
for i in range(24):
    fam = families[i % 4]
    tail = toks(200 + i % 6, 20 + (i % 3) * 30)  # i % 6 == j % 6 and same family: identical prompts
    body = {"tokens": fam[: 150 + 50 * (i % 5)] + tail, "max_tokens": 16, "temperature": 0.7, "seed": i % 3,
            "ignore_eos": True}
    jobs.append(("/generate", body) if i % 2 else ("/score", {"tokens": body["tokens"]}))
want = [post(ref.url, p, b) for p, b in jobs]
got, errors = [None] * len(jobs), []


def client(i):
    try:
        got[i] = post(srv.url, *jobs[i])
    except Exception as ex:  # noqa: BLE001
        errors.append(f"{i}: {ex}")


def hang_up(k):
    """a long prompt on a raw socket, closed while it is being prefilled"""
    body = json.dumps({"tokens": families[k % 4] + toks(300 + k, 20000), "max_tokens": 4}).encode()
    host, port = srv.url.split("//")[1].split(":")
    sk = socket.create_connection((host, int(port)))
    sk.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
               % len(body) + body)
    time.sleep(0.05 + 0.05 * k)
    sk.close()


for rnd in range(2):
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    threads += [threading.Thread(target=hang_up, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    key = lambda r, path: (r["tokens"], r["text"]) if path == "/generate" else r["token_logprobs"]  # noqa: E731
    bad = [i for i in range(len(jobs)) if got[i] is None or key(got[i], jobs[i][0]) != key(want[i], jobs[i][0])]
    check(not errors and not bad, f"stress round {rnd + 1}: all 24 outputs equal no cache under constant eviction",
          f"{errors[:3]} differing: {bad}")
deadline = time.time() + 30
while time.time() < deadline and metric(metrics(srv.url), "kda_running_sequences") > 0:
    time.sleep(0.1)
m = metrics(srv.url)
print("stress:", {k: metric(m, k) for k in ("kda_prefix_cache_hits_total", "kda_prefix_cache_evictions_total",
                                             "kda_prefix_cache_snapshots", "kda_prefix_cache_bytes")})
check(metric(m, "kda_prefix_cache_hits_total") > 0 and metric(m, "kda_prefix_cache_evictions_total") > 20,
      "stress: the cache both hit and evicted constantly")
check(metric(m, "kda_prefix_cache_bytes") <= budget, "stress: the cache stays within its budget",
      f"{metric(m, 'kda_prefix_cache_bytes')} > {budget}")
check(metric(m, "kda_running_sequences") == 0 and metric(m, "kda_state_pool_used_sequences") == 0,
      "stress: every sequence is gone afterwards (disconnects included)")
srv.check_clean_exit()
check("engine now holds 0 sequences, 0 KV bytes, 0 snapshots, 0 cache bytes" in srv.log(),
      "stress: the pools are back to zero at shutdown", srv.log()[-600:])
ref.stop()
finish()

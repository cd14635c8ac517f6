"""kda-server endpoints against real clients: formats, greedy output equal to
kda-cli, seeds, stop strings, scoring, the OpenAI client, every error case,
API keys and metrics."""
import json
import math
import os
import subprocess
import sys
import threading

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import (Server, check, cli_generate, cli_score, finish, make_checkpoint, metric,  # noqa: E402
                     sse_events)

model = make_checkpoint("tiny-long", "--preset", "tiny", "--tokenizer", "bytes", "--max-pos", "65536")
srv = Server(model)
U = srv.url


def post(path, body, **kw):
    return requests.post(U + path, json=body, timeout=60, **kw)


def gen(body):
    r = post("/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


# ---- basic endpoints ----
r = requests.get(U + "/health")
check(r.status_code == 200 and r.json() == {"status": "ok"}, "health is 200 ok when ready")
r = requests.get(U + "/v1/models").json()
check(r["object"] == "list" and r["data"][0]["id"] == os.path.basename(model), "/v1/models lists the model by dir name")

# ---- startup report: pools and capacity (numbers from config.json, not the server) ----
cfg = json.load(open(os.path.join(model, "config.json")))
att = cfg["attn"]
kv_kib = len(att["layers"]) * 2 * att["num_kv_heads"] * att.get("head_dim", cfg["hidden_size"] // att["num_heads"]) * 4 / 1024
log = srv.log()
mem = [l for l in log.splitlines() if "memory on cpu:" in l]
check(len(mem) == 1 and "KV cache pool" in mem[0] and "KDA state pool" in mem[0] and "weights" in mem[0]
      and "(%.1f KiB/token)" % kv_kib in mem[0], "startup reports weights, KV and state pools (fp32 KV per token on CPU)",
      log)
cap = [l for l in log.splitlines() if "capacity: max concurrent sequences at full context" in l]
check(len(cap) == 1 and "(%d tokens): 32;" % 65536 in cap[0], "startup reports the sequences that fit at full context",
      log)

text = "héllo, wörld"
r = post("/tokenize", {"text": text}).json()
check(r["tokens"] == list(text.encode()), "byte tokenizer: /tokenize gives the UTF-8 bytes", str(r))
r = post("/detokenize", {"tokens": list(text.encode())}).json()
check(r["text"] == text, "/detokenize inverts /tokenize")
r = post("/detokenize", {"tokens": [104, 0, 105, 0]}).json()
check(r["text"] == "h\ufffdi\ufffd" and r["prompt"] == r["text"],
      "/detokenize: a NUL byte id becomes U+FFFD (as in generated text), not the end of the text", r)

# ---- greedy output equals kda-cli ----
prompt_ids = list(b"The quick brown fox")
g = gen({"tokens": prompt_ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
ref = cli_generate(model, prompt_ids, 24, ["--ignore-eos"])
if ref is not None:
    check(g["tokens"] == ref, "greedy /generate equals kda-cli generate", f"{g['tokens']} vs {ref}")
check(len(g["tokens"]) == 24 and g["finish_reason"] == "length", "max_tokens reached -> finish_reason length")
check(g["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 24, "total_tokens": len(prompt_ids) + 24,
                     "prompt_tokens_details": {"cached_tokens": 0}},
      "usage counts prompt and completion tokens", str(g["usage"]))
check(all(k in g["timings"] for k in ("queue_ms", "prompt_ms", "generation_ms", "ttft_ms")), "timings are reported")
g2 = gen({"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0, "ignore_eos": True})
check(g2["tokens"] == g["tokens"], "a text prompt equals its byte tokens (no BOS for a byte tokenizer)")
dec = post("/detokenize", {"tokens": g["tokens"]}).json()["text"]
check(g["text"] == dec, "generated text equals the detokenized ids")

# EOS: the model's eos_token_id ends generation unless ignore_eos
cfg = json.load(open(os.path.join(model, "config.json")))
ids = gen({"tokens": prompt_ids, "max_tokens": 200, "temperature": 1.5, "seed": 7, "ignore_eos": True})["tokens"]
if cfg["eos_token_id"] in ids:
    k = ids.index(cfg["eos_token_id"])
    e = gen({"tokens": prompt_ids, "max_tokens": 200, "temperature": 1.5, "seed": 7})
    check(e["finish_reason"] == "eos" and e["tokens"] == ids[:k + 1], "EOS ends /generate with finish_reason eos")

# ---- streaming format (curl and requests) ----
body = {"tokens": prompt_ids, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True}
out = subprocess.run(["curl", "-sN", "-H", "Content-Type: application/json", "-d", json.dumps(body), U + "/generate"],
                     capture_output=True, text=True, timeout=60).stdout
chunks = out.split("\n\n")
check(chunks[-1] == "" and chunks[-2] == "data: [DONE]", "curl: stream ends with data: [DONE]")
events = [json.loads(c[6:]) for c in chunks[:-2] if c.startswith("data: ")]
check(all(c.startswith("data: ") or c.startswith(":") for c in chunks[:-1]), "curl: every event is 'data: ...' (or a comment)")
check(sum((e["tokens"] for e in events), []) == g["tokens"], "curl: streamed ids equal the non-streamed ones")
check("".join(e["text"] for e in events) == g["text"], "curl: streamed text equals the non-streamed text")
check(events[-1].get("finish_reason") == "length" and "usage" in events[-1], "curl: last event has finish_reason and usage")
check(all("finish_reason" not in e for e in events[:-1]), "curl: only the last event has a finish_reason")
r = post("/generate", body, stream=True)
check(r.headers.get("Content-Type", "").startswith("text/event-stream"), "stream Content-Type is text/event-stream")
data, _ = sse_events(r.iter_lines())
check(data[-1] == "[DONE]" and sum((json.loads(d)["tokens"] for d in data[:-1]), []) == g["tokens"],
      "requests: streamed ids equal the non-streamed ones")

# ---- seeds ----
sb = {"tokens": prompt_ids, "max_tokens": 32, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "seed": 1234,
      "ignore_eos": True}
a, b = gen(sb), gen(sb)
c = gen(dict(sb, seed=4321))
check(a["tokens"] == b["tokens"] and a["seed"] == 1234, "same seed and params -> same output")
check(a["tokens"] != c["tokens"], "a different seed -> different output")
ref = cli_generate(model, prompt_ids, 32, ["--ignore-eos", "--temperature", "1", "--top-p", "0.95", "--top-k", "50",
                                            "--seed", "1234"])
if ref is not None:
    check(a["tokens"] == ref, "seeded sampling equals kda-cli with the same seed", f"{a['tokens']} vs {ref}")


def noise():
    for i in range(6):
        gen({"tokens": list(os.urandom(40)), "max_tokens": 40, "temperature": 1.0, "ignore_eos": True})


threads = [threading.Thread(target=noise) for _ in range(6)]
for t in threads:
    t.start()
crowded = [gen(sb)["tokens"] for _ in range(4)]
for t in threads:
    t.join()
check(all(x == a["tokens"] for x in crowded), "seeded output does not depend on what else is in the batch")

# ---- stop strings ----
long = gen({"tokens": prompt_ids, "max_tokens": 120, "temperature": 0, "ignore_eos": True})
t = long["text"]
stop = None
for k in range(5, len(t) - 2):
    cand = t[k:k + 2]
    if cand.isascii() and cand.isprintable() and t.index(cand) == k:
        stop = cand
        break
if check(stop is not None, "found a stop string candidate in the greedy text", repr(t)):
    s = gen({"tokens": prompt_ids, "max_tokens": 120, "temperature": 0, "ignore_eos": True, "stop": [stop, "\u2603"]})
    check(s["finish_reason"] == "stop" and s["text"] == t[:t.index(stop)], "stop string ends the text right before it",
          f"{s['text']!r} vs {t[:t.index(stop)]!r}")
    r = post("/generate", {"tokens": prompt_ids, "max_tokens": 120, "temperature": 0, "ignore_eos": True,
                           "stop": stop, "stream": True}, stream=True)
    data, _ = sse_events(r.iter_lines())
    ev = [json.loads(d) for d in data[:-1]]
    check("".join(e["text"] for e in ev) == t[:t.index(stop)] and ev[-1]["finish_reason"] == "stop",
          "stop strings hold back streamed text that could start one")

# ---- logprobs ----
lp = gen({"tokens": prompt_ids, "max_tokens": 8, "temperature": 0, "logprobs": 3, "ignore_eos": True})
L = lp["logprobs"]
ok = len(L["token_logprobs"]) == 8 and len(L["top_logprobs"]) == 8
for i, tok in enumerate(lp["tokens"]):
    top = L["top_logprobs"][i]
    ok = ok and len(top) == 3 and top[0]["id"] == tok and abs(top[0]["logprob"] - L["token_logprobs"][i]) < 1e-6
    ok = ok and all(top[j]["logprob"] >= top[j + 1]["logprob"] for j in range(2)) and L["token_logprobs"][i] <= 0
check(ok, "greedy logprobs: the chosen id is the best alternative, alternatives sorted")

# ---- /score ----
sc = post("/score", {"tokens": prompt_ids}).json()
check(len(sc["token_logprobs"]) == len(prompt_ids) - 1, "/score: one log-prob per predicted token")
n = len(sc["token_logprobs"])
check(abs(sc["nll"] + sum(sc["token_logprobs"]) / n) < 1e-6 and abs(sc["ppl"] - math.exp(sc["nll"])) < 1e-6 * sc["ppl"],
      "/score: nll is the mean negative log-prob and ppl its exp")
ref = cli_score(model, prompt_ids)
if ref is not None:
    check(max(abs(x - y) for x, y in zip(sc["token_logprobs"], ref["token_logprobs"])) < 1e-4,
          "/score equals kda-cli score")
multi = post("/score", {"texts": ["The quick brown fox", "jumps over"]}).json()
check(len(multi["results"]) == 2 and multi["results"][0]["token_logprobs"] == sc["token_logprobs"],
      "/score texts: per-text results, same numbers as a single request")

# ---- /v1/completions through the official openai client ----
try:
    import openai
except ImportError:
    openai = None
    print("SKIP openai client checks: pip install openai")
if openai:
    client = openai.OpenAI(base_url=U + "/v1", api_key="unused")
    mname = client.models.list().data[0].id
    cmp = client.completions.create(model=mname, prompt="The quick brown fox", max_tokens=24, temperature=0,
                                    extra_body={"ignore_eos": True})
    check(cmp.choices[0].text == g["text"] and cmp.choices[0].finish_reason == "length",
          "openai: greedy completion equals /generate")
    check(cmp.usage.prompt_tokens == len(prompt_ids) and cmp.usage.completion_tokens == 24, "openai: usage")
    st = client.completions.create(model=mname, prompt="The quick brown fox", max_tokens=24, temperature=0,
                                   stream=True, extra_body={"ignore_eos": True})
    parts = list(st)
    check("".join(p.choices[0].text for p in parts if p.choices) == g["text"] and
          parts[-1].choices[0].finish_reason == "length", "openai: streamed completion equals the non-streamed one")
    n2 = client.completions.create(model=mname, prompt=["The quick", "brown fox"], max_tokens=16, n=2, seed=99,
                                   temperature=1.0, extra_body={"ignore_eos": True})
    check([c.index for c in n2.choices] == [0, 1, 2, 3], "openai: prompts x n choices, indexed prompt-major")
    single = client.completions.create(model=mname, prompt="brown fox", max_tokens=16, seed=100, temperature=1.0,
                                       extra_body={"ignore_eos": True})
    check(n2.choices[3].text == single.choices[0].text, "openai: choice j of n uses seed + j")
    # lm-eval's loglikelihood request: echo + logprobs + max_tokens 0
    ll = client.completions.create(model=mname, prompt=prompt_ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    lpo = ll.choices[0].logprobs
    check(lpo.token_logprobs[0] is None and
          max(abs(x - y) for x, y in zip(lpo.token_logprobs[1:], sc["token_logprobs"])) < 1e-6,
          "openai echo+logprobs+max_tokens=0 gives the prompt's log-probs (= /score)")
    check(ll.choices[0].text == "The quick brown fox" and len(lpo.tokens) == len(prompt_ids) and
          "".join(lpo.tokens) == "The quick brown fox", "echo returns the prompt text and its tokens")
    check(all(lpo.token_logprobs[i] <= max(lpo.top_logprobs[i].values()) + 1e-6 for i in range(1, len(prompt_ids))),
          "echo top_logprobs hold the chosen token and the best alternative (lm-eval is_greedy)")
    try:
        client.completions.create(model=mname, prompt="x", max_tokens=10, temperature=-1)
        check(False, "openai: a bad field raises BadRequestError")
    except openai.BadRequestError as e:
        check("temperature" in str(e), "openai: a bad field raises BadRequestError naming it")
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        check(False, "openai: an unknown model raises NotFoundError")
    except openai.NotFoundError as e:
        check("no-such-model" in str(e), "openai: an unknown model is a 404 naming it")


# ---- errors ----
def err(r, status, *words):
    try:
        e = r.json()["error"]
    except Exception:
        return False
    return (r.status_code == status and e["code"] == status and isinstance(e["type"], str) and
            all(w in e["message"] for w in words))


r = requests.post(U + "/generate", data=b'{"prompt": "x", ', timeout=10)
check(err(r, 400, "malformed JSON"), "malformed JSON -> 400", r.text)


# strict bodies: one JSON value and nothing after it; no NUL in any string (C strings would cut it)
def raw(path, data):
    return requests.post(U + path, data=data, timeout=30)


def param_of(r):
    try:
        return r.json()["error"]["param"]
    except Exception:
        return "?"


for path, body in [("/generate", b'{"prompt": "ab", "max_tokens": 1}'), ("/score", b'{"text": "ab"}'),
                   ("/v1/completions", b'{"prompt": "ab", "max_tokens": 1}'), ("/tokenize", b'{"prompt": "ab"}'),
                   ("/detokenize", b'{"tokens": [97]}')]:
    check(raw(path, body + b" \n\t").status_code == 200, f"{path}: trailing whitespace is fine")
    for tail in (b" xyz", b"{}", b"\x00", b" 1"):
        r = raw(path, body + tail)
        check(err(r, 400, "after its JSON value"), f"{path}: data after the JSON value ({tail!r}) -> 400", r.text[:120])
r = raw("/score", b'{"text": "a\\u0000bcdef"}')
check(err(r, 400, "NUL") and param_of(r) == "text", "score: \"a\\u0000bcdef\" -> 400 naming text (not scored as \"a\")",
      r.text[:160])
r = raw("/score", b'{"text": "a\x00bcdef"}')
check(err(r, 400, "NUL") and param_of(r) == "text", "score: a raw NUL byte in text -> 400 naming text", r.text[:160])
r = raw("/v1/completions", b'{"model": "demo\\u0000zz", "prompt": "ab", "max_tokens": 1}')
check(err(r, 400, "NUL") and param_of(r) == "model", "completions: model \"demo\\u0000zz\" -> 400 naming model",
      r.text[:160])
r = raw("/generate", b'{"prompt": "ab", "max_tokens": 1, "stop": ["x", "y\\u0000"]}')
check(err(r, 400, "NUL") and param_of(r) == "stop", "a NUL in a nested string names its top-level field", r.text[:160])
r = raw("/generate", b'{"prompt": "ab", "max_tokens": 1, "seed\\u0000x": 5}')
check(err(r, 400, "NUL"), "a NUL in a key -> 400 (it would read as \"seed\")", r.text[:160])
r = raw("/score", b'{"text": "a\\\\u0000b"}')
check(r.status_code == 200 and len(r.json()["tokens"]) >= 8, "an escaped backslash before u0000 is plain text",
      r.text[:160])
check(err(post("/generate", {"prompt": "x", "temperature": -1}), 400, "temperature", "[0, 100]"),
      "temperature out of range -> 400 naming field and range")
check(err(post("/generate", {"prompt": "x", "top_p": 2}), 400, "top_p", "(0, 1]"), "top_p out of range -> 400")
check(err(post("/generate", {"prompt": "x", "max_tokens": "ten"}), 400, "max_tokens"), "max_tokens not a number -> 400")
check(err(post("/generate", {"tokens": [1, 256]}), 400, "tokens[1]", "[0, 255]"), "token id out of range -> 400")
check(err(post("/generate", {"prompt": "x", "stop": [1]}), 400, "stop"), "stop of the wrong type -> 400")
check(err(post("/generate", {}), 400, "prompt"), "no prompt -> 400")
check(err(post("/generate", {"prompt": ""}), 400, "empty"), "empty prompt without BOS -> 400")
check(err(post("/generate", {"prompt": "x", "max_tokens": 65536}), 400, "context"),
      "prompt + max_tokens beyond the context -> 400")
check(err(post("/v1/completions", {"prompt": "x", "n": 100}), 400, "\"n\""), "completions n out of range -> 400")
check(err(post("/score", {"text": "x"}), 400, "2 tokens"), "score of a single token -> 400")
check(err(requests.get(U + "/nope"), 404), "unknown path -> 404")
r = requests.get(U + "/generate")
check(err(r, 405) and r.headers.get("Allow") == "POST", "wrong method -> 405 with Allow")
check(requests.get(U + "/health").status_code == 200, "errors do not disturb the server")

# ---- metrics move ----
m0 = requests.get(U + "/metrics").text
gen({"tokens": prompt_ids, "max_tokens": 10, "temperature": 0, "ignore_eos": True})
post("/generate", {"prompt": "x", "temperature": -1})
m1 = requests.get(U + "/metrics").text
d = lambda name, **lab: metric(m1, name, lab or None) - metric(m0, name, lab or None)  # noqa: E731
check(d("kda_requests_total", route="/generate", status="200") == 1, "metrics: /generate 200 counted")
check(d("kda_requests_total", route="/generate", status="400") == 1, "metrics: /generate 400 counted")
check(d("kda_generated_tokens_total") == 10 and d("kda_prompt_tokens_total") == len(prompt_ids),
      "metrics: generated and prompt tokens counted exactly")
check(d("kda_time_to_first_token_seconds_count") == 1 and d("kda_inter_token_latency_seconds_count") == 9,
      "metrics: one TTFT and n-1 inter-token samples per request")
check("kda_queue_depth 0" in m1 and "kda_running_sequences 0" in m1 and "kda_state_pool_used_sequences 0" in m1,
      "metrics: queue, batch and pool gauges back to 0 when idle")
srv.check_clean_exit()

# ---- API key and body limit ----
keyfile = os.path.join(os.path.dirname(model), "key.txt")
with open(keyfile, "w") as f:
    f.write("s3cret\n")
with Server(model, "--api-key-file", keyfile, "--max-body-bytes", "4096") as s2:
    u = s2.url
    b = {"prompt": "hi", "max_tokens": 2}
    check(err(requests.post(u + "/generate", json=b), 401), "no API key -> 401")
    check(err(requests.post(u + "/generate", json=b, headers={"Authorization": "Bearer nope"}), 401), "wrong key -> 401")
    check(requests.post(u + "/generate", json=b, headers={"Authorization": "Bearer s3cret"}).status_code == 200,
          "right key -> 200")
    check(requests.get(u + "/health").status_code == 200, "/health needs no key")
    if openai:
        c2 = openai.OpenAI(base_url=u + "/v1", api_key="s3cret")
        check(c2.completions.create(model=mname, prompt="hi", max_tokens=2).choices[0].finish_reason in ("length", "stop"),
              "openai client authenticates with the key")
        try:
            openai.OpenAI(base_url=u + "/v1", api_key="bad").completions.create(model=mname, prompt="hi", max_tokens=2)
            check(False, "openai: a wrong key raises AuthenticationError")
        except openai.AuthenticationError:
            check(True, "openai: a wrong key raises AuthenticationError")
    big = {"prompt": "x" * 5000}
    r = requests.post(u + "/generate", json=big, headers={"Authorization": "Bearer s3cret"})
    check(err(r, 413, "4096"), "body over --max-body-bytes -> 413", r.text[:200])
    r = requests.post(u + "/generate", data=(b"x" * 1000 for _ in range(6)),
                      headers={"Authorization": "Bearer s3cret"})
    check(err(r, 413), "chunked body over the limit -> 413", r.text[:200])
    check(requests.post(u + "/generate", json=b, headers={"Authorization": "Bearer s3cret"}).status_code == 200,
          "the server carries on after 413s")
    s2.check_clean_exit("keyed server exits 0")

# ---- the GPU pool size flag: range-checked like every number (ignored by the CPU backend) ----
from fixture import SERVER  # noqa: E402
r = subprocess.run([SERVER, "--model", model, "--gpu-memory-fraction", "1.5"], capture_output=True, text=True,
                   timeout=30)
check(r.returncode != 0 and "--gpu-memory-fraction" in r.stderr, "--gpu-memory-fraction 1.5 is refused by name",
      r.stderr[-300:])
with Server(model, "--gpu-memory-fraction", "0.5") as s3:
    check(requests.get(s3.url + "/health").status_code == 200, "--gpu-memory-fraction 0.5 starts")
    s3.check_clean_exit("server with --gpu-memory-fraction exits 0")
finish()

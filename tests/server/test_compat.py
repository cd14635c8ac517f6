"""What OpenAI/vLLM clients rely on beyond the basics: logit_bias (raw
log-probs still reported), min_tokens (EOS and stop strings held back),
stream_options (usage null, final usage, continuous usage), streaming echo
with the prompt's real log-probs, unknown sampling fields refused by name,
error.param, vLLM's /tokenize and /detokenize (also under /v1), GET
/v1/models/{id}, CORS, the vLLM-named metrics a vLLM Grafana dashboard
queries, --version and kda-cli SUB --help."""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import CLI, SERVER, Server, check, finish, make_checkpoint, metric, sse_events  # noqa: E402

model = make_checkpoint("tiny-long", "--preset", "tiny", "--tokenizer", "bytes", "--max-pos", "65536")
cfg = json.load(open(os.path.join(model, "config.json")))
EOS = cfg["eos_token_id"]
srv = Server(model)
U = srv.url
prompt_ids = list(b"The quick brown fox")


def post(path, body, **kw):
    return requests.post(U + path, json=body, timeout=60, **kw)


def err(r, status, param=None, *words):
    try:
        e = r.json()["error"]
    except Exception:
        return False
    return (r.status_code == status and e["code"] == status and "param" in e and
            (param is None or e["param"] == param) and all(w in e["message"] for w in words))


def gen(body):
    r = post("/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


greedy = gen({"tokens": prompt_ids, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "logprobs": 1})

# ---- logit_bias ----
forced = 65   # 'A'
g = gen({"tokens": prompt_ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": True,
         "logit_bias": {str(forced): 100}})
check(g["tokens"] == [forced] * 6, "logit_bias +100 forces the token", str(g["tokens"]))
sc = post("/score", {"tokens": prompt_ids + [forced]}).json()
check(abs(g["logprobs"]["token_logprobs"][0] - sc["token_logprobs"][-1]) < 1e-4,
      "with logit_bias the reported log-prob is the model's raw one (= /score)",
      f"{g['logprobs']['token_logprobs'][0]} vs {sc['token_logprobs'][-1]}")
first = greedy["tokens"][0]
g = gen({"tokens": prompt_ids, "max_tokens": 1, "temperature": 0, "ignore_eos": True, "logit_bias": {str(first): -100}})
check(g["tokens"][0] != first, "logit_bias -100 bans the greedy token")
r = post("/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 0, "logit_bias": {str(forced): 100}})
check(r.status_code == 200 and r.json()["choices"][0]["text"] == "AAAA", "logit_bias on /v1/completions", r.text[:200])
check(err(post("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}), 400, "logit_bias", "token id"),
      "logit_bias with a non-id key -> 400 naming logit_bias")
check(err(post("/v1/completions", {"prompt": "x", "logit_bias": {"1": 150}}), 400, "logit_bias", "[-100, 100]"),
      "logit_bias out of [-100, 100] -> 400")
check(err(post("/v1/completions", {"prompt": "x", "logit_bias": {"256": 1}}), 400, "logit_bias"),
      "logit_bias on an id outside the vocabulary -> 400")

# ---- min_tokens: EOS forced by a bias, then held back ----
eos_bias = {str(EOS): 100}
g = gen({"tokens": prompt_ids, "max_tokens": 20, "temperature": 0, "logit_bias": eos_bias})
check(g["tokens"] == [EOS] and g["finish_reason"] == "eos", "EOS biased to +100 ends generation at once", str(g))
g = gen({"tokens": prompt_ids, "max_tokens": 20, "temperature": 0, "logit_bias": eos_bias, "min_tokens": 5})
check(len(g["tokens"]) == 6 and EOS not in g["tokens"][:5] and g["tokens"][5] == EOS and g["finish_reason"] == "eos",
      "min_tokens 5: EOS is banned for 5 tokens, then ends the 6th", str(g["tokens"]))
r = post("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 20, "temperature": 0,
                             "logit_bias": eos_bias, "min_tokens": 3})
check(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4 and
      r.json()["choices"][0]["finish_reason"] == "stop", "min_tokens on /v1/completions", r.text[:300])
check(err(post("/v1/completions", {"prompt": "x", "max_tokens": 2, "min_tokens": 3}), 400, "min_tokens"),
      "min_tokens > max_tokens -> 400 naming min_tokens")
# stop strings: the text of the first min_tokens tokens is not searched
toks = greedy["tokens"]
k = next((i for i in range(1, 12) if 32 < toks[i] < 127), None)
if check(k is not None, "a printable ASCII byte near the start of the greedy text (a stop string)", str(toks)):
    stop = chr(toks[k])
    body = {"tokens": prompt_ids, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    plain = gen(body)
    check(plain["finish_reason"] == "stop" and plain["text"] == greedy["text"][:greedy["text"].index(stop)],
          "without min_tokens the early stop string ends the text")
    # a boundary after an ASCII byte, so the first m tokens' text is exactly their decode
    m = next(i for i in range(k + 2, 40) if toks[i - 1] < 0x80)
    held = gen(dict(body, min_tokens=m))
    head = bytes(toks[:m]).decode("utf-8", "replace")
    rest = greedy["text"][len(head):]
    want = head + (rest[:rest.index(stop)] if stop in rest else rest)
    check(greedy["text"].startswith(head) and held["text"] == want and len(held["tokens"]) >= m,
          f"min_tokens {m}: the stop string only counts in the text after {m} tokens", f"{held['text']!r} vs {want!r}")

# ---- unknown fields, error.param ----
check(err(post("/v1/completions", {"prompt": "x", "typical_p": 0.5}), 400, "typical_p", "typical_p"),
      "a sampling field this server lacks (typical_p) -> 400 naming it")
check(err(post("/v1/completions", {"prompt": "x", "top_q": 0.5}), 400, "top_q"),
      "an unknown sampling-like field (top_q) -> 400 naming it")
check(err(post("/generate", {"prompt": "x", "stop_token_ids": [1]}), 400, "stop_token_ids"),
      "stop_token_ids (vLLM) is refused rather than ignored")
check(err(post("/v1/completions", {"prompt": "x", "top_logprobs": 2}), 400, "top_logprobs"),
      "chat's top_logprobs on /v1/completions -> 400")
r = post("/v1/completions", {"prompt": "x", "max_tokens": 2, "metadata": {"a": 1}, "store": False, "service_tier": "x"})
check(r.status_code == 200, "unknown non-sampling fields are ignored (as OpenAI-compatible servers do)", r.text[:200])
check(err(post("/v1/completions", {"prompt": "x", "temperature": -1}), 400, "temperature"), "error.param names the field")
check(err(post("/v1/completions", {"prompt": "x", "model": "nope"}), 404, "model", "nope"), "unknown model -> 404, param model")
r = requests.post(U + "/v1/completions", data=b"{", timeout=10)
check(r.status_code == 400 and r.json()["error"]["param"] is None, "malformed JSON -> 400 with param null")
r = post("/generate", {"prompt": ""})
check(err(r, 400, "prompt", "no BOS") and "add_bos" not in r.json()["error"]["message"],
      "empty prompt on a model without BOS: no advice to set add_bos", r.text)

# ---- streaming: usage null, include_usage, continuous_usage_stats ----
def stream(path, body):
    r = post(path, dict(body, stream=True), stream=True)
    data, _ = sse_events(r.iter_lines())
    return [json.loads(d) for d in data if d != "[DONE]"], data[-1] == "[DONE]"


ev, done = stream("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                       "stream_options": {"include_usage": True}})
check(done and all("usage" in e and e["usage"] is None for e in ev[:-1]), "non-final chunks carry \"usage\": null")
u = dict(ev[-1]["usage"])
cached_tokens = u.pop("prompt_tokens_details", {}).get("cached_tokens", -1)
check(ev[-1]["choices"] == [] and u == {"prompt_tokens": len(prompt_ids), "completion_tokens": 8,
                                        "total_tokens": len(prompt_ids) + 8} and 0 <= cached_tokens < len(prompt_ids),
      "include_usage: a final chunk with empty choices and the usage", str(ev[-1]["usage"]))
ev, _ = stream("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
cu = [e["usage"]["completion_tokens"] for e in ev[:-1]]
check(cu and cu == sorted(cu) and cu[-1] == 8 and all(e["usage"]["prompt_tokens"] == len(prompt_ids) for e in ev[:-1]),
      "continuous_usage_stats: every chunk has the usage so far", str(cu))

# ---- streaming echo + logprobs equals the whole response ----
body = {"prompt": prompt_ids, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "echo": True, "logprobs": 2}
whole = post("/v1/completions", body).json()["choices"][0]
ev, _ = stream("/v1/completions", body)
lp = {"tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": []}
for e in ev:
    for k in lp:
        lp[k] += e["choices"][0]["logprobs"][k]
check("".join(e["choices"][0]["text"] for e in ev) == whole["text"], "streamed echo text equals the whole response")
check(lp["tokens"] == whole["logprobs"]["tokens"] and lp["text_offset"] == whole["logprobs"]["text_offset"],
      "streamed echo tokens and offsets equal the whole response")
a, b = lp["token_logprobs"], whole["logprobs"]["token_logprobs"]
check(len(a) == len(b) and a[0] is None and all(abs(x - y) < 1e-6 for x, y in zip(a[1:], b[1:])) and
      all(x < 0 for x in a[1:len(prompt_ids)]), "streamed echo log-probs are the prompt's real ones (not 0.0)",
      f"{a[:6]} vs {b[:6]}")
check(lp["top_logprobs"] == whole["logprobs"]["top_logprobs"] and
      all(v < 0 for d in lp["top_logprobs"][1:] for v in d.values()),
      "streamed echo top_logprobs equal the whole response", f"{lp['top_logprobs'][:3]} vs {whole['logprobs']['top_logprobs'][:3]}")

# ---- vLLM's tokenizer routes ----
for base in ("", "/v1"):
    r = post(base + "/tokenize", {"prompt": "hello", "add_special_tokens": False, "return_token_strs": True}).json()
    check(r["tokens"] == list(b"hello") and r["count"] == 5 and r["max_model_len"] == 65536 and
          len(r["token_strs"]) == 5, f"{base}/tokenize: vLLM's fields (tokens, count, max_model_len, token_strs)", str(r))
    r = post(base + "/detokenize", {"tokens": list(b"hello")}).json()
    check(r.get("prompt") == "hello" and r.get("text") == "hello", f"{base}/detokenize answers vLLM's \"prompt\" (and \"text\")")
r = post("/tokenize", {"prompt": "x"}).json()
check(r["token_strs"] is None, "token_strs is null unless asked for")
info = requests.get(U + "/tokenizer_info").json()
check(info["eos_token"] == chr(EOS) and info["bos_token"] is None and info["model_max_length"] == 65536 and
      info["chat_template"] is None, "/tokenizer_info: the byte model's EOS as text, no BOS, no template", str(info))
check(post("/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False}).json()["tokens"] == [EOS],
      "the eos_token string tokenizes to the EOS id (how lm-eval finds it)")

# ---- models ----
m = requests.get(U + "/v1/models/" + os.path.basename(model))
check(m.status_code == 200 and m.json()["id"] == os.path.basename(model) and m.json()["object"] == "model",
      "GET /v1/models/{id} returns the model")
check(err(requests.get(U + "/v1/models/other"), 404, "model", "other"), "GET /v1/models/{other} -> 404")
try:
    import openai
except ImportError:
    openai = None
if openai:
    client = openai.OpenAI(base_url=U + "/v1", api_key="unused")
    check(client.models.retrieve(os.path.basename(model)).id == os.path.basename(model), "openai: models.retrieve")
    try:
        client.models.retrieve("other")
        check(False, "openai: models.retrieve of another id raises NotFoundError")
    except openai.NotFoundError:
        check(True, "openai: models.retrieve of another id raises NotFoundError")
    try:
        client.completions.create(model=os.path.basename(model), prompt="x", max_tokens=2, extra_body={"typical_p": 0.2})
        check(False, "openai: an unsupported sampling field raises BadRequestError")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "typical_p", "openai: BadRequestError carries param", str(e.body))
    st = client.completions.create(model=os.path.basename(model), prompt="The quick brown fox", max_tokens=4,
                                   temperature=0, stream=True, stream_options={"include_usage": True},
                                   extra_body={"ignore_eos": True})
    parts = list(st)
    check(parts[-1].usage.completion_tokens == 4 and all(p.usage is None for p in parts[:-1]),
          "openai: stream_options include_usage parsed by the client")

# ---- vLLM metrics: every series a vLLM Grafana dashboard queries, with model_name ----
m0 = requests.get(U + "/metrics").text
gen({"tokens": prompt_ids, "max_tokens": 5, "temperature": 0, "ignore_eos": True})
m1 = requests.get(U + "/metrics").text
mn = {"model_name": os.path.basename(model)}
d = lambda name, **lab: metric(m1, name, dict(mn, **lab)) - metric(m0, name, dict(mn, **lab))  # noqa: E731
check(d("vllm:request_success_total", finished_reason="length") == 1, "vllm:request_success_total{finished_reason} counts")
check(d("vllm:generation_tokens_total") == 5 and d("vllm:prompt_tokens_total") == len(prompt_ids),
      "vllm:generation_tokens_total and prompt_tokens_total count exactly")
check(d("vllm:e2e_request_latency_seconds_count") == 1 and d("vllm:request_prompt_tokens_sum") == len(prompt_ids) and
      d("vllm:request_generation_tokens_sum") == 5 and d("vllm:time_to_first_token_seconds_count") == 1 and
      d("vllm:time_per_output_token_seconds_count") == 4, "per-request histograms move by one request")
for h in ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time"):
    s = d(f"vllm:{h}_seconds_sum")
    check(0 <= s < 60, f"vllm:{h}_seconds observed a plausible duration", str(s))
q = d("vllm:request_queue_time_seconds_sum") + d("vllm:request_prefill_time_seconds_sum") + \
    d("vllm:request_decode_time_seconds_sum")
check(abs(q - d("vllm:e2e_request_latency_seconds_sum")) < 1e-3, "queue + prefill + decode = end-to-end")
frac = metric(m1, "vllm:kv_cache_usage_perc", mn)
check(0 <= frac <= 1 and metric(m1, "vllm:gpu_cache_usage_perc", mn) == frac, "KV cache usage is a fraction")
check(metric(m1, "process_resident_memory_bytes") > 1e6 and metric(m1, "process_cpu_seconds_total") > 0 and
      metric(m1, "process_open_fds") > 2 and metric(m1, "process_start_time_seconds") > 1e9, "process_* metrics")
dashboard = json.load(open(os.path.join(os.path.dirname(__file__), "vllm_dashboard_queries.json")))
names = sorted({n for q in dashboard["queries"] for n in re.findall(r"vllm:[a-z0-9_:]+", q)})
present = {n for n in names if re.search(r"^" + re.escape(n) + r'(\{[^}]*model_name="' + re.escape(mn["model_name"]) +
                                         r'"[^}]*\})', m1, re.M)}
for suffix in ("_bucket", "_sum", "_count"):
    present |= {n for n in names if n.endswith(suffix) and n[:-len(suffix)] + "_bucket" in m1}
check(len(names) >= 15 and set(names) <= present, f"all {len(names)} vllm: series of the vLLM dashboard exist with model_name",
      str(sorted(set(names) - present)))
promtool = shutil.which("promtool") or next((p for p in ["/opt/kda-promtool/usr/bin/promtool"] if os.path.exists(p)), None)
if promtool:
    r = subprocess.run([promtool, "check", "metrics"], input=m1, capture_output=True, text=True)
    # vLLM's own names break two lint rules (':' in names, a histogram named
    # iteration_tokens_total); a dashboard needs them as they are. Anything
    # else is ours to fix.
    problems = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    vllm_naming = [l for l in problems if l.startswith("vllm:") and
                   ("should not contain ':'" in l or l.startswith("vllm:iteration_tokens_total non-counter"))]
    check(set(problems) == set(vllm_naming), "promtool check metrics: no lint problem but vLLM's own naming",
          "\n".join(sorted(set(problems) - set(vllm_naming))))
else:
    print("SKIP promtool lint: promtool not installed")
srv.check_clean_exit()

# ---- CORS ----
with Server(model, "--allowed-origins", "http://a.test, http://b.test", "--api-key", "k") as s2:
    u = s2.url
    pre = requests.options(u + "/v1/chat/completions", headers={"Origin": "http://b.test",
                                                                "Access-Control-Request-Method": "POST",
                                                                "Access-Control-Request-Headers": "authorization,content-type"})
    check(pre.status_code == 204 and pre.headers.get("Access-Control-Allow-Origin") == "http://b.test" and
          "POST" in pre.headers.get("Access-Control-Allow-Methods", "") and
          pre.headers.get("Access-Control-Allow-Headers") == "authorization,content-type",
          "preflight from an allowed origin: 204 with the CORS headers, no API key needed", str(pre.headers))
    pre = requests.options(u + "/v1/completions", headers={"Origin": "http://evil.test",
                                                           "Access-Control-Request-Method": "POST"})
    check(pre.status_code == 204 and "Access-Control-Allow-Origin" not in pre.headers,
          "preflight from another origin: no CORS headers (the browser refuses)")
    h = {"Origin": "http://a.test"}
    auth = dict(h, Authorization="Bearer k")
    for what, r in [("200", requests.get(u + "/health", headers=h)),
                    ("401", requests.post(u + "/generate", json={"prompt": "x"}, headers=h)),
                    ("400", requests.post(u + "/generate", json={"prompt": "x", "top_p": 5}, headers=auth)),
                    ("404", requests.get(u + "/nope", headers=h)),
                    ("stream", requests.post(u + "/generate", json={"prompt": "x", "max_tokens": 2, "stream": True},
                                             headers=auth))]:
        check(r.headers.get("Access-Control-Allow-Origin") == "http://a.test" and "Origin" in r.headers.get("Vary", ""),
              f"CORS headers on a {what} response", str(r.headers))
    s2.check_clean_exit("CORS server exits 0")
with Server(model) as s3:
    r = requests.get(s3.url + "/health", headers={"Origin": "http://a.test"})
    check("Access-Control-Allow-Origin" not in r.headers, "no --allowed-origins: no CORS headers")
    pre = requests.options(s3.url + "/generate", headers={"Origin": "http://a.test", "Access-Control-Request-Method": "POST"})
    check(pre.status_code == 204 and "Access-Control-Allow-Origin" not in pre.headers, "preflight answered (204) but not allowed")
    s3.stop()

# ---- --version, kda-cli SUB --help ----
r = subprocess.run([SERVER, "--version"], capture_output=True, text=True)
check(r.returncode == 0 and re.match(r"kda-server \d+\.\d+\.\d+ \(git \S+\)", r.stdout), "kda-server --version", r.stdout)
if os.path.exists(CLI):
    r = subprocess.run([CLI, "--version"], capture_output=True, text=True)
    check(r.returncode == 0 and re.match(r"kda-cli \d+\.\d+\.\d+ \(git \S+\)", r.stdout), "kda-cli --version", r.stdout)
    for sub in ("inspect", "score", "generate", "tokenize", "detokenize", "bench"):
        r = subprocess.run([CLI, sub, "--help"], capture_output=True, text=True)
        check(r.returncode == 0 and r.stdout.startswith("usage: kda-cli " + sub), f"kda-cli {sub} --help", r.stdout + r.stderr)
finish()

"""guidellm (the vLLM project's serving benchmark client) end to end against
kda-server on the demo model. Two `guidellm run`s with fixed workloads, both
streamed, 32-token synthetic prompts and exactly 16 output tokens each through
ignore_eos: 12 /v1/completions requests 4 at a time, then 4 /v1/chat/completions
requests (guidellm's default format; the server's plain chat template) 2 at a
time. Each JSON report is checked:

* every request completed, none errored or cut short;
* the token counts it reports equal what was asked, and independent sources
  agree: the prompt tokens it reports are the server's /tokenize count of what
  it sent (for completions 32, the prompt's bytes), and the text it received is
  16 bytes (the demo model's tokens are bytes);
* TTFT and ITL are present and positive for every request, TTFT below the
  request's latency;
* the server's vLLM-named /metrics moved by exactly what the client sent and
  received (requests finished for "length", prompt and generation tokens, the
  TTFT / ITL / end-to-end sample counts), and the server's latency sums sit just
  below the client's (the server's clock starts after the client sends and stops
  before the client has read the last token).

guidellm comes from setup-debian.sh's KDA_GUIDELLM_DIR (default /opt/kda-guidellm,
--no-deps with what `guidellm run` imports), layered on lm-eval's folder (datasets,
pyarrow, pandas, numpy) and run by Debian's Python, whose python3-torch provides
the torch.utils.data loader guidellm feeds requests through. Without them the test
skips. Tokens are counted with a byte-level Hugging Face tokenizer made at test
time (byte_tokenizer.py): nothing is downloaded."""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SKIP, SRC, Server, check, finish, metric  # noqa: E402

REQUESTS, STREAMS, PROMPT_TOKENS, OUTPUT_TOKENS = 12, 4, 32, 16
CHAT_REQUESTS, CHAT_STREAMS = 4, 2
GL_DIR = os.environ.get("KDA_GUIDELLM_DIR", "/opt/kda-guidellm")
LM_DIR = os.environ.get("KDA_LM_EVAL_DIR", "/opt/kda-lm-eval")
PY = os.environ.get("KDA_GUIDELLM_PYTHON", "/usr/bin/python3")
work = tempfile.mkdtemp(prefix="kda-guidellm-")
atexit.register(shutil.rmtree, work, ignore_errors=True)
env = dict(os.environ, PYTHONPATH=os.pathsep.join([GL_DIR, LM_DIR, os.environ.get("PYTHONPATH", "")]),
           HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
           HF_HOME=os.path.join(work, "hf"), HF_DATASETS_CACHE=os.path.join(work, "hf-datasets"),
           # guidellm spawns one worker process per stream by default; one runs all
           # the streams (they are async), so fewer Pythons import it on 2 cores
           GUIDELLM__MAX_WORKER_PROCESSES="1")
# One Python both checks the install and writes the tokenizer (each start imports
# transformers, seconds on 2 cores).
tok_dir = os.path.join(work, "byte-tokenizer")
if not os.path.exists(PY):
    print(f"SKIP: {PY} (Debian's Python, which runs guidellm) is missing")
    sys.exit(SKIP)
setup = f"""import sys
try:
    import guidellm, datasets, torch.utils.data, transformers, tokenizers
except ImportError as e:
    print(e)
    sys.exit({SKIP})
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import byte_tokenizer
byte_tokenizer.main({tok_dir!r})
"""
r = subprocess.run([PY, "-c", setup], env=env, capture_output=True, text=True)
if r.returncode == SKIP:
    print(f"SKIP: guidellm is not installed in {GL_DIR} (with lm-eval's {LM_DIR} and Debian's python3-torch; "
          f"bash scripts/setup-debian.sh)\n{r.stdout[-300:]}")
    sys.exit(SKIP)
if r.returncode != 0:
    print("FAIL writing the byte-level tokenizer", r.stdout, r.stderr[-2000:])
    sys.exit(1)

VLLM_SERIES = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
               "vllm:time_to_first_token_seconds_sum", "vllm:inter_token_latency_seconds_count",
               "vllm:inter_token_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count",
               "vllm:e2e_request_latency_seconds_sum"]
REASONS = ["stop", "length", "abort", "error"]


def vllm_metrics(url):
    text = requests.get(url + "/metrics", timeout=30).text
    got = {name: metric(text, name, {"model_name": "demo"}) for name in VLLM_SERIES}
    for reason in REASONS:
        got[reason] = metric(text, "vllm:request_success_total", {"model_name": "demo", "finished_reason": reason})
    return got


def guidellm(url, request_format, n, streams):
    """One `guidellm run` of n streamed requests; returns its benchmark and how the
    server's vLLM metrics moved meanwhile."""
    before = vllm_metrics(url)
    report = os.path.join(work, request_format.strip("/").replace("/", "_") + ".json")
    cmd = [PY, "-m", "guidellm", "run",
           "--backend", f"kind=openai_http,target={url},model=demo,request_format={request_format},stream=true",
           "--profile", f"kind=concurrent,streams={streams}",
           "--constraint", f"kind=max_requests,count={n}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--tokenizer", f"kind=huggingface_auto,model={tok_dir}",
           "--output", f"kind=json,path={report}", "--disable-console-interactive"]
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=work)
    print(f"guidellm run {request_format} took {time.time() - t0:.1f} s")
    ok = check(r.returncode == 0 and os.path.exists(report), f"{request_format}: guidellm run finishes and writes its report",
               (r.stdout + r.stderr)[-3000:])
    after = vllm_metrics(url)
    return (json.load(open(report))["benchmarks"][0] if ok else None), {k: after[k] - before[k] for k in after}


def check_run(what, bench, d, n, streams, server_prompt_tokens):
    """The report against what was asked, against the server's own counts
    (server_prompt_tokens(body) tokenizes a request body's prompt), and against
    the server's metrics d."""
    reqs = bench["requests"]
    done = reqs["successful"]
    check(bench["metrics"]["request_totals"] == {"successful": n, "errored": 0, "incomplete": 0, "total": n},
          f"{what}: all {n} requests succeeded, none errored or incomplete", str(bench["metrics"]["request_totals"]))
    check(len(done) == n and not reqs["errored"] and not reqs["incomplete"] and
          all(q["info"]["status"] == "completed" and q["info"]["error"] is None for q in done),
          f"{what}: each request in the report completed with no error",
          str([(q["info"]["status"], q["info"]["error"]) for q in done]))
    events = sorted([(q["request_start_time"], 1) for q in done] + [(q["request_end_time"], -1) for q in done])
    in_flight = [0]
    for _, step in events:   # an end sorts before a start at the same instant
        in_flight.append(in_flight[-1] + step)
    check(max(in_flight) == streams, f"{what}: guidellm kept {streams} requests in flight at most and at some point",
          str(max(in_flight)))
    bodies = [json.loads(q["request_args"])["body"] for q in done]
    check(all(b.get("stream") is True and b.get("ignore_eos") is True and
              OUTPUT_TOKENS in (b.get("max_tokens"), b.get("max_completion_tokens")) for b in bodies),
          f"{what}: guidellm streamed each request for {OUTPUT_TOKENS} tokens with ignore_eos", str(bodies[:1]))
    server_counts = [server_prompt_tokens(b) for b in bodies]
    check([q["prompt_tokens"] for q in done] == server_counts,
          f"{what}: the prompt tokens guidellm reports are the server's /tokenize count of what it sent",
          f"{[q['prompt_tokens'] for q in done]} vs {server_counts}")
    check(all(q["output_tokens"] == OUTPUT_TOKENS for q in done),
          f"{what}: guidellm counts {OUTPUT_TOKENS} output tokens per request", str([q["output_tokens"] for q in done]))
    # A byte token that is part of an unfinished UTF-8 character reaches the
    # client as U+FFFD; tiny Shakespeare is ASCII, so such outputs are rare.
    whole = [q["output"] for q in done if "\ufffd" not in q["output"]]
    check(len(whole) >= n // 2 and all(len(t.encode()) == OUTPUT_TOKENS for t in whole),
          f"{what}: the text guidellm received is {OUTPUT_TOKENS} bytes = tokens per request",
          str([len(t.encode()) for t in whole]))
    ttft = [q["time_to_first_token_ms"] for q in done]
    itl = [q["inter_token_latency_ms"] for q in done]
    lat = [q["request_latency"] for q in done]
    check(all(t is not None and 0 < t < 1e3 * l for t, l in zip(ttft, lat)),
          f"{what}: TTFT is present, positive and below the request latency for every request", str(ttft))
    check(all(i is not None and i > 0 for i in itl), f"{what}: ITL is present and positive for every request", str(itl))

    check(d["length"] == n and d["stop"] == d["abort"] == d["error"] == 0,
          f"{what}: vllm:request_success_total{{finished_reason=\"length\"}} rose by {n}, no other reason",
          str({k: d[k] for k in REASONS}))
    check(d["vllm:prompt_tokens_total"] == sum(q["prompt_tokens"] for q in done),
          f"{what}: vllm:prompt_tokens_total rose by the prompt tokens guidellm counted",
          f"{d['vllm:prompt_tokens_total']} vs {sum(q['prompt_tokens'] for q in done)}")
    check(d["vllm:generation_tokens_total"] == sum(q["output_tokens"] for q in done) == n * OUTPUT_TOKENS,
          f"{what}: vllm:generation_tokens_total rose by the output tokens guidellm received",
          f"{d['vllm:generation_tokens_total']} vs {sum(q['output_tokens'] for q in done)}")
    check(d["vllm:time_to_first_token_seconds_count"] == d["vllm:e2e_request_latency_seconds_count"] == n and
          d["vllm:inter_token_latency_seconds_count"] == n * (OUTPUT_TOKENS - 1),
          f"{what}: one TTFT and one end-to-end sample per request, one ITL sample per later token",
          str({k: d[k] for k in VLLM_SERIES if k.endswith("_count")}))
    # The server measures arrival -> first token / last token; the client measures
    # from before sending to after reading, so its figures are the larger, by the
    # HTTP and Python overhead: bounded here at 25% + 50 ms per request.
    client = {"TTFT": sum(ttft) / 1e3, "end-to-end latency": sum(lat)}
    server = {"TTFT": d["vllm:time_to_first_token_seconds_sum"],
              "end-to-end latency": d["vllm:e2e_request_latency_seconds_sum"]}
    for k in client:
        check(server[k] <= client[k] + 1e-3 * n and client[k] - server[k] <= 0.25 * client[k] + 0.05 * n,
              f"{what}: the server's summed {k} is just below guidellm's",
              f"server {server[k]:.3f} s, client {client[k]:.3f} s")
    server_itl = 1e3 * d["vllm:inter_token_latency_seconds_sum"] / max(d["vllm:inter_token_latency_seconds_count"], 1)
    client_itl = sum(itl) / len(itl)
    check(abs(server_itl - client_itl) <= 0.25 * client_itl + 2.0,
          f"{what}: the server's mean ITL agrees with guidellm's within 25%",
          f"server {server_itl:.2f} ms, client {client_itl:.2f} ms")
    print(f"{what}: guidellm (server) TTFT sum {client['TTFT']:.3f} ({server['TTFT']:.3f}) s, end-to-end sum "
          f"{client['end-to-end latency']:.3f} ({server['end-to-end latency']:.3f}) s, ITL mean {client_itl:.2f} "
          f"({server_itl:.2f}) ms; benchmark {bench['duration']:.2f} s")
    return bodies


demo = os.path.join(SRC, "models", "demo")
# --chat-template plain: the demo model has none of its own, and chat is guidellm's default format
with Server(demo, "--chat-template", "plain") as s:
    def tokenize(body):
        return requests.post(s.url + "/tokenize", json=body, timeout=30).json()["count"]

    bench, d = guidellm(s.url, "/v1/completions", REQUESTS, STREAMS)
    if bench:
        bodies = check_run("completions", bench, d, REQUESTS, STREAMS, lambda b: tokenize({"prompt": b["prompt"]}))
        check(all(len(b["prompt"].encode()) == PROMPT_TOKENS for b in bodies),
              f"completions: guidellm made each prompt {PROMPT_TOKENS} tokens (bytes) with the byte tokenizer",
              str([len(b["prompt"].encode()) for b in bodies]))
        check(len(set(b["prompt"] for b in bodies)) == REQUESTS, "completions: guidellm sent distinct prompts")
    bench, d = guidellm(s.url, "/v1/chat/completions", CHAT_REQUESTS, CHAT_STREAMS)
    if bench:
        # /tokenize with messages renders the same template (with the generation prompt)
        bodies = check_run("chat", bench, d, CHAT_REQUESTS, CHAT_STREAMS, lambda b: tokenize({"messages": b["messages"]}))
        check(all(tokenize({"messages": b["messages"]}) > PROMPT_TOKENS for b in bodies),
              "chat: the template adds tokens around guidellm's prompt")
    s.check_clean_exit("server exits 0 after guidellm")
finish()

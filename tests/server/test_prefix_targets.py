"""The prefix cache's targets from issue 17 on the shipped demo model (CPU
backend), each against a --prefix-cache off server on the same model:
  - an lm-eval-style scoring workload (one 1,024-token context, 8
    continuations of 1-32 tokens, sent as lm-eval's local-completions sends
    loglikelihood requests: echo, logprobs 1, max_tokens 1): log-probs
    bit-identical, prompt tokens computed <= 1/6, wall time <= 1/3, sent one
    by one and as one batched request; and the same task run by
    lm-evaluation-harness itself (when installed): the same loglikelihoods
    with and without the cache, <= 1/6 of the prompt tokens computed;
  - a 10-turn chat resending its history: every turn's output identical,
    TTFT of turn 10 within 1.5x of turn 1's.
Timing checks compare two runs on the same machine in the same process, so
only the ratios mean anything (the CI machine is shared). Not run under the
sanitizers (suite targets): a debug build measures nothing.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SRC, Server, check, finish, metric  # noqa: E402

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

# the same workload run by lm-evaluation-harness itself (local-completions, the
# server's tokenizer), when setup-debian.sh installed it: the same
# loglikelihoods with and without the cache, and the tokens computed
LM_DIR = os.environ.get("KDA_LM_EVAL_DIR", "/opt/kda-lm-eval")
lm_env = dict(os.environ, PYTHONPATH=LM_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
              HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
              HF_DATASETS_CACHE=tempfile.mkdtemp(prefix="kda-hf-"))
probe = subprocess.run([sys.executable, "-c", "import lm_eval, datasets, tenacity"], env=lm_env, capture_output=True)
if probe.returncode != 0:
    print(f"SKIP the lm-eval run: lm-eval is not installed in {LM_DIR}")
else:
    work = tempfile.mkdtemp(prefix="kda-lm-eval-prefix-")
    with open(os.path.join(work, "data.jsonl"), "w") as f:  # one document: the context and its 8 continuations
        f.write(json.dumps({"context": context, "choices": [c.strip() or c for c in conts], "label": 0}) + "\n")
    with open(os.path.join(work, "kda_prefix.yaml"), "w") as f:
        f.write("task: kda_prefix\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: %s\n"
                "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
                "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{label}}\"\nmetric_list:\n  - metric: acc\n"
                % os.path.join(work, "data.jsonl"))

    def lm_eval_cli(server, tag):
        out = os.path.join(work, tag)
        cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
               f"base_url={server.url}/v1/completions,model=demo,tokenizer_backend=remote,num_concurrent=1,max_retries=1",
               "--tasks", "kda_prefix", "--include_path", work, "--log_samples", "--output_path", out]
        r = subprocess.run(cmd, env=lm_env, capture_output=True, text=True, timeout=600, cwd=work)
        smp = glob.glob(os.path.join(out, "*", "samples_kda_prefix_*.jsonl"))
        if r.returncode or len(smp) != 1:
            print((r.stdout + r.stderr)[-2000:])
            return None
        return [[float(x[0]) for x in json.loads(l)["filtered_resps"]] for l in open(smp[0])]

    lm_ref = Server(demo, "--prefix-cache", "off")
    lm_srv = Server(demo)
    ll_ref, ll = lm_eval_cli(lm_ref, "nocache"), lm_eval_cli(lm_srv, "cache")
    m_ref, m = requests.get(lm_ref.url + "/metrics").text, requests.get(lm_srv.url + "/metrics").text
    prompt_ref = metric(m_ref, "kda_prompt_tokens_total")
    computed = metric(m, "kda_prompt_tokens_total") - metric(m, "kda_prefix_cache_hit_tokens_total")
    print(f"lm-eval itself: {prompt_ref:.0f} prompt tokens computed without the cache, {computed:.0f} with it")
    check(ll is not None and ll == ll_ref, "lm-eval (local-completions): the 8 loglikelihoods with the cache equal "
          "those without it", f"{ll} vs {ll_ref}")
    check(computed * 6 <= prompt_ref, "lm-eval (local-completions): prompt tokens computed <= 1/6 of the no-cache run",
          f"{computed} vs {prompt_ref}")
    lm_srv.stop()
    lm_ref.stop()

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

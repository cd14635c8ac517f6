"""lm-evaluation-harness end to end against kda-server: `lm_eval --model
local-completions --model_args ...,tokenizer_backend=remote` runs a
loglikelihood (multiple-choice) task on local data with the demo model,
tokenizing through the server's /tokenizer_info and /tokenize and scoring
through /v1/completions (echo + logprobs).

Checked independently of lm-eval's arithmetic: every loglikelihood it
reports equals the sum of the continuation's log-probs from /score, its
accuracy equals the one those /score sums give, and the trained demo model
prefers the real line of Shakespeare in every pair.

lm-eval comes from setup-debian.sh's KDA_LM_EVAL_DIR (default
/opt/kda-lm-eval; installed with --no-deps and only what local-completions
imports); without it the test skips."""
import glob
import json
import os
import subprocess
import sys
import tempfile

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SKIP, SRC, Server, check, finish  # noqa: E402

LM_DIR = os.environ.get("KDA_LM_EVAL_DIR", "/opt/kda-lm-eval")
env = dict(os.environ, PYTHONPATH=LM_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
           HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=tempfile.mkdtemp(prefix="kda-hf-"))
probe = subprocess.run([sys.executable, "-c", "import lm_eval, datasets, tenacity"], env=env, capture_output=True, text=True)
if probe.returncode != 0:
    print(f"SKIP: lm-eval is not installed in {LM_DIR} (bash scripts/setup-debian.sh)\n{probe.stderr[-300:]}")
    sys.exit(SKIP)

task_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm_eval_task")
data = os.path.join(task_dir, "shakespeare.jsonl")
docs = [json.loads(l) for l in open(data)]
work = tempfile.mkdtemp(prefix="kda-lm-eval-")
with open(os.path.join(task_dir, "kda_shakespeare.yaml")) as f, open(os.path.join(work, "kda_shakespeare.yaml"), "w") as g:
    g.write(f.read().replace("DATA_FILE", data))

demo = os.path.join(SRC, "models", "demo")
with Server(demo) as s:
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
           f"base_url={s.url}/v1/completions,model=demo,tokenizer_backend=remote,num_concurrent=1,max_retries=1",
           "--tasks", "kda_shakespeare", "--include_path", work, "--log_samples", "--output_path", os.path.join(work, "out")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=work)
    check(r.returncode == 0, "lm_eval local-completions with tokenizer_backend=remote runs to the end",
          (r.stdout + r.stderr)[-3000:])
    results = glob.glob(os.path.join(work, "out", "*", "results_*.json"))
    samples = glob.glob(os.path.join(work, "out", "*", "samples_kda_shakespeare_*.jsonl"))
    if check(len(results) == 1 and len(samples) == 1, "lm_eval wrote its results and samples", str(results + samples)):
        acc = json.load(open(results[0]))["results"]["kda_shakespeare"]["acc,none"]
        lls = {}
        for line in open(samples[0]):
            smp = json.loads(line)
            lls[smp["doc_id"]] = [float(resp[0]) for resp in smp["filtered_resps"]]
        ours, worst = [], 0.0
        for i, doc in enumerate(docs):
            sums = []
            for choice in doc["choices"]:
                ctx = list(doc["context"].encode())
                full = ctx + list((" " + choice).encode())   # lm-eval's target_delimiter is " "
                sc = requests.post(s.url + "/score", json={"tokens": full}).json()
                sums.append(sum(sc["token_logprobs"][len(ctx) - 1:]))
            ours.append(max(range(len(sums)), key=lambda k: sums[k]))
            worst = max([worst] + [abs(a - b) for a, b in zip(lls.get(i, []), sums)])
            check(len(lls.get(i, [])) == len(sums), f"lm_eval scored both choices of doc {i}")
        check(worst < 1e-3, "every lm_eval loglikelihood equals the continuation's log-prob sum from /score",
              f"worst difference {worst:.2e}")
        want = sum(o == d["label"] for o, d in zip(ours, docs)) / len(docs)
        check(abs(acc - want) < 1e-9, "lm_eval's accuracy equals the one /score gives", f"{acc} vs {want}")
        check(want == 1.0, "the demo model prefers the real line of Shakespeare in every pair", str(ours))
    log = s.log()
    check("GET /tokenizer_info 200" in log and "POST /tokenize 200" in log and "POST /v1/completions 200" in log,
          "lm-eval used the server's tokenizer (/tokenizer_info, /tokenize) and /v1/completions")
    s.check_clean_exit("server exits 0 after lm_eval")
finish()

"""kda-server with a SentencePiece tokenizer (Llama-2's, vocab 32000): BOS
handling, tokenization and greedy text equal to kda-cli, streaming text
through the incremental detokenizer. Skips without /work/shared."""
import json
import os
import subprocess
import sys

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import CLI, SKIP, Server, check, finish, make_checkpoint, shared_dir, sse_events  # noqa: E402

shared = shared_dir()
spm = shared and os.path.join(shared, "data", "llama2-tokenizer.model")
if not spm or not os.path.exists(spm):
    print("SKIP: no shared/data/llama2-tokenizer.model")
    sys.exit(SKIP)

model = make_checkpoint("tiny-spm", "--preset", "tiny", "--vocab", "32000", "--tokenizer", "spm:" + spm)
text = "Hello world, this is a tokenizer test."


def cli(*args):
    r = subprocess.run([CLI] + list(args), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


with Server(model) as s:
    u = s.url
    toks = requests.post(u + "/tokenize", json={"text": text}).json()["tokens"]
    check(toks[0] == 1 and len(toks) > 3, "text gets BOS (id 1) by default")
    nobos = requests.post(u + "/tokenize", json={"text": text, "add_bos": False}).json()["tokens"]
    check(nobos == toks[1:], "add_bos false drops only the BOS")
    if os.path.exists(CLI):
        ref = cli("tokenize", model, "--text", text, "--bos", "--json")
        ref = ref["ids"]
        check(toks == ref, "/tokenize equals kda-cli tokenize", f"{toks} vs {ref}")
    check(requests.post(u + "/detokenize", json={"tokens": toks}).json()["text"] == text, "/detokenize round-trips")
    g = requests.post(u + "/generate", json={"prompt": text, "max_tokens": 40, "temperature": 0,
                                             "ignore_eos": True}).json()
    if os.path.exists(CLI):
        ref = cli("generate", model, "--text", text, "--max-tokens", "40", "--temperature", "0", "--ignore-eos",
                  "--json", "--threads", "1")
        check(g["tokens"] == ref["tokens"], "greedy /generate with a text prompt equals kda-cli generate --text")
    r = requests.post(u + "/generate", json={"prompt": text, "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                                             "stream": True}, stream=True)
    data, _ = sse_events(r.iter_lines())
    check("".join(json.loads(d)["text"] for d in data[:-1]) == g["text"],
          "streamed SentencePiece text equals the whole decode")
    dec = requests.post(u + "/detokenize", json={"tokens": g["tokens"]}).json()["text"]
    check(g["text"] == dec, "generated text equals /detokenize of the generated ids")
    sc = requests.post(u + "/score", json={"text": text}).json()
    check(sc["tokens"] == toks and len(sc["token_logprobs"]) == len(toks) - 1, "/score scores the text after BOS")
    s.check_clean_exit()
finish()

"""Shared bits of the trainer tests: find scripts/, skip (77) without torch,
run train.py, make a small synthetic corpus, locate kda-cli and the data."""
import json
import os
import random
import subprocess
import sys
import tempfile

SRC = os.environ.get("KDA_SRC") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPTS = os.path.join(SRC, "scripts")
sys.path.insert(0, SCRIPTS)

try:
    import numpy  # noqa: F401
    import torch
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

torch.set_num_threads(1)
TMP = tempfile.mkdtemp(prefix="trainer-test-")

# A tiny model: 2 KDA layers and 1 GQA layer, every option of the family exercised.
TINY = ["--d-model", "32", "--layers", "3", "--pattern", "KKG", "--kda-heads", "2", "--kda-head-dim", "16",
        "--gqa-heads", "2", "--gqa-kv-heads", "1", "--gqa-head-dim", "16", "--ffn", "64", "--rope-frac", "0.5"]


def corpus(n_lines=600, seed=0):
    """A small learnable text file: a toy grammar, so a few steps visibly lower the loss."""
    r = random.Random(seed)
    who, verb, what = ["the cat", "a dog", "my lord", "the king"], ["sees", "eats", "loves", "fears"], \
        ["the mat.", "a bone.", "his crown.", "the moon."]
    path = os.path.join(TMP, "corpus.txt")
    with open(path, "w") as f:
        for _ in range(n_lines):
            f.write("%s %s %s\n" % (r.choice(who), r.choice(verb), r.choice(what)))
    return path


def train(*args, check=True):
    """stdout of train.py train ARGS (check=False: the CompletedProcess)."""
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "train.py"), "train"] + [str(a) for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if not check:
        return r
    if r.returncode != 0:
        raise AssertionError("train.py failed (%d):\n%s\n%s" % (r.returncode, r.stdout[-2000:], r.stderr[-2000:]))
    return r.stdout


def logged_losses(stdout):
    return [float(l.split("| loss ")[1].split()[0]) for l in stdout.splitlines() if l.startswith("step ")]


def kda_cli():
    """Path of the built kda-cli, or None."""
    build = os.environ.get("KDA_BUILD")
    cands = [os.path.join(build, "cli", "kda-cli")] if build else []
    cands += [os.path.join(SRC, d, "cli", "kda-cli") for d in sorted(os.listdir(SRC)) if d.startswith("build")]
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    return None


def cli_score(cli, model_dir, ids):
    r = subprocess.run([cli, "score", model_dir, "--tokens", ",".join(map(str, ids)), "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        raise AssertionError("kda-cli score failed (%d): %s" % (r.returncode, r.stderr))
    return json.loads(r.stdout)["token_logprobs"]


def shared_data(name):
    base = os.environ.get("KDA_SHARED") or os.path.join(SRC, "..", "shared")
    p = os.path.join(base, "data", name)
    return p if os.path.exists(p) else None


def run_tests(g):
    """Runs every test_* function in g; exit 1 on the first failure."""
    for name in sorted(k for k in g if k.startswith("test_") and callable(g[k])):
        g[name]()
        print("ok  %s" % name)

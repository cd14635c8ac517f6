"""Special files in a model directory (issue 19, items 7 and 10): every file
the loaders read (config.json, model.safetensors, its index, tokenizer.model,
tokenizer_config.json, chat_template.jinja, a name map) replaced in turn by a
FIFO, /dev/zero, /dev/urandom and a directory. kda-cli inspect and kda-server
must each fail at once (no hang in open(), no read without end) with a message
naming the file and saying what it is; text files over their cap are refused by
size. The weights file truncated and rewritten under a running CPU server
changes nothing: it serves on, the same output (issue 19, item 8). Under the ASan build the server's exit is checked for leak reports (a
directory as tokenizer.model leaked the SentencePiece model)."""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from fixture import CLI, SERVER, Server, _tmp, check, finish, make_checkpoint  # noqa: E402

base = make_checkpoint()
LIMIT = 20   # seconds: "at once", with room for a sanitizer build on a busy machine


def case_dir(name):
    d = os.path.join(_tmp, "case-" + name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(base, d)
    return d


def make_special(path, kind):
    if os.path.lexists(path):
        os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        os.mkdir(path)
    else:
        os.symlink("/dev/" + kind, path)


WHAT = {"fifo": "FIFO", "dir": "directory", "zero": "character device", "urandom": "character device"}


def run(cmd):
    t0 = time.time()
    env = dict(os.environ, OMP_NUM_THREADS="1", ASAN_OPTIONS="detect_leaks=1")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT, env=env)
        return r.returncode, r.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""), LIMIT


def server(d, *flags):
    return run([SERVER, "--model", d, "--port", "0", "--threads", "1", "--log-level", "warn"] + list(flags))


def clean(log):
    return "Sanitizer" not in log and "runtime error" not in log


# (file, does kda-cli inspect read it?, extra server flags)
FILES = [("config.json", True, []), ("model.safetensors", True, []), ("model.safetensors.index.json", True, []),
         ("tokenizer.model", False, []), ("tokenizer_config.json", False, []), ("chat_template.jinja", False, []),
         ("names.map", True, ["--name-map"])]
for fname, cli_reads, flags in FILES:
    for kind in ("fifo", "zero", "urandom", "dir"):
        d = case_dir(f"{fname}-{kind}")
        p = os.path.join(d, fname)
        make_special(p, kind)
        fl = flags + [p] if flags else []
        rc, log, dt = server(d, *fl)
        check(rc not in (0, "timeout") and fname in log and WHAT[kind] in log and clean(log),
              f"kda-server: {fname} as {kind} fails in {dt:.1f}s naming it ({WHAT[kind]})",
              f"rc={rc} {log[-300:]}")
        if cli_reads and os.path.exists(CLI):
            cmd = [CLI, "inspect", d] + (["--name-map", p] if flags else [])
            rc, log, dt = run(cmd)
            check(rc not in (0, "timeout") and fname in log and WHAT[kind] in log and clean(log),
                  f"kda-cli inspect: {fname} as {kind} fails in {dt:.1f}s naming it", f"rc={rc} {log[-300:]}")

# size caps on text files (sparse files: no disk, but stat says the size)
for fname, size, cap in [("config.json", 17 << 20, "16 MiB"), ("tokenizer.model", 65 << 20, "64 MiB"),
                         ("tokenizer_config.json", 65 << 20, "64 MiB")]:
    d = case_dir(f"{fname}-big")
    with open(os.path.join(d, fname), "ab") as f:
        f.truncate(size)
    rc, log, dt = server(d)
    check(rc not in (0, "timeout") and fname in log and cap in log and clean(log),
          f"kda-server: a {size >> 20} MiB {fname} is refused by its {cap} cap", f"rc={rc} {log[-300:]}")

# a tokenizer.model that is a regular file but not a model: an error, no leak
d = case_dir("tokenizer-garbage")
with open(os.path.join(d, "tokenizer.model"), "wb") as f:
    f.write(os.urandom(4096))
rc, log, dt = server(d)
check(rc not in (0, "timeout") and "tokenizer.model" in log and clean(log),
      "kda-server: a garbage tokenizer.model is an error naming it, with no leak", f"rc={rc} {log[-300:]}")
# the model directory itself
for kind in ("fifo", "zero"):
    p = os.path.join(_tmp, "modeldir-" + kind)
    make_special(p, kind)
    rc, log, dt = server(p)
    check(rc not in (0, "timeout") and clean(log), f"kda-server: --model a {kind} fails in {dt:.1f}s", f"rc={rc} {log[-200:]}")

# the weights file changes underneath a running CPU server: truncated, then rewritten with garbage
import requests  # noqa: E402
d = case_dir("weights-change")
w = os.path.join(d, "model.safetensors")
size = os.path.getsize(w)
body = {"tokens": [1, 2, 3, 4], "max_tokens": 24, "temperature": 0, "ignore_eos": True}
with Server(d) as s:
    before = requests.post(s.url + "/generate", json=body, timeout=60).json()["tokens"]
    os.truncate(w, 0)
    r = requests.post(s.url + "/generate", json=body, timeout=60)
    check(r.status_code == 200 and r.json()["tokens"] == before,
          "weights file truncated to 0 under the server: it serves on, the same output", r.text[:200])
    with open(w, "r+b") as f:
        f.write(os.urandom(size))
    r = requests.post(s.url + "/generate", json=dict(body, tokens=[5, 6, 7]), timeout=60)
    r2 = requests.post(s.url + "/generate", json=body, timeout=60)
    check(r.status_code == 200 and r2.status_code == 200 and r2.json()["tokens"] == before,
          "weights file rewritten with garbage: still the weights it loaded", r2.text[:200])
    os.truncate(w, size // 2)
    r = requests.post(s.url + "/v1/completions", json={"prompt": "ab", "max_tokens": 8}, timeout=60)
    check(r.status_code == 200 and requests.get(s.url + "/health").status_code == 200,
          "and after a truncation to half: completions and /health still answer")
    s.check_clean_exit("the server whose weights file changed exits 0")
finish()

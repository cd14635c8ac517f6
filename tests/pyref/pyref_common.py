"""Shared bits of the scripts/ tests: find scripts/, skip (77) without torch,
make checkpoints in a temp dir, run test_* functions and report."""
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

SRC = os.environ.get("KDA_SRC") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPTS = os.path.join(SRC, "scripts")
sys.path.insert(0, SCRIPTS)

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

TMP = tempfile.mkdtemp(prefix="pyref-")


def script(name, *args, check=True):
    """Runs scripts/<name> with this interpreter; returns stdout."""
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, name)] + [str(a) for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if check and r.returncode != 0:
        raise AssertionError("%s %s failed (%d):\n%s" % (name, " ".join(map(str, args)), r.returncode, r.stderr))
    return r.stdout if check else r


def gen(name, *args):
    """A checkpoint under the temp dir; returns its path."""
    d = os.path.join(TMP, name)
    script("gen_checkpoint.py", d, *args)
    return d


def rel(a, b):
    return float((a - b).norm() / b.norm())


def run_tests(ns):
    fails = 0
    for name in sorted(k for k in ns if k.startswith("test_") and callable(ns[k])):
        try:
            ns[name]()
            print("ok   %s" % name)
        except Exception:
            fails += 1
            print("FAIL %s" % name)
            traceback.print_exc()
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(1 if fails else 0)

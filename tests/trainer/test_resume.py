"""Stopping and resuming gives bit-identical training: same weights,
optimiser state and logged losses as an uninterrupted run (CPU, fixed seed,
dropout and gradient accumulation on, so every random draw is covered)."""
import os

import torch

from trainer_common import TINY, TMP, corpus, logged_losses, run_tests, train
from train import torch_load

DATA = corpus()
COMMON = ["--data", DATA, *TINY, "--ctx", "24", "--batch", "4", "--accum", "2", "--steps", "6", "--warmup", "2",
          "--dropout", "0.1", "--log-every", "1", "--eval-every", "0", "--sample-len", "4", "--seed", "7"]


def same_tree(a, b, path="state"):
    if torch.is_tensor(a):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            same_tree(a[k], b[k], "%s.%s" % (path, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same_tree(x, y, "%s[%d]" % (path, i))
    else:
        assert a == b, (path, a, b)


def test_resume_is_bit_identical_to_uninterrupted():
    full, part = os.path.join(TMP, "full"), os.path.join(TMP, "part")
    l_full = logged_losses(train(*COMMON, "--out", full))
    l_a = logged_losses(train(*COMMON, "--out", part, "--stop-after", "3"))
    l_b = logged_losses(train(*COMMON, "--out", part, "--resume"))
    assert len(l_full) == 6 and len(l_a) == 3 and len(l_b) == 3
    assert l_a + l_b == l_full, (l_full, l_a + l_b)
    a, b = torch_load(os.path.join(full, "ckpt.pt")), torch_load(os.path.join(part, "ckpt.pt"))
    assert a["step"] == b["step"] == 6
    same_tree(a["model"], b["model"], "model")
    same_tree(a["opt"], b["opt"], "opt")
    ea = open(os.path.join(full, "export", "model.safetensors"), "rb").read()
    eb = open(os.path.join(part, "export", "model.safetensors"), "rb").read()
    assert ea == eb


def test_resume_refuses_changed_training_flags():
    run = os.path.join(TMP, "refuse")
    train(*COMMON, "--out", run, "--stop-after", "1")
    args = [x if x != "6" else "9" for x in COMMON]   # --steps 9
    out = train(*args, "--out", run, "--resume", check=False)
    assert out.returncode != 0 and "--steps" in out.stderr, out.stderr


if __name__ == "__main__":
    run_tests(globals())

"""The committed demo model (models/demo) is what its model card says:
kda-cli score over a held-out slice gives the card's figure, computed by the
trainer with the same definition (scripts/train.py docstring): the last 10% of
tinyshakespeare.txt by bytes, windows of 257 bytes starting every 256 bytes,
each scored from an empty state, mean -log p over bytes 1..256 of each window.
The slice is the first 32 windows (8,192 predicted bytes) so the test stays
fast; KDA_TRAINER_FULL=1 scores the whole held-out split (about 2-3 minutes)
against the card's full figure. Tolerance 1e-3 nats: the card prints six
decimals, and fp32 engine vs PyTorch differ by ~1e-6 per token."""
import json
import os
import re
import sys

from trainer_common import SRC, cli_score, kda_cli, run_tests, shared_data
from train import heldout_windows, split_text
import torch

DEMO = os.path.join(SRC, "models", "demo")
CLI = kda_cli()
DATA = shared_data("tinyshakespeare.txt")
if CLI is None or DATA is None:
    print("SKIP: %s" % ("kda-cli not built (set KDA_BUILD)" if CLI is None else "tinyshakespeare.txt not found (KDA_SHARED)"))
    sys.exit(77)


def card_figures():
    text = open(os.path.join(DEMO, "MODEL_CARD.md")).read()
    return {k: float(v) for k, v in re.findall(r"^(heldout_\w+) = ([0-9.]+)\s*$", text, re.M)}


def score_windows(n_windows):
    _, val = split_text(DATA, 0.1)
    ids = torch.tensor(list(val.encode("utf-8")))
    wins = heldout_windows(ids, 256, None)
    wins = wins[:n_windows] if n_windows else wins
    nll, n = 0.0, 0
    for w in wins:
        lp = cli_score(CLI, DEMO, w.tolist())
        nll -= sum(lp)
        n += len(lp)
    return nll / n, n, len(wins)


def test_demo_checkpoint_is_small_and_byte_level():
    size = sum(os.path.getsize(os.path.join(DEMO, f)) for f in os.listdir(DEMO))
    assert size <= 16 * 2 ** 20, size
    cfg = json.load(open(os.path.join(DEMO, "config.json")))
    assert cfg["tokenizer"] == "bytes" and cfg["vocab_size"] == 256


def test_kda_cli_heldout_slice_matches_the_card():
    f = card_figures()
    n_win = int(f["heldout_slice_windows"])
    got, n, _ = score_windows(n_win)
    print("    kda-cli: %.6f nats/byte over %d bytes; card: %.6f" % (got, n, f["heldout_slice_nats_per_token"]))
    assert n == 256 * n_win
    assert abs(got - f["heldout_slice_nats_per_token"]) < 1e-3


def test_kda_cli_full_heldout_matches_the_card():
    if os.environ.get("KDA_TRAINER_FULL") != "1":
        print("    (full held-out check skipped; KDA_TRAINER_FULL=1 runs it)")
        return
    got, n, _ = score_windows(0)
    f = card_figures()
    print("    kda-cli: %.6f nats/byte over %d bytes; card: %.6f" % (got, n, f["heldout_full_nats_per_token"]))
    assert abs(got - f["heldout_full_nats_per_token"]) < 1e-3


if __name__ == "__main__":
    run_tests(globals())

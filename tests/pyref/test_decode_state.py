"""The reference's state (conv tails, KDA state, KV cache) continues a
sequence exactly; outputs depend on position and only on the past; the
reference.py CLI reports what its definition says."""
import json
import math
import os

import numpy as np
import torch

from pyref_common import TMP, gen, rel, run_tests, script
from ref_model import RefModel

TOKS = [1] + [(7 * i * i + 3 * i + 40) % 256 for i in range(40)]


def test_prefill_then_decode_equals_one_pass():
    for preset in ("tiny", "llama-tiny"):
        m = RefModel(gen("dec-" + preset, "--preset", preset))
        full, _ = m.forward(TOKS)
        parts, st = [], None
        for a, b in [(0, 13), (13, 14), (14, 30), (30, 31), (31, len(TOKS))]:
            lg, st = m.forward(TOKS[a:b], st)
            parts.append(lg)
        assert rel(torch.cat(parts), full) < 1e-12, preset
        assert st["pos"] == len(TOKS)


def test_outputs_depend_on_position_and_only_on_the_past():
    for preset in ("tiny", "llama-tiny"):
        m = RefModel(gen("pos-" + preset, "--preset", preset))
        same, _ = m.forward([65] * 12)
        for i in range(1, 12):  # identical inputs, different positions
            assert rel(same[i], same[0]) > 1e-3, (preset, i)
        a, _ = m.forward(TOKS)
        b, _ = m.forward(TOKS[:20] + [(t + 1) % 256 for t in TOKS[20:]])
        assert torch.equal(a[:20], b[:20])
        assert rel(b[20:], a[20:]) > 1e-3


def test_cli_json_logprobs_ppl_greedy_and_logits_file():
    d = gen("cli", "--preset", "tiny")
    lf = os.path.join(TMP, "logits.f32")
    out = json.loads(script("reference.py", d, "--tokens", ",".join(map(str, TOKS)), "--greedy", "6",
                            "--json", "--logits-out", lf))
    assert out["tokens"] == TOKS and len(out["token_logprobs"]) == len(TOKS) - 1
    m = RefModel(d)
    lg, _ = m.forward(TOKS)
    lp = torch.log_softmax(lg, -1)
    for i, x in enumerate(out["token_logprobs"]):
        assert abs(x - float(lp[i, TOKS[i + 1]])) < 1e-12
    assert abs(out["nll"] + sum(out["token_logprobs"]) / (len(TOKS) - 1)) < 1e-12
    assert abs(out["ppl"] - math.exp(out["nll"])) < 1e-9 * out["ppl"]
    # greedy recomputed from scratch each step, no state reuse
    seq = list(TOKS)
    for _ in range(6):
        seq.append(int(np.argmax(m.forward(seq)[0][-1].numpy())))
    assert out["greedy"] == seq[len(TOKS):], (out["greedy"], seq[len(TOKS):])
    assert len(set(out["greedy"])) > 1  # the random model does not just repeat one token
    raw = np.fromfile(lf, dtype="<f4")
    assert raw.size == len(TOKS) * 256
    assert np.allclose(raw.reshape(len(TOKS), 256), lg.numpy(), rtol=1e-6, atol=1e-6)


def test_text_input_prepends_bos_and_uses_bytes():
    d = gen("text", "--preset", "tiny")
    out = json.loads(script("reference.py", d, "--text", "Hi!", "--json"))
    assert out["tokens"] == [1, 72, 105, 33]


if __name__ == "__main__":
    run_tests(globals())

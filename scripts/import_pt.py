#!/usr/bin/env python3
"""import_pt.py - a PyTorch state-dict checkpoint -> the canonical checkpoint
directory (MODEL_SPEC 5): model.safetensors with fla-style names + config.json.

    import_pt.py ckpt.pt OUTDIR [--name-map configs/FILE.map] [--config config.json]
                 [--set key=value ...] [--dtype keep|bf16|f32] [--allow-unused]

The .pt is read with torch.load(weights_only=True): tensors, dicts, lists and
numbers only, never pickled code (a checkpoint that needs more is refused).
It may be a state dict itself, or a dict holding one under "model",
"state_dict" or "model_state_dict" and optionally the config under "config"
(e.g. torch.save({'model': model.state_dict(), 'config': {...}}) from a small
trainer). Prefixes that wrappers add ("module.", "_orig_mod.") are stripped.

Names: the name map (the same file kda-cli --name-map takes, rules
"CANONICAL CHECKPOINT") is applied in reverse: a tensor named like a rule's
checkpoint pattern gets that rule's canonical name; without a map the HF
scheme is recognised, other names are kept. The result is checked against
every tensor the config needs (names and shapes, scripts/ref_model.py):
missing tensors, tensors it could not place and shape mismatches are listed,
and any of them makes the import fail (--allow-unused tolerates unplaced
extras, which are then left out).

config.json: --config FILE, else the checkpoint's "config" dict, with --set
overrides (JSON values: --set tie_word_embeddings=true --set 'attn={"layers":[3],"num_heads":4}').
A config in a foreign layout can stay foreign: pass --config-map to the checker
here and to kda-cli / kda-server later.
"""
import argparse
import json
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402
from ref_model import Config, expected_tensors  # noqa: E402

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
HF_RULES = [  # MODEL_SPEC 5, as engine/weights.c applies them
    ("model.embeddings.weight", "model.embed_tokens.weight"),
    ("model.layers.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"),
    ("model.layers.{N}.mlp_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"),
    ("model.layers.{N}.attn.{*}", "model.layers.{N}.self_attn.{*}"),
]


def read_map(path):
    rules = []
    with open(path) as fh:
        for ln, line in enumerate(fh, 1):
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            if len(line) != 2:
                raise SystemExit("%s:%d: expected \"canonical-name checkpoint-name\"" % (path, ln))
            rules.append(tuple(line))
    return rules


def pattern_re(p):
    """A map pattern as a regex: {N} a layer number, {*} (at the end) the rest."""
    out = re.escape(p).replace(re.escape("{N}"), r"(?P<N>\d+)").replace(re.escape("{*}"), r"(?P<rest>.+)")
    return re.compile("^" + out + "$")


def to_canonical(name, rules):
    """The canonical name of checkpoint tensor `name` by the first rule whose checkpoint
    side matches, or None when no rule does."""
    for canon, ckpt in rules:
        m = pattern_re(ckpt).match(name)
        if m:
            g = m.groupdict()
            return canon.replace("{N}", g.get("N") or "").replace("{*}", g.get("rest") or "")
    return None


def load_pt(path):
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickled code, or not a torch file
        hint = ""
        if "Unsupported operand 71" in str(e):  # pickle BINFLOAT
            hint = (" (torch %s's weights-only loader cannot read Python floats, e.g. in the config: "
                    "torch >= 2.0 can; or save the config apart and pass --config)" % torch.__version__)
        raise SystemExit("%s: cannot be read with torch.load(weights_only=True): %s%s" % (path, e, hint))
    config = None
    sd = obj
    if isinstance(obj, dict):
        for k in ("model", "state_dict", "model_state_dict"):
            if isinstance(obj.get(k), dict):
                sd = obj[k]
                break
        if isinstance(obj.get("config"), dict):
            config = obj["config"]
    if not isinstance(sd, dict) or not sd:
        raise SystemExit("%s: no state dict found (a dict of tensors, or one under 'model' / 'state_dict')" % path)
    tensors = {}
    for k, v in sd.items():
        if not torch.is_tensor(v):
            continue
        for p in WRAPPER_PREFIXES:
            while k.startswith(p):
                k = k[len(p):]
        tensors[k] = v
    return tensors, config


def tensor_bytes(t, dtype):
    """(safetensors dtype, contiguous numpy array of its raw bytes)."""
    t = t.detach().contiguous()
    if dtype == "keep":
        dtype = {torch.bfloat16: "BF16", torch.float16: "F16"}.get(t.dtype, "F32")
    if dtype in ("bf16", "BF16"):
        if t.dtype == torch.bfloat16:
            return "BF16", t.view(torch.int16).numpy().view(np.uint16)
        return "BF16", st.f32_to_bf16_bits(t.float().numpy())
    if dtype == "F16":
        return "F16", t.numpy().astype("<f2")
    return "F32", t.float().numpy().astype("<f4")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pt")
    ap.add_argument("outdir")
    ap.add_argument("--name-map", help="name-map file (configs/*.map): CANONICAL CHECKPOINT per line")
    ap.add_argument("--config", help="config.json to use instead of the checkpoint's 'config'")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override a config key")
    ap.add_argument("--dtype", choices=["keep", "bf16", "f32"], default="keep")
    ap.add_argument("--allow-unused", action="store_true", help="leave out tensors no rule places")
    a = ap.parse_args(argv)

    tensors, config = load_pt(a.pt)
    if a.config:
        with open(a.config) as fh:
            config = json.load(fh)
    if config is None:
        raise SystemExit("%s has no 'config' dict: give --config config.json" % a.pt)
    config = dict(config)
    for kv in a.set:
        k, _, v = kv.partition("=")
        try:
            config[k] = json.loads(v)
        except ValueError:
            config[k] = v
    try:
        cfg = Config(config)
    except (KeyError, ValueError, TypeError) as e:
        raise SystemExit("config: %s (a foreign layout: check it with kda-cli inspect --config-map)" % e)

    rules = read_map(a.name_map) if a.name_map else HF_RULES
    placed, unplaced = {}, []
    for name, t in tensors.items():
        canon = to_canonical(name, rules)
        if canon is None:
            canon = name  # already canonical, or unplaced (decided against the config below)
        if canon in placed:
            raise SystemExit("tensors %s and another both map to %s" % (name, canon))
        placed[canon] = (name, t)
    want = expected_tensors(cfg, "fla", lambda n: n in placed)
    missing = [n for n in want if n not in placed]
    bad_shape = ["%s: %s, expected %s" % (n, list(placed[n][1].shape), list(want[n]))
                 for n in want if n in placed and tuple(placed[n][1].shape) != tuple(want[n])]
    unplaced = sorted(placed[n][0] for n in placed if n not in want)
    for title, items in (("missing (the config needs them)", missing), ("wrong shape", bad_shape),
                         ("could not place (no rule maps them to a tensor the config needs)", unplaced)):
        if items:
            print("%s: %d" % (title, len(items)), file=sys.stderr)
            for i in items:
                print("  " + i, file=sys.stderr)
    if missing or bad_shape or (unplaced and not a.allow_unused):
        raise SystemExit("import failed: nothing written")

    os.makedirs(a.outdir, exist_ok=True)
    data = {n: tensor_bytes(placed[n][1], a.dtype) for n in want}
    st.write_file(os.path.join(a.outdir, "model.safetensors"), [(n, dt, tuple(want[n])) for n, (dt, _) in data.items()],
                  lambda n, dt, sh: [data[n][1]], metadata={"source": os.path.basename(a.pt)})
    with open(os.path.join(a.outdir, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    print("wrote %s: %d tensors (%s parameters)%s" % (a.outdir, len(want), "{:,}".format(
        sum(st.numel(s) for s in want.values())), ", left out %d unplaced" % len(unplaced) if unplaced else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

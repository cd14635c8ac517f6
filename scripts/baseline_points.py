#!/usr/bin/env python3
"""baseline_points.py - run ../shared/bench/baseline_torch_fla.py unchanged
except for WHICH points it measures, so the baseline fits one 10-minute GPU call.

    baseline_points.py BASELINE_PY [--decode P:B,...] [--no-prefill]

The script's own code (model, cache, timing, decode_eager / decode_graph loop,
ceilings, JSON output) runs as written; only the literal lists of measured
points in its `--quick` branch are substituted. Every substitution must match
exactly once, or this exits 2 instead of measuring something else.
Default: the four decode points of the issue's target table, no prefill/score.
"""
import os
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    decode = "128:1,128:64,128:256,4096:64"
    prefill = False
    args = sys.argv[2:]
    while args:
        a = args.pop(0)
        if a == "--decode":
            decode = args.pop(0)
        elif a == "--prefill":
            prefill = True
        else:
            sys.exit(f"baseline_points.py: unknown argument {a!r}")
    points = [tuple(int(x) for x in p.split(":")) for p in decode.split(",") if p]
    src = open(path).read()
    subs = [("[(128, 1), (128, 64)] if quick", repr(points) + " if quick")]
    if not prefill:
        subs += [("[(1, 512), (8, 2048)] if quick", "[] if quick"),
                 ("[(1, 8192)] if quick", "[] if quick")]
    for old, new in subs:
        if src.count(old) != 1:
            print(f"baseline_points.py: {path} changed: {old!r} found {src.count(old)} times", file=sys.stderr)
            sys.exit(2)
        src = src.replace(old, new)
    sys.argv = [path, "--quick"]
    code = compile(src, path, "exec")
    g = {"__name__": "__main__", "__file__": path}
    exec(code, g)


if __name__ == "__main__":
    main()

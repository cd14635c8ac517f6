#!/usr/bin/env python3
"""bench_merge.py - combine `kda-cli bench --json` output with the baseline's
baseline.json (same invocation, same GPU) into one results file with ratios.

    bench_merge.py OURS.json BASELINE.json > results.json
    bench_merge.py --table results.json          # print the summary table
"""
import datetime
import json
import os
import subprocess
import sys

TARGETS = {(1, 128): 1.0, (64, 128): 2.0, (256, 128): 4.5, (64, 4096): 2.5}


def commit():
    if os.environ.get("KDA_COMMIT"):
        return os.environ["KDA_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


def merge(ours_path, base_path):
    ours = json.load(open(ours_path))
    base = []
    if os.path.exists(base_path):
        base = json.load(open(base_path))
    else:  # the baseline was cut short: take the JSON lines it printed
        txt = os.path.join(os.path.dirname(base_path), "baseline.txt")
        for line in open(txt) if os.path.exists(txt) else []:
            if line.startswith("{"):
                try:
                    base.append(json.loads(line))
                except ValueError:
                    pass
    env = next((r for r in base if r.get("kind") == "env"), {})
    bdec = {}
    for r in base:
        if r.get("kind") in ("decode_graph", "decode_eager") and "ms_step" in r:
            bdec.setdefault((r["B"], r["T"]), {})[r["kind"]] = r["ms_step"]
    rows = []
    for d in ours.get("decode", []):
        key = (d["B"], d["ctx"])
        b = bdec.get(key, {})
        row = dict(B=d["B"], ctx=d["ctx"], ours_ms=d["ms_step"], ours_tok_s=d["tok_s"],
                   baseline_graph_ms=b.get("decode_graph"), baseline_eager_ms=b.get("decode_eager"))
        if b.get("decode_graph") and d["ms_step"] > 0:
            row["speedup_vs_graph"] = round(b["decode_graph"] / d["ms_step"], 2)
        if key in TARGETS:
            row["target_ms"] = TARGETS[key]
            row["target_met"] = 0 < d["ms_step"] <= TARGETS[key]
        rows.append(row)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": ours.get("device", env.get("gpu")),
        "commit": commit(),
        "model": "DM-KDAGQA-1.7B shape, random bf16 weights",
        "params": ours.get("params"),
        "weight_bytes": ours.get("weight_bytes"),
        "copy_TBps": ours.get("copy_TBps"),
        "decode": rows,
        "kernels": ours.get("kernels", []),
        "baseline": base,
    }


def table(res):
    print(f"{res['gpu']}  commit {res['commit']}  copy {res.get('copy_TBps')} TB/s")
    print(f"{'B':>4} {'ctx':>5} {'ours ms':>9} {'base graph':>10} {'speedup':>8} {'target':>7}")
    for r in res["decode"]:
        print(f"{r['B']:>4} {r['ctx']:>5} {r['ours_ms']:>9.3f} {str(r.get('baseline_graph_ms')):>10} "
              f"{str(r.get('speedup_vs_graph')):>8} {str(r.get('target_ms', '')):>7}"
              f"{'' if 'target_met' not in r else (' met' if r['target_met'] else ' MISSED')}")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(json.load(open(sys.argv[2])))
    else:
        json.dump(merge(sys.argv[1], sys.argv[2]), sys.stdout, indent=1)
        print()

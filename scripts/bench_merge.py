#!/usr/bin/env python3
"""bench_merge.py - combine `kda-cli bench --json` output with the baseline's
baseline.json (same invocation, same GPU) into one results file with ratios,
the issues' targets and each prefill/score point's fraction of the compute
floor (its counted matrix FLOPs at the bf16 GEMM rate the baseline measured on
the same card).

    bench_merge.py OURS.json BASELINE.json [PROF.json] > results.json
    bench_merge.py --table results.json          # print the summary tables
"""
import datetime
import json
import os
import subprocess
import sys

# decode ms/step (issue #14), prefill/score ms (issue #12)
DECODE_TARGETS = {(1, 128): 1.0, (16, 128): 1.3, (64, 128): 2.0, (256, 128): 4.5, (64, 4096): 2.5}
PREFILL_TARGETS = {("prefill", 1, 2048): 20.0, ("prefill", 8, 2048): 100.0,
                   ("score", 1, 8192): 60.0, ("score", 4, 8192): 200.0}


def commit():
    if os.environ.get("KDA_COMMIT"):
        return os.environ["KDA_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


def load_baseline(base_path):
    if os.path.exists(base_path):
        return json.load(open(base_path))
    base = []  # the baseline was cut short: take the JSON lines it printed
    txt = os.path.join(os.path.dirname(base_path), "baseline.txt")
    for line in open(txt) if os.path.exists(txt) else []:
        if line.startswith("{"):
            try:
                base.append(json.loads(line))
            except ValueError:
                pass
    return base


def merge(ours_path, base_path, prof_path=None):
    ours = json.load(open(ours_path))
    prof = json.load(open(prof_path)) if prof_path and os.path.exists(prof_path) else {}
    base = load_baseline(base_path)
    env = next((r for r in base if r.get("kind") == "env"), {})
    gemm = next((r["TFLOPs"] for r in base if r.get("kind") == "ceiling" and "TFLOPs" in r), None)
    bdec, bpre = {}, {}
    for r in base:
        if r.get("kind") in ("decode_graph", "decode_eager") and "ms_step" in r:
            bdec.setdefault((r["B"], r["T"]), {})[r["kind"]] = r["ms_step"]
        if r.get("kind") in ("prefill", "score") and "ms" in r:
            bpre[(r["kind"], r["B"], r["T"])] = r["ms"]
    rows = []
    for d in ours.get("decode", []):
        key = (d["B"], d["ctx"])
        b = bdec.get(key, {})
        row = dict(B=d["B"], ctx=d["ctx"], ours_ms=d["ms_step"], ours_tok_s=d["tok_s"],
                   baseline_graph_ms=b.get("decode_graph"), baseline_eager_ms=b.get("decode_eager"))
        if b.get("decode_graph") and d["ms_step"] > 0:
            row["speedup_vs_graph"] = round(b["decode_graph"] / d["ms_step"], 2)
        if key in DECODE_TARGETS:
            row["target_ms"] = DECODE_TARGETS[key]
            row["target_met"] = 0 < d["ms_step"] <= DECODE_TARGETS[key]
        rows.append(row)
    shares = {(p["kind"], p["B"], p["T"]): p.get("device_ms_per_step") for p in prof.get("prefill", [])}
    pre = []
    for p in ours.get("prefill", []):
        key = (p["kind"], p["B"], p["T"])
        row = dict(kind=p["kind"], B=p["B"], T=p["T"], ours_ms=p["ms"], ours_tok_s=p["tok_s"],
                   TFLOPs=p["TFLOPs"], baseline_ms=bpre.get(key))
        if gemm and p["ms"] > 0:
            floor_ms = p["flops"] / (gemm * 1e12) * 1e3
            row["floor_ms"] = round(floor_ms, 2)
            row["of_floor"] = round(floor_ms / p["ms"], 3)
        if bpre.get(key) and p["ms"] > 0:
            row["speedup"] = round(bpre[key] / p["ms"], 2)
        if key in PREFILL_TARGETS:
            row["target_ms"] = PREFILL_TARGETS[key]
            row["target_met"] = 0 < p["ms"] <= PREFILL_TARGETS[key]
        if shares.get(key):
            tot = sum(shares[key].values()) or 1
            row["device_ms"] = shares[key]
            row["device_share"] = {k: round(v / tot, 3) for k, v in shares[key].items()}
        pre.append(row)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": ours.get("device", env.get("gpu")),
        "commit": commit(),
        "model": "DM-KDAGQA-1.7B shape, random bf16 weights",
        "params": ours.get("params"),
        "weight_bytes": ours.get("weight_bytes"),
        "tuning": ours.get("tuning"),
        "copy_TBps": ours.get("copy_TBps"),
        "gemm_TFLOPs_baseline_measured": gemm,
        "decode": rows,
        "prefill": pre,
        "kernels": ours.get("kernels", []),
        "baseline": base,
    }


def table(res):
    print(f"{res['gpu']}  commit {res['commit']}  copy {res.get('copy_TBps')} TB/s  "
          f"bf16 GEMM {res.get('gemm_TFLOPs_baseline_measured')} TFLOP/s")
    print(f"{'B':>4} {'ctx':>5} {'ours ms':>9} {'base graph':>10} {'speedup':>8} {'target':>7}")
    for r in res["decode"]:
        print(f"{r['B']:>4} {r['ctx']:>5} {r['ours_ms']:>9.3f} {str(r.get('baseline_graph_ms')):>10} "
              f"{str(r.get('speedup_vs_graph')):>8} {str(r.get('target_ms', '')):>7}"
              f"{'' if 'target_met' not in r else (' met' if r['target_met'] else ' MISSED')}")
    if res.get("prefill"):
        print(f"{'kind':>7} {'B':>3} {'T':>5} {'ours ms':>9} {'base ms':>8} {'speedup':>7} {'floor':>6} "
              f"{'of floor':>8} {'target':>7}  device time")
        for r in res["prefill"]:
            sh = " ".join(f"{k} {100 * v:.0f}%" for k, v in r.get("device_share", {}).items())
            print(f"{r['kind']:>7} {r['B']:>3} {r['T']:>5} {r['ours_ms']:>9.2f} {str(r.get('baseline_ms')):>8} "
                  f"{str(r.get('speedup')):>7} {str(r.get('floor_ms')):>6} {str(r.get('of_floor')):>8} "
                  f"{str(r.get('target_ms', '')):>7}"
                  f"{'' if 'target_met' not in r else (' met' if r['target_met'] else ' MISSED')}  {sh}")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(json.load(open(sys.argv[2])))
    else:
        json.dump(merge(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None), sys.stdout, indent=1)
        print()

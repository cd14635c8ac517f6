#!/usr/bin/env bash
# CPU decode benchmark on the 1.7B shape (random bf16 weights) with the
# machine's memory ceilings measured in the same run; writes
# bench/results/cpu-<host>-<date>.json (date, machine, commit, figures).
#   scripts/bench-cpu.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
MODEL=${2:-/tmp/kda-1.7b}
[ -f "$MODEL/config.json" ] || /usr/bin/python3 scripts/gen_checkpoint.py "$MODEL" --preset 1.7b >/dev/null
tmp=$(mktemp)
"$BUILD/cli/kda-cli" bench "$MODEL" --device cpu --pairs "${KDA_BENCH_PAIRS:-128:1}" --steps "${KDA_BENCH_STEPS:-8}" \
  --json "$tmp"
out=bench/results/cpu-$(hostname -s)-$(date -u +%F).json
python3 - "$tmp" "$out" <<'PY'
import json, os, subprocess, sys, datetime
r = json.load(open(sys.argv[1]))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
r = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
     "machine": {"cpu": cpu, "cores": os.cpu_count(),
                 "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
     "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
     "model": "DM-KDAGQA-1.7B shape, random bf16 (scripts/gen_checkpoint.py --preset 1.7b)",
     **r}
for d in r["decode"]:
    if "cpu_ceiling" in r and d["B"] == 1:
        d["fraction_of_read_ceiling"] = round(d["weight_GBps"] / r["cpu_ceiling"]["read_GBps"], 3)
json.dump(r, open(sys.argv[2], "w"), indent=1)
print("wrote", sys.argv[2])
PY
rm -f "$tmp"

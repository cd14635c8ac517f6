#!/usr/bin/env python3
"""The cost of a prompt length a fresh kda-server has not met before.

Starts kda-server (prefix cache off), then sends /score requests of a series of
lengths, each twice in a row, and records both client times: the first call of
a new length minus the second is what meeting that shape costs (on CUDA, one
cuBLAS kernel choice per new GEMM shape unless tuning gemm_pad prepared them at
load). Repeated with each --variant (extra server flags) on its own fresh
server, so an A/B runs in one invocation.

  bench_first_shape.py --server build/server/kda-server --model DIR --device cuda \
      --variant "pad=" --variant "nopad=--tuning gemm_pad=0" --out first-shape.json
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import time
import urllib.request

LENGTHS = [1032, 1037, 1045, 1056, 1100, 1117, 2000, 2017, 70, 80, 96, 97, 333, 517, 3001, 5003]


def run(a, name, flags):
    port = a.port
    cmd = [a.server, "--model", a.model, "--device", a.device, "--port", str(port), "--prefix-cache", "off",
           "--log-level", "warn"] + [f for f in flags.split() if f]
    log = open(f"{a.log_prefix}-{name}.log", "w")
    t_start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except Exception:
                if p.poll() is not None:
                    raise SystemExit(f"kda-server exited ({p.returncode}): see {log.name}")
                time.sleep(0.25)
        ready_s = time.perf_counter() - t_start
        rng = random.Random(11)

        def score(n):
            toks = [rng.randrange(3, a.vocab) for _ in range(n)]
            req = urllib.request.Request(url + "/score", data=json.dumps({"tokens": toks}).encode(),
                                         headers={"Content-Type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
            return (time.perf_counter() - t) * 1e3

        score(64), score(64)
        rows = []
        for n in a.lengths:
            first, second = score(n), score(n)
            rows.append({"tokens": n, "first_ms": round(first, 2), "second_ms": round(second, 2),
                         "extra_ms": round(first - second, 2)})
            print(f"{name:>8} {n:6d} tokens: first {first:8.2f} ms, again {second:8.2f} ms", flush=True)
        extra = [r["extra_ms"] for r in rows]
        return {"flags": flags, "ready_s": round(ready_s, 2), "lengths": rows,
                "extra_ms_median": round(statistics.median(extra), 2), "extra_ms_max": round(max(extra), 2)}
    finally:
        p.terminate()
        p.wait(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--port", type=int, default=18777)
    ap.add_argument("--variant", action="append", default=[], help="NAME=extra server flags (repeatable)")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths, each new to the server")
    ap.add_argument("--log-prefix", default="/tmp/first-shape")
    ap.add_argument("--out")
    a = ap.parse_args()
    a.lengths = [int(x) for x in a.lengths.split(",")]
    a.vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": os.environ.get("KDA_COMMIT"),
           "model": a.model, "device": a.device, "variants": {}}
    for v in a.variant or ["default="]:
        name, _, flags = v.partition("=")
        res["variants"][name] = r = run(a, name, flags)
        print(f"{name}: server ready in {r['ready_s']} s; a new length costs {r['extra_ms_median']} ms more "
              f"(median, max {r['extra_ms_max']})", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

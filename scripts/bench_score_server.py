#!/usr/bin/env python3
"""/score through kda-server against the engine's own figure (issue 12: "/score 1 x 8192 through
kda-server within 10% of the engine figure").

Starts kda-server (prefix cache off, so no request reuses another's work), sends B concurrent
/score requests of T random token ids, REPS times after one warm-up round, each client thread
on its own keep-alive connection (as the openai and requests clients pool them). The ids are
drawn before the clock starts (drawing 8192 ids with random.randrange costs the client ~1.5-2 ms
that no real client spends). Per round it reports
  client_ms   the round's wall time as the client sees it: json.dumps of the bodies, the
              exchange, json.loads of the answers
  exchange_ms first request sent to last response byte read: the server's HTTP side, api_parse,
              the engine, api_render and the transfer, without the client's own JSON work
and per request the client's json.dumps / json.loads times and the server's own view from its
metrics (arrival after api_parse to finish before api_render). With --engine-json (bench-gpu.sh's
results.json or kda-cli bench --json) it puts the engine's figure for the same B x T beside
both: server_over_engine (client_ms) and exchange_over_engine.

  bench_score_server.py --server build/server/kda-server --model DIR --device cuda \
      --points 1:8192,4:8192 --engine-json results.json --out score-server.json
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefix import Server  # noqa: E402


def engine_ms(path, B, T):
    if not path or not os.path.exists(path):
        return None
    d = json.load(open(path))
    for p in d.get("prefill", []):
        if p.get("kind") == "score" and p.get("B") == B and p.get("T") == T:
            return p.get("ours_ms", p.get("ms"))
    return None


def timed_post(conn, path, body):
    """POST body as JSON over the http.client connection conn: (response, raw bytes, parsed JSON,
    (t0, t1, t2, t3)) with perf_counter seconds: json.dumps from t0 to t1, the exchange (request
    sent to last byte read) to t2, json.loads to t3"""
    t0 = time.perf_counter()
    data = json.dumps(body).encode()
    t1 = time.perf_counter()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    t2 = time.perf_counter()
    r = json.loads(raw)
    t3 = time.perf_counter()
    assert resp.status == 200, raw[:300]
    return resp, raw, r, (t0, t1, t2, t3)


def metric_sum(srv, name):
    """name's value summed over its label sets (0 if absent)"""
    with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
        tot = 0.0
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                tot += float(line.rsplit(None, 1)[1])
        return tot


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--points", default="1:8192,4:8192", help="B:T,...")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--engine-json")
    ap.add_argument("--log", default="/tmp/score-server.log")
    ap.add_argument("--out")
    a = ap.parse_args()
    vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
    points = [tuple(int(x) for x in p.split(":")) for p in a.points.split(",")]
    maxb = max(b for b, _ in points)
    maxt = max(t for _, t in points)
    flags = ["--device", a.device, "--prefix-cache", "off", "--max-batch", str(max(maxb, 8)), "--log-level", "warn"]
    if json.load(open(os.path.join(a.model, "config.json"))).get("max_position_embeddings", 0) < maxt:
        flags += ["--max-seq-len", str(maxt)]
    srv = Server(a.server, a.model, flags, a.log, dict(os.environ))
    rng = random.Random(7)
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": os.environ.get("KDA_COMMIT"),
           "model": a.model, "device": a.device, "reps": a.reps, "points": []}
    host, port = srv.url.split("//")[1].split(":")
    local = threading.local()

    def conn():
        if not hasattr(local, "c"):
            local.c = http.client.HTTPConnection(host, int(port), timeout=3600)
        return local.c

    def one(toks):
        """one /score request: (dumps start, exchange start, exchange end, loads end), perf_counter seconds"""
        _, _, r, ts = timed_post(conn(), "/score", {"tokens": toks})
        assert len(r["token_logprobs"]) in (len(toks), len(toks) - 1), len(r["token_logprobs"])
        return ts

    try:
        with concurrent.futures.ThreadPoolExecutor(maxb) as pool:
            for B, T in points:
                rounds = [[[rng.randrange(3, vocab) for _ in range(T)] for _ in range(B)] for _ in range(a.reps + 1)]
                list(pool.map(one, rounds[0]))  # warm-up round
                walls, exch, dumps, loads = [], [], [], []
                keys = ("vllm:e2e_request_latency_seconds_sum", "vllm:request_queue_time_seconds_sum",
                        "vllm:request_prefill_time_seconds_sum")
                m0 = {k: metric_sum(srv, k) for k in keys}
                for rep in range(a.reps):
                    t0 = time.perf_counter()
                    ts = list(pool.map(one, rounds[rep + 1]))
                    walls.append((time.perf_counter() - t0) * 1e3)
                    exch.append((max(t[2] for t in ts) - min(t[1] for t in ts)) * 1e3)
                    dumps += [(t[1] - t[0]) * 1e3 for t in ts]
                    loads += [(t[3] - t[2]) * 1e3 for t in ts]
                e = engine_ms(a.engine_json, B, T)
                # the server's own view per request (its vLLM-style metrics): arrival to end,
                # queueing, admission to first output; the rest of the exchange is HTTP + parse + render
                n_req = a.reps * B
                inside = {k.split(":")[1].replace("_seconds_sum", "_ms"): round((metric_sum(srv, k) - m0[k]) / n_req * 1e3, 2)
                          for k in keys}
                med = statistics.median
                p = {"B": B, "T": T, "server_ms_median": round(med(walls), 2), "server_ms_min": round(min(walls), 2),
                     "exchange_ms_median": round(med(exch), 2), "exchange_ms_min": round(min(exch), 2),
                     "client_dumps_ms_median": round(med(dumps), 2), "client_loads_ms_median": round(med(loads), 2),
                     "per_request_inside": inside, "engine_ms": e,
                     "server_over_engine": round(med(walls) / e, 3) if e else None,
                     "exchange_over_engine": round(med(exch) / e, 3) if e else None}
                res["points"].append(p)
                print(f"/score {B} x {T}: client {p['server_ms_median']:.1f} ms (min {p['server_ms_min']:.1f}), "
                      f"exchange {p['exchange_ms_median']:.1f} (client dumps {p['client_dumps_ms_median']:.2f}, "
                      f"loads {p['client_loads_ms_median']:.2f} per request)"
                      + (f", engine {e:.1f} ms, ratio client {p['server_over_engine']:.3f} / exchange "
                         f"{p['exchange_over_engine']:.3f}" if e else "")
                      + f"; per request inside the server {inside}", flush=True)
    finally:
        srv.stop()
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()

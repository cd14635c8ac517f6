#!/usr/bin/env python3
"""Where a large /score or echo+logprobs /v1/completions request spends its time outside the
engine (issues #12, #17): kda-server (prefix cache off) gets each request one at a time over
one keep-alive connection; per request the client times building the body (json.dumps), the
exchange (request sent to last response byte read) and json.loads, and the server's metrics
give its arrival-to-finish time (vllm:e2e_request_latency_seconds: the engine's part, from
the task's arrival after api_parse to its finish, before api_render). exchange - e2e is what
the server's HTTP side, api_parse, api_render and the transfer cost together;
tests/server/bench_render.c times api_parse and api_render alone.

  bench_render_server.py --server build/server/kda-server --model DIR [--device cpu]
      [--points score:1044:0,completions:1044:5,...] [--reps N] [--text FILE] [--out F.json]

Prompts are windows of FILE's tokens (the server's /tokenize) when given, else random ids.
completions points send echo, logprobs K, max_tokens 1 (lm-eval's loglikelihood request).
exchange - e2e is taken per request (the metrics are read between requests) and its median reported.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefix import Server  # noqa: E402
from bench_score_server import metric_sum, timed_post  # noqa: E402

KEYS = ("vllm:e2e_request_latency_seconds_sum", "vllm:request_prefill_time_seconds_sum",
        "vllm:request_queue_time_seconds_sum")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--points", default="score:1044:0,score:8192:0,completions:1044:1,completions:1044:5,"
                                        "completions:8192:1,completions:8192:5")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--text")
    ap.add_argument("--log", default="/tmp/bench-render-server.log")
    ap.add_argument("--out")
    a = ap.parse_args()
    points = [(r, int(t), int(k)) for r, t, k in (p.split(":") for p in a.points.split(","))]
    maxt = max(t for _, t, _ in points) + 2
    flags = ["--device", a.device, "--prefix-cache", "off", "--log-level", "warn"]
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    if cfg.get("max_position_embeddings", 0) < maxt:
        flags += ["--max-seq-len", str(maxt)]
    srv = Server(a.server, a.model, flags, a.log, dict(os.environ))
    rng = random.Random(7)
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": os.environ.get("KDA_COMMIT"),
           "model": a.model, "device": a.device, "reps": a.reps, "ids": "text" if a.text else "uniform", "points": []}
    try:
        if a.text:
            text = open(a.text, encoding="utf-8").read()[:120000]
            ids = srv.post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
        else:
            ids = [rng.randrange(3, cfg["vocab_size"]) for _ in range(maxt * 4)]
        host, port = srv.url.split("//")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=3600)
        for route, T, k in points:
            def body_of(rep):
                start = (rep * 7919 + T) % (len(ids) - T)
                toks = ids[start:start + T]
                if route == "score":
                    return "/score", {"tokens": toks}
                return "/v1/completions", {"prompt": toks, "echo": True, "logprobs": k, "max_tokens": 1}

            def one(rep):
                path, body = body_of(rep)
                _, raw, r, (t0, t1, t2, t3) = timed_post(conn, path, body)
                n = len(r["token_logprobs"]) if route == "score" else len(r["choices"][0]["logprobs"]["tokens"])
                assert n in (T - 1, T + 1), n
                return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, len(raw)

            one(0)  # warm-up
            runs, inside_runs = [], []
            for rep in range(a.reps):   # the metrics per request, read between requests
                m0 = {key: metric_sum(srv, key) for key in KEYS}
                runs.append(one(rep + 1))
                inside_runs.append({key: (metric_sum(srv, key) - m0[key]) * 1e3 for key in KEYS})
            inside = {key.split(":")[1].replace("_seconds_sum", "_ms"): round(statistics.median(r[key] for r in inside_runs), 2)
                      for key in KEYS}
            outside = [x[1] - r[KEYS[0]] for x, r in zip(runs, inside_runs)]
            med = [statistics.median(x[i] for x in runs) for i in range(3)]
            p = {"route": route, "T": T, "logprobs": k, "response_bytes": runs[-1][3],
                 "client_dumps_ms": round(med[0], 2), "exchange_ms": round(med[1], 2), "client_loads_ms": round(med[2], 2),
                 "server_inside": inside,
                 "exchange_minus_e2e_ms": round(statistics.median(outside), 2),
                 "exchange_minus_e2e_ms_each": [round(x, 2) for x in outside]}
            res["points"].append(p)
            print(f"{route:12s} T={T:5d} top={k}: exchange {p['exchange_ms']:8.2f} ms, server e2e "
                  f"{inside['e2e_request_latency_ms']:8.2f}, outside the engine {p['exchange_minus_e2e_ms']:7.2f}; "
                  f"client dumps {p['client_dumps_ms']:.2f}, loads {p['client_loads_ms']:.2f}; "
                  f"{p['response_bytes']} bytes", flush=True)
        conn.close()
    finally:
        srv.stop()
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()

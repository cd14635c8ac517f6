"""A bounded loopback load run against kda-server (fixed request counts) that
must finish with zero errors, and the figures the issue asks for:
  - /generate throughput (requests/s, generated tokens/s) under concurrency;
  - requests/s on /health (keep-alive raw-socket clients);
  - server overhead per streamed token: the wall time per token one
    streaming client sees, minus the engine's own step time (from the
    kda_engine_step_seconds histogram over the same run).
Counts can be raised with KDA_LOAD_REQUESTS / KDA_LOAD_HEALTH."""
import json
import os
import socket
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import Server, check, finish, make_checkpoint, metric  # noqa: E402

N_GEN = int(os.environ.get("KDA_LOAD_REQUESTS", "400"))
N_HEALTH = int(os.environ.get("KDA_LOAD_HEALTH", "20000"))
CONC = 16
model = make_checkpoint("tiny-long", "--preset", "tiny", "--tokenizer", "bytes", "--max-pos", "65536")
figures = {}

with Server(model, "--max-batch", "32", "--log-level", "warn") as s:
    u = s.url
    # ---- /generate load: fixed request count, CONC concurrent clients ----
    body = {"tokens": list(b"load test prompt"), "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    want = requests.post(u + "/generate", json=body).json()["tokens"]
    errors, wrong, done = [], [0], [0]
    lock = threading.Lock()
    next_i = [0]

    def worker():
        sess = requests.Session()
        while True:
            with lock:
                if next_i[0] >= N_GEN:
                    return
                next_i[0] += 1
            try:
                r = sess.post(u + "/generate", json=body, timeout=120)
                ok = r.status_code == 200 and r.json()["tokens"] == want
                with lock:
                    done[0] += 1
                    wrong[0] += not ok
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))

    t0 = time.time()
    ths = [threading.Thread(target=worker) for _ in range(CONC)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    dt = time.time() - t0
    check(not errors and wrong[0] == 0 and done[0] == N_GEN,
          f"load: {N_GEN} /generate requests, {CONC} clients, zero errors",
          f"errors={errors[:3]} wrong={wrong[0]}")
    figures["generate_requests"] = N_GEN
    figures["generate_req_per_s"] = N_GEN / dt
    figures["generate_tok_per_s"] = N_GEN * 16 / dt

    # ---- /health requests/s: raw keep-alive sockets, no client library overhead ----
    req = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\n\r\n".encode()
    bad = [0]

    def health_worker(n):
        sk = socket.create_connection(("127.0.0.1", s.port))
        sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        for _ in range(n):
            sk.sendall(req)
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    head = buf[:end].decode()
                    length = int([l.split(":")[1] for l in head.split("\r\n") if l.lower().startswith("content-length")][0])
                    if len(buf) >= end + 4 + length:
                        if not head.startswith("HTTP/1.1 200"):
                            bad[0] += 1
                        buf = buf[end + 4 + length:]
                        break
                buf += sk.recv(65536)
        sk.close()

    n_thr = 4
    t0 = time.time()
    ths = [threading.Thread(target=health_worker, args=(N_HEALTH // n_thr,)) for _ in range(n_thr)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    dt = time.time() - t0
    check(bad[0] == 0, f"load: {N_HEALTH} /health requests, all 200")
    figures["health_req_per_s"] = N_HEALTH / dt

    # ---- per-token overhead of one stream versus the engine step ----
    n_tok = 2000
    m0 = requests.get(u + "/metrics").text
    r = requests.post(u + "/generate", json={"tokens": list(b"overhead"), "max_tokens": n_tok, "temperature": 0,
                                             "ignore_eos": True, "stream": True}, stream=True)
    stamps, count = [], 0
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            count += len(json.loads(line[6:])["tokens"])
            stamps.append((time.perf_counter(), count))
    m1 = requests.get(u + "/metrics").text
    steps = metric(m1, "kda_engine_step_seconds_count") - metric(m0, "kda_engine_step_seconds_count")
    step_s = (metric(m1, "kda_engine_step_seconds_sum") - metric(m0, "kda_engine_step_seconds_sum")) / steps
    itl = ((metric(m1, "kda_inter_token_latency_seconds_sum") - metric(m0, "kda_inter_token_latency_seconds_sum")) /
           (metric(m1, "kda_inter_token_latency_seconds_count") - metric(m0, "kda_inter_token_latency_seconds_count")))
    per_tok = (stamps[-1][0] - stamps[0][0]) / (stamps[-1][1] - stamps[0][1])
    check(count == n_tok, f"overhead run: streamed {n_tok} tokens")
    figures["stream_tokens"] = n_tok
    figures["stream_s_per_token"] = per_tok
    figures["engine_step_s"] = step_s
    figures["server_overhead_s_per_token"] = per_tok - step_s
    figures["stream_events"] = len(stamps)
    figures["scheduler_overhead_s_per_token"] = itl - step_s   # server-side only: no HTTP, no client
    s.check_clean_exit()

print("figures: " + json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in figures.items()}))
print(f"  /generate: {figures['generate_req_per_s']:.1f} req/s, {figures['generate_tok_per_s']:.0f} generated tok/s "
      f"({N_GEN} requests x 16 tokens, {CONC} clients)")
print(f"  /health: {figures['health_req_per_s']:.0f} req/s (4 keep-alive connections)")
print(f"  stream: {figures['stream_s_per_token'] * 1e6:.1f} us/token seen by the client vs "
      f"{figures['engine_step_s'] * 1e6:.1f} us engine step -> overhead "
      f"{figures['server_overhead_s_per_token'] * 1e6:.1f} us/token\n"
      f"  scheduler alone (inter-token latency - step): {figures['scheduler_overhead_s_per_token'] * 1e6:.1f} us/token; "
      f"{figures['stream_events']} SSE events for {n_tok} tokens (a slower reader gets tokens coalesced)")
finish()

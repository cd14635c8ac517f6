"""kda-server under stress: 32 concurrent streams, disconnects, a full queue,
heartbeats while queued, and graceful shutdown (drain and grace expiry)."""
import json
import os
import socket
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import Server, check, cli_generate, finish, make_checkpoint, metric, sse_events  # noqa: E402

model = make_checkpoint("tiny-long", "--preset", "tiny", "--tokenizer", "bytes", "--max-pos", "65536")
LONG = 60000   # tokens: many seconds of decoding for the tiny model


def metrics(u):
    return requests.get(u + "/metrics").text


def raw_post(u, path, obj):
    """Sends a POST on a raw socket and returns the socket (for hanging up)."""
    import socket
    body = json.dumps(obj).encode()
    host, port = u.split("//")[1].split(":")
    sk = socket.create_connection((host, int(port)))
    sk.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
               % (path.encode(), len(body)) + body)
    return sk


def wait_metrics(u, cond, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = metrics(u)
        if cond(m):
            return m
        time.sleep(0.05)
    return None


def open_stream(u, body):
    r = requests.post(u + "/generate", json=dict(body, stream=True), stream=True, timeout=60)
    return r, r.iter_lines()


def read_events(lines, n):
    """Reads until n data events (heartbeat comments counted separately)."""
    got, comments = [], 0
    for line in lines:
        if line.startswith(b":"):
            comments += 1
        elif line.startswith(b"data: "):
            got.append(line[6:].decode())
            if len(got) == n:
                break
    return got, comments


# ---- 32 concurrent streaming clients ----
with Server(model, "--max-batch", "32") as s:
    prompts = [list(f"client {i}: the quick brown fox".encode()) for i in range(32)]
    want = [cli_generate(model, p, 48, ["--ignore-eos"]) for p in prompts]
    if want[0] is None:   # no kda-cli: each client's output must equal its own non-streamed request
        want = [requests.post(s.url + "/generate", json={"tokens": p, "max_tokens": 48, "temperature": 0,
                                                         "ignore_eos": True}).json()["tokens"] for p in prompts]
    got = [None] * 32
    errors = []
    m0 = metrics(s.url)

    def client(i):
        try:
            r = requests.post(s.url + "/generate", json={"tokens": prompts[i], "max_tokens": 48, "temperature": 0,
                                                         "ignore_eos": True, "stream": True}, stream=True, timeout=120)
            data, _ = sse_events(r.iter_lines())
            assert data[-1] == "[DONE]", data[-1]
            got[i] = sum((json.loads(d)["tokens"] for d in data[:-1]), [])
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m1 = metrics(s.url)
    check(not errors, "32 concurrent streams: no client errors", str(errors[:3]))
    check(all(got[i] == want[i] for i in range(32)), "32 concurrent streams: every client gets its own greedy output",
          str([i for i in range(32) if got[i] != want[i]]))
    steps = metric(m1, "kda_engine_steps_total") - metric(m0, "kda_engine_steps_total")
    check(0 < steps < 32 * 48 / 4, "32 concurrent streams share engine steps (continuous batching)", f"steps={steps}")
    s.check_clean_exit()

# ---- disconnects, a full queue, heartbeats ----
with Server(model, "--max-batch", "1", "--max-queue", "1", "--heartbeat-seconds", "0.2") as s:
    u = s.url
    ra, la = open_stream(u, {"tokens": list(b"long one"), "max_tokens": LONG, "temperature": 0, "ignore_eos": True})
    read_events(la, 3)
    m = metrics(u)
    check(metric(m, "kda_running_sequences") == 1 and metric(m, "kda_state_pool_used_sequences") == 1,
          "metrics show the running stream and its state slot")
    # B waits in the queue; it hears heartbeats while it waits
    rb, lb = open_stream(u, {"tokens": list(b"queued"), "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    t0 = time.time()
    nb, comments = [], 0
    for line in lb:
        if line.startswith(b":"):
            comments += 1
            if comments == 2:
                break
    check(comments == 2 and time.time() - t0 < 5, "a queued stream receives keep-alive comments")
    check(metric(metrics(u), "kda_queue_depth") == 1, "metrics: queue depth 1")
    # C finds the queue full
    rc = requests.post(u + "/generate", json={"prompt": "no room", "max_tokens": 4})
    check(rc.status_code == 503 and rc.headers.get("Retry-After") and rc.json()["error"]["code"] == 503,
          "full queue -> 503 with Retry-After", f"{rc.status_code} {rc.headers}")
    # B disconnects while queued: its place is given back
    c0 = metric(metrics(u), "kda_requests_cancelled_total")
    rb.close()
    m = wait_metrics(u, lambda m: metric(m, "kda_queue_depth") == 0 and metric(m, "kda_requests_cancelled_total") > c0)
    check(m is not None, "a queued client that disconnects leaves the queue (noticed at its heartbeat)")
    # D: a non-streaming request queued behind A hangs up: found by the scheduler's socket probe
    c0 = metric(metrics(u), "kda_requests_cancelled_total")
    sd = raw_post(u, "/generate", {"tokens": list(b"queued too"), "max_tokens": 8})
    check(wait_metrics(u, lambda m: metric(m, "kda_queue_depth") == 1) is not None, "D waits in the queue")
    sd.close()
    m = wait_metrics(u, lambda m: metric(m, "kda_queue_depth") == 0 and metric(m, "kda_requests_cancelled_total") > c0)
    check(m is not None, "a queued non-streaming client that hangs up leaves the queue (socket probe)")
    check(requests.post(u + "/generate", json={"prompt": "x", "max_tokens": 1, "stream": True}, stream=True,
                        timeout=5).status_code == 200, "its queue slot is free again")
    # A disconnects mid-stream: its sequence and state are freed at the next step
    c0 = metric(metrics(u), "kda_requests_cancelled_total")
    ra.close()
    m = wait_metrics(u, lambda m: metric(m, "kda_running_sequences") == 0 and
                     metric(m, "kda_state_pool_used_sequences") == 0 and metric(m, "kda_queue_depth") == 0)
    check(m is not None and metric(m, "kda_requests_cancelled_total") >= c0 + 1,
          "mid-stream disconnect cancels the sequence and frees its state (metrics)")
    check(metric(m or "", "kda_generated_tokens_total") < LONG, "the cancelled stream did not run to the end")
    # C sends a non-streaming request and hangs up while it decodes
    c0 = metric(metrics(u), "kda_requests_cancelled_total")
    g0 = metric(metrics(u), "kda_generated_tokens_total")
    sk = raw_post(u, "/generate", {"tokens": list(b"hang up"), "max_tokens": LONG, "temperature": 0, "ignore_eos": True})
    check(wait_metrics(u, lambda m: metric(m, "kda_running_sequences") == 1) is not None,
          "a non-streaming request is running")
    sk.close()
    m = wait_metrics(u, lambda m: metric(m, "kda_running_sequences") == 0 and
                     metric(m, "kda_requests_cancelled_total") >= c0 + 1)
    check(m is not None, "a non-streaming client that hangs up is cancelled and its state freed")
    check(metric(m or "", "kda_generated_tokens_total") - g0 < LONG, "the abandoned request did not run to the end")
    r = requests.post(u + "/generate", json={"tokens": list(b"after"), "max_tokens": 8, "temperature": 0,
                                             "ignore_eos": True})
    want = cli_generate(model, list(b"after"), 8, ["--ignore-eos"])
    check(r.status_code == 200 and (want is None or r.json()["tokens"] == want),
          "the server serves correctly after the disconnects")
    s.check_clean_exit()

# ---- graceful shutdown: running requests finish ----
with Server(model, "--grace-seconds", "60") as s:
    n = 3000
    r, lines = open_stream(s.url, {"tokens": list(b"drain me"), "max_tokens": n, "temperature": 0, "ignore_eos": True})
    first, _ = read_events(lines, 1)
    s.proc.send_signal(15)
    time.sleep(0.3)
    refused = False
    try:
        socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
        h = requests.get(s.url + "/health", timeout=2)
        refused = h.status_code == 503
    except (OSError, requests.ConnectionError):
        refused = True
    check(refused, "after SIGTERM new connections are refused (or told 503)")
    rest, _ = sse_events(lines)
    events = [json.loads(d) for d in first + rest[:-1]]
    check(rest and rest[-1] == "[DONE]" and sum(len(e["tokens"]) for e in events) == n and
          events[-1].get("finish_reason") == "length", "a running stream completes during the drain")
    rc = s.proc.wait(60)
    check(rc == 0, "exit 0 after the drain", f"rc={rc}")
    s.check_clean_exit("no sanitizer report after the drain")

# ---- graceful shutdown: the grace period runs out ----
with Server(model, "--grace-seconds", "0.5") as s:
    r, lines = open_stream(s.url, {"tokens": list(b"too long"), "max_tokens": LONG, "temperature": 0,
                                   "ignore_eos": True})
    read_events(lines, 1)
    t0 = time.time()
    s.proc.send_signal(15)
    rest, _ = sse_events(lines)
    rc = s.proc.wait(30)
    check(rc == 0 and time.time() - t0 < 10, "exit 0 soon after the grace period", f"rc={rc}")
    last = json.loads(rest[-2]) if len(rest) >= 2 else {}
    check(rest and rest[-1] == "[DONE]" and last.get("error", {}).get("code") == 503,
          "an unfinished stream is told the server is shutting down", str(rest[-2:]))
    s.check_clean_exit("no sanitizer report after the grace period")
finish()

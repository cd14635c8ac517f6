"""Keep-alive comments reach idle streams on time even while one long engine step runs.

The step: a /score fed as one prompt chunk (--prefill-chunk and --step-tokens above its length)
on the demo model, its length chosen from a timed 64-token /score so that it runs ~2 s. Meanwhile stream A (decoding,
so it shares that step and gets no token until it ends) and stream B (queued behind a full batch)
must each receive a line at least every --heartbeat-seconds plus the HTTP side's tick, because
the HTTP event loops, not the scheduler between steps, decide when a comment is due."""
import os
import random
import sys
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SRC, Server, check, finish, metric  # noqa: E402

HB = 0.25          # --heartbeat-seconds
SLACK = 0.3        # the loop's tick (50 ms), thread wake-ups, a loaded CI machine
STEP_S = 2.0       # target length of the long step
model = os.path.join(SRC, "models", "demo")


class Reader(threading.Thread):
    """Reads one SSE stream, stamping every line (event or comment) with its arrival time."""

    def __init__(self, url, body):
        super().__init__(daemon=True)
        self.resp = requests.post(url + "/generate", json=dict(body, stream=True), stream=True, timeout=120)
        self.lines = []   # (time, is_comment)
        self.stop = False

    def run(self):
        try:
            for line in self.resp.iter_lines():
                if self.stop:
                    break
                if line:
                    self.lines.append((time.monotonic(), line.startswith(b":")))
        except Exception:  # noqa: BLE001  (closed from the main thread)
            pass

    def gaps(self, t0, t1):
        """Longest silence within [t0, t1] and the comments heard there."""
        ts = [t0] + [t for t, _ in self.lines if t0 <= t <= t1] + [t1]
        comments = sum(1 for t, c in self.lines if c and t0 <= t <= t1)
        return max(b - a for a, b in zip(ts, ts[1:])), comments


with Server(model, "--max-batch", "2", "--step-tokens", "4096", "--prefill-chunk", "4096",
            "--heartbeat-seconds", str(HB), "--log-level", "warn") as s:
    u = s.url
    body = {"tokens": [65, 66, 67], "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
    a = Reader(u, body)
    a.start()
    deadline = time.time() + 30
    while sum(1 for _, c in a.lines if not c) < 3 and time.time() < deadline:
        time.sleep(0.01)
    check(len(a.lines) >= 3, "stream A is decoding")
    rng = random.Random(7)
    t = time.monotonic()
    requests.post(u + "/score", json={"tokens": [rng.randrange(256) for _ in range(64)]}, timeout=300)
    per_token = (time.monotonic() - t) / 64
    SCORE_TOKENS = max(64, min(2000, int(STEP_S / per_token)))
    toks = [rng.randrange(256) for _ in range(SCORE_TOKENS)]
    score = {}

    def run_score():
        score["r"] = requests.post(u + "/score", json={"tokens": toks}, timeout=300)
        score["t1"] = time.monotonic()
    m0 = requests.get(u + "/metrics").text
    th = threading.Thread(target=run_score)
    th.start()
    # The score is admitted next to A: from then on, one step holds A's next token and the whole
    # prompt. B arrives during that step and waits in the queue (max batch 2).
    deadline = time.time() + 30
    while metric(requests.get(u + "/metrics").text, "kda_running_sequences") < 2 and time.time() < deadline:
        time.sleep(0.005)
    t0 = time.monotonic()
    b = Reader(u, dict(body, max_tokens=4))
    b.start()
    th.join()
    t1 = score["t1"]
    m1 = requests.get(u + "/metrics").text
    a.stop = b.stop = True
    a.resp.close()
    b.resp.close()
    r = score["r"]
    steps = metric(m1, "kda_engine_steps_total") - metric(m0, "kda_engine_steps_total")
    check(r.status_code == 200 and len(r.json()["token_logprobs"]) == SCORE_TOKENS - 1,
          f"the {SCORE_TOKENS}-token /score completes")
    gap_a, com_a = a.gaps(t0 + 0.02, t1 - 0.05)
    gap_b, com_b = b.gaps(b.lines[0][0] if b.lines else t0, t1 - 0.05)
    print(f"the step with the score's prompt ran for ~{t1 - t0:.2f}s ({steps:.0f} steps during the score); "
          f"stream A: longest silence {gap_a:.2f}s, {com_a} comments; queued stream B: {gap_b:.2f}s, {com_b} comments")
    check(t1 - t0 > 4 * HB, "the step is much longer than the heartbeat period", f"{t1 - t0:.2f}s")
    check(gap_a <= HB + SLACK and com_a >= 2, "a decoding stream hears keep-alive comments on time during a long step",
          f"longest silence {gap_a:.2f}s, {com_a} comments")
    check(gap_b <= HB + SLACK and com_b >= 2, "a queued stream hears keep-alive comments on time during a long step",
          f"longest silence {gap_b:.2f}s, {com_b} comments")
    s.check_clean_exit()
finish()

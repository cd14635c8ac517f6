#!/usr/bin/env python3
"""serve_bench.py - drive a running kda-server over HTTP the way `vllm bench serve` does, and
report what clients get: output tok/s, requests/s, TTFT / ITL / end-to-end latency (p50, p99),
every request that did not complete and why, and the server's efficiency: output tok/s divided
by the engine-only decode rate at the same batch size (kda-cli bench, same machine, same model,
same invocation).

Load:
  --concurrency 1,16,64,256   closed loop: C streaming clients, each sends its next request when
                              its last one ends; --requests-per-client K (default 3: 3 x C per level)
  --request-rate 50,100       open loop: Poisson arrivals at R requests/s (--num-requests per level;
                              --max-concurrency caps requests in flight, as vllm's does)
  --input-len 128 --output-len 128 [--range-ratio 0.5]   fixed, or uniform in [L(1-r), L(1+r)]
  --prompt ids|text           random token ids in [0, --vocab-size) through /generate "tokens",
                              or random words (prompt length then counted by the server)
  --endpoint generate|completions   /generate or OpenAI /v1/completions (stream, include_usage)
  --ignore-eos                every request generates exactly its output length
  --procs N                   client processes (default: enough that none drives more than 32
                              streams, at most half the cores); each runs one asyncio loop
The client's own overhead is measured and reported per level: CPU use of the busiest client
process and its event-loop lag (p99 of how late a 5 ms timer fires). A loop lag in the
milliseconds means the client, not the server, shaped the latencies.

Engine rate: --engine-json FILE (a `kda-cli bench --json` file made in the same invocation with
the server stopped, as scripts/bench-serve.sh does), or --kda-cli PATH --model-dir DIR to run it
here before the load (the server must be idle). The pairs measured are ctx:C for each level's
batch C (ctx = --engine-ctx, default the input length). --merge RESULTS --engine-after FILE adds
a second engine run made after the load (the spread shows how noisy the machine was).

Output: a table on stdout and --json FILE (machine, date, commit, args, engine figures, per-level
figures, server step statistics from /metrics, failures).
"""
import argparse
import asyncio
import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import random
import re
import subprocess
import sys
import time
import urllib.request

WORDS = ("the of and to in is was that for on with as by at his from her which an be this had not are but "
         "were one all they have there their been has when who more will would no so out up said what its "
         "about into than them can only other new some could time these two may then first any like now my "
         "such over our even most made after also did many before must through back years where much your "
         "way well down should because each just those people how too little state good very make world "
         "still own see men work long get here between both life being under never day same another know "
         "while last might us great old year off come since against go came right used take three").split()


# ---------------------------------------------------------------- client side (worker processes)

class Req:
    __slots__ = ("idx", "n_in", "n_out", "ok", "why", "t_send", "ttft", "e2e", "itl", "out_tokens", "prompt_tokens")

    def __init__(self, idx, n_in, n_out):
        self.idx, self.n_in, self.n_out = idx, n_in, n_out
        self.ok, self.why = False, ""
        self.t_send = self.ttft = self.e2e = 0.0
        self.itl = []
        self.out_tokens = self.prompt_tokens = 0

    def as_tuple(self):
        return (self.idx, self.n_in, self.n_out, self.ok, self.why, self.t_send, self.ttft, self.e2e, self.itl,
                self.out_tokens, self.prompt_tokens)


def make_body(a, rng, n_in, n_out, seed):
    if a.prompt == "ids":
        prompt = [rng.randrange(a.vocab_size) for _ in range(n_in)]
    else:
        prompt = " ".join(rng.choice(WORDS) for _ in range(n_in))
    if a.endpoint == "generate":
        body = {("tokens" if a.prompt == "ids" else "prompt"): prompt, "max_tokens": n_out, "stream": True,
                "temperature": a.temperature, "seed": seed}
    else:
        body = {"model": a.model_name, "prompt": prompt, "max_tokens": n_out, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": a.temperature, "seed": seed}
    if a.ignore_eos:
        body["ignore_eos"] = True
    return body


async def one_request(a, sess, url, req, body):
    """Streams one request; fills req (times relative to t_send, seconds)."""
    import aiohttp
    req.t_send = time.perf_counter()
    last = req.t_send
    got = 0
    try:
        async with sess.post(url, json=body, timeout=aiohttp.ClientTimeout(total=a.timeout)) as r:
            if r.status != 200:
                text = await r.text()
                try:
                    msg = json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    msg = text[:200]
                req.why = f"HTTP {r.status}: {msg}"
                return
            done = False
            async for raw in r.content:
                if not raw.startswith(b"data: "):
                    continue   # blank separators, keep-alive comments
                now = time.perf_counter()
                data = raw[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    req.why = "error event: " + str(ev["error"].get("message"))
                    continue
                if a.endpoint == "generate":
                    n = len(ev.get("tokens", ()))
                    if "usage" in ev:
                        req.prompt_tokens = ev["usage"]["prompt_tokens"]
                else:
                    if ev.get("usage"):
                        req.prompt_tokens = ev["usage"]["prompt_tokens"]
                        got = ev["usage"]["completion_tokens"]
                        continue
                    ch = ev["choices"][0] if ev["choices"] else {}
                    n = 1 if ch.get("text") or ch.get("logprobs") else 0
                if n:
                    if got == 0:
                        req.ttft = now - req.t_send
                    else:
                        # an event carrying k tokens: its gap is shared among them
                        req.itl.extend([(now - last) / n] * n)
                    got += n
                    last = now
            req.e2e = time.perf_counter() - req.t_send
            req.out_tokens = got
            if not done:
                req.why = req.why or f"stream closed before [DONE] after {got} tokens"
            elif req.why:
                pass
            elif a.ignore_eos and got != req.n_out:
                req.why = f"{got} tokens, expected {req.n_out}"
            else:
                req.ok = True
    except asyncio.TimeoutError:
        req.why = f"no complete answer within {a.timeout:.0f}s ({got} tokens received)"
    except Exception as e:  # noqa: BLE001  (every failure is reported, with its type)
        req.why = f"{type(e).__name__}: {e} ({got} tokens received)"
    if not req.e2e:
        req.e2e = time.perf_counter() - req.t_send


def lengths(a, rng):
    def pick(L):
        if a.range_ratio <= 0:
            return L
        return max(1, rng.randint(int(L * (1 - a.range_ratio)), int(math.ceil(L * (1 + a.range_ratio)))))
    return pick(a.input_len), pick(a.output_len)


async def loop_lag_probe(stop, lags):
    """How late a 5 ms timer fires: the client's own event-loop overhead."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.005)
        lags.append(time.perf_counter() - t - 0.005)


async def worker_main(a, wid, n_clients, n_requests, rate, t_start):
    import aiohttp
    rng = random.Random(a.seed * 1000 + wid)
    url = a.url.rstrip("/") + ("/generate" if a.endpoint == "generate" else "/v1/completions")
    reqs = []
    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
    stop, lags = asyncio.Event(), []
    async with aiohttp.ClientSession(connector=conn) as sess:
        await asyncio.sleep(max(0.0, t_start - time.time()))
        probe = asyncio.ensure_future(loop_lag_probe(stop, lags))
        cpu0 = time.process_time()
        idx = [0]

        def next_req():
            i = idx[0]
            idx[0] += 1
            n_in, n_out = lengths(a, rng)
            r = Req(wid * 1_000_000 + i, n_in, n_out)
            reqs.append(r)
            return r, make_body(a, rng, n_in, n_out, seed=rng.randrange(1 << 31))

        if rate is None:   # closed loop: each client runs its share back to back
            per = [n_requests // n_clients + (k < n_requests % n_clients) for k in range(n_clients)]

            async def client(k):
                for _ in range(per[k]):
                    r, body = next_req()
                    await one_request(a, sess, url, r, body)
            await asyncio.gather(*(client(k) for k in range(n_clients)))
        else:              # open loop: Poisson arrivals, optionally capped in flight
            sem = asyncio.Semaphore(a.max_concurrency) if a.max_concurrency else None
            tasks = []

            async def fire(r, body):
                if sem:
                    async with sem:
                        await one_request(a, sess, url, r, body)
                else:
                    await one_request(a, sess, url, r, body)
            t_next = time.perf_counter()
            for _ in range(n_requests):
                t_next += rng.expovariate(rate)
                await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
                r, body = next_req()
                tasks.append(asyncio.ensure_future(fire(r, body)))
            await asyncio.gather(*tasks)
        t_end = time.time()
        cpu = time.process_time() - cpu0
        stop.set()
        await probe
    return {"reqs": [r.as_tuple() for r in reqs], "cpu_s": cpu, "t_end": t_end, "loop_lag": lags}


def worker_entry(a, wid, n_clients, n_requests, rate, t_start, q):
    try:
        q.put((wid, asyncio.run(worker_main(a, wid, n_clients, n_requests, rate, t_start))))
    except BaseException as e:  # noqa: BLE001
        q.put((wid, {"fatal": f"{type(e).__name__}: {e}"}))


# ---------------------------------------------------------------- driver

def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(math.floor(k)), int(math.ceil(k))
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats_ms(xs):
    if not xs:
        return {"p50": None, "p99": None, "mean": None}
    return {"p50": round(pct(xs, 50) * 1e3, 3), "p99": round(pct(xs, 99) * 1e3, 3),
            "mean": round(sum(xs) / len(xs) * 1e3, 3)}


def scrape(url):
    """The counters of /metrics this benchmark reads (server-side step statistics)."""
    try:
        text = urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"(kda_[a-z_]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and not m.group(2):
            out[m.group(1)] = float(m.group(3))
        # histogram buckets (cumulative counts): the engine's step time and
        # the server's own inter-token latency, to tell long steps from
        # delays between the engine and the client
        m = re.match(r'(kda_engine_step_seconds|vllm:inter_token_latency_seconds)_bucket\{.*le="([^"]+)"\}\s+(\S+)$',
                     line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
        m = re.match(r'kda_scheduler_seconds_total\{phase="([a-z]+)"\}\s+(\S+)$', line)
        if m:
            out[("sched", m.group(1))] = float(m.group(2))
    return out


def bucket_delta(m0, m1, name):
    """per-bucket counts of histogram name between two scrapes: {"<=le ms": count}"""
    les = sorted((k[1] for k in m1 if isinstance(k, tuple) and k[0] == name),
                 key=lambda x: float("inf") if x == "+Inf" else float(x))
    out, prev = {}, 0.0
    for le in les:
        cum = m1.get((name, le), 0) - m0.get((name, le), 0)
        if cum - prev > 0:
            out["inf" if le == "+Inf" else f"<={float(le) * 1e3:g}ms"] = int(cum - prev)
        prev = cum
    return out


def long_gaps(reqs, factor=3.0):
    """where in their requests the client's long inter-token gaps fall: gaps
    above factor x the median gap, counted by the gap's index (0 = between
    the first and the second token)"""
    gaps = sorted(x for r in reqs for x in r[8])
    if not gaps:
        return {}
    cut = gaps[len(gaps) // 2] * factor
    where = {"0": 0, "1-7": 0, "8-31": 0, "32+": 0}
    for r in reqs:
        for i, x in enumerate(r[8]):
            if x > cut:
                where["0" if i == 0 else "1-7" if i < 8 else "8-31" if i < 32 else "32+"] += 1
    return {"threshold_ms": round(cut * 1e3, 3), "count": sum(where.values()), "of": len(gaps), "by_index": where}


def run_level(a, mode, value):
    if mode == "closed":
        C = value
        n_total = a.num_requests or a.requests_per_client * C
        procs = a.procs or max(1, min(math.ceil(C / 32), max(1, (os.cpu_count() or 2) // 2)))
        procs = min(procs, C)
        shares = [(C // procs + (w < C % procs), None) for w in range(procs)]
        req_shares = [n_total * s[0] // C for s in shares]
        req_shares[0] += n_total - sum(req_shares)
    else:
        n_total = a.num_requests or 200
        procs = a.procs or max(1, min(4, (os.cpu_count() or 2) // 2))
        shares = [(0, value / procs) for _ in range(procs)]
        req_shares = [n_total // procs + (w < n_total % procs) for w in range(procs)]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    load = os.getloadavg()[0]
    m0 = scrape(a.url)
    t_start = time.time() + 0.5 + 0.05 * procs   # every process connects and waits for the same instant
    ps = [ctx.Process(target=worker_entry, args=(a, w, shares[w][0], req_shares[w], shares[w][1], t_start, q))
          for w in range(procs)]
    for p in ps:
        p.start()
    results = {}
    deadline = time.time() + a.timeout + 60 + n_total * a.timeout / max(1, (value if mode == "closed" else 1))
    while len(results) < procs and time.time() < deadline:
        try:
            wid, res = q.get(timeout=1)
            results[wid] = res
        except Exception:  # noqa: BLE001 (queue.Empty)
            if not any(p.is_alive() for p in ps) and q.empty():
                break
    for p in ps:
        p.join(5)
        if p.is_alive():
            p.kill()
    m1 = scrape(a.url)
    fatal = [r["fatal"] for r in results.values() if "fatal" in r]
    if fatal or len(results) < procs:
        raise SystemExit(f"client process failed: {fatal or 'no result'}")
    reqs = [r for res in results.values() for r in res["reqs"]]
    wall = max(res["t_end"] for res in results.values()) - t_start
    ok = [r for r in reqs if r[3]]
    failures = [{"request": r[0], "why": r[4], "after_s": round(r[7], 3)} for r in reqs if not r[3]]
    out_tokens = sum(r[9] for r in reqs)
    lags = [x for res in results.values() for x in res["loop_lag"]]
    steps = m1.get("kda_engine_steps_total", 0) - m0.get("kda_engine_steps_total", 0)
    step_s = m1.get("kda_engine_step_seconds_sum", 0) - m0.get("kda_engine_step_seconds_sum", 0)
    step_tok = m1.get("kda_engine_step_tokens_total", 0) - m0.get("kda_engine_step_tokens_total", 0)
    lvl = {
        "mode": mode, ("concurrency" if mode == "closed" else "request_rate"): value,
        "requests": len(reqs), "completed": len(ok), "failed": len(failures),
        "duration_s": round(wall, 3),
        "output_tok_s": round(out_tokens / wall, 1), "requests_s": round(len(ok) / wall, 3),
        "output_tokens": out_tokens,
        "ttft_ms": stats_ms([r[6] for r in ok]), "itl_ms": stats_ms([x for r in ok for x in r[8]]),
        "e2e_ms": stats_ms([r[7] for r in ok]),
        "server": {"engine_steps": int(steps), "engine_busy_fraction": round(step_s / wall, 3) if wall else None,
                   "mean_step_ms": round(step_s / steps * 1e3, 3) if steps else None,
                   "mean_tokens_per_step": round(step_tok / steps, 2) if steps else None,
                   "step_ms_buckets": bucket_delta(m0, m1, "kda_engine_step_seconds"),
                   "itl_ms_buckets": bucket_delta(m0, m1, "vllm:inter_token_latency_seconds"),
                   # the scheduler thread's wall time by phase, per step (ms)
                   "sched_ms_per_step": {k[1]: round((m1[k] - m0.get(k, 0)) / steps * 1e3, 4)
                                         for k in m1 if isinstance(k, tuple) and k[0] == "sched"} if steps else {}},
        "client_long_gaps": long_gaps(ok),
        "client": {"procs": procs, "cpu_util_max": round(max(res["cpu_s"] for res in results.values()) / wall, 3),
                   "loop_lag_ms": {"p50": round((pct(lags, 50) or 0) * 1e3, 3),
                                   "p99": round((pct(lags, 99) or 0) * 1e3, 3)}},
        "loadavg_1min_at_start": round(load, 2),
        "failures": failures,
    }
    return lvl


def engine_rates(a, batches):
    """{B: tok/s} from a kda-cli bench JSON (given or run now)."""
    path = a.engine_json
    if not path and a.kda_cli:
        path = a.json + ".engine.json" if a.json else "/tmp/serve_bench_engine.json"
        pairs = ",".join(f"{a.engine_ctx or a.input_len}:{b}" for b in batches)
        cmd = [a.kda_cli, "bench", a.model_dir, "--device", a.device, "--pairs", pairs, "--steps",
               str(a.engine_steps), "--no-kernels", "--threads", str(a.engine_threads), "--json", path]
        print("engine:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    if not path:
        return None, {}
    e = json.load(open(path))
    return e, rates_from(e, a.engine_ctx or a.input_len)


def rates_from(e, ctx):
    rates = {}
    for d in e.get("decode", []):
        if d["ms_step"] > 0 and (d["ctx"] == ctx or d["B"] not in rates):
            rates[d["B"]] = d["tok_s"]
    return rates


def merge_engine_after(a):
    """Adds a second engine measurement, made after the load, to a results file: on a shared
    machine the spread between the two says how far the efficiency figures can be trusted."""
    res = json.load(open(a.merge))
    e = json.load(open(a.engine_after))
    args = res["args"]
    rates = rates_from(e, args.get("engine_ctx") or args["input_len"])
    res["engine_after"] = e
    for lvl in res["levels"]:
        b = lvl.get("concurrency")
        if b in rates:
            lvl["engine_tok_s_after"] = rates[b]
            lvl["efficiency_after"] = round(lvl["output_tok_s"] / rates[b], 3)
    with open(a.merge, "w") as f:
        json.dump(res, f, indent=1)
    print(table(res["levels"]))
    print("updated", a.merge)
    return 0


def machine():
    cpu = "?"
    try:
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    except OSError:
        pass
    gpu = None
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "gpu": gpu,
            "loadavg_1min_at_start": round(os.getloadavg()[0], 2)}


def commit():
    c = os.environ.get("KDA_COMMIT")
    if c:
        return c
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def table(levels):
    head = (f"{'load':>10} {'done':>9} {'out tok/s':>10} {'req/s':>7} {'engine':>11} {'eff':>7} "
            f"{'TTFT p50/p99 ms':>17} {'ITL p50/p99 ms':>16} {'E2E p50/p99 ms':>17} {'client cpu/lag99':>17}")
    lines = [head, "-" * len(head)]

    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    def pc(x, x2=None):
        if x is None:
            return "-"
        return f"{x * 100:.0f}%" if x2 is None else f"{x * 100:.0f}/{x2 * 100:.0f}%"

    def eng(l):   # engine tok/s, before[/after] the load
        e, e2 = l.get("engine_tok_s"), l.get("engine_tok_s_after")
        return f(e, 0) if e2 is None else f"{e:.0f}/{e2:.0f}"
    for l in levels:
        load = f"C={l['concurrency']}" if l["mode"] == "closed" else f"R={l['request_rate']}/s"
        lines.append(
            f"{load:>10} {l['completed']:>4}/{l['requests']:<4} {l['output_tok_s']:>10.0f} {l['requests_s']:>7.2f} "
            f"{eng(l):>11} {pc(l.get('efficiency'), l.get('efficiency_after')):>7} "
            f"{f(l['ttft_ms']['p50']) + ' / ' + f(l['ttft_ms']['p99']):>17} "
            f"{f(l['itl_ms']['p50'], 2) + ' / ' + f(l['itl_ms']['p99'], 2):>16} "
            f"{f(l['e2e_ms']['p50'], 0) + ' / ' + f(l['e2e_ms']['p99'], 0):>17} "
            f"{f(l['client']['cpu_util_max'] * 100, 0) + '% / ' + f(l['client']['loop_lag_ms']['p99'], 1):>17}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--endpoint", choices=["generate", "completions"], default="generate")
    ap.add_argument("--concurrency", help="closed-loop levels, e.g. 1,16,64,256")
    ap.add_argument("--request-rate", help="open-loop levels in requests/s, e.g. 10,50")
    ap.add_argument("--requests-per-client", type=int, default=3, help="closed loop: requests per level = K x C")
    ap.add_argument("--num-requests", type=int, default=0, help="requests per level (overrides K x C)")
    ap.add_argument("--max-concurrency", type=int, default=0, help="open loop: cap on requests in flight")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--range-ratio", type=float, default=0.0, help="mixed lengths: uniform in L*(1 +- r)")
    ap.add_argument("--prompt", choices=["ids", "text"], default="ids")
    ap.add_argument("--vocab-size", type=int, default=0, help="random ids below this (default: from --model-dir, "
                    "else 256)")
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--procs", type=int, default=0, help="client processes (0: auto)")
    ap.add_argument("--timeout", type=float, default=600, help="per-request deadline, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2, help="requests sent (and not counted) before the levels")
    ap.add_argument("--engine-json", help="kda-cli bench --json output of this invocation")
    ap.add_argument("--kda-cli", help="run kda-cli bench before the load (server idle)")
    ap.add_argument("--model-dir", help="the served checkpoint (vocab size; kda-cli bench)")
    ap.add_argument("--device", default="cpu", help="kda-cli bench --device")
    ap.add_argument("--engine-ctx", type=int, default=0, help="context of the engine pairs (default: input len)")
    ap.add_argument("--engine-steps", type=int, default=32)
    ap.add_argument("--engine-threads", type=int, default=0, help="kda-cli bench --threads (cpu)")
    ap.add_argument("--merge", metavar="RESULTS", help="add --engine-after to this results file and exit")
    ap.add_argument("--engine-after", help="kda-cli bench JSON made after the load (with --merge)")
    ap.add_argument("--json", help="results file")
    ap.add_argument("--note", default="", help="free text stored in the results (model, machine notes)")
    a = ap.parse_args()
    if a.merge:
        return merge_engine_after(a)
    if not a.concurrency and not a.request_rate:
        a.concurrency = "1,16,64,256"
    levels_spec = [("closed", int(c)) for c in (a.concurrency or "").split(",") if c] + \
                  [("open", float(r)) for r in (a.request_rate or "").split(",") if r]
    if not a.vocab_size:
        a.vocab_size = 256
        if a.model_dir and os.path.exists(os.path.join(a.model_dir, "config.json")):
            a.vocab_size = json.load(open(os.path.join(a.model_dir, "config.json")))["vocab_size"]
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise SystemExit("serve_bench.py needs aiohttp (python3 -m pip install aiohttp)")
    models = json.load(urllib.request.urlopen(a.url.rstrip("/") + "/v1/models", timeout=30))
    a.model_name = models["data"][0]["id"]

    batches = sorted({v for m, v in levels_spec if m == "closed"})
    engine, rates = engine_rates(a, batches)
    if a.warmup:
        w = argparse.Namespace(**vars(a))
        w.ignore_eos, w.output_len, w.range_ratio = True, 4, 0
        asyncio.run(worker_main(w, 999, a.warmup, a.warmup, None, time.time()))

    levels = []
    for mode, v in levels_spec:
        lvl = run_level(a, mode, v)
        if mode == "closed" and v in rates:
            lvl["engine_tok_s"] = rates[v]
            lvl["efficiency"] = round(lvl["output_tok_s"] / rates[v], 3)
        levels.append(lvl)
        print(table([lvl]).splitlines()[-1] if len(levels) > 1 else table([lvl]), flush=True)
        for fl in lvl["failures"][:20]:
            print(f"    failed request {fl['request']} after {fl['after_s']}s: {fl['why']}")
        if len(lvl["failures"]) > 20:
            print(f"    ... {len(lvl['failures']) - 20} more failures (all in the JSON)")
    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(), "commit": commit(), "note": a.note,
        "args": {k: v for k, v in vars(a).items() if k not in ("model_name",)},
        "served_model": a.model_name,
        "engine": engine,
        "levels": levels,
    }
    print()
    print(table(levels))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote", a.json)
    return 1 if any(l["failed"] for l in levels) else 0


if __name__ == "__main__":
    sys.exit(main())

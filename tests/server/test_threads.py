"""CPU threads on a shared machine (issue 19, item 12): with the default
--threads 0 (every core), a busy neighbour (one spinning process per core)
may slow decoding down by its fair share of the cores, not collapse it.

libgomp's idle threads used to spin at every barrier (300,000 rounds before
sleeping), holding the cores the working thread and the neighbour needed: ITL
3.1 ms quiet became 59.7 ms. kda-server sets passive waiting before libgomp
starts (common/omp_wait.c). The bound: busy ITL <= BOUND x quiet ITL, median
of a few requests each. A fair share of the cores is 2x; 10x leaves room for a
noisy machine (passive waiting measured 2.9x, 4.0x, 6.2x and 8.5x on the 2-core
dev VM, so a 6x bound failed fresh-clone CI twice) and still fails the spinning
that the issue measured at 19x (3.1 -> 59.7 ms). A busy figure over the bound is
measured once more before the test fails: spinning is slow every time, a
neighbour's unlucky second is not; skipped when other work already runs on the machine (the
figures would be that work's). KDA_THREADS_TEST_ENV="GOMP_SPINCOUNT=300000" runs the
same test with the old waiting (libgomp's default), which must fail it.
"""
import os
import statistics
import subprocess
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SRC, Server, check, finish  # noqa: E402

BOUND = 10.0
NCPU = os.cpu_count() or 1
DEMO = os.path.join(SRC, "models", "demo")
env = {"OMP_NUM_THREADS": str(NCPU)}
for kv in filter(None, os.environ.get("KDA_THREADS_TEST_ENV", "").split(",")):
    k, v = kv.split("=", 1)
    env[k] = v
if NCPU < 2:
    print("SKIP: one core: --threads 0 is one thread, nothing waits")
    sys.exit(77)



def others_running(samples=20):
    """Runnable tasks besides this one, averaged over a second (/proc/stat procs_running)."""
    n = 0
    for _ in range(samples):
        with open("/proc/stat") as f:
            n += next(int(l.split()[1]) for l in f if l.startswith("procs_running"))
        time.sleep(1 / samples)
    return n / samples - 1


# The bound compares against a neighbour this test controls; on a machine already busy with other
# work (a shared development VM) neither figure means anything.
if others_running() >= 1:
    print(f"SKIP: {others_running():.1f} other runnable tasks already: the machine is not quiet")
    sys.exit(77)
srv = Server(DEMO, "--threads", "0", env=env)
body = {"prompt": "ROMEO:", "max_tokens": 48, "temperature": 0, "ignore_eos": True, "cache_prompt": False}


def itl_ms(n=5):
    """Median over n requests of each one's mean inter-token latency."""
    out = []
    for _ in range(n):
        t = requests.post(srv.url + "/generate", json=body, timeout=300).json()["timings"]
        out.append(t["generation_ms"] / (body["max_tokens"] - 1))
    return statistics.median(out)


itl_ms(1)   # warm up
quiet = itl_ms()


def busy_itl_ms():
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(NCPU)]
    try:
        return itl_ms()
    finally:
        for p in spinners:
            p.kill()
            p.wait()


busy = busy_itl_ms()
if busy > BOUND * quiet:
    print(f"busy {busy:.2f} ms is {busy / quiet:.1f}x quiet {quiet:.2f} ms: measuring once more")
    quiet = itl_ms()
    busy = busy_itl_ms()
after = itl_ms()
print(f"ITL --threads 0 ({NCPU} cores) {env}: quiet {quiet:.2f} ms, with {NCPU} spinning neighbours {busy:.2f} ms "
      f"({busy / quiet:.1f}x), quiet again {after:.2f} ms")
check(busy <= BOUND * quiet, f"a busy neighbour slows decoding by at most {BOUND:g}x ({busy / quiet:.1f}x)",
      f"quiet {quiet:.2f} ms, busy {busy:.2f} ms")
srv.check_clean_exit()
finish()

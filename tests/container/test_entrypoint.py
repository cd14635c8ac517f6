#!/usr/bin/python3
"""deploy/entrypoint.sh: KDA_* variables become kda-server flags, the
caller's flags win, and the shell execs the server (same PID, so SIGTERM
reaches the daemon). Runs the script against a fake server that reports its
arguments and PID; needs only sh."""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("KDA_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")
ENTRY = os.path.join(SRC, "deploy", "entrypoint.sh")
FAKE = """#!/usr/bin/python3
import json, os, sys
print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "KDA_MODEL": os.environ.get("KDA_MODEL")}))
"""
failures = []


def check(cond, what, detail=""):
    if not cond:
        failures.append(what)
    print(("ok    " if cond else "FAIL  ") + what + ("" if cond else f"  ({detail})"))


def run(args=(), env=None, tmp=None):
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KDA_SERVER_BIN": os.path.join(tmp, "fake-server"),
         "KDA_DEMO_MODEL": "/demo/model"}
    e.update(env or {})
    p = subprocess.Popen(["sh", ENTRY, *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=30)
    if p.returncode != 0:
        return p.pid, {"error": err, "rc": p.returncode, "out": out}
    try:
        return p.pid, json.loads(out)
    except ValueError:
        return p.pid, {"out": out}


def flags(argv):
    """argv -> {flag: [values]}; kda-server takes '--flag value' pairs."""
    d, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and i + 1 < len(argv):
            d.setdefault(a, []).append(argv[i + 1])
            i += 1
        i += 1
    return d


def main():
    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "fake-server")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)

        pid, r = run(tmp=tmp)
        f = flags(r.get("argv", []))
        check(r.get("pid") == pid, "the shell execs the server: same PID, no shell left in between", r)
        check(f.get("--host") == ["0.0.0.0"], "binds 0.0.0.0 by default (reachable through the port map)", r)
        check(f.get("--port") == ["8080"], "port 8080 by default", r)
        check(f.get("--model") == ["/demo/model"], "without /models or KDA_MODEL: the baked-in demo model", r)
        check(r.get("KDA_MODEL") == "/demo/model", "the chosen model is exported as KDA_MODEL too", r)
        check(not any(k in f for k in ("--device", "--api-key", "--threads")), "unset variables add no flags", r)

        env = {"KDA_MODEL": "/srv/m", "KDA_MODEL_NAME": "kda-1.7b", "KDA_PORT": "9000", "KDA_HOST": "::", "KDA_DEVICE": "cuda",
               "KDA_THREADS": "6", "KDA_MAX_BATCH": "16", "KDA_MAX_QUEUE": "64", "KDA_MAX_SEQ_LEN": "4096",
               "KDA_LOG_LEVEL": "debug", "KDA_GRACE_SECONDS": "12", "KDA_API_KEY_FILE": "/etc/kda/key",
               "KDA_API_KEY": "s3cr3t with 'quotes' and $dollar"}
        _, r = run(env=env, tmp=tmp)
        f = flags(r.get("argv", []))
        want = {"--model": "/srv/m", "--model-name": "kda-1.7b", "--port": "9000", "--host": "::", "--device": "cuda", "--threads": "6",
                "--max-batch": "16", "--max-queue": "64", "--max-seq-len": "4096", "--log-level": "debug",
                "--grace-seconds": "12", "--api-key-file": "/etc/kda/key",
                "--api-key": "s3cr3t with 'quotes' and $dollar"}
        for k, v in want.items():
            check(f.get(k) == [v], f"{k} comes from its KDA_* variable, verbatim", f.get(k))

        _, r = run(["--port", "7000", "--model", "/cli/model", "--max-batch", "2"],
                   env={"KDA_PORT": "9000", "KDA_MODEL": "/env/model"}, tmp=tmp)
        f = flags(r.get("argv", []))
        check(f.get("--port") == ["7000"], "a flag given to the container overrides the variable", r)
        check(f.get("--model") == ["/cli/model"], "--model DIR overrides KDA_MODEL, and appears once", r)
        check(r.get("argv", [])[-6:] == ["--port", "7000", "--model", "/cli/model", "--max-batch", "2"],
              "the caller's arguments are passed last and unchanged", r)

        _, r = run(["--device", "cpu"], env={"KDA_DEVICE": ""}, tmp=tmp)
        check(flags(r.get("argv", [])).get("--device") == ["cpu"], "an empty variable is ignored", r)

        p = subprocess.run(["sh", ENTRY, "echo", "other", "command"], capture_output=True, text=True,
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KDA_SERVER_BIN": fake})
        check(p.stdout.strip() == "other command", "a non-flag first argument runs that command instead",
              p.stdout + p.stderr)

    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

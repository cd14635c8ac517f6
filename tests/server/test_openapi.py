"""server/openapi.json against the server.

1. The routes: every route of server/http.c's table is in the spec with its
   method, and every spec path is served (not a 404).
2. The fields: each generation endpoint's request schema lists exactly the
   fields server/fields.c says it reads, and the server validates each one
   (a value of the wrong type is a 400 whose error.param names it).
3. A property-based run (schemathesis, from PyPI) against the running server:
   requests generated from the spec, valid and invalid; no 5xx, status codes,
   content types and response bodies as the spec says, invalid data refused.
   Bounded: a fixed seed, a few examples per operation, a small context."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SRC, Server, check, finish, make_checkpoint  # noqa: E402

spec_path = os.path.join(SRC, "server", "openapi.json")
spec = json.load(open(spec_path))
check(spec["openapi"].startswith("3.0"), "openapi.json parses as OpenAPI 3.0")

# ---- routes ----
http_c = open(os.path.join(SRC, "server", "http.c")).read()
table = re.findall(r'\[ROUTE_\w+\] = \{"(/[^"]*)", "(\w+)", [01]\}', http_c)
check(len(table) >= 14, "route table read from server/http.c", str(table))
spec_routes = {(re.sub(r"\{[^}]+\}$", "", p), m.upper()) for p, ops in spec["paths"].items() for m in ops}
check(set(table) == spec_routes, "every route of the server is in the spec and every spec route is served",
      f"server only: {sorted(set(table) - spec_routes)}; spec only: {sorted(spec_routes - set(table))}")

# ---- fields ----
fields_c = open(os.path.join(SRC, "server", "fields.c")).read()


def c_fields(array):
    body = re.search(r"static const char \*const " + array + r"\[\] = \{(.*?)NULL\};", fields_c, re.S).group(1)
    return set(re.findall(r'"(\w+)"', body))


schemas = spec["components"]["schemas"]
kinds = {"generate": ("GenerateRequest", "/generate"), "score": ("ScoreRequest", "/score"),
         "completions": ("CompletionRequest", "/v1/completions"), "chat": ("ChatCompletionRequest", "/v1/chat/completions")}
for kind, (schema, path) in kinds.items():
    have = set(schemas[schema]["properties"])
    want = c_fields(kind + "_fields")
    check(have == want, f"{schema} lists exactly the fields {path} reads",
          f"spec only: {sorted(have - want)}; server only: {sorted(want - have)}")

model = make_checkpoint("tiny-long", "--preset", "tiny", "--tokenizer", "bytes", "--max-pos", "4096")
srv = Server(model, "--chat-template", "plain", "--max-seq-len", "64", "--max-queue", "16")
U = srv.url
minimal = {"generate": {"prompt": "hi", "max_tokens": 2}, "score": {"text": "hello"},
           "completions": {"prompt": "hi", "max_tokens": 2}, "chat": {"messages": [{"role": "user", "content": "hi"}],
                                                                       "max_tokens": 2}}
for kind, (schema, path) in kinds.items():
    r = requests.post(U + path, json=minimal[kind], timeout=60)
    check(r.status_code == 200, f"{path} accepts its minimal request", r.text[:200])
    exclusive = {"generate": {"prompt", "tokens"}, "score": {"text", "tokens", "texts"}}.get(kind, set())
    bad_fields = []
    for name, prop in schemas[schema]["properties"].items():
        body = dict(minimal[kind])
        if name in exclusive:
            for other in exclusive:
                body.pop(other, None)
        types = {prop.get("type")} | {alt.get("type") for alt in prop.get("oneOf", [])}
        body[name] = "wrong" if "object" in types else {"wrong": 1}
        r = requests.post(U + path, json=body, timeout=60)
        try:
            e = r.json()["error"]
        except Exception:
            e = {}
        if not (r.status_code == 400 and e.get("param") == name):
            bad_fields.append((name, r.status_code, e.get("param"), e.get("message", r.text[:80])))
    check(not bad_fields, f"{path}: every field is validated (wrong type -> 400 naming it)", str(bad_fields))
for path in [p for p in spec["paths"] if "{" not in p]:
    m = list(spec["paths"][path])[0]
    r = requests.request(m.upper(), U + path, json={} if m == "post" else None, timeout=60)
    check(r.status_code != 404, f"{m.upper()} {path} is served", str(r.status_code))
r = requests.get(U + "/openapi.json")
check(r.status_code == 200 and r.json() == spec, "GET /openapi.json serves server/openapi.json (compiled in)")

# ---- property-based run ----
st = shutil.which("schemathesis") or shutil.which("st")
if not st:
    print("SKIP the property-based run: schemathesis is not installed (pip install schemathesis)")
else:
    t0 = time.time()
    cmd = [st, "run", spec_path, "--url", U, "--checks",
           "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
           "negative_data_rejection", "--max-examples", os.environ.get("KDA_SCHEMATHESIS_EXAMPLES", "12"),
           "--seed", "1", "--phases", "examples,coverage,fuzzing", "--request-timeout", "30", "--workers", "1",
           "--generation-deterministic", "--suppress-health-check", "all", "--no-color"]
    # run elsewhere: schemathesis keeps a .schemathesis cache in its working directory
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, NO_COLOR="1"),
                       cwd=tempfile.mkdtemp(prefix="kda-st-"))
    out = r.stdout + r.stderr
    summary = [l for l in out.splitlines() if re.search(r"\d+ (passed|failed)", l) or "No issues found" in l]
    print("\n".join(out.splitlines()[-40:]) if r.returncode else "\n".join(summary[-5:]))
    check(r.returncode == 0, f"schemathesis: every generated request answered as the spec says ({time.time() - t0:.0f}s)",
          out[-3000:])
    check(requests.get(U + "/health").status_code == 200, "the server is healthy after the property-based run")
srv.check_clean_exit()
finish()

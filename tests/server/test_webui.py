"""The playground route over plain HTTP: GET / serves the page from the source tree
byte for byte, as HTML within its size budget, confined to its origin (CSP, no
external URL anywhere in it), public even when an API key is required while
/props (the model facts it shows) is not, and gone with --no-webui."""
import json
import os
import re
import struct
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SRC, Server, check, finish, make_checkpoint, metric  # noqa: E402

PAGE_BUDGET = 100 * 1024
page_src = open(os.path.join(SRC, "server", "webui", "index.html"), "rb").read()
model = make_checkpoint()
cfg = json.load(open(os.path.join(model, "config.json")))


def safetensors_params(path):
    """Parameter count from the file's own header, not from the engine."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        k = 1
        for d in t["shape"]:
            k *= d
        total += k
    return total


# ---- the page itself (no server needed) ----
html = page_src.decode("utf-8")
check(len(page_src) < PAGE_BUDGET, f"the page is under {PAGE_BUDGET} bytes", str(len(page_src)))
check(not re.search(r"(?i)\b(?:https?|wss?|ftp):", html), "the page names no http(s)/ws URL")
check(not re.search(r"""["'`(]\s*//[A-Za-z0-9]""", html), "the page has no protocol-relative URL")
refs = re.findall(r"""(?i)\b(?:src|href|action)\s*=\s*["']?([^"'\s>]*)""", html)
check(all(r.startswith("data:") for r in refs), "src/href attributes are data: only", str(refs))
check(not re.search(r"(?i)@import|url\((?!\s*['\"]?data:)", html), "the stylesheet loads nothing")
paths = re.findall(r"""\b(?:api|fetch)\(\s*["'`]([^"'`]*)""", html)
check(paths and all(p.startswith("/") and not p.startswith("//") for p in paths),
      "every request the page makes goes to a path on its own origin", str(paths))

with Server(model) as srv:
    r = requests.get(srv.url + "/", timeout=10)
    check(r.status_code == 200, "GET / is 200", str(r.status_code))
    check(r.headers.get("Content-Type") == "text/html; charset=utf-8", "GET / is UTF-8 HTML", r.headers.get("Content-Type"))
    check(r.content == page_src, "GET / serves server/webui/index.html byte for byte (embedded at build time)",
          f"{len(r.content)} vs {len(page_src)} bytes")
    check(int(r.headers.get("Content-Length", -1)) == len(page_src), "Content-Length is the page's size")
    csp = r.headers.get("Content-Security-Policy", "")
    check("default-src 'none'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp,
          "a Content-Security-Policy keeps the page to its own origin", csp)
    check(r.headers.get("X-Content-Type-Options") == "nosniff", "nosniff is set")
    check("Access-Control-Allow-Origin" not in r.headers, "no CORS header: the page is same-origin")
    check(requests.get(srv.url + "/?tab=score", timeout=10).content == page_src, "a query string does not change the page")
    # "/" is an exact path, not a prefix of every other one
    check(all(requests.get(srv.url + u, timeout=10).status_code == 404 for u in ("/index.html", "/no/such/path", "//")),
          "only / serves the page: other paths are 404")
    check(requests.get(srv.url + "/generate", timeout=10).status_code == 405, "GET on an API route is still 405")
    p = requests.post(srv.url + "/", data="x", timeout=10)
    check(p.status_code == 405 and p.headers.get("Allow") == "GET", "POST / is 405 with Allow: GET", str(p.status_code))

    props = requests.get(srv.url + "/props", timeout=10).json()
    expect = {"model": os.path.basename(model), "family": cfg["model_type"], "device": "cpu",
              "max_seq_len": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"],
              "n_layers": cfg["num_hidden_layers"],
              "n_params": safetensors_params(os.path.join(model, "model.safetensors"))}
    got = {k: props.get(k) for k in expect}
    check(got == expect, "/props reports the model as its config.json and safetensors header describe it",
          f"{got} vs {expect}")
    # Counted when a response completes, which may be just after the client has it.
    for _ in range(50):
        loads = metric(requests.get(srv.url + "/metrics", timeout=10).text, "kda_requests_total",
                       {"route": "/", "status": "200"})
        if loads == 2:
            break
        time.sleep(0.02)
    check(loads == 2, "/metrics counts the two page loads under route \"/\"", str(loads))
    srv.check_clean_exit()

with Server(model, "--api-key", "pl4y", "--model-name", "tiny-demo") as srv:
    r = requests.get(srv.url + "/", timeout=10)
    check(r.status_code == 200 and r.content == page_src, "with --api-key the page still loads without a key "
          "(it asks for the key itself)", str(r.status_code))
    check(requests.get(srv.url + "/props", timeout=10).status_code == 401, "with --api-key /props wants the key")
    check(requests.get(srv.url + "/props", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401,
          "/props refuses a wrong key")
    r = requests.get(srv.url + "/props", headers={"Authorization": "Bearer pl4y"}, timeout=10)
    check(r.status_code == 200 and r.json()["model"] == "tiny-demo", "/props takes the Bearer key and shows --model-name",
          r.text)
    # The page probes /v1/chat/completions to decide whether to show the chat tab (hidden
    # only on a 404). The key is checked before routing, so without it the probe gets 401:
    # the route is not disclosed, and the tab stays (the page asks for the key).
    chat = requests.get(srv.url + "/v1/chat/completions", timeout=10).status_code
    check(chat == 401, "without the key the chat-route probe gets 401 (no route disclosed), not 404", str(chat))
    chat = requests.get(srv.url + "/v1/chat/completions", headers={"Authorization": "Bearer pl4y"}, timeout=10)
    check(chat.status_code == 405, "with the key the chat-route probe gets 405", str(chat.status_code))
    srv.check_clean_exit()

with Server(model, "--no-webui") as srv:
    r = requests.get(srv.url + "/", timeout=10)
    check(r.status_code == 404 and r.headers.get("Content-Type") == "application/json" and "error" in r.json(),
          "--no-webui: GET / is a JSON 404", str(r.status_code))
    check(requests.get(srv.url + "/props", timeout=10).status_code == 200, "--no-webui leaves /props")
    check(requests.post(srv.url + "/score", json={"text": "ab"}, timeout=30).status_code == 200,
          "--no-webui leaves the API")
    srv.check_clean_exit()

finish()

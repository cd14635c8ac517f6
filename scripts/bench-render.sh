#!/usr/bin/env bash
# The server's cost of turning requests into jobs and finished jobs into bytes (issues #12, #17),
# on the CPU, into one JSON file:
#   1. build/tests/server/bench_render: api_parse and api_render alone at /score 1044 and 8192 tokens
#      and /v1/completions echo + logprobs 1 and 5 (lm-eval's request), with the current renderer
#      and with render_reference.c (the cJSON-tree renderer before server/json_out.c; same bytes);
#   2. scripts/bench_render_server.py: the same requests through a CPU kda-server (a generated tiny
#      model with the Llama-2 tokenizer and a 16k context), client-side times against the server's
#      own arrival-to-finish time; with BASE_SERVER=path also through that (older) binary.
#
#   bash scripts/bench-render.sh OUT.json      (BASE_SERVER=... REPS=3 POINTS=route:T:K,... to change)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench-render.sh OUT.json}
shared=${KDA_SHARED:-../shared}
spm=$shared/data/llama2-tokenizer.model
text=$shared/data/tinyshakespeare.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ninja -C build tests/server/bench_render server/kda-server >/dev/null

./build/tests/server/bench_render "$spm" --text "$text" --json "$tmp/render-new.json"
./build/tests/server/bench_render "$spm" --text "$text" --reference --json "$tmp/render-ref.json"

# the CPU engine takes seconds per 8192-token request on this model: POINTS to choose
points=${POINTS:-score:1044:0,completions:1044:1,completions:1044:5,score:8192:0,completions:8192:5}
/usr/bin/python3 scripts/gen_checkpoint.py --preset tiny --vocab 32000 --tokenizer "spm:$spm" --max-pos 16384 \
  "$tmp/model" >/dev/null
KDA_COMMIT=$(git rev-parse --short HEAD) python3 scripts/bench_render_server.py --server build/server/kda-server \
  --model "$tmp/model" --text "$text" --reps "${REPS:-3}" --points "$points" --log "$tmp/server.log" --out "$tmp/server-new.json"
if [ -n "${BASE_SERVER:-}" ]; then
  KDA_COMMIT=base python3 scripts/bench_render_server.py --server "$BASE_SERVER" \
    --model "$tmp/model" --text "$text" --reps "${REPS:-3}" --points "$points" --log "$tmp/server-base.log" --out "$tmp/server-base.json"
fi

python3 - "$tmp" "$out" "$(git rev-parse --short HEAD)" "${BASE_SERVER:-}" <<'EOF'
import json, os, platform, sys, time
tmp, out, commit, base = sys.argv[1:5]
load = lambda n: json.load(open(os.path.join(tmp, n))) if os.path.exists(os.path.join(tmp, n)) else None
res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
       "machine": f"{platform.node()} ({os.cpu_count()} cores, shared)", "load_avg": os.getloadavg(),
       "what": "api_parse / api_render CPU ms alone (bench_render: json_out = this commit, cjson-tree = the renderer "
               "before it, same bytes); requests through a CPU kda-server: exchange (client send to last byte) minus the "
               "server's arrival-to-finish e2e = parse + render + HTTP; client json.dumps / json.loads",
       "render_alone": {"json_out": load("render-new.json"), "cjson_tree": load("render-ref.json")},
       "through_server": {"this_commit": load("server-new.json"), "base": load("server-base.json"),
                          "base_server": base or None}}
json.dump(res, open(out, "w"), indent=1)
print("wrote", out)
EOF

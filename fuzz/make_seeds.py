#!/usr/bin/env python3
"""make_seeds.py - writes the seed corpora of fuzz/corpus/ (committed; rerun
after changing a harness's input format, then review the diff).

    python3 fuzz/make_seeds.py

Seeds are small valid and near-valid inputs: tiny checkpoints from
scripts/gen_checkpoint.py (run with /usr/bin/python3, which has numpy) in
every option family, the repository's config fixtures, the chat templates and
conversations of tests/server, and request bodies like those of
tests/server/test_api.py. The input format of each harness is described at
the top of its fuzz_NAME.c.
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(HERE, "corpus")
NUMPY_PY = "/usr/bin/python3"


def write(harness, name, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def st_file(header, data=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return f.read(n).rstrip(b" ")


# ---- tiny checkpoints: safetensors + config seeds -------------------------
TINY = ["--d", "8", "--layers", "2", "--pattern", "KG", "--heads", "1", "--head-dim", "8", "--ffn", "8",
        "--vocab", "16", "--gqa-heads", "1", "--gqa-kv-heads", "1", "--gqa-head-dim", "8", "--rope-dim", "4",
        "--tokenizer", "none"]
VARIANTS = {
    # name: (extra gen_checkpoint args, config harness flags byte)
    "fla": (["--preset", "tiny"], 0),
    "hf-interleaved-untied-f32": (["--preset", "tiny", "--scheme", "hf", "--gate", "interleaved", "--untied",
                                   "--dtype", "f32"], 4),
    "hf-builtin": (["--preset", "tiny", "--scheme", "hf"], 0),
    "options": (["--preset", "tiny", "--v-heads", "2", "--conv-bias", "--lower-bound", "-5", "--safe-gate",
                 "--neg-eigval", "--qkv-bias", "--window", "8", "--attnres", "2"], 0),
    "noconv-noqknorm-mixed-tools": (["--preset", "tiny", "--no-short-conv", "--no-qk-norm", "--dtype", "mixed",
                                     "--config-style", "tools"], 0),
    "llama-kda": (["--preset", "llama-tiny", "--mlp-bias", "--rope-type", "llama3", "--rope-factor", "8",
                   "--rope-low", "1", "--rope-high", "4", "--rope-orig", "64", "--rope-dim", "8"], 0),
    "llama-kda-linear": (["--preset", "llama-tiny", "--rope-type", "linear", "--rope-factor", "2", "--rope-dim", "8"], 0),
}


def checkpoints():
    tmp = tempfile.mkdtemp()
    try:
        for name, (extra, flags) in VARIANTS.items():
            out = os.path.join(tmp, name)
            r = subprocess.run([NUMPY_PY, os.path.join(ROOT, "scripts", "gen_checkpoint.py"), out] + TINY + extra,
                               capture_output=True, text=True)
            if r.returncode:
                print(f"skip {name}: {r.stderr.strip().splitlines()[-1]}", file=sys.stderr)
                continue
            with open(os.path.join(out, "model.safetensors"), "rb") as f:
                write("safetensors", f"tiny-{name}.safetensors", f.read())
            with open(os.path.join(out, "config.json"), "rb") as f:
                config = f.read()
            header = read_header(os.path.join(out, "model.safetensors"))
            write("config", f"tiny-{name}", bytes([flags]) + config + b"\0" + header)
    finally:
        shutil.rmtree(tmp)


def safetensors_edges():
    dtypes = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
              "I64", "U64"]
    size = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for i, dt in enumerate(dtypes):
        n = size[dt] * 2
        hdr[f"t.{i}"] = {"dtype": dt, "shape": [2], "data_offsets": [off, off + n]}
        off += n
    write("safetensors", "every-dtype", st_file(hdr, bytes(range(off))))
    write("safetensors", "empty-object", st_file({}))
    write("safetensors", "metadata-only", st_file({"__metadata__": {"a": "b"}}))
    write("safetensors", "scalar-and-empty", st_file({
        "s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "e": {"dtype": "BF16", "shape": [0, 5], "data_offsets": [4, 4]},
        "z": {"dtype": "I64", "shape": [1, 1, 1, 1, 1, 1, 1, 1], "data_offsets": [4, 12]}}, bytes(12)))
    write("safetensors", "near-hole", st_file({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}},
                                              bytes(3)))
    write("safetensors", "near-overlap", st_file({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                                  "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}},
                                                 bytes(3)))
    write("safetensors", "near-duplicate", b"\x40\0\0\0\0\0\0\0" +
          b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}'[:64]
          + b"\0\0")
    write("safetensors", "short", b"\x10\0\0\0")


def config_fixtures():
    paths = [os.path.join(ROOT, "models", "demo", "config.json")]
    paths += sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "configs", "*.json")))
    paths += sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "fla", "*", "config.json")))
    paths += [os.path.join(ROOT, "configs", "dm-kdagqa-1.7b.json")]
    for p in paths:
        if not os.path.exists(p):
            continue
        name = os.path.relpath(p, ROOT).replace("/", "_").replace(".json", "")
        with open(p, "rb") as f:
            write("config", name, b"\0" + f.read() + b"\0{}")
    bq = os.path.join(ROOT, "tests", "fixtures", "configmap", "bqalm-config.json")
    with open(bq, "rb") as f:
        text = f.read()
    write("config", "bqalm-folder", b"\x01" + text + b"\0{}")
    write("config", "bqalm-file", b"\x02" + text + b"\0{}")
    write("config", "near-eos-list", b"\0" + b'{"model_type":"kda","hidden_size":8,"num_hidden_layers":1,'
          b'"num_heads":1,"head_dim":8,"intermediate_size":8,"vocab_size":16,"eos_token_id":[2,3]}\0{}')


def st_index():
    # the shards fuzz_st_index.c writes: a (x, y), b (z), dup (x), sub/a (w)
    good = {"metadata": {"total_size": 12}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors",
                                                          "z": "b.safetensors"}}
    write("st_index", "two-shards", json.dumps(good))
    write("st_index", "one-shard", json.dumps({"weight_map": {"z": "b.safetensors"}}))
    write("st_index", "near-duplicate-across-shards", json.dumps({"weight_map": {"x": "a.safetensors",
                                                                                 "w": "dup.safetensors"}}))
    write("st_index", "near-wrong-shard", json.dumps({"weight_map": {"x": "b.safetensors", "z": "b.safetensors"}}))
    write("st_index", "near-subdir", json.dumps({"weight_map": {"w": "sub/a.safetensors"}}))
    write("st_index", "near-traversal", json.dumps({"weight_map": {"x": "../a.safetensors"}}))
    write("st_index", "near-missing", json.dumps({"weight_map": {"q": "c.safetensors"}}))


# ---- request bodies ------------------------------------------------------
ROUTES = {"generate": 0, "score": 1, "completions": 2, "chat": 3, "tokenize": 4, "detokenize": 5}
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
REQUESTS = [
    ("generate", {"prompt": "ROMEO:", "max_tokens": 8, "temperature": 0.8, "stream": True}),
    ("generate", {"tokens": [1, 65, 66], "max_tokens": 4, "logprobs": 3, "seed": 42, "add_bos": True}),
    ("generate", {"prompt": "a", "max_tokens": 5, "stop": ["\n", "xy"], "top_k": -1, "top_p": 0.9, "min_p": 0.05,
                  "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5, "ignore_eos": True,
                  "min_tokens": 2, "logit_bias": {"65": -100, "66": 5.5}, "cache_prompt": False}),
    ("generate", {"prompt": "x", "typical_p": 0.5}),
    ("generate", {"prompt": "x", "seed": 9007199254740991, "logprobs": True}),
    ("score", {"text": "To be, or not to be"}),
    ("score", {"tokens": [1, 2, 3, 4], "add_bos": False}),
    ("score", {"texts": ["ab", "cde", "<s>x</s>"], "model": "demo"}),
    ("completions", {"model": "demo", "prompt": "JULIET:", "max_tokens": 6, "n": 2, "logprobs": 2, "echo": True}),
    ("completions", {"prompt": ["a", "bc"], "max_tokens": 3, "stream": True,
                     "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("completions", {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 0, "echo": True, "logprobs": 1}),
    ("completions", {"prompt": [7, 8, 9], "max_tokens": 2, "best_of": 1, "user": "u", "seed": 3}),
    ("completions", {"prompt": "x", "suffix": "y"}),
    ("completions", {"prompt": "x", "model": "other"}),
    ("chat", {"model": "demo", "messages": MSGS, "max_tokens": 5, "logprobs": True, "top_logprobs": 2}),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
              "stream": True, "n": 2, "stream_options": {"include_usage": True}}),
    ("chat", {"messages": MSGS[:3], "continue_final_message": True, "add_generation_prompt": False,
              "max_completion_tokens": 4, "chat_template_kwargs": {"enable_thinking": False}}),
    ("chat", {"messages": MSGS[1:2], "tools": [{"type": "function", "function": {"name": "f"}}],
              "tool_choice": "none", "response_format": {"type": "text"}, "parallel_tool_calls": False}),
    ("chat", {"messages": [{"role": "assistant", "content": None, "tool_calls": []}], "add_special_tokens": True}),
    ("tokenize", {"prompt": "Hello <s> world</s>", "add_special_tokens": True, "return_token_strs": True}),
    ("tokenize", {"text": "abc", "add_bos": False, "with_pieces": True}),
    ("tokenize", {"messages": MSGS, "add_generation_prompt": True}),
    ("detokenize", {"tokens": [1, 72, 105, 2]}),
    ("detokenize", {"tokens": [0xE2, 0x96, 0x81, 200], "model": "demo"}),
]


def requests():
    k = 0
    for route, body in REQUESTS:
        text = json.dumps(body)
        # byte tokenizer + chatml, and SentencePiece + llama-2 (route + 6 + 12)
        for variant, opt in ((ROUTES[route], 0x00), (ROUTES[route] + 6 + 12, 0x0B)):
            write("api", f"{k:02d}-{route}-{variant}", bytes([variant, opt]) + text.encode())
        k += 1
    write("api", "near-trailing-garbage", bytes([4, 0]) + b'{"text":"ab"} xyz')
    write("api", "near-nul", bytes([1, 0]) + b'{"text":"a\\u0000bcdef"}')
    write("api", "near-not-object", bytes([0, 0]) + b"[1,2]")


# ---- chat templates -------------------------------------------------------
def templates():
    with open(os.path.join(ROOT, "tests", "server", "conversations.json")) as f:
        convs = json.load(f)
    for i, p in enumerate(sorted(glob.glob(os.path.join(ROOT, "tests", "server", "chat_templates", "*.jinja")))):
        with open(p, "rb") as f:
            src = f.read()
        conv = convs[i % len(convs)]
        vars_ = {"messages": conv["messages"], "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
        for k in ("tools", "extra"):
            if k in conv:
                vars_[k] = conv[k]
        name = os.path.basename(p).replace(".jinja", "")
        write("jinja", name, src + b"\0" + json.dumps(vars_).encode())
    write("jinja", "expr-mix", b"{% set ns = namespace(x=0) %}{% for m in messages if m.role != 'system' %}"
          b"{{ loop.index }}:{{ m.content | trim | upper }}{% if not loop.last %},{% endif %}"
          b"{% set ns.x = ns.x + 1 %}{% else %}none{% endfor %}{{ ns.x }}{{ [1,2,3][1:] | join('-') }}"
          b"{{ {'a': 1}.items() | list | tojson }}{{ 'x' ~ 3 * 2 }}{{ raise_exception('bad') if ns.x > 9 }}\0")
    write("jinja", "whitespace-control", b"  {%- if true -%}  a  {%+ endif %}{#- c -#}\n{{- 'b' -}}\n\0")


# ---- tokenizer --------------------------------------------------------------
def tokenizer():
    texts = [b"First Citizen:\nBefore we proceed any further, hear me speak.",
             "na\u00efve caf\u00e9 \u2014 \U0001F600 \u65e5\u672c\u8a9e".encode(),
             b"invalid \xff\xfe \xe2\x82 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 end",
             b"<s> control </s> <unk> <0x41>"]
    stops = [b"", b"\n", b"ea\x01me", b"\xe2\x80\x94\x01\xf0\x9f"]
    k = 0
    for mode in (0, 1, 3, 0x1d):
        for i, t in enumerate(texts):
            write("tokenizer", f"{k:02d}-mode{mode:02x}", bytes([mode]) + stops[i] + b"\0" + t)
            k += 1


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    checkpoints()
    safetensors_edges()
    st_index()
    config_fixtures()
    requests()
    templates()
    tokenizer()
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(CORPUS, "*", "*")))
    print(f"wrote {CORPUS}: {total:,} bytes")


if __name__ == "__main__":
    main()

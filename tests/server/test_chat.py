"""/v1/chat/completions through the official openai client, and where chat
templates come from.

The prompt the server builds is checked against an independent rendering:
Python's Jinja2 renders the same template (tests/server/chat_templates/), and
the server's greedy chat reply must equal its /v1/completions reply to that
text. With the Llama-2 SentencePiece tokenizer, the chat prompt's ids must be
what Hugging Face gives (<s> read as the BOS id, then "[INST]" as
518, 25580, 29962), checked with Python's sentencepiece on each text piece."""
import json
import os
import shutil
import subprocess
import sys

import requests

sys.path.insert(0, os.path.dirname(__file__))
from fixture import SERVER, Server, check, finish, make_checkpoint, shared_dir, sse_events  # noqa: E402

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    jinja2 = None
try:
    import openai
except ImportError:
    openai = None

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "chat_templates")


def render(name, messages, add_generation_prompt=True, bos="", eos=""):
    """The reference rendering: Jinja2 as transformers configures it."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(open(os.path.join(TEMPLATES, name + ".jinja")).read()).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)


def err(r, status, param=None, *words):
    try:
        e = r.json()["error"]
    except Exception:
        return False
    return r.status_code == status and (param is None or e.get("param") == param) and all(w in e["message"] for w in words)


model = make_checkpoint("tiny-long", "--preset", "tiny", "--tokenizer", "bytes", "--max-pos", "4096")
name = os.path.basename(model)
conv = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]

# ---- no template, no flag: a 400 that says what to do ----
with Server(model) as s:
    r = requests.post(s.url + "/v1/chat/completions", json={"messages": conv, "max_tokens": 2})
    check(err(r, 400, None, "no chat template", "--chat-template"), "no template and no --chat-template -> 400 saying so",
          r.text)
    check(requests.get(s.url + "/tokenizer_info").json()["chat_template"] is None, "/tokenizer_info: chat_template null")
    s.check_clean_exit("server without a template exits 0")

r = subprocess.run([SERVER, "--model", model, "--port", "0", "--chat-template", "/no/such.jinja"], capture_output=True,
                   text=True, timeout=60)
check(r.returncode != 0 and "--chat-template" in r.stderr and "llama-2" in r.stderr,
      "--chat-template naming neither a file nor a built-in: startup fails naming the flag and the built-ins",
      r.stderr[-300:])

with Server(model, "--chat-template", "plain") as s:
    U = s.url
    info = requests.get(U + "/tokenizer_info").json()
    check(info["chat_template"] == open(os.path.join(TEMPLATES, "plain.jinja")).read(),
          "--chat-template plain serves the built-in (= chat_templates/plain.jinja)")
    if jinja2 and openai:
        client = openai.OpenAI(base_url=U + "/v1", api_key="unused")
        prompt = render("plain", conv)
        ref = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0,
                                        extra_body={"ignore_eos": True}, logprobs=2)
        chat = client.chat.completions.create(model=name, messages=conv, max_tokens=24, temperature=0,
                                              logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
        c = chat.choices[0]
        check(c.message.role == "assistant" and c.message.content == ref.choices[0].text and c.finish_reason == "length",
              "greedy chat reply equals /v1/completions on the Jinja2-rendered prompt",
              f"{c.message.content!r} vs {ref.choices[0].text!r}")
        check(chat.object == "chat.completion" and chat.id.startswith("chatcmpl-") and chat.model == name, "chat envelope")
        check(chat.usage.prompt_tokens == len(prompt.encode()) and chat.usage.completion_tokens == 24 and
              chat.usage.total_tokens == len(prompt.encode()) + 24, "chat usage counts the rendered prompt's tokens")
        lps = c.logprobs.content
        check(len(lps) == 24 and all(abs(a.logprob - b) < 1e-6 for a, b in zip(lps, ref.choices[0].logprobs.token_logprobs)),
              "chat logprobs equal the completion's for the same ids")
        check(all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob and
                  abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6 and t.bytes == list(t.token.encode("utf-8"))
                  if "\ufffd" not in t.token else len(t.bytes) == 1 for t in lps),
              "greedy top_logprobs: sorted, the chosen token first; bytes are the token's bytes")
        # streaming
        st = client.chat.completions.create(model=name, messages=conv, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        parts = list(st)
        check(parts[0].choices[0].delta.role == "assistant" and parts[0].object == "chat.completion.chunk",
              "stream: the first chunk carries the role")
        text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
        fins = [p.choices[0].finish_reason for p in parts if p.choices]
        check(text == c.message.content and fins[-1] == "length" and all(f is None for f in fins[:-1]),
              "stream: deltas concatenate to the reply; only the last choice chunk has a finish_reason")
        check(parts[-1].choices == [] and parts[-1].usage.completion_tokens == 24 and
              all(p.usage is None for p in parts[:-1]), "stream: include_usage gives a final usage chunk, null before")
        # n and seeds
        n2 = client.chat.completions.create(model=name, messages=conv, max_tokens=12, temperature=1.0, n=2, seed=41,
                                            extra_body={"ignore_eos": True})
        one = client.chat.completions.create(model=name, messages=conv, max_tokens=12, temperature=1.0, seed=42,
                                             extra_body={"ignore_eos": True})
        check([x.index for x in n2.choices] == [0, 1] and n2.choices[1].message.content == one.choices[0].message.content,
              "n=2: choice j draws with seed + j")
        st = client.chat.completions.create(model=name, messages=conv, max_tokens=12, temperature=1.0, n=2, seed=41,
                                            stream=True, extra_body={"ignore_eos": True})
        by = {0: "", 1: ""}
        for p in st:
            for ch in p.choices:
                by[ch.index] += ch.delta.content or ""
        check(by[0] == n2.choices[0].message.content and by[1] == n2.choices[1].message.content,
              "n=2 streamed: each choice's deltas equal the non-streamed choice")
        mct = client.chat.completions.create(model=name, messages=conv, max_completion_tokens=5, temperature=0,
                                             extra_body={"ignore_eos": True})
        check(mct.usage.completion_tokens == 5, "max_completion_tokens is honoured")
        # errors through the client
        for what, kw, param in [("messages missing", {"messages": []}, "messages"),
                                ("image part", {"messages": [{"role": "user", "content": [
                                    {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "messages"),
                                ("tools with tool_choice auto", {"messages": conv, "tools": [{"type": "function",
                                 "function": {"name": "f", "parameters": {}}}], "tool_choice": "auto"}, "tool_choice"),
                                ("json response_format", {"messages": conv, "response_format": {"type": "json_object"}},
                                 "response_format"),
                                ("top_logprobs without logprobs", {"messages": conv, "top_logprobs": 2}, "top_logprobs"),
                                ("unknown sampling field", {"messages": conv, "extra_body": {"mirostat": 2}}, "mirostat")]:
            try:
                client.chat.completions.create(model=name, max_tokens=2, **kw)
                check(False, f"chat {what} -> 400")
            except openai.BadRequestError as e:
                check(e.body.get("param") == param, f"chat {what} -> 400 with param {param}", str(e.body))
        parts = client.chat.completions.create(model=name, max_tokens=3, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Name a"}, {"type": "text", "text": "colour."}]}])
        ref = client.chat.completions.create(model=name, max_tokens=3, temperature=0,
                                             messages=[{"role": "user", "content": "Name a\ncolour."}])
        check(parts.choices[0].message.content == ref.choices[0].message.content and
              parts.usage.prompt_tokens == ref.usage.prompt_tokens, "text content parts are joined by newlines")
        r = requests.post(U + "/v1/chat/completions", json={"messages": [{"role": "tool", "content": "x"}], "max_tokens": 2})
        check(err(r, 400, "messages", "the plain template knows the roles"), "raise_exception in the template -> 400 with its message")
        cont = requests.post(U + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"},
                                                                 {"role": "assistant", "content": "Hel"}],
                                                    "continue_final_message": True, "add_generation_prompt": False}).json()
        want = render("plain", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}], False)
        want = want[:want.rindex("Hel") + 3]
        check(cont["tokens"] == list(want.encode()), "continue_final_message ends the prompt inside the last message")
    s.check_clean_exit("chat server exits 0")

# ---- Llama-2's SentencePiece tokenizer, template from the model directory ----
shared = shared_dir()
spm = shared and os.path.join(shared, "data", "llama2-tokenizer.model")
if not spm or not os.path.exists(spm) or not jinja2:
    print("SKIP SentencePiece chat checks: no shared/data/llama2-tokenizer.model or no jinja2")
    finish()
spm_model = make_checkpoint("tiny-spm", "--preset", "tiny", "--vocab", "32000", "--tokenizer", "spm:" + spm)
llama2 = open(os.path.join(TEMPLATES, "llama-2.jinja")).read()
with open(os.path.join(spm_model, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": False}, "chat_template": llama2}, f)


def sp_reference(text):
    """HF's ids for rendered text: <s>/</s> are the control ids, each piece
    between them is encoded on its own (Python's sentencepiece, which adds the
    word-start marker, as the legacy Llama tokenizer does)."""
    code = ("import json,re,sys,sentencepiece as s; sp=s.SentencePieceProcessor(model_file=sys.argv[1]); out=[]\n"
            "for part in re.split(r'(<s>|</s>)', sys.stdin.read()):\n"
            "    out += [1] if part == '<s>' else [2] if part == '</s>' else sp.encode(part) if part else []\n"
            "print(json.dumps(out))")
    r = subprocess.run(["/usr/bin/python3", "-c", code, spm], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Who are you?"}]
with Server(spm_model) as s:
    U = s.url
    check("chat template: " + os.path.join(spm_model, "tokenizer_config.json") in s.log(),
          "the template comes from the model's tokenizer_config.json", s.log()[-500:])
    info = requests.get(U + "/tokenizer_info").json()
    check(info["chat_template"] == llama2 and info["bos_token"] == "<s>" and info["eos_token"] == "</s>" and
          info["bos_token_id"] == 1 and info["eos_token_id"] == 2, "/tokenizer_info: template and special tokens", str(info))
    toks = requests.post(U + "/tokenize", json={"messages": msgs}).json()["tokens"]
    text = render("llama-2", msgs, bos="<s>", eos="</s>")
    ref = sp_reference(text)
    check(toks == ref and toks[:4] == [1, 518, 25580, 29962] and toks.count(1) == 2 and toks.count(2) == 1,
          "chat prompt ids equal Hugging Face's: <s> and </s> are the control ids, [INST] is 518 25580 29962",
          f"{toks[:12]} vs {ref[:12]}")
    r = requests.post(U + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 3, "temperature": 0}).json()
    check(r["usage"]["prompt_tokens"] == len(ref), "chat usage counts the ids of the rendered prompt")
    r = requests.post(U + "/tokenize", json={"prompt": "</s>", "add_special_tokens": False}).json()
    check(r["tokens"] == [2], "the eos_token string tokenizes to the EOS id (lm-eval's remote tokenizer relies on it)")
    run = "ab" + "</s>" * 5 + "<s><s>" + "cd" + "</s><s>" * 20
    r = requests.post(U + "/tokenize", json={"prompt": run, "add_special_tokens": False}).json()
    check(r["tokens"] == sp_reference(run), "runs of special-token strings with no text between them are one id each",
          f"{r['tokens'][:16]}")
    r = requests.post(U + "/tokenize", json={"prompt": "hi", "add_special_tokens": True}).json()
    r2 = requests.post(U + "/tokenize", json={"prompt": "hi", "add_special_tokens": False}).json()
    check(r["tokens"] == [1] + r2["tokens"] and r2["tokens"] == sp_reference("hi"),
          "add_special_tokens adds BOS; without it the text's own ids")
    r = requests.post(U + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"},
                                                                     {"role": "user", "content": "b"}], "max_tokens": 2})
    check(err(r, 400, "messages", "Conversation roles must alternate"), "Llama-2's raise_exception -> 400 with its message")
    r = requests.post(U + "/generate", json={"prompt": "", "add_bos": False})
    check(err(r, 400, "prompt") and "add_bos" in r.json()["error"]["message"],
          "empty prompt with add_bos false on a BOS model suggests add_bos", r.text)
    s.check_clean_exit("SentencePiece chat server exits 0")

shutil.copy(os.path.join(TEMPLATES, "chatml.jinja"), os.path.join(spm_model, "chat_template.jinja"))
with Server(spm_model) as s:
    check(requests.get(s.url + "/tokenizer_info").json()["chat_template"] == open(os.path.join(TEMPLATES, "chatml.jinja")).read(),
          "chat_template.jinja in the model directory wins over tokenizer_config.json")
    s.stop()
with Server(spm_model, "--chat-template", "plain") as s:
    check(requests.get(s.url + "/tokenizer_info").json()["chat_template"] == open(os.path.join(TEMPLATES, "plain.jinja")).read(),
          "--chat-template wins over the model directory")
    s.stop()
finish()

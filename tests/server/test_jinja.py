"""server/jinja.c against Python's Jinja2 on real chat templates.

Each template in chat_templates/ (the models' own, as published in their
tokenizer_config.json, plus the server's built-ins and a feature sweep) is
rendered with every conversation of conversations.json, with and without the
generation prompt, by Jinja2 configured exactly as transformers'
apply_chat_template configures it, and by the C engine (tests/server/
jinja_render). The outputs must be byte-identical, and where Jinja2 raises
(raise_exception or an error) the C engine must fail too, with the same
message for raise_exception."""
import glob
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

sys.path.insert(0, os.path.dirname(__file__))
from fixture import BUILD, SKIP, check, finish  # noqa: E402

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: Python's jinja2 is missing (pip install jinja2)")
    sys.exit(SKIP)

RENDER = os.path.join(BUILD, "tests", "server", "jinja_render")
HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.exists(RENDER):
    print("SKIP: jinja_render not built")
    sys.exit(SKIP)


def hf_environment():
    """transformers.utils.chat_template_utils._compile_jinja_template's setup."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


env = hf_environment()
conversations = json.load(open(os.path.join(HERE, "conversations.json")))
templates = sorted(glob.glob(os.path.join(HERE, "chat_templates", "*.jinja")))
check(len(templates) >= 12, "the template corpus is there", str(templates))
tmp = tempfile.mkdtemp(prefix="kda-jinja-")
n_same = n_raised = 0
for path in templates:
    name = os.path.basename(path)
    src = open(path, encoding="utf-8").read()
    tpl = env.from_string(src)
    for conv in conversations:
        for agp in (True, False):
            for specials in (("<s>", "</s>"), ("", "")):
                vars = {"messages": conv["messages"], "add_generation_prompt": agp, "bos_token": specials[0],
                        "eos_token": specials[1]}
                if "tools" in conv:
                    vars["tools"] = conv["tools"]
                label = f"{name} / {conv['name']} / agp={agp} / bos={specials[0]!r}"
                try:
                    want, want_err = tpl.render(**vars), None
                except Exception as e:  # noqa: BLE001 - any Jinja2 failure is an expected failure
                    want, want_err = None, e
                vpath = os.path.join(tmp, "vars.json")
                with open(vpath, "w", encoding="utf-8") as f:
                    json.dump(vars, f, ensure_ascii=False)
                r = subprocess.run([RENDER, path, vpath], capture_output=True, timeout=30)
                if want_err is None:
                    ok = r.returncode == 0 and r.stdout.decode("utf-8") == want
                    n_same += ok
                    if not ok:
                        check(False, label, f"rc={r.returncode} err={r.stderr.decode()[:300]}\n--- jinja2:\n{want!r}\n"
                                            f"--- C:\n{r.stdout.decode('utf-8', 'replace')!r}")
                else:
                    raised = isinstance(want_err, jinja2.exceptions.TemplateError) and \
                        not isinstance(want_err, (jinja2.exceptions.UndefinedError, jinja2.exceptions.TemplateSyntaxError))
                    msg = r.stderr.decode().strip()
                    ok = r.returncode == (2 if raised else 1) and (not raised or msg == str(want_err))
                    n_raised += ok
                    if not ok:
                        check(False, label + " fails as Jinja2 does",
                              f"jinja2: {type(want_err).__name__}: {want_err}; C rc={r.returncode}: {msg[:300]}")
n_cases = len(templates) * len(conversations) * 4
check(n_same + n_raised == n_cases, f"{n_cases} renderings byte-identical to Jinja2 ({n_same} texts, {n_raised} errors)")
check(n_same > n_cases // 2, "most renderings produce text (the corpus exercises the templates, not only errors)")

# Errors the C engine must report rather than mis-render.
bad = {"{% macro m() %}x{% endmacro %}": "not supported", "{{ 'unterminated }}": "unterminated",
       "{% if x %}no end": "endif", "{{ a.b }}": "undefined", "{{ 1 / 0 }}": "division by zero",
       "{% for i in range(100000000) %}{% endfor %}": "steps", "{{ 'x' * 100000000 }}": "steps",
       # a string grown in a loop: quadratic copying, stopped by the memory bound
       "{% set ns = namespace(s='') %}{% for i in range(200000) %}{% set ns.s = ns.s + 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' %}"
       "{% endfor %}{{ ns.s | length }}": "MiB"}
for src, word in bad.items():
    p = os.path.join(tmp, "bad.jinja")
    with open(p, "w") as f:
        f.write(src)
    with open(os.path.join(tmp, "v.json"), "w") as f:
        f.write("{}")
    r = subprocess.run([RENDER, p, os.path.join(tmp, "v.json")], capture_output=True, timeout=60)
    check(r.returncode == 1 and word in r.stderr.decode(), f"{src!r} fails with a message naming {word!r}",
          r.stderr.decode()[:200])
finish()

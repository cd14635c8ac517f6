/*
 * jinja.h - the subset of Jinja2 that Hugging Face chat templates use, in C.
 *
 * Semantics are those of transformers' apply_chat_template environment:
 * jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True) with the loopcontrols extension, raise_exception(),
 * strftime_now() and HF's tojson (json.dumps, ensure_ascii=False).
 * tests/server/test_jinja.py renders real templates with Python's Jinja2 and
 * with this code and compares the bytes.
 *
 * Supported: {{ }}, {% if/elif/else %}, {% for x[, y] in ... [if ...] %}
 * with loop.* and {% else %}, {% set %} (also ns.attr and block set),
 * {% break %}/{% continue %}, {# #}, whitespace control (- and +);
 * literals, lists, dicts, tuples, attribute/item access, slices, calls,
 * filters, tests, "x if c else y", Python operators and string/dict
 * methods. Not supported (a parse error names it): macros, call blocks,
 * includes, extends, filter blocks, raw blocks.
 *
 * A template is immutable after parsing and may be rendered from many
 * threads at once. Rendering is bounded (output size, loop iterations,
 * nesting), so a hostile conversation cannot make it run away.
 */
#ifndef SRV_JINJA_H
#define SRV_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct jinja_template jinja_template;

/* 0, or -1 with a message naming the line. */
int jinja_parse(const char *src, size_t len, jinja_template **out, char *err, size_t errlen);
void jinja_free(jinja_template *t);

/* Renders with the members of vars (a JSON object) as the template's
 * variables. *out is malloc'd, NUL-terminated. Returns 0, or -1 with err
 * filled; a raise_exception() in the template returns -2 with its message. */
int jinja_render(const jinja_template *t, const cJSON *vars, char **out, size_t *out_len, char *err,
                 size_t errlen);

#endif

/*
 * chat.h - chat templates: messages -> prompt text.
 *
 * A template comes from, in this order: --chat-template (a built-in name or
 * a Jinja file), the model directory's chat_template.jinja, or the
 * "chat_template" of its tokenizer_config.json. Built-in formats are Jinja
 * sources rendered by the same engine (jinja.h):
 *   llama-2  [INST] ... [/INST] with <<SYS>> (Llama-2-chat's own template)
 *   chatml   <|im_start|>role\n...<|im_end|>
 *   plain    "User: ...\nAssistant: ..." transcript
 * Immutable after load; rendering is thread-safe.
 */
#ifndef SRV_CHAT_H
#define SRV_CHAT_H

#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct chat_template chat_template;

/* Special-token strings a template refers to (bos_token, eos_token), as
 * tokenizer_config.json names them; "" when it does not exist. */
typedef struct { char bos[64], eos[64]; } chat_specials;

/* flag: NULL, a built-in name or a file. *out is NULL when no template is
 * found (chat requests then get a 400); -1 with err for a template that is
 * named but cannot be read or parsed. specials (may be NULL) receives the
 * token strings of tokenizer_config.json, when it names them. */
int chat_template_load(const char *flag, const char *model_dir, chat_template **out, chat_specials *specials,
                       char *err, size_t errlen);
void chat_template_free(chat_template *t);
const char *chat_template_name(const chat_template *t);     /* "llama-2", a path, ... */
const char *chat_template_source(const chat_template *t);   /* the Jinja text */
const char *chat_builtin_names(void);                        /* "llama-2, chatml, plain" */

/* Renders messages (a JSON array of {role, content, ...}; content already a
 * string or null) to *out (malloc'd). extra: more template variables (the
 * request's chat_template_kwargs) or NULL. continue_final: the prompt ends
 * inside the last (assistant) message instead of after it. Returns 0, -1 on
 * a template error, -2 when the template raised an exception (its message
 * in err: a bad conversation, the client's fault). */
int chat_render(const chat_template *t, const cJSON *messages, int add_generation_prompt, int continue_final,
                const cJSON *extra, const chat_specials *sp, char **out, char *err, size_t errlen);

#endif

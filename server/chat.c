/* chat.c - see chat.h. */
#include "chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "kda_file.h"

struct chat_template {
    char name[512];
    char *source;
    jinja_template *jt;
};

/* Llama-2-chat's template as published with meta-llama/Llama-2-7b-chat-hf. */
static const char llama2_src[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

static const char chatml_src[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* For base models with no chat training (the demo model): a transcript the
 * model can continue. */
static const char plain_src[] =
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + '\\n' }}"
    "{% else %}{{ raise_exception('the plain template knows the roles system, user and assistant, not ' + message['role']) }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

static const struct { const char *name; const char *src; } builtins[] = {
    {"llama-2", llama2_src}, {"chatml", chatml_src}, {"plain", plain_src},
};

const char *chat_builtin_names(void) { return "llama-2, chatml, plain"; }

/* A template or tokenizer_config.json: a regular file under the tokenizer
 * cap (kda_file.h), so a FIFO or /dev/zero in the model directory is an
 * error naming it rather than a hang or a read without end. */
static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    return kda_file_read(path, KDA_MAX_TOKENIZER_BYTES, len, err, errlen);
}

static int make(chat_template **out, const char *name, const char *src, size_t len, char *err, size_t errlen)
{
    chat_template *t = calloc(1, sizeof *t);
    if (!t) { snprintf(err, errlen, "out of memory"); return -1; }
    snprintf(t->name, sizeof t->name, "%s", name);
    t->source = malloc(len + 1);
    if (!t->source) { free(t); snprintf(err, errlen, "out of memory"); return -1; }
    memcpy(t->source, src, len);
    t->source[len] = '\0';
    char jerr[400];
    if (jinja_parse(t->source, len, &t->jt, jerr, sizeof jerr)) {
        snprintf(err, errlen, "chat template %s: %s", name, jerr);
        chat_template_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

/* A tokenizer_config.json token is a string or an AddedToken {"content": ...}. */
static void token_string(const cJSON *cfg, const char *key, char *out, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (cJSON_IsString(v) && strlen(v->valuestring) < cap) snprintf(out, cap, "%s", v->valuestring);
}

int chat_template_load(const char *flag, const char *model_dir, chat_template **out, chat_specials *sp, char *err,
                       size_t errlen)
{
    *out = NULL;
    char path[4096];
    size_t len = 0;
    cJSON *cfg = NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    char *cfg_text = read_file(path, &len, err, errlen);
    if (!cfg_text && errno != ENOENT) return -1;   /* there but unreadable: a setup error naming it */
    if (cfg_text) {
        cfg = cJSON_ParseWithLength(cfg_text, len);
        free(cfg_text);
        if (!cJSON_IsObject(cfg)) {
            snprintf(err, errlen, "%s is not a JSON object", path);
            cJSON_Delete(cfg);
            return -1;
        }
        if (sp) {
            token_string(cfg, "bos_token", sp->bos, sizeof sp->bos);
            token_string(cfg, "eos_token", sp->eos, sizeof sp->eos);
        }
    }
    int rc = 0;
    if (flag) {
        for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
            if (!strcmp(flag, builtins[i].name)) {
                rc = make(out, builtins[i].name, builtins[i].src, strlen(builtins[i].src), err, errlen);
                goto done;
            }
        char *src = read_file(flag, &len, err, errlen);
        if (!src) {
            char why[400];
            snprintf(why, sizeof why, "%s", err);
            snprintf(err, errlen, "--chat-template: %s (not a file, nor a built-in name: %s)", why, chat_builtin_names());
            rc = -1;
            goto done;
        }
        rc = make(out, flag, src, len, err, errlen);
        free(src);
        goto done;
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
    char *src = read_file(path, &len, err, errlen);
    if (!src && errno != ENOENT) { rc = -1; goto done; }
    if (src) {
        rc = make(out, path, src, len, err, errlen);
        free(src);
        goto done;
    }
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (cJSON_IsArray(ct)) {   /* [{"name": "default", "template": ...}, ...] */
        const cJSON *it, *pick = NULL;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            if (!pick || (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default"))) pick = it;
        }
        ct = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
    }
    if (cJSON_IsString(ct)) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
        rc = make(out, path, ct->valuestring, strlen(ct->valuestring), err, errlen);
    }
done:
    cJSON_Delete(cfg);
    if (rc == 0) err[0] = '\0';
    return rc;
}

void chat_template_free(chat_template *t)
{
    if (!t) return;
    jinja_free(t->jt);
    free(t->source);
    free(t);
}

const char *chat_template_name(const chat_template *t) { return t->name; }
const char *chat_template_source(const chat_template *t) { return t->source; }

/* HF's continue_final_message: cut the rendering right after the final
 * message's content (its stripped text, last occurrence). */
static int cut_after_final(char *text, const cJSON *messages, char *err, size_t errlen)
{
    const cJSON *last = cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(last, "content");
    if (!cJSON_IsString(content)) { snprintf(err, errlen, "the final message has no text to continue"); return -1; }
    const char *s = content->valuestring;
    size_t n = strlen(s);
    while (n && strchr(" \t\n\r", s[n - 1])) n--;
    while (n && strchr(" \t\n\r", *s)) { s++; n--; }
    if (!n) return 0;
    char *needle = strndup(s, n), *found = NULL;
    if (!needle) { snprintf(err, errlen, "out of memory"); return -1; }
    for (char *p = text; (p = strstr(p, needle)); p++) found = p;
    free(needle);
    if (!found) {
        snprintf(err, errlen, "continue_final_message: the template does not reproduce the final message's text");
        return -1;
    }
    found[n] = '\0';
    return 0;
}

int chat_render(const chat_template *t, const cJSON *messages, int add_generation_prompt, int continue_final,
                const cJSON *extra, const chat_specials *sp, char **out, char *err, size_t errlen)
{
    *out = NULL;
    cJSON *vars = cJSON_CreateObject();
    if (!vars) { snprintf(err, errlen, "out of memory"); return -1; }
    if (extra) {
        const cJSON *it;
        cJSON_ArrayForEach(it, extra) cJSON_AddItemToObject(vars, it->string, cJSON_Duplicate(it, 1));
    }
    /* the server's own values win over chat_template_kwargs of the same name */
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "messages");
    cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(messages, 1));
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "add_generation_prompt");
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt);
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "bos_token");
    cJSON_AddStringToObject(vars, "bos_token", sp ? sp->bos : "");
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "eos_token");
    cJSON_AddStringToObject(vars, "eos_token", sp ? sp->eos : "");
    size_t len = 0;
    int rc = jinja_render(t->jt, vars, out, &len, err, errlen);
    cJSON_Delete(vars);
    if (rc) return rc;
    if (continue_final && cut_after_final(*out, messages, err, errlen)) {
        free(*out);
        *out = NULL;
        return -2;
    }
    return 0;
}

/*
 * fuzz_jinja.c - the chat-template engine (server/jinja.c): parsing any
 * template source and rendering it with any variables.
 *
 * Input: the template source, a NUL byte, then the variables as a JSON
 * object (missing or invalid: a two-turn conversation with
 * add_generation_prompt and the Llama special tokens, what chat.c passes).
 * Checks: parse and render return 0 or an error with a message (-2 only from
 * raise_exception); output is NUL-terminated at its length and within the
 * engine's 4 MiB bound; a template renders the same text twice (it is
 * immutable and shared by all HTTP threads), unless it reads the clock.
 */
#include "fuzz_common.h"

#include <cjson/cJSON.h>

#include "jinja.h"

static const char default_vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
    "\"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}, {\"role\": \"user\", \"content\": \"More\"}], "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader r = {data, size};
    const uint8_t *sp;
    size_t sn = fz_until(&r, 0, &sp);
    char *src = fz_strndup(sp, sn);
    cJSON *vars = r.n ? cJSON_ParseWithLength((const char *)r.p, r.n) : NULL;
    if (!cJSON_IsObject(vars)) {
        cJSON_Delete(vars);
        vars = cJSON_Parse(default_vars);
    }
    jinja_template *t = NULL;
    char err[512] = "";
    int rc = jinja_parse(src, sn, &t, err, sizeof err);
    FZ_CHECK(rc == 0 || rc == -1, "jinja_parse returned %d", rc);
    if (rc) {
        FZ_CHECK(err[0], "parse error without a message");
    } else {
        char *out = NULL, *again = NULL;
        size_t len = 0, len2 = 0;
        err[0] = 0;
        rc = jinja_render(t, vars, &out, &len, err, sizeof err);
        FZ_CHECK(rc == 0 || rc == -1 || rc == -2, "jinja_render returned %d", rc);
        if (rc == 0) {
            FZ_CHECK(out && out[len] == 0, "output not terminated at its length %zu", len);
            FZ_CHECK(len <= (4u << 20), "output of %zu bytes past the 4 MiB bound", len);
            if (!strstr(src, "strftime")) {
                char err2[512] = "";
                int rc2 = jinja_render(t, vars, &again, &len2, err2, sizeof err2);
                FZ_CHECK(rc2 == 0 && len2 == len && !memcmp(out, again, len),
                         "second render differs (rc %d, %zu vs %zu bytes): %s", rc2, len2, len, err2);
            }
        } else {
            FZ_CHECK(err[0], "render error %d without a message", rc);
        }
        free(out);
        free(again);
        jinja_free(t);
    }
    cJSON_Delete(vars);
    free(src);
    return 0;
}

/*
 * jinja_render - test driver for server/jinja.c: renders a template file
 * with the variables of a JSON file and writes the text to stdout.
 *   jinja_render TEMPLATE VARS.json
 * Exit 0 ok; 2 raise_exception() (its message on stderr); 1 any other error.
 */
#include <stdio.h>
#include <stdlib.h>

#include "jinja.h"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[len] = '\0'; *n = (size_t)len; }
    return b;
}

int main(int argc, char **argv)
{
    if (argc != 3) { fprintf(stderr, "usage: jinja_render TEMPLATE VARS.json\n"); return 1; }
    size_t tn = 0, vn = 0;
    char *src = slurp(argv[1], &tn), *vars = slurp(argv[2], &vn), err[512];
    if (!src || !vars) { fprintf(stderr, "cannot read the inputs\n"); return 1; }
    cJSON *v = cJSON_ParseWithLength(vars, vn);
    jinja_template *t = NULL;
    if (!v || jinja_parse(src, tn, &t, err, sizeof err)) {
        fprintf(stderr, "%s\n", v ? err : "bad JSON");
        return 1;
    }
    char *out = NULL;
    size_t len = 0;
    int rc = jinja_render(t, v, &out, &len, err, sizeof err);
    if (rc) {
        fprintf(stderr, "%s\n", err);
    } else {
        fwrite(out, 1, len, stdout);
    }
    free(out);
    jinja_free(t);
    cJSON_Delete(v);
    free(src);
    free(vars);
    return rc == 0 ? 0 : rc == -2 ? 2 : 1;
}

/*
 * cli_tok.c - kda-cli tokenize / detokenize.
 *
 *   kda-cli tokenize   DIR --text "..." [--bos] [--pieces] [--json]
 *   kda-cli detokenize DIR --ids 1,2,3 [--json]
 *
 * DIR is a model directory (tokenizer.model, or config.json with
 * "tokenizer": "bytes"); --tokenizer PATH names a .model file (or a
 * directory) instead. Plain output: ids separated by spaces / the raw text,
 * then a newline. --json: {"ids":[...]} (plus "pieces" with --pieces) /
 * {"text":"..."}. Exit 0 ok, 1 failure, 2 bad usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "tokenizer.h"

typedef struct {
    const char *dir, *tokenizer, *text, *ids;
    int bos, json, pieces;
} tok_args;

void cli_tok_usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "tokenize"))
        fprintf(f, "usage: kda-cli tokenize DIR|--tokenizer PATH --text TEXT [--bos] [--pieces] [--json]\n");
    else
        fprintf(f, "usage: kda-cli detokenize DIR|--tokenizer PATH --ids 1,2,3 [--json]\n");
}

static int usage(const char *cmd) {
    cli_tok_usage(stderr, cmd);
    return 2;
}

static int parse_args(const char *cmd, int argc, char **argv, tok_args *a) {
    memset(a, 0, sizeof(*a));
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(s, "--text") && has_val) a->text = argv[++i];
        else if (!strcmp(s, "--ids") && has_val) a->ids = argv[++i];
        else if (!strcmp(s, "--tokenizer") && has_val) a->tokenizer = argv[++i];
        else if (!strcmp(s, "--bos")) a->bos = 1;
        else if (!strcmp(s, "--json")) a->json = 1;
        else if (!strcmp(s, "--pieces")) a->pieces = 1;
        else if (s[0] != '-' && !a->dir) a->dir = s;
        else {
            fprintf(stderr, "%s: unexpected argument '%s'\n", cmd, s);
            return -1;
        }
    }
    if (!a->dir && !a->tokenizer) {
        fprintf(stderr, "%s: need a model directory or --tokenizer PATH\n", cmd);
        return -1;
    }
    return 0;
}

static tok_tokenizer *open_tokenizer(const tok_args *a) {
    tok_tokenizer *t = NULL;
    char err[1024];
    int rc;
    struct stat st;
    if (a->tokenizer && !(stat(a->tokenizer, &st) == 0 && S_ISDIR(st.st_mode)))
        rc = tok_open_spm(&t, a->tokenizer, err, sizeof(err));
    else
        rc = tok_open_dir(&t, a->tokenizer ? a->tokenizer : a->dir, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    return t;
}

/* Prints a cJSON tree on one line; consumes it. */
static int print_json(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    puts(s);
    cJSON_free(s);
    return 0;
}

int cli_tokenize(int argc, char **argv) {
    tok_args a;
    if (parse_args("tokenize", argc, argv, &a) != 0) return usage("tokenize");
    if (!a.text || a.ids) return usage("tokenize");
    tok_tokenizer *t = open_tokenizer(&a);
    if (!t) return 1;
    int32_t *ids;
    int n;
    char err[512];
    if (tok_encode(t, a.text, strlen(a.text), a.bos, &ids, &n, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        tok_close(t);
        return 1;
    }
    int rc = 0;
    if (a.json) {
        cJSON *root = cJSON_CreateObject();
        cJSON *arr = cJSON_AddArrayToObject(root, "ids");
        cJSON *pieces = a.pieces ? cJSON_AddArrayToObject(root, "pieces") : NULL;
        for (int i = 0; i < n; i++) {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
            if (pieces) cJSON_AddItemToArray(pieces, cJSON_CreateString(tok_id_to_piece(t, ids[i])));
        }
        rc = print_json(root);
    } else {
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        putchar('\n');
        if (a.pieces) {
            for (int i = 0; i < n; i++) printf(i ? " %s" : "%s", tok_id_to_piece(t, ids[i]));
            putchar('\n');
        }
    }
    free(ids);
    tok_close(t);
    return rc;
}

/* "1,2,3" or "1 2 3" -> malloc'd ids; -1 with a message on anything else. */
static int parse_ids(const char *s, int32_t **out, int *n_out) {
    size_t cap = strlen(s) / 2 + 1;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    int n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
            (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            fprintf(stderr, "detokenize: --ids: not an integer list near '%.20s'\n", p);
            free(ids);
            return -1;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

int cli_detokenize(int argc, char **argv) {
    tok_args a;
    if (parse_args("detokenize", argc, argv, &a) != 0) return usage("detokenize");
    if (!a.ids || a.text) return usage("detokenize");
    int32_t *ids;
    int n;
    if (parse_ids(a.ids, &ids, &n) != 0) return 2;
    tok_tokenizer *t = open_tokenizer(&a);
    if (!t) { free(ids); return 1; }
    char *text, err[512];
    size_t len;
    int rc = 0;
    if (tok_decode_len(t, ids, n, &text, &len, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        rc = 1;
    } else if (a.json) {
        /* Decoded text is valid UTF-8 (tokenizer.h); a NUL byte would end the
         * JSON string early, as cJSON strings are C strings. */
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "text", text);
        rc = print_json(root);
        free(text);
    } else {
        fwrite(text, 1, len, stdout);
        putchar('\n');
        free(text);
    }
    free(ids);
    tok_close(t);
    return rc;
}

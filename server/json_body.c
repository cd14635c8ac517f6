/*
 * json_body.c - strict request bodies and exact integers (see json_body.h).
 *
 * The scanners below walk text cJSON has already parsed, so they only need
 * to find where each token ends, never to report syntax errors; they still
 * stop at the end of the buffer whatever the text holds.
 */
#include "json_body.h"

#include <stdio.h>
#include <string.h>

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* p at the opening quote; returns the position after the closing one and
 * sets *nul when the string decodes to something holding a NUL byte. */
static const char *skip_string(const char *p, const char *end, int *nul)
{
    for (p++; p < end; p++) {
        if (*p == '"') return p + 1;
        if (*p == '\0') *nul = 1;
        if (*p == '\\') {
            if (end - p >= 6 && p[1] == 'u' && !memcmp(p + 2, "0000", 4)) *nul = 1;
            p++;   /* the escaped character; \uXXXX's hex digits are plain characters */
        }
    }
    return end;
}

/* p at the first character of a value; returns the position after it. */
static const char *skip_value(const char *p, const char *end, int *nul)
{
    if (p < end && *p == '"') return skip_string(p, end, nul);
    if (p < end && (*p == '{' || *p == '[')) {
        int depth = 0;
        while (p < end) {
            if (*p == '"') { p = skip_string(p, end, nul); continue; }
            if (*p == '{' || *p == '[') depth++;
            else if (*p == '}' || *p == ']') depth--;
            p++;
            if (depth == 0) return p;
        }
        return end;
    }
    while (p < end && !strchr(",}] \t\r\n", *p)) p++;
    return p;
}

/* Calls fn for each top-level member of the object at the start of
 * [p, end) with its index and its key and value spans; stops early when fn
 * returns nonzero (and returns that). */
typedef int (*member_fn)(void *arg, int index, const char *key, const char *key_end, const char *val,
                         const char *val_end);
static int for_each_member(const char *p, const char *end, member_fn fn, void *arg)
{
    int nul_ignored = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '{') return 0;
    p++;
    for (int i = 0;; i++) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"') return 0;   /* '}' of an empty object */
        const char *key = p;
        p = skip_string(p, end, &nul_ignored);
        const char *key_end = p;
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return 0;
        p = skip_ws(p + 1, end);
        const char *val = p;
        p = skip_value(p, end, &nul_ignored);
        int rc = fn(arg, i, key, key_end, val, p);
        if (rc) return rc;
        p = skip_ws(p, end);
        if (p >= end || *p != ',') return 0;
        p++;
    }
}

typedef struct { int index; } nul_find;

static int find_nul(void *arg, int index, const char *key, const char *key_end, const char *val, const char *val_end)
{
    int nul = 0;
    skip_string(key, key_end, &nul);
    skip_value(val, val_end, &nul);
    if (!nul) return 0;
    ((nul_find *)arg)->index = index;
    return 1;
}

cJSON *json_body_parse(const char *body, size_t len, char *msg, size_t msglen, char *param, size_t paramlen)
{
    const char *end = body + len, *stop = NULL;
    param[0] = '\0';
    cJSON *o = cJSON_ParseWithLengthOpts(body, len, &stop, 0);
    if (!o) {
        long off = stop && stop >= body && stop <= end ? (long)(stop - body) : -1;
        snprintf(msg, msglen, "malformed JSON in the request body (near byte %ld)", off);
        return NULL;
    }
    const char *rest = skip_ws(stop, end);
    if (rest < end) {
        snprintf(msg, msglen, "the request body has data after its JSON value (at byte %ld)", (long)(rest - body));
        cJSON_Delete(o);
        return NULL;
    }
    if (!cJSON_IsObject(o)) {
        snprintf(msg, msglen, "the request body must be a JSON object");
        cJSON_Delete(o);
        return NULL;
    }
    nul_find f = {-1};
    if (for_each_member(body, end, find_nul, &f)) {
        const cJSON *m = o->child;
        for (int i = 0; m && i < f.index; i++) m = m->next;
        const char *name = m && m->string ? m->string : "";
        snprintf(param, paramlen, "%s", name);
        snprintf(msg, msglen, "\"%.60s\": strings must not contain NUL characters (\\u0000)", name);
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

typedef struct { int index; const char *p; size_t n; } member_find;

static int find_member(void *arg, int index, const char *key, const char *key_end, const char *val, const char *val_end)
{
    (void)key, (void)key_end;
    member_find *f = arg;
    if (index != f->index) return 0;
    f->p = val;
    f->n = (size_t)(val_end - val);
    return 1;
}

int json_body_member_text(const char *body, size_t len, const cJSON *o, const char *name, const char **p, size_t *n)
{
    int index = 0;
    const cJSON *m = o->child;
    while (m && !(m->string && !strcmp(m->string, name))) m = m->next, index++;
    if (!m) return -1;
    member_find f = {index, NULL, 0};
    if (!for_each_member(body, body + len, find_member, &f)) return -1;
    *p = f.p;
    *n = f.n;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int json_exact_int64(const char *s, size_t n, int64_t *v)
{
    const char *p = s, *end = s + n;
    int neg = p < end && *p == '-';
    p += neg;
    const char *ip = p;
    while (p < end && is_digit(*p)) p++;
    size_t ni = (size_t)(p - ip), nf = 0;
    if (!ni) return -1;
    const char *fp = p;
    if (p < end && *p == '.') {
        fp = ++p;
        while (p < end && is_digit(*p)) p++;
        nf = (size_t)(p - fp);
        if (!nf) return -1;
    }
    long exp = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = p < end && *p == '-';
        if (p < end && (*p == '-' || *p == '+')) p++;
        if (p >= end || !is_digit(*p)) return -1;
        for (; p < end && is_digit(*p); p++)
            if (exp < 100000) exp = exp * 10 + (*p - '0');   /* beyond that only 0 can be an int64 */
        if (eneg) exp = -exp;
    }
    if (p != end) return -1;
    /* The literal is the digit sequence D = int digits then fraction digits,
     * times 10^(exp - nf). Strip D's leading and trailing zeros. */
    size_t len = ni + nf, lz = 0, tz = 0;
#define DIGIT(k) ((k) < ni ? ip[k] : fp[(k) - ni])
    while (lz < len && DIGIT(lz) == '0') lz++;
    if (lz == len) { *v = 0; return 0; }
    while (DIGIT(len - 1 - tz) == '0') tz++;
    long scale = exp - (long)nf + (long)tz;   /* value = D[lz, len - tz) * 10^scale */
    size_t sig = len - tz - lz;
    if (scale < 0 || (long)sig + scale > 19) return -1;   /* a fraction, or >= 10^19 */
    uint64_t u = 0;
    for (size_t k = lz; k < len - tz; k++) u = u * 10 + (uint64_t)(DIGIT(k) - '0');
#undef DIGIT
    for (long k = 0; k < scale; k++) u *= 10;   /* < 10^19 < 2^64 */
    if (u > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) return -1;
    *v = neg ? (int64_t)(0 - u) : (int64_t)u;
    return 0;
}

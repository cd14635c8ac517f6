/*
 * json_body.h - what cJSON cannot say about a request body: that it is one
 * JSON value and nothing else, that no string in it holds a NUL, and the
 * exact integer a number literal spells (cJSON keeps numbers as doubles,
 * exact only below 2^53). Each function reads the body text itself, which
 * cJSON has already accepted as JSON.
 */
#ifndef SRV_JSON_BODY_H
#define SRV_JSON_BODY_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

/* Parses body[0, len) as one JSON object. NULL on failure, with the error
 * in msg and, for a NUL, the top-level member it is in in param ("" when
 * none applies): malformed JSON, non-whitespace after the value, a string
 * or key holding a NUL (\u0000 or a raw zero byte: C strings would cut it,
 * so "demo\u0000zz" would read as "demo"), not an object. */
cJSON *json_body_parse(const char *body, size_t len, char *msg, size_t msglen, char *param, size_t paramlen);

/* The source text of the value of o's first member named name, as
 * cJSON_GetObjectItemCaseSensitive picks it; o must be the object
 * json_body_parse returned for this body. Returns 0 with *p, *n set, or -1
 * when there is no such member. */
int json_body_member_text(const char *body, size_t len, const cJSON *o, const char *name, const char **p, size_t *n);

/* The exact value of the JSON number literal s[0, n) if it is an integer in
 * [INT64_MIN, INT64_MAX] ("12", "-3", "5.0" and "5e3" are; "5.5", "1e30"
 * are not). Returns 0 with *v set, or -1. */
int json_exact_int64(const char *s, size_t n, int64_t *v);

#endif

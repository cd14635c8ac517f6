/*
 * json_out.h - JSON text written straight into a growing buffer, for the large
 * per-token arrays of responses (8192 log-probs, ids, token strings, alternatives),
 * where one cJSON node per value costs more than the engine's work on CPU-cheap paths.
 *
 * Invariant: every writer but json_float emits exactly the bytes cJSON 1.7
 * (cJSON_PrintUnformatted) emits for the same value, so a response mixes these with
 * cJSON-rendered parts freely: numbers as "%1.15g" when that reads back within cJSON's
 * tolerance, else "%1.17g", NaN and infinities as null; strings with '"', '\\', \b \f
 * \n \r \t escaped and other bytes below 0x20 as \u00XX (the caller makes them valid
 * UTF-8 first). json_float, for float32 values (log-probs), prints "%.9g": the fewest
 * digits that always read back as the same float32 (json_out.c says why), integers
 * below 10^15 as their digits and NaN and infinities as null as cJSON does.
 * tests/server/test_render.c checks both against the cJSON library and printf on
 * random values.
 *
 * A write that cannot grow the buffer sets failed and the buffer keeps what it had;
 * callers check failed once at the end.
 */
#ifndef SRV_JSON_OUT_H
#define SRV_JSON_OUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *p;          /* NUL-terminated once anything was written */
    size_t len, cap;
    int failed;       /* out of memory at some write */
} json_buf;

/* Room for n more bytes (plus the NUL): 0, or -1 with failed set. */
int json_reserve(json_buf *b, size_t n);
void json_raw(json_buf *b, const char *s, size_t n);
static inline void json_lit(json_buf *b, const char *s);   /* a literal: punctuation, a fixed key */
void json_char(json_buf *b, char c);
/* "s" with cJSON's escapes; s holds n bytes of valid UTF-8 without NUL. */
void json_str(json_buf *b, const char *s, size_t n);
/* The same for any n bytes: each byte that does not start a well-formed UTF-8
 * sequence (and NUL) becomes U+FFFD first, so clients' JSON parsers never choke. */
void json_text(json_buf *b, const char *s, size_t n);
/* The length of the well-formed UTF-8 sequence (no NUL, no surrogate, no overlong
 * form) at p, or 0 when the byte at p starts none. */
int utf8_sequence_len(const unsigned char *p, const unsigned char *end);
/* Copies the well-formed sequence at *p to o, or writes U+FFFD for the one
 * byte that starts none; advances *p past what it read and returns the end of
 * what it wrote (at most 4 bytes). */
static inline char *utf8_put_clean(char *o, const unsigned char **p, const unsigned char *end)
{
    const int len = utf8_sequence_len(*p, end);
    if (!len) {
        memcpy(o, "\xEF\xBF\xBD", 3);
        *p += 1;
        return o + 3;
    }
    memcpy(o, *p, (size_t)len);
    *p += len;
    return o + len;
}
/* Every digit; the bytes cJSON prints for (double)v when |v| < 10^15. */
void json_int(json_buf *b, int64_t v);
/* A double as cJSON prints it. */
void json_number(json_buf *b, double d);
/* f as "%.9g" (it reads back as f), an integer below 10^15 as its digits, NaN and
 * infinities as null; without printf for every normal float. */
void json_float(json_buf *b, float f);
/* Pointer-level writers for the hot loops: the caller has reserved JSON_NUMBER_MAX
 * bytes at o and sets len (and the NUL) itself. Each returns the end of what it wrote. */
#define JSON_NUMBER_MAX 32
char *json_put_int(char *o, int64_t v);
char *json_put_float(char *o, float f);
/* The bytes json_str would write for s, as a malloc'd NUL-terminated string (quotes
 * included): token strings are escaped once at load. NULL when out of memory. */
char *json_str_dup(const char *s, size_t n, size_t *out_len);
void json_buf_free(json_buf *b);

#include <string.h>
static inline void json_lit(json_buf *b, const char *s) { json_raw(b, s, strlen(s)); }

#endif

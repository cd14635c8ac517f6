/* json_text.c - see json_text.h. */
#include "json_text.h"

#include "json_out.h" /* utf8_sequence_len, utf8_put_clean */

#include <stdlib.h>
#include <string.h>

char *utf8_clean(const char *s, size_t n)
{
    char *out = malloc(n * 3 + 1), *o = out;
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) o = utf8_put_clean(o, &p, end);
    *o = '\0';
    return out;
}

size_t json_text_bytes(const char *s, size_t n)
{
    size_t total = 0;
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        int len = utf8_sequence_len(p, end);
        if (!len) {
            total += 3;   /* U+FFFD */
            p++;
            continue;
        }
        unsigned c = *p;
        if (len > 1 || (c > 31 && c != '"' && c != '\\')) total += (size_t)len;
        else if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') total += 2;
        else total += 6;
        p += len;
    }
    return total;
}

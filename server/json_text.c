/* json_text.c - see json_text.h. */
#include "json_text.h"

#include <stdlib.h>
#include <string.h>

/* The length of the well-formed UTF-8 character at p (not NUL, no overlong
 * form, no surrogate, at most U+10FFFF), or 0 where p starts none. */
static int utf8_char_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = *p;
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || c == 0 || p + len > end) return 0;
    for (int k = 1; k < len; k++)
        if ((p[k] & 0xC0) != 0x80) return 0;
    if (len > 1) {
        unsigned cp = c & (0x7F >> len);
        for (int k = 1; k < len; k++) cp = (cp << 6) | (p[k] & 0x3F);
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
    }
    return len;
}

char *utf8_clean(const char *s, size_t n)
{
    char *out = malloc(n * 3 + 1), *o = out;
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        int len = utf8_char_len(p, end);
        if (len) {
            memcpy(o, p, (size_t)len);
            o += len;
            p += len;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            p++;
        }
    }
    *o = '\0';
    return out;
}

size_t json_text_bytes(const char *s, size_t n)
{
    size_t total = 0;
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        int len = utf8_char_len(p, end);
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

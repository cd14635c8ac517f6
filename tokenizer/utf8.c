/*
 * utf8.c - the UTF-8 policy of tokenizer.h: ill-formed bytes become U+FFFD,
 * one per byte, as SentencePiece does for byte pieces.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* Unicode table 3-7: the allowed range of the second byte depends on the
 * lead byte; later continuation bytes are always 80..BF. */
static int seq_len(unsigned char b0, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80; *hi = 0xBF;
    if (b0 < 0x80) return 1;
    if (b0 < 0xC2) return 0;                 /* stray continuation or overlong C0/C1 */
    if (b0 < 0xE0) return 2;
    if (b0 < 0xF0) {
        if (b0 == 0xE0) *lo = 0xA0;          /* overlong */
        if (b0 == 0xED) *hi = 0x9F;          /* surrogates */
        return 3;
    }
    if (b0 < 0xF5) {
        if (b0 == 0xF0) *lo = 0x90;          /* overlong */
        if (b0 == 0xF4) *hi = 0x8F;          /* past U+10FFFF */
        return 4;
    }
    return 0;
}

/* How many bytes of s[0..len) match a well-formed sequence so far, and the
 * sequence's full length in *need (0 if s[0] cannot start one). */
static int matched_prefix(const unsigned char *s, size_t len, int *need) {
    unsigned char lo, hi;
    *need = seq_len(s[0], &lo, &hi);
    if (*need == 0) return 0;
    int i = 1;
    for (; i < *need && (size_t)i < len; i++) {
        if (s[i] < lo || s[i] > hi) return i;
        lo = 0x80; hi = 0xBF;
    }
    return i;
}

int tok_utf8_char_len(const char *s, size_t len) {
    if (len == 0) return 0;
    int need;
    int got = matched_prefix((const unsigned char *)s, len, &need);
    return (need > 0 && got == need) ? need : 0;
}

size_t tok_utf8_incomplete_tail(const char *s, size_t len) {
    /* A sequence is at most 4 bytes, so an unfinished one starts in the last 3. */
    for (size_t k = 1; k <= 3 && k <= len; k++) {
        const unsigned char *p = (const unsigned char *)s + len - k;
        if (*p >= 0x80 && *p < 0xC0) continue;   /* continuation: look further back */
        int need;
        int got = matched_prefix(p, k, &need);
        return (need > (int)k && got == (int)k) ? k : 0;
    }
    return 0;
}

size_t tok_utf8_sanitize_to(char *out, const char *s, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        int n = tok_utf8_char_len(s + i, len - i);
        if (n > 0) {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += 1;
        }
    }
    return o;
}

char *tok_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    /* Worst case every byte becomes the 3-byte U+FFFD. */
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    size_t o = tok_utf8_sanitize_to(out, s, len);
    out[o] = '\0';
    if (out_len) *out_len = o;
    return out;
}

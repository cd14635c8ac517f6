/*
 * stopper.c - stop strings across streamed chunks.
 *
 * Invariant: the held-back text is the longest suffix of everything fed so
 * far that is a proper prefix of some stop string, so a stop string can only
 * begin inside it or in the next chunk, and text before it is safe to emit.
 * Matching is on bytes; with valid UTF-8 on both sides a match or a held
 * suffix always starts at a character boundary (it starts with a stop
 * string's first byte, a lead byte), so emitted text stays whole characters.
 * Empty stop strings are ignored (they would stop before any output).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

struct tok_stopper {
    char **stops;      /* [n] copies of the stop strings */
    size_t *lens;      /* [n] */
    int n;
    size_t max_len;    /* longest stop string */
    char *buf;         /* [cap] held-back text, then the new chunk */
    size_t len, cap;
    char *out;         /* [out_cap] returned text */
    size_t out_cap;
    int stopped;
};

tok_stopper *tok_stopper_new(const char *const *stops, int n_stops) {
    tok_stopper *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->stops = calloc((size_t)(n_stops > 0 ? n_stops : 1), sizeof(char *));
    s->lens = calloc((size_t)(n_stops > 0 ? n_stops : 1), sizeof(size_t));
    if (!s->stops || !s->lens) { tok_stopper_free(s); return NULL; }
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        s->stops[s->n] = strdup(stops[i]);
        if (!s->stops[s->n]) { tok_stopper_free(s); return NULL; }
        s->lens[s->n] = strlen(stops[i]);
        if (s->lens[s->n] > s->max_len) s->max_len = s->lens[s->n];
        s->n++;
    }
    return s;
}

void tok_stopper_free(tok_stopper *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->stops);
    free(s->lens);
    free(s->buf);
    free(s->out);
    free(s);
}

static int reserve(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *np = realloc(*p, c);
    if (!np) return -1;
    *p = np;
    *cap = c;
    return 0;
}

/* Moves buf[0..n) to out and drops it from buf. */
static const char *take(tok_stopper *s, size_t n, size_t *out_len) {
    *out_len = 0;
    if (reserve(&s->out, &s->out_cap, n + 1) != 0) return "";
    if (n) memcpy(s->out, s->buf, n);   /* buf is NULL until the first feed */
    s->out[n] = '\0';
    if (s->len > n) memmove(s->buf, s->buf + n, s->len - n);
    s->len -= n;
    *out_len = n;
    return s->out;
}

/* Whether buf[at..len) is a proper prefix of some stop string. */
static int is_stop_prefix(const tok_stopper *s, size_t at) {
    size_t tail = s->len - at;
    for (int i = 0; i < s->n; i++)
        if (tail < s->lens[i] && memcmp(s->buf + at, s->stops[i], tail) == 0) return 1;
    return 0;
}

const char *tok_stopper_feed(tok_stopper *s, const char *text, size_t len, size_t *out_len,
                             int *stopped) {
    *out_len = 0;
    *stopped = s->stopped;
    if (s->stopped) return "";
    if (reserve(&s->buf, &s->cap, s->len + len) != 0) return "";
    memcpy(s->buf + s->len, text, len);
    s->len += len;

    /* The earliest match wins; among matches at one position, any will do
     * (the text before it is the same). */
    size_t best = SIZE_MAX;
    for (int i = 0; i < s->n; i++) {
        if (s->lens[i] > s->len) continue;
        const char *hit = memmem(s->buf, s->len, s->stops[i], s->lens[i]);
        if (hit && (size_t)(hit - s->buf) < best) best = (size_t)(hit - s->buf);
    }
    if (best != SIZE_MAX) {
        s->stopped = 1;
        *stopped = 1;
        const char *r = take(s, best, out_len);
        s->len = 0;   /* the stop string and anything after it are dropped */
        return r;
    }
    /* A held suffix is shorter than the longest stop string. */
    size_t keep = s->max_len ? s->max_len - 1 : 0;
    size_t at = s->len > keep ? s->len - keep : 0;
    while (at < s->len && !is_stop_prefix(s, at)) at++;
    return take(s, at, out_len);
}

const char *tok_stopper_flush(tok_stopper *s, size_t *out_len) {
    if (s->stopped) { *out_len = 0; return ""; }
    return take(s, s->len, out_len);
}

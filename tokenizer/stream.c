/*
 * stream.c - streaming detokenizer: ids in one at a time, complete UTF-8
 * text out, and the concatenated output equals tok_decode of all the ids.
 *
 * Bytes: hold back an unfinished UTF-8 sequence at the end (at most 3
 * bytes), emit the rest through the U+FFFD rule. The cut never changes how
 * the bytes before it decode: a held sequence starts at a lead byte, which
 * no earlier sequence can use as a continuation.
 *
 * SentencePiece: rather than re-implement its decoder (leading-space
 * stripping after BOS, byte-fallback runs, <unk> surface, all of which have
 * changed between library versions) the stream asks the library to decode a
 * short window of ids and emits what is new. Two facts make that exact:
 *  1. decode(ids[0..k]) is a prefix of decode(ids[0..n]) when k does not
 *     split a byte-fallback run in the middle of an unfinished UTF-8
 *     sequence: a piece's text depends only on the ids before it.
 *  2. Once the decoded text is non-empty, the library no longer strips a
 *     leading space. So after an id whose text on its own is non-empty
 *     (an "anchor"), decode([anchor] + rest) minus the anchor's own text is
 *     exactly what the full decode adds for rest.
 * Both hold for models without a denormalizer (Llama-2 and spm_train's
 * defaults have none); one would rewrite the joined text and could differ
 * at window edges. The tests compare stream and one-shot decode for that.
 * The window restarts at every anchor, so a push costs two decodes of a few
 * ids; only a long run of non-anchor ids (byte pieces, BOS/EOS) makes the
 * window grow, and it shrinks again at the next ordinary piece.
 *
 * With the tokenizer's surface table (surface.c, built from the same two
 * facts and checked against the library at open) the common case costs no
 * decode at all: while everything the window decodes to has been emitted
 * and ends on a whole character, a non-byte id emits its table text
 * (exactly what decode([anchor, ..., id]) adds) and an ASCII byte piece its
 * one byte; the table says whether the id anchors the next window
 * (decode([id]) is non-empty). Other byte pieces take the library path. The scheduler pushes every generated token of every sequence,
 * so this is per-step host work proportional to the batch.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

struct tok_stream {
    const tok_tokenizer *t;
    int32_t *win;          /* [cap] ids since the anchor (win[0]), or since the start */
    int n, cap;
    size_t done;           /* bytes of decode(win) already emitted */
    int anchored;          /* the table's fast case: win starts at an anchor, done is decode(win)'s
                              whole text, and it ends on a whole character */
    unsigned char *bytes;  /* [cap] scratch: the bytes of a trailing byte run */
    char *out;             /* [out_cap] what the last push/flush returned */
    size_t out_cap;
};

tok_stream *tok_stream_new(const tok_tokenizer *t) {
    tok_stream *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->t = t;
    s->cap = 64;
    s->win = malloc((size_t)s->cap * sizeof(int32_t));
    s->bytes = malloc((size_t)s->cap);
    s->out_cap = 256;
    s->out = malloc(s->out_cap);
    if (!s->win || !s->bytes || !s->out) { tok_stream_free(s); return NULL; }
    s->out[0] = '\0';
    return s;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->win);
    free(s->bytes);
    free(s->out);
    free(s);
}

/* Copies text into s->out; returns it (the empty string if out of memory). */
static const char *emit(tok_stream *s, const char *text, size_t len, size_t *out_len) {
    if (len + 1 > s->out_cap) {
        size_t cap = s->out_cap;
        while (cap < len + 1) cap *= 2;
        char *nb = realloc(s->out, cap);
        if (!nb) { s->out[0] = '\0'; *out_len = 0; return s->out; }
        s->out = nb;
        s->out_cap = cap;
    }
    memcpy(s->out, text, len);
    s->out[len] = '\0';
    *out_len = len;
    return s->out;
}

static int byte_value(const tok_tokenizer *t, int32_t id) {
    if (!t->spm) return id;
    if (t->surf) return t->surf->byte[id];
    return (int)strtol(spm_id_to_piece(t->spm, id) + 3, NULL, 16);   /* "<0xNN>" */
}

/* How many ids of the window are final: all but an unfinished UTF-8
 * sequence at the end of a trailing run of byte ids. */
static int stable_ids(tok_stream *s) {
    int r = s->n;
    while (r > 0 && tok_is_byte_piece(s->t, s->win[r - 1])) r--;
    int run = s->n - r;
    if (run == 0) return s->n;
    for (int i = 0; i < run; i++) s->bytes[i] = (unsigned char)byte_value(s->t, s->win[r + i]);
    return s->n - (int)tok_utf8_incomplete_tail((const char *)s->bytes, (size_t)run);
}

/* Decodes win[0..k] and emits whatever lies past s->done. */
static const char *emit_window(tok_stream *s, int k, size_t *len) {
    char *text;
    size_t n;
    if (tok_decode_len(s->t, s->win, k, &text, &n, NULL, 0) != 0) return emit(s, "", 0, len);
    /* By fact 1 text extends what was emitted; never step backwards even if not. */
    size_t from = s->done < n ? s->done : n;
    const char *r = emit(s, text + from, n - from, len);
    s->done = n > s->done ? n : s->done;
    free(text);
    return r;
}

const char *tok_stream_push(tok_stream *s, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= s->t->vocab) return emit(s, "", 0, len);   /* ignored; tok_decode rejects it */
    if (s->n == s->cap) {
        int cap = s->cap * 2;
        int32_t *nw = realloc(s->win, (size_t)cap * sizeof(int32_t));
        if (!nw) return emit(s, "", 0, len);
        s->win = nw;
        unsigned char *nb = realloc(s->bytes, (size_t)cap);
        if (!nb) return emit(s, "", 0, len);
        s->bytes = nb;
        s->cap = cap;
    }
    s->win[s->n++] = id;

    if (!s->t->spm) {
        /* The window is just the held-back bytes: no anchors needed. */
        int k = stable_ids(s);
        s->done = 0;
        const char *r = emit_window(s, k, len);
        memmove(s->win, s->win + k, (size_t)(s->n - k) * sizeof(int32_t));
        s->n -= k;
        s->done = 0;
        return r;
    }

    const tok_surface *sf = s->t->surf;
    if (sf && s->anchored && sf->byte[id] < 0x80) { /* a non-byte id (-1) or an ASCII byte piece */
        /* win[0..n-1) is fully emitted, its text is non-empty and ends on a
         * whole character: a non-byte id adds its table text, an ASCII byte
         * piece (a newline, say) its one character */
        char ch = (char)sf->byte[id];
        const char *r = sf->byte[id] >= 0 ? emit(s, &ch, 1, len)
                                          : emit(s, sf->text + sf->off[id], sf->off[id + 1] - sf->off[id], len);
        if (sf->byte[id] < 0 && sf->solo[id] > 0) { /* the next anchor */
            s->win[0] = id;
            s->n = 1;
            s->done = sf->solo[id];
        } else {                /* BOS / EOS / a lone space / a byte: the window grows, still all emitted */
            s->done += *len;
        }
        return r;
    }
    s->anchored = 0;
    int k = stable_ids(s);
    if (k == 0) return emit(s, "", 0, len);
    const char *r = emit_window(s, k, len);
    if (k == s->n && !tok_is_byte_piece(s->t, id)) {
        size_t solo_len = 0; /* decode([id]) alone: the table has it */
        char *solo;
        if (sf) solo_len = sf->solo[id];
        else if (tok_decode_len(s->t, &id, 1, &solo, &solo_len, NULL, 0) == 0) free(solo);
        if (solo_len > 0) {   /* an anchor: restart the window at it */
            s->win[0] = id;
            s->n = 1;
            s->done = solo_len;
            s->anchored = 1;
        }
    }
    return r;
}

const char *tok_stream_flush(tok_stream *s, size_t *len) {
    /* The library (and the U+FFFD rule) turn an unfinished sequence into
     * U+FFFD per byte, exactly as tok_decode does at the end of the text. */
    if (!s->t->spm) s->done = 0;
    const char *r = emit_window(s, s->n, len);
    s->n = 0;
    s->done = 0;
    s->anchored = 0;
    return r;
}

/*
 * surface.c - SentencePiece decoding from a per-id table of surfaces,
 * without calling the library once per text or per streamed token.
 *
 * libsentencepiece's Decode turns each piece into text one after the other:
 * a control id (BOS, EOS) into nothing, <unk> into its surface, a run of
 * byte pieces into their bytes under the U+FFFD rule of tokenizer.h, any
 * other piece into its string with U+2581 as a space, where only a piece
 * met while the text is still empty loses its leading space. So once the
 * text is non-empty, every non-byte id adds the same string wherever it
 * stands: what decode([A, id]) adds to decode([A]) for an anchor A whose own
 * text is non-empty. stream.c rests on the same two facts (its comment).
 *
 * The table holds that string for every id, the length of decode([id]) and
 * each byte piece's byte, all computed by the library itself at open
 * (~2 x vocab decodes of one or two ids). tok_decode then asks the library
 * only for the shortest prefix whose text is non-empty (usually one or two
 * ids) and appends the table's strings for the rest; a 1,044-id echo text
 * costs ~20 ns per id instead of ~0.4-1.2 us.
 *
 * A model whose decoding the two facts do not describe (a denormalizer, say,
 * which rewrites the joined text) must not take this path: after building
 * the table, tok_surface_build decodes a few hundred random id sequences
 * both ways and keeps the table only if every one agrees byte for byte.
 * Otherwise t->surf stays NULL and everything goes through the library, as
 * before. tests/tokenizer compares the result with the Python package too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static int lib_decode(const tok_tokenizer *t, const int32_t *ids, int n, char **text, size_t *len) {
    return spm_decode(t->spm, ids, n, text, len, NULL, 0);
}

void tok_surface_free(tok_surface *s) {
    if (!s) return;
    free(s->off);
    free(s->solo);
    free(s->byte);
    free(s->text);
    free(s);
}

/* decode(ids[0..q)) + the table's text for ids[q..n), where decode(ids[0..q))
 * is head (non-empty, ids[q-1] not a byte piece). */
static int decode_tail(const tok_surface *s, const char *head, size_t hl, const int32_t *ids, int q, int n,
                       char **text, size_t *len) {
    size_t cap = hl + 1;
    for (int i = q; i < n; i++)
        cap += s->byte[ids[i]] >= 0 ? 3 : s->off[ids[i] + 1] - s->off[ids[i]];
    char *out = malloc(cap);
    if (!out) return -1;
    memcpy(out, head, hl);
    size_t o = hl;
    unsigned char run[64];
    int nrun = 0;
    for (int i = q; i < n; i++) {
        const int id = ids[i];
        if (s->byte[id] >= 0) {
            /* A run is cut only between whole characters (at most 4 bytes),
             * so flushing a full buffer early cannot change its text. */
            if (nrun >= (int)sizeof run - 4) {
                size_t keep = tok_utf8_incomplete_tail((const char *)run, (size_t)nrun);
                o += tok_utf8_sanitize_to(out + o, (const char *)run, (size_t)nrun - keep);
                memmove(run, run + nrun - (int)keep, keep);
                nrun = (int)keep;
            }
            run[nrun++] = (unsigned char)s->byte[id];
            continue;
        }
        if (nrun) o += tok_utf8_sanitize_to(out + o, (const char *)run, (size_t)nrun), nrun = 0;
        const uint32_t a = s->off[id], b = s->off[id + 1];
        memcpy(out + o, s->text + a, b - a);
        o += b - a;
    }
    if (nrun) o += tok_utf8_sanitize_to(out + o, (const char *)run, (size_t)nrun);
    out[o] = '\0';
    *text = out;
    *len = o;
    return 0;
}

int tok_surface_decode(const tok_tokenizer *t, const int32_t *ids, int n, char **text, size_t *len) {
    const tok_surface *s = t->surf;
    /* The shortest prefix, ending on a non-byte id, whose text is non-empty:
     * usually [BOS, first word] or [first word]. Past 32 ids of BOS / EOS /
     * lone spaces the library decodes the whole text. */
    for (int q = 1; q <= n && q <= 32; q++) {
        if (s->byte[ids[q - 1]] >= 0) continue;
        char *head;
        size_t hl;
        if (lib_decode(t, ids, q, &head, &hl) != 0) return -1;
        if (hl == 0 && q < n) {
            free(head);
            continue;
        }
        int rc = decode_tail(s, head, hl, ids, q, n, text, len);
        free(head);
        return rc;
    }
    return lib_decode(t, ids, n, text, len);
}

/* ---- building and checking the table ---- */

static uint32_t lcg(uint32_t *x) {
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

/* One random id sequence rich in what decoding treats specially: byte runs
 * (whole characters and stray bytes), BOS / EOS / <unk>, lone-space pieces,
 * leading positions. */
static int random_ids(const tok_tokenizer *t, const int32_t *byte_id, int32_t space,
                      uint32_t *x, int32_t *ids, int cap) {
    int n = 1 + (int)(lcg(x) % (uint32_t)(cap - 4));
    int k = 0;
    while (k < n) {
        uint32_t r = lcg(x) % 20;
        if (r < 9) {
            ids[k++] = (int32_t)(lcg(x) % (uint32_t)t->vocab);
        } else if (r < 12) {
            /* a whole character as byte pieces: U+0080..U+10FFFF, no surrogates */
            uint32_t cp = 0x80 + lcg(x) % 0x10FF80u;
            if (cp >= 0xD800 && cp < 0xE000) cp = 0x4E2D;
            unsigned char u[4];
            int m = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            if (m == 2) u[0] = (unsigned char)(0xC0 | cp >> 6);
            if (m == 3) u[0] = (unsigned char)(0xE0 | cp >> 12);
            if (m == 4) u[0] = (unsigned char)(0xF0 | cp >> 18);
            for (int j = 1; j < m; j++) u[j] = (unsigned char)(0x80 | ((cp >> (6 * (m - 1 - j))) & 0x3F));
            for (int j = 0; j < m && k < cap; j++)
                if (byte_id[u[j]] >= 0) ids[k++] = byte_id[u[j]];
        } else if (r < 14) {
            int32_t b = byte_id[lcg(x) % 256];
            if (b >= 0) ids[k++] = b;
        } else if (r < 17) {
            const int32_t sp[3] = {t->bos, t->eos, spm_unk_id(t->spm)};
            int32_t id = sp[lcg(x) % 3];
            if (id >= 0) ids[k++] = id;
        } else if (space >= 0) {
            ids[k++] = space;
        }
    }
    return k < cap ? k : cap;
}

static int agrees(const tok_tokenizer *t, const int32_t *ids, int n) {
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    int ok = lib_decode(t, ids, n, &a, &la) == 0 && tok_surface_decode(t, ids, n, &b, &lb) == 0 && la == lb &&
             !memcmp(a, b, la);
    free(a);
    free(b);
    return ok;
}

int tok_surface_build(tok_tokenizer *t) {
    const int V = t->vocab;
    if (V <= 0 || V > (1 << 24)) return -1;
    tok_surface *s = calloc(1, sizeof *s);
    int32_t byte_id[256];
    for (int i = 0; i < 256; i++) byte_id[i] = -1;
    if (!s) return -1;
    s->off = malloc(((size_t)V + 1) * sizeof *s->off);
    s->solo = malloc((size_t)V * sizeof *s->solo);
    s->byte = malloc((size_t)V * sizeof *s->byte);
    size_t cap = (size_t)V * 8 + 64, used = 0;
    s->text = malloc(cap);
    if (!s->off || !s->solo || !s->byte || !s->text) goto bad;

    /* The anchor: the first non-byte id whose own text is a plain ASCII letter
     * or word, so that nothing about it can join with what follows. */
    int32_t anchor = -1, space = -1;
    char *base = NULL;
    size_t bl = 0;
    for (int32_t id = 0; id < V && anchor < 0; id++) {
        if (spm_is_byte(t->spm, id)) continue;
        char *d;
        size_t dl;
        if (lib_decode(t, &id, 1, &d, &dl) != 0) goto bad;
        int letters = dl > 0;
        for (size_t j = 0; j < dl; j++)
            letters &= (d[j] >= 'a' && d[j] <= 'z') || (d[j] >= 'A' && d[j] <= 'Z');
        if (letters) anchor = id, base = d, bl = dl;
        else free(d);
    }
    if (anchor < 0) goto bad;

    for (int32_t id = 0; id < V; id++) {
        s->off[id] = (uint32_t)used;
        s->byte[id] = -1;
        if (spm_is_byte(t->spm, id)) {
            const char *p = spm_id_to_piece(t->spm, id); /* "<0xNN>" */
            unsigned v = 0;
            for (int j = 3; j < 5; j++) {
                char c = p[j];
                v = v * 16 + (unsigned)(c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                         : c >= 'a' && c <= 'f' ? c - 'a' + 10 : 0);
            }
            if (strlen(p) != 6 || v > 255) goto bad_base;
            s->byte[id] = (int16_t)v;
            if (byte_id[v] < 0) byte_id[v] = id;
            s->solo[id] = 0; /* not used: a byte piece never anchors the stream */
            continue;
        }
        int32_t pair[2] = {anchor, id};
        char *d, *solo;
        size_t dl, sl;
        if (lib_decode(t, pair, 2, &d, &dl) != 0) goto bad_base;
        if (dl < bl || memcmp(d, base, bl) != 0 || dl - bl > UINT32_MAX / 2) { free(d); goto bad_base; }
        if (used + (dl - bl) + 1 > cap) {
            while (used + (dl - bl) + 1 > cap) cap *= 2;
            char *nt = realloc(s->text, cap);
            if (!nt) { free(d); goto bad_base; }
            s->text = nt;
        }
        memcpy(s->text + used, d + bl, dl - bl);
        used += dl - bl;
        free(d);
        if (lib_decode(t, &id, 1, &solo, &sl) != 0) goto bad_base;
        free(solo);
        s->solo[id] = (uint32_t)sl;
        if (space < 0 && sl == 0 && s->off[id] != used && !(id == t->bos || id == t->eos)) space = id;
    }
    s->off[V] = (uint32_t)used;
    free(base);
    t->surf = s;

    /* The check: the library and the table agree on every sequence. */
    int32_t ids[48];
    uint32_t x = 12345u;
    for (int iter = 0; iter < 400; iter++) {
        int n = random_ids(t, byte_id, space, &x, ids, (int)(sizeof ids / sizeof ids[0]));
        if (!agrees(t, ids, n)) {
            t->surf = NULL;
            tok_surface_free(s);
            return -1;
        }
    }
    return 0;

bad_base:
    free(base);
bad:
    tok_surface_free(s);
    return -1;
}

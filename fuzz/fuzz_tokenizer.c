/*
 * fuzz_tokenizer.c - the tokenizers (tokenizer/tokenizer.c with the
 * SentencePiece shim and the byte tokenizer), the streaming detokenizer used
 * for SSE (stream.c), stop strings across chunks (stopper.c) and the UTF-8
 * rules (utf8.c).
 *
 * Input: a mode byte, up to four stop strings separated by 0x01 and ended by
 * 0x00, then text.
 *   mode bit 0: SentencePiece (FUZZ_SPM_MODEL, when the build has one), else bytes
 *   mode bit 1: encode with BOS
 *   mode bits 2-4: chunk length - 1 for feeding the stop-string matcher
 * Checks (each a documented contract in tokenizer.h):
 *  - encode gives ids inside the vocabulary; bytes: one id per byte;
 *  - decode is valid UTF-8; bytes: decode(encode(x)) == sanitize(x);
 *  - the stream's pushes plus its flush equal tok_decode of the same ids
 *    (ids read from the text, out-of-range ones included, which it ignores),
 *    and again after the flush reset it;
 *  - the stopper's output is a prefix of the text holding no whole stop
 *    string; stopped: a stop string starts right after it; else it is all;
 *  - sanitize is idempotent and valid; incomplete_tail is at most 3.
 */
#include "fuzz_common.h"

#include "tokenizer.h"

#define FUZZ_SPM_MAX_TEXT 2048   /* SentencePiece's BPE is superlinear (tokenizer.h) */

static tok_tokenizer *toks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (tok_open_bytes(&toks[0])) abort();
#ifdef FUZZ_SPM_MODEL
    char err[512];
    if (tok_open_spm(&toks[1], FUZZ_SPM_MODEL, err, sizeof err)) {
        fprintf(stderr, "fuzz_tokenizer: %s (SentencePiece inputs use the byte tokenizer)\n", err);
        toks[1] = NULL;
    }
#endif
    return 0;
}

static void check_utf8(const char *s, size_t n, const char *what)
{
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_char_len(s + i, n - i);
        FZ_CHECK(k > 0, "%s: invalid UTF-8 at byte %zu of %zu", what, i, n);
        i += (size_t)k;
    }
}

typedef struct { char *p; size_t len, cap; } buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

/* Streams ids (invalid ones included) and compares with the one-shot decode of the valid ones. */
static void check_stream(const tok_tokenizer *t, tok_stream *st, const int32_t *ids, int n, const char *what)
{
    int vocab = tok_vocab_size(t), nv = 0;
    int32_t *valid = malloc((size_t)(n + 1) * sizeof *valid);
    if (!valid) abort();
    buf got = {0};
    for (int i = 0; i < n; i++) {
        size_t len = 99;
        const char *s = tok_stream_push(st, ids[i], &len);
        FZ_CHECK(s != NULL, "%s: push %d returned NULL", what, i);   /* may hold a NUL: byte 0 is an id */
        check_utf8(s, len, "stream push");
        put(&got, s, len);
        if (ids[i] >= 0 && ids[i] < vocab) valid[nv++] = ids[i];
    }
    size_t len = 99;
    const char *s = tok_stream_flush(st, &len);
    put(&got, s, len);
    char *want = NULL, err[256] = "";
    size_t wn = 0;
    FZ_CHECK(tok_decode_len(t, valid, nv, &want, &wn, err, sizeof err) == 0, "%s: decode failed: %s", what, err);
    check_utf8(want, wn, "decode");
    FZ_CHECK(got.len == wn && (wn == 0 || !memcmp(got.p, want, wn)),
             "%s: stream gave %zu bytes \"%.200s\", decode %zu bytes \"%.200s\"", what, got.len, got.p ? got.p : "", wn,
             want);
    free(want);
    free(got.p);
    free(valid);
}

static int contains(const char *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    return k <= n && memmem(hay, n, needle, k) != NULL;
}

static void check_stopper(const char *const *stops, int n_stops, const char *text, size_t n, size_t chunk)
{
    tok_stopper *sp = tok_stopper_new(stops, n_stops);
    if (!sp) abort();
    buf out = {0};
    int stopped = 0;
    for (size_t at = 0; at < n; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk, len = 0;
        const char *s = tok_stopper_feed(sp, text + at, k, &len, &stopped);
        put(&out, s, len);
    }
    if (!stopped) {
        size_t len = 0;
        const char *s = tok_stopper_flush(sp, &len);
        put(&out, s, len);
    }
    FZ_CHECK(out.len <= n && (out.len == 0 || !memcmp(out.p, text, out.len)), "stopper output is not a prefix");
    for (int i = 0; i < n_stops; i++)
        FZ_CHECK(!stops[i][0] || !contains(out.p ? out.p : "", out.len, stops[i]),
                 "stopper output holds the whole stop string %d", i);
    if (stopped) {
        int starts = 0;
        for (int i = 0; i < n_stops; i++)
            starts |= stops[i][0] && strlen(stops[i]) <= n - out.len && !memcmp(text + out.len, stops[i], strlen(stops[i]));
        FZ_CHECK(starts, "stopped at byte %zu where no stop string starts", out.len);
    } else {
        FZ_CHECK(out.len == n, "not stopped, but %zu of %zu bytes came out", out.len, n);
    }
    free(out.p);
    tok_stopper_free(sp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader r = {data, size};
    unsigned mode = fz_byte(&r);
    const tok_tokenizer *t = mode & 1 && toks[1] ? toks[1] : toks[0];
    int bytes = tok_is_bytes(t), vocab = tok_vocab_size(t);

    const uint8_t *sp;
    size_t sn = fz_until(&r, 0, &sp);
    char *stops_text = fz_strndup(sp, sn);
    const char *stops[4];
    int n_stops = 0;
    for (char *p = stops_text, *q; n_stops < 4 && p; p = q) {
        q = strchr(p, 1);
        if (q) *q++ = 0;
        stops[n_stops++] = p;
    }
    size_t n = r.n;
    if (!bytes && n > FUZZ_SPM_MAX_TEXT) n = FUZZ_SPM_MAX_TEXT;
    char *text = fz_strndup(r.p, n);

    /* encode / decode */
    int32_t *ids = NULL;
    int n_ids = 0;
    char err[256] = "";
    int bos = (mode >> 1) & 1;
    FZ_CHECK(tok_encode(t, text, n, bos, &ids, &n_ids, err, sizeof err) == 0, "encode failed: %s", err);
    for (int i = 0; i < n_ids; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "encode gave id %d", ids[i]);
    if (bytes) FZ_CHECK((size_t)n_ids == n, "bytes: %d ids for %zu bytes", n_ids, n);
    char *dec = NULL;
    size_t dn = 0;
    FZ_CHECK(tok_decode_len(t, ids, n_ids, &dec, &dn, err, sizeof err) == 0, "decode failed: %s", err);
    check_utf8(dec, dn, "decode");
    size_t cn = 0;
    char *clean = tok_utf8_sanitize(text, n, &cn);
    if (!clean) abort();
    check_utf8(clean, cn, "sanitize");
    if (bytes) FZ_CHECK(dn == cn && !memcmp(dec, clean, cn), "bytes: decode(encode(x)) != sanitize(x)");
    size_t cn2 = 0;
    char *clean2 = tok_utf8_sanitize(clean, cn, &cn2);
    FZ_CHECK(clean2 && cn2 == cn && !memcmp(clean, clean2, cn), "sanitize is not idempotent");
    FZ_CHECK(tok_utf8_incomplete_tail(text, n) <= 3 && tok_utf8_incomplete_tail(text, n) <= n, "incomplete tail");
    for (int i = 0; i < n_ids; i++) FZ_CHECK(tok_id_to_piece(t, ids[i]) != NULL, "no piece for id %d", ids[i]);

    /* the stream: ids read from the text (two bytes each, some out of range), then the encoded ids */
    tok_stream *st = tok_stream_new(t);
    if (!st) abort();
    int nf = (int)(n / 2);
    int32_t *fids = malloc((size_t)(nf + 1) * sizeof *fids);
    if (!fids) abort();
    for (int i = 0; i < nf; i++) {
        unsigned v = (unsigned char)text[2 * i] | (unsigned)(unsigned char)text[2 * i + 1] << 8;
        fids[i] = (int32_t)(v % (unsigned)(vocab + 3)) - 1;   /* -1 .. vocab + 1 */
    }
    check_stream(t, st, fids, nf, "fuzz ids");
    check_stream(t, st, ids, n_ids, "encoded ids after a flush");
    tok_stream_free(st);

    /* stop strings over the decoded text, as the scheduler feeds them */
    check_stopper(stops, n_stops, dec, dn, ((mode >> 2) & 7) + 1);

    free(fids);
    free(clean2);
    free(clean);
    free(dec);
    free(ids);
    free(text);
    free(stops_text);
    return 0;
}

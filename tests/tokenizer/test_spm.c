/*
 * test_spm.c - the SentencePiece tokenizer against its contract.
 *
 *   test_spm MODEL [--lines FILE] [--llama2] [--dump CASES | --ref REF]
 *
 * Cases: an edge-case list (spaces, tabs, newlines, emoji, CJK, combining
 * marks, digits, long words, invalid UTF-8, a 1 MB input, the empty string),
 * every line of FILE, and random id sequences rich in byte pieces, BOS, EOS
 * and <unk>. Without --ref the checks are self-consistency (round trip,
 * stream == one-shot, invalid UTF-8 rule, pieces); spm_oracle.py first runs
 * --dump to get the cases, computes ids and text with the Python
 * sentencepiece package, and reruns with --ref to compare against them.
 * A path starting with "@shared/" is under the shared data folder
 * ($KDA_SHARED, else $KDA_SRC/../shared); if it is absent the test skips (77).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "tokenizer.h"
#include "stream_check.h"

typedef struct {
    char *text;        /* text case: [len] bytes (NULL for an id case) */
    size_t len;
    int32_t *ids;      /* id case: [n] ids; text case: the reference encoding (--ref) */
    int n;
    char *ref_text;    /* id case with --ref: Python's decode */
    size_t ref_len;
    int32_t *enc;      /* text case: tok_encode without BOS, [n_enc] (encoding 1 MB takes seconds) */
    int n_enc;
} tcase;

static tok_tokenizer *T;
static tcase *cases;
static int n_cases, cap_cases;
static int have_ref, expect_llama2;

static void add_case(const char *text, size_t len, const int32_t *ids, int n) {
    if (n_cases == cap_cases) {
        cap_cases = cap_cases ? cap_cases * 2 : 256;
        cases = realloc(cases, (size_t)cap_cases * sizeof(*cases));
    }
    tcase *c = &cases[n_cases++];
    memset(c, 0, sizeof(*c));
    if (text) {
        c->text = malloc(len + 1);
        memcpy(c->text, text, len);
        c->text[len] = '\0';
        c->len = len;
    } else {
        c->ids = malloc(((size_t)n + 1) * sizeof(int32_t));
        memcpy(c->ids, ids, (size_t)n * sizeof(int32_t));
        c->n = n;
    }
}

#define ADD(s) add_case(s, sizeof(s) - 1, NULL, 0)

static void add_edge_cases(void) {
    ADD("");
    ADD(" ");
    ADD("  ");
    ADD("     ");
    ADD("   leading spaces");
    ADD("trailing spaces   ");
    ADD(" leading");
    ADD("trailing ");
    ADD("  both  sides  ");
    ADD("a  b   c    d     e");
    ADD("\t");
    ADD("\ttabs\tbetween\t\twords\t");
    ADD("\n");
    ADD("\n\n\nthree newlines first\n\n");
    ADD("line one\nline two\r\nline three\rend");
    ADD(" \t \n \t ");
    ADD("Hello, World!");
    ADD("The quick brown fox jumps over the lazy dog.");
    ADD("\xF0\x9F\x98\x80");                                          /* 😀 */
    ADD("I \xE2\x9D\xA4\xEF\xB8\x8F \xF0\x9F\x8D\x95 and \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9"
        "\xE2\x80\x8D\xF0\x9F\x91\xA7 families");                     /* ❤️ 🍕 👨‍👩‍👧 (ZWJ) */
    ADD("\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5 flag");                     /* 🇯🇵 */
    ADD("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C");   /* 你好，世界 */
    ADD("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88");
    ADD("\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xEB\xAC\xB8\xEC\x9E\xA5");   /* 한국어 문장 */
    ADD("\xF0\xA0\x80\x80\xF0\xAA\x9A\xB2 rare CJK ext B");            /* 𠀀𪚲 */
    ADD("e\xCC\x81 vs \xC3\xA9");                                     /* e + combining acute vs é */
    ADD("Z\xCC\xA4\xCD\x94\xCD\xA7\xCC\x91\xCC\x93" "a\xCC\x88\xCD\x96\xCC\xADl\xCD\xAE\xCC\x92g\xCC\x8C"
        "o\xCC\x99\xCC\x94");                                          /* stacked combining marks */
    ADD("\xEF\xAC\x81 ligature, \xE2\x84\xAB Angstrom, \xEF\xBC\xA1 fullwidth");   /* not normalized */
    ADD("0123456789");
    ADD("3.14159 2,718 1e-9 -42 +7 0x1F 1_000_000");
    ADD("2024-01-01T12:34:56Z");
    ADD("99999999999999999999999999999999");
    ADD("Pneumonoultramicroscopicsilicovolcanoconiosis");
    ADD("\xC2\xBF\x51u\xC3\xA9 tal? \xC3\x87" "a va. Gr\xC3\xBC\xC3\x9F" "e, \xC3\x98resund");
    ADD("\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC \xD0\xA0\xD1\x83\xD1\x81\xD1\x81"
        "\xD0\xBA\xD0\xB8\xD0\xB9 \xD7\xA2\xD7\x91\xD7\xA8\xD7\x99\xD7\xAA \xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1"
        "\xD8\xA8\xD9\x8A\xD8\xA9");                                   /* Greek, Russian, Hebrew, Arabic */
    ADD("<s> </s> <unk> <0x41> are plain text here");
    ADD("\xE2\x96\x81 the space marker itself \xE2\x96\x81\xE2\x96\x81");   /* ▁ */
    ADD("a\0b\0");                                                     /* NUL bytes */
    ADD("\x01\x02\x1B[0m\x7F control characters");
    ADD("\xEF\xBB\xBF" "BOM first");
    ADD("\xEF\xBF\xBD replacement character");
    /* Invalid UTF-8 (documented: each ill-formed byte acts as U+FFFD). */
    ADD("\xFF");
    ADD("abc\x80" "def");
    ADD("cut \xE2\x82");
    ADD("\xC0\x80 overlong");
    ADD("\xED\xA0\x80 surrogate");
    ADD("\xF4\x90\x80\x80 too high");
    ADD("ok \xF0\x9F\x98");
    ADD("\xE2\x82\xE2\x82\xAC");

    /* Very long words and a 1 MB input. */
    static char buf[1 << 20];
    memset(buf, 'x', 10000);
    add_case(buf, 10000, NULL, 0);
    size_t n = 0;
    while (n + 26 <= 8000) { memcpy(buf + n, "supercalifragilisticexpia", 25); n += 25; }
    add_case(buf, n, NULL, 0);
    static const char para[] =
        "The quick brown fox \xE4\xBD\xA0\xE5\xA5\xBD jumps \xF0\x9F\x98\x80 over the lazy dog, "
        "\xC3\xBC" "ber 42 times.\n\tIndented: x = 3.14;  two  spaces\n";
    n = 0;
    while (n + sizeof(para) - 1 <= sizeof(buf)) { memcpy(buf + n, para, sizeof(para) - 1); n += sizeof(para) - 1; }
    add_case(buf, n, NULL, 0);
}

static void add_lines(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        if (len > 0 && line[len - 1] == '\n') len--;
        add_case(line, (size_t)len, NULL, 0);
    }
    free(line);
    fclose(f);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static int32_t byte_id[256];

/* Appends the UTF-8 bytes of a random code point as byte pieces, sometimes
 * cut short or corrupted, so runs form and break characters. */
static int add_byte_run(int32_t *ids, int at, int max) {
    static const uint32_t ranges[][2] = {{0x20, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF}, {0x10000, 0x10FFFF}};
    int r = (int)(next_rand() % 4);
    uint32_t cp = ranges[r][0] + next_rand() % (ranges[r][1] - ranges[r][0]);
    if (cp >= 0xD800 && cp < 0xE000) cp = 0xE000;
    unsigned char b[4];
    int n;
    if (cp < 0x80) { b[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { b[0] = 0xC0 | (cp >> 6); b[1] = 0x80 | (cp & 63); n = 2; }
    else if (cp < 0x10000) { b[0] = 0xE0 | (cp >> 12); b[1] = 0x80 | ((cp >> 6) & 63); b[2] = 0x80 | (cp & 63); n = 3; }
    else { b[0] = 0xF0 | (cp >> 18); b[1] = 0x80 | ((cp >> 12) & 63); b[2] = 0x80 | ((cp >> 6) & 63); b[3] = 0x80 | (cp & 63); n = 4; }
    uint32_t mode = next_rand() % 6;
    if (mode == 0 && n > 1) n = 1 + (int)(next_rand() % (uint32_t)(n - 1));   /* cut short */
    if (mode == 1) b[next_rand() % (uint32_t)n] = (unsigned char)(next_rand() % 256);   /* corrupt */
    int k = 0;
    for (; k < n && at + k < max; k++) ids[at + k] = byte_id[b[k]];
    return k;
}

static void add_random_id_cases(int count) {
    const int V = tok_vocab_size(T);
    int32_t special[4] = {tok_bos_id(T), tok_eos_id(T), tok_piece_to_id(T, "<unk>"),
                          tok_piece_to_id(T, "\xE2\x96\x81")};
    int32_t ids[48];
    for (int c = 0; c < count; c++) {
        int n = 1 + (int)(next_rand() % 48);
        for (int i = 0; i < n;) {
            uint32_t r = next_rand() % 10;
            if (r < 4) ids[i++] = (int32_t)(next_rand() % (uint32_t)V);
            else if (r < 7) i += add_byte_run(ids, i, n);
            else {
                int32_t id = special[next_rand() % 4];
                ids[i++] = id >= 0 ? id : (int32_t)(next_rand() % (uint32_t)V);
            }
        }
        add_case(NULL, 0, ids, n);
    }
    /* Hand-picked starts: the leading-space rule after BOS and lone markers. */
    int32_t bos = special[0], sp = special[3];
    int32_t the = tok_piece_to_id(T, "\xE2\x96\x81the");
    if (the < 0) the = tok_piece_to_id(T, "\xE2\x96\x81t");
    if (sp >= 0 && the >= 0 && bos >= 0) {
        int32_t a[] = {bos, sp, the}, b[] = {sp, sp, the}, d[] = {bos, bos, sp},
                e[] = {byte_id[' '], the, sp}, f[] = {bos, byte_id[0xE2], byte_id[0x82], the};
        add_case(NULL, 0, a, 3);
        add_case(NULL, 0, b, 3);
        add_case(NULL, 0, d, 3);
        add_case(NULL, 0, e, 3);
        add_case(NULL, 0, f, 4);
    }
}

/* ---- case and reference files (format documented in spm_oracle.py) ---- */

static void dump_cases(const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        if (c->text) {
            fprintf(f, "T %zu\n", c->len);
            fwrite(c->text, 1, c->len, f);
            fputc('\n', f);
        } else {
            fprintf(f, "I %d", c->n);
            for (int j = 0; j < c->n; j++) fprintf(f, " %d", (int)c->ids[j]);
            fputc('\n', f);
        }
    }
    fclose(f);
}

static void read_ref(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        char kind;
        if (c->text) {
            int n;
            if (fscanf(f, " %c %d", &kind, &n) != 2 || kind != 'E') goto bad;
            c->ids = malloc(((size_t)n + 1) * sizeof(int32_t));
            c->n = n;
            for (int j = 0; j < n; j++) {
                int v;
                if (fscanf(f, "%d", &v) != 1) goto bad;
                c->ids[j] = v;
            }
        } else {
            size_t len;
            if (fscanf(f, " %c %zu", &kind, &len) != 2 || kind != 'D' || fgetc(f) != '\n') goto bad;
            c->ref_text = malloc(len + 1);
            if (fread(c->ref_text, 1, len, f) != len) goto bad;
            c->ref_text[len] = '\0';
            c->ref_len = len;
        }
    }
    fclose(f);
    have_ref = 1;
    return;
bad:
    fprintf(stderr, "%s: malformed reference file\n", path);
    exit(1);
}

/* ---- tests ---- */

static int is_valid_utf8(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        int k = tok_utf8_char_len(s + i, len - i);
        if (k == 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

static void encode(const char *text, size_t len, int bos, int32_t **ids, int *n) {
    char err[256];
    if (tok_encode(T, text, len, bos, ids, n, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        fail();
    }
}

static int encode_all_cases(void **state) {
    (void)state;
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        char err[256];
        if (c->text && tok_encode(T, c->text, c->len, 0, &c->enc, &c->n_enc, err, sizeof(err)) != 0) {
            fprintf(stderr, "case %d: %s\n", i, err);
            return -1;
        }
    }
    return 0;
}

#define SMALL_CASE 65536   /* the bytes beyond which a check skips a case it would merely repeat */

static void special_ids_and_vocabulary(void **state) {
    (void)state;
    assert_true(tok_vocab_size(T) > 256);
    assert_false(tok_is_bytes(T));
    assert_int_equal(tok_bos_id(T), tok_piece_to_id(T, "<s>"));
    assert_int_equal(tok_eos_id(T), tok_piece_to_id(T, "</s>"));
    if (expect_llama2) {   /* MODEL_SPEC: Llama-2 vocabulary, 32000 ids, BOS 1, EOS 2 */
        assert_int_equal(tok_vocab_size(T), 32000);
        assert_int_equal(tok_bos_id(T), 1);
        assert_int_equal(tok_eos_id(T), 2);
    }
}

static void every_id_round_trips_through_its_piece(void **state) {
    (void)state;
    int V = tok_vocab_size(T), n_bytes = 0;
    for (int32_t id = 0; id < V; id++) {
        const char *p = tok_id_to_piece(T, id);
        assert_non_null(p);
        assert_int_equal(tok_piece_to_id(T, p), id);
        unsigned v;
        char tail;
        int looks_byte = strlen(p) == 6 && sscanf(p, "<0x%2X%c", &v, &tail) == 2 && tail == '>';
        assert_int_equal(tok_is_byte_piece(T, id), looks_byte);
        n_bytes += looks_byte;
    }
    assert_int_equal(n_bytes, 256);   /* byte fallback: every byte has a piece */
    assert_null(tok_id_to_piece(T, V));
    assert_null(tok_id_to_piece(T, -1));
    assert_int_equal(tok_piece_to_id(T, "no such piece \xC2\xA7\xC2\xA7"), -1);
}

static void encode_matches_python_sentencepiece(void **state) {
    (void)state;
    if (!have_ref) skip();
    int checked = 0;
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        if (!c->text) continue;
        if (c->n_enc != c->n || memcmp(c->enc, c->ids, (size_t)c->n * sizeof(int32_t)) != 0) {
            fprintf(stderr, "case %d (%zu bytes, \"%.40s\"): %d ids, Python gives %d\n", i, c->len,
                    c->text, c->n_enc, c->n);
            fail();
        }
        checked++;
    }
    assert_true(checked > 0);
}

/* The models of these tests (spm_train's BPE and unigram, Llama-2) decode
 * from the per-id table (tokenizer/surface.c). Its check at open turns it
 * off for a model it cannot describe, and would do the same for a broken
 * table: so this has to hold for the decode tests below to test the table. */
static void decodes_by_table(void **state) {
    (void)state;
    assert_true(tok_decodes_by_table(T));
}

static void decode_matches_python_sentencepiece(void **state) {
    (void)state;
    if (!have_ref) skip();
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        if (c->text) continue;
        char *text, err[256];
        size_t len;
        assert_int_equal(tok_decode_len(T, c->ids, c->n, &text, &len, err, sizeof(err)), 0);
        if (len != c->ref_len || memcmp(text, c->ref_text, len) != 0) {
            fprintf(stderr, "id case %d: decode differs from Python\n", i);
            fail();
        }
        free(text);
    }
}

/* Valid UTF-8 comes back unchanged (identity normalization; the one
 * exception is U+2581 itself, which SentencePiece reads as a space).
 * Invalid UTF-8 behaves as if each ill-formed byte were U+FFFD. */
static void decode_of_encode_gives_the_text_back(void **state) {
    (void)state;
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        if (!c->text) continue;
        int32_t *ids = c->enc;
        int n = c->n_enc;
        for (int j = 0; j < n; j++) assert_true(ids[j] >= 0 && ids[j] < tok_vocab_size(T));
        char *back, err[256];
        size_t back_len;
        assert_int_equal(tok_decode_len(T, ids, n, &back, &back_len, err, sizeof(err)), 0);
        size_t want_len;
        char *want = tok_utf8_sanitize(c->text, c->len, &want_len);
        if (!is_valid_utf8(c->text, c->len)) {
            int32_t *ids2;
            int n2;
            encode(want, want_len, 0, &ids2, &n2);
            assert_int_equal(n, n2);
            assert_memory_equal(ids, ids2, (size_t)n * sizeof(int32_t));
            free(ids2);
        }
        if (!memmem(c->text, c->len, "\xE2\x96\x81", 3)) {
            if (back_len != want_len || memcmp(back, want, want_len) != 0) {
                fprintf(stderr, "case %d (\"%.40s\") does not round-trip: \"%.40s\"\n", i, c->text, back);
                fail();
            }
        }
        free(want);
        free(back);
    }
}

static void add_bos_prepends_exactly_bos(void **state) {
    (void)state;
    for (int i = 0; i < n_cases && i < 200; i++) {
        tcase *c = &cases[i];
        if (!c->text || c->len > SMALL_CASE) continue;
        int32_t *b;
        int nb;
        encode(c->text, c->len, 1, &b, &nb);
        assert_int_equal(nb, c->n_enc + 1);
        assert_int_equal(b[0], tok_bos_id(T));
        assert_memory_equal(b + 1, c->enc, (size_t)c->n_enc * sizeof(int32_t));
        free(b);
    }
}

static void stream_equals_one_shot_for_encoded_texts(void **state) {
    (void)state;
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        if (!c->text) continue;
        int n = c->n_enc;
        check_stream(T, c->enc, n);                      /* without BOS */
        if (c->len > SMALL_CASE) continue;
        int32_t *more = malloc(((size_t)n + 2) * sizeof(int32_t));
        more[0] = tok_bos_id(T);
        memcpy(more + 1, c->enc, (size_t)n * sizeof(int32_t));
        more[n + 1] = tok_eos_id(T);
        check_stream(T, more, n + 2);                    /* BOS ... EOS */
        free(more);
    }
}

static void stream_equals_one_shot_for_random_ids(void **state) {
    (void)state;
    int checked = 0;
    for (int i = 0; i < n_cases; i++) {
        tcase *c = &cases[i];
        if (c->text) continue;
        check_stream(T, c->ids, c->n);
        checked++;
    }
    assert_true(checked > 0);
}

/* The byte tokenizer's U+FFFD rule (tok_utf8_sanitize) is SentencePiece's
 * rule for byte pieces: both kinds decode the same bytes to the same text. */
static void byte_pieces_decode_like_tok_utf8_sanitize(void **state) {
    (void)state;
    unsigned char b[16];
    int32_t ids[16];
    for (int iter = 0; iter < 20000; iter++) {
        int n = 1 + (int)(next_rand() % 16);
        for (int i = 0; i < n; i++) {
            uint32_t r = next_rand() % 4;
            b[i] = (unsigned char)(r == 0 ? next_rand() % 128 : r == 1 ? 0x80 + next_rand() % 64
                                                                       : 0xC0 + next_rand() % 64);
            ids[i] = byte_id[b[i]];
        }
        char *got, err[256];
        size_t got_len, want_len;
        assert_int_equal(tok_decode_len(T, ids, n, &got, &got_len, err, sizeof(err)), 0);
        char *want = tok_utf8_sanitize((const char *)b, (size_t)n, &want_len);
        assert_int_equal(got_len, want_len);
        assert_memory_equal(got, want, want_len);
        free(got);
        free(want);
    }
}

static void decode_rejects_ids_outside_the_vocabulary(void **state) {
    (void)state;
    int32_t ids[] = {tok_bos_id(T), tok_vocab_size(T)};
    char *text, err[256] = "";
    assert_int_not_equal(tok_decode(T, ids, 2, &text, err, sizeof(err)), 0);
    assert_true(strlen(err) > 0);
    ids[1] = -5;
    assert_int_not_equal(tok_decode(T, ids, 2, &text, err, sizeof(err)), 0);
}

/* Encode/decode share one immutable tokenizer across threads. */
static void *encode_all(void *arg) {
    unsigned long sum = 0; /* a hash: wraps by design */
    for (int i = 0; i < n_cases && i < 300; i++) {
        if (!cases[i].text || cases[i].len > SMALL_CASE) continue;
        int32_t *ids;
        int n;
        char err[256];
        if (tok_encode(T, cases[i].text, cases[i].len, 1, &ids, &n, err, sizeof(err)) != 0) return NULL;
        for (int j = 0; j < n; j++) sum = sum * 31u + (unsigned long)ids[j];
        free(ids);
    }
    *(long *)arg = (long)sum;
    return arg;
}

static void concurrent_encodes_agree(void **state) {
    (void)state;
    long want, got[4];
    assert_non_null(encode_all(&want));
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, encode_all, &got[i]), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_non_null(r);
        assert_true(got[i] == want);
    }
}

/* ---- main ---- */

static const char *resolve(const char *path) {
    if (strncmp(path, "@shared/", 8) != 0) return path;
    static char buf[4][4096];
    static int next;
    char *out = buf[next++ % 4];
    const char *shared = getenv("KDA_SHARED"), *src = getenv("KDA_SRC");
    if (shared && *shared) snprintf(out, 4096, "%s/%s", shared, path + 8);
    else if (src && *src) snprintf(out, 4096, "%s/../shared/%s", src, path + 8);
    else { printf("SKIP: %s needs KDA_SHARED or KDA_SRC\n", path); exit(77); }
    struct stat st;
    if (stat(out, &st) != 0) {
        printf("SKIP: %s not found (shared data absent; set KDA_SHARED)\n", out);
        exit(77);
    }
    return out;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [--lines FILE] [--llama2] [--dump CASES | --ref REF]\n", argv[0]);
        return 2;
    }
    const char *model = resolve(argv[1]), *lines = NULL, *dump = NULL, *ref = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--lines") && i + 1 < argc) lines = resolve(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(argv[i], "--ref") && i + 1 < argc) ref = argv[++i];
        else if (!strcmp(argv[i], "--llama2")) expect_llama2 = 1;
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    char err[512];
    if (tok_open_spm(&T, model, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof(piece), "<0x%02X>", b);
        byte_id[b] = tok_piece_to_id(T, piece);
        if (byte_id[b] < 0) { fprintf(stderr, "%s has no byte fallback piece %s\n", model, piece); return 1; }
    }
    add_edge_cases();
    if (lines) add_lines(lines);
    add_random_id_cases(3000);
    if (dump) { dump_cases(dump); return 0; }
    if (ref) read_ref(ref);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(special_ids_and_vocabulary),
        cmocka_unit_test(every_id_round_trips_through_its_piece),
        cmocka_unit_test(encode_matches_python_sentencepiece),
        cmocka_unit_test(decodes_by_table),
        cmocka_unit_test(decode_matches_python_sentencepiece),
        cmocka_unit_test(decode_of_encode_gives_the_text_back),
        cmocka_unit_test(add_bos_prepends_exactly_bos),
        cmocka_unit_test(stream_equals_one_shot_for_encoded_texts),
        cmocka_unit_test(stream_equals_one_shot_for_random_ids),
        cmocka_unit_test(byte_pieces_decode_like_tok_utf8_sanitize),
        cmocka_unit_test(decode_rejects_ids_outside_the_vocabulary),
        cmocka_unit_test(concurrent_encodes_agree),
    };
    int rc = cmocka_run_group_tests(tests, encode_all_cases, NULL);
    tok_close(T);
    return rc;
}

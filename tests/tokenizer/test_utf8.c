/*
 * test_utf8.c - the UTF-8 policy of tokenizer.h, with expectations taken
 * from Unicode's table 3-7 (well-formed byte sequences), and the property the
 * streams rely on: cutting before an unfinished tail never changes how the
 * bytes before the cut decode.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tokenizer.h"

#define FFFD "\xEF\xBF\xBD"
/* Literals may hold NUL bytes, so lengths come from sizeof. */
#define SANITIZED(in, want) assert_sanitized(in, sizeof(in) - 1, want, sizeof(want) - 1)

static void assert_sanitized(const char *in, size_t len, const char *want, size_t want_len) {
    size_t n;
    char *out = tok_utf8_sanitize(in, len, &n);
    assert_non_null(out);
    assert_int_equal(n, want_len);
    assert_memory_equal(out, want, n);
    assert_int_equal(out[n], '\0');
    free(out);
}

static void well_formed_sequences_have_their_length(void **state) {
    (void)state;
    assert_int_equal(tok_utf8_char_len("A", 1), 1);
    assert_int_equal(tok_utf8_char_len("\0", 1), 1);
    assert_int_equal(tok_utf8_char_len("\xC3\xA9", 2), 2);             /* é */
    assert_int_equal(tok_utf8_char_len("\xE2\x82\xAC", 3), 3);         /* € */
    assert_int_equal(tok_utf8_char_len("\xE0\xA0\x80", 3), 3);         /* U+0800, lowest 3-byte */
    assert_int_equal(tok_utf8_char_len("\xED\x9F\xBF", 3), 3);         /* U+D7FF, below surrogates */
    assert_int_equal(tok_utf8_char_len("\xEE\x80\x80", 3), 3);         /* U+E000, above surrogates */
    assert_int_equal(tok_utf8_char_len("\xF0\x9F\x98\x80", 4), 4);     /* 😀 */
    assert_int_equal(tok_utf8_char_len("\xF4\x8F\xBF\xBF", 4), 4);     /* U+10FFFF */
}

static void ill_formed_sequences_have_no_length(void **state) {
    (void)state;
    assert_int_equal(tok_utf8_char_len("", 0), 0);
    assert_int_equal(tok_utf8_char_len("\x80", 1), 0);                 /* stray continuation */
    assert_int_equal(tok_utf8_char_len("\xC0\x80", 2), 0);             /* overlong NUL */
    assert_int_equal(tok_utf8_char_len("\xC1\xBF", 2), 0);             /* overlong */
    assert_int_equal(tok_utf8_char_len("\xE0\x9F\xBF", 3), 0);         /* overlong 3-byte */
    assert_int_equal(tok_utf8_char_len("\xED\xA0\x80", 3), 0);         /* surrogate U+D800 */
    assert_int_equal(tok_utf8_char_len("\xF0\x8F\xBF\xBF", 4), 0);     /* overlong 4-byte */
    assert_int_equal(tok_utf8_char_len("\xF4\x90\x80\x80", 4), 0);     /* U+110000 */
    assert_int_equal(tok_utf8_char_len("\xF5\x80\x80\x80", 4), 0);
    assert_int_equal(tok_utf8_char_len("\xFF", 1), 0);
    assert_int_equal(tok_utf8_char_len("\xE2\x82", 2), 0);             /* truncated */
    assert_int_equal(tok_utf8_char_len("\xE2\x82\x41", 3), 0);         /* interrupted */
}

static void sanitize_replaces_each_ill_formed_byte(void **state) {
    (void)state;
    SANITIZED("", "");
    SANITIZED("plain ascii", "plain ascii");
    SANITIZED("a\0b", "a\0b");
    SANITIZED("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
    SANITIZED("a\xFF" "b", "a" FFFD "b");
    SANITIZED("\xE2\x82" "b", FFFD FFFD "b");                /* truncated: one per byte */
    SANITIZED("\xE2\x82", FFFD FFFD);
    SANITIZED("\xC0\x80", FFFD FFFD);
    SANITIZED("\xED\xA0\x80", FFFD FFFD FFFD);
    SANITIZED("\xF4\x90\x80\x80", FFFD FFFD FFFD FFFD);
    SANITIZED("\x80\xBF" "x", FFFD FFFD "x");
    SANITIZED("\xF0\x9F\x98\xE2\x82\xAC", FFFD FFFD FFFD "\xE2\x82\xAC");
}

static void incomplete_tail_is_an_unfinished_well_formed_prefix(void **state) {
    (void)state;
    assert_int_equal(tok_utf8_incomplete_tail("", 0), 0);
    assert_int_equal(tok_utf8_incomplete_tail("abc", 3), 0);
    assert_int_equal(tok_utf8_incomplete_tail("a\xE2", 2), 1);
    assert_int_equal(tok_utf8_incomplete_tail("a\xE2\x82", 3), 2);
    assert_int_equal(tok_utf8_incomplete_tail("\xE2\x82\xAC", 3), 0);
    assert_int_equal(tok_utf8_incomplete_tail("\xF0", 1), 1);
    assert_int_equal(tok_utf8_incomplete_tail("\xF0\x9F", 2), 2);
    assert_int_equal(tok_utf8_incomplete_tail("\xF0\x9F\x98", 3), 3);
    assert_int_equal(tok_utf8_incomplete_tail("\xF0\x9F\x98\x80", 4), 0);
    assert_int_equal(tok_utf8_incomplete_tail("\xF0\x9F\x98\x80\xC3", 5), 1);
    assert_int_equal(tok_utf8_incomplete_tail("\xED\xA0", 2), 0);      /* can only become a surrogate */
    assert_int_equal(tok_utf8_incomplete_tail("\xE0\x80", 2), 0);      /* can only become overlong */
    assert_int_equal(tok_utf8_incomplete_tail("\xF4\x90", 2), 0);      /* past U+10FFFF */
    assert_int_equal(tok_utf8_incomplete_tail("\xC0", 1), 0);
    assert_int_equal(tok_utf8_incomplete_tail("\xFF", 1), 0);
    assert_int_equal(tok_utf8_incomplete_tail("\x80\x80", 2), 0);
    assert_int_equal(tok_utf8_incomplete_tail("\xE2\x41", 2), 0);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Random bytes biased towards lead and continuation bytes. */
static void random_bytes(unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t r = next_rand() % 8;
        if (r < 2) b[i] = (unsigned char)(0x20 + next_rand() % 0x60);
        else if (r < 5) b[i] = (unsigned char)(0x80 + next_rand() % 0x40);
        else b[i] = (unsigned char)(0xC0 + next_rand() % 0x40);
    }
}

static void cut_before_incomplete_tail_keeps_the_decoded_prefix(void **state) {
    (void)state;
    unsigned char b[24];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = 1 + next_rand() % sizeof(b);
        random_bytes(b, n);
        size_t full_len;
        char *full = tok_utf8_sanitize((const char *)b, n, &full_len);
        for (size_t c = 0; c <= n; c++) {
            size_t cut = c - tok_utf8_incomplete_tail((const char *)b, c);
            size_t head_len, rest_len;
            char *head = tok_utf8_sanitize((const char *)b, cut, &head_len);
            char *rest = tok_utf8_sanitize((const char *)b + cut, n - cut, &rest_len);
            assert_int_equal(head_len + rest_len, full_len);
            assert_memory_equal(full, head, head_len);
            assert_memory_equal(full + head_len, rest, rest_len);
            free(head);
            free(rest);
        }
        /* The output is itself well-formed all the way. */
        for (size_t i = 0; i < full_len;) {
            int k = tok_utf8_char_len(full + i, full_len - i);
            assert_true(k > 0);
            i += (size_t)k;
        }
        free(full);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(well_formed_sequences_have_their_length),
        cmocka_unit_test(ill_formed_sequences_have_no_length),
        cmocka_unit_test(sanitize_replaces_each_ill_formed_byte),
        cmocka_unit_test(incomplete_tail_is_an_unfinished_well_formed_prefix),
        cmocka_unit_test(cut_before_incomplete_tail_keeps_the_decoded_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

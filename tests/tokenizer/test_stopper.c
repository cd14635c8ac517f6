/*
 * test_stopper.c - stop strings across streamed chunks: whatever the chunking,
 * the emitted text is everything before the first stop string (or all of it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tokenizer.h"

typedef struct { char text[4096]; size_t len; int stopped; int stop_calls; } result;

/* Feeds chunks (NULL-terminated list), then flushes; collects the output. */
static result run(const char *const *stops, int n_stops, const char *const *chunks) {
    result r = {0};
    tok_stopper *s = tok_stopper_new(stops, n_stops);
    assert_non_null(s);
    for (int i = 0; chunks[i]; i++) {
        size_t n;
        int stopped;
        const char *out = tok_stopper_feed(s, chunks[i], strlen(chunks[i]), &n, &stopped);
        assert_true(r.len + n < sizeof(r.text));
        memcpy(r.text + r.len, out, n);
        r.len += n;
        if (stopped) r.stop_calls++;
        if (stopped && !r.stopped) r.stopped = 1;
        /* Once stopped, it stays stopped and emits nothing. */
        if (r.stopped) assert_true(stopped);
    }
    size_t n;
    const char *out = tok_stopper_flush(s, &n);
    memcpy(r.text + r.len, out, n);
    r.len += n;
    r.text[r.len] = '\0';
    tok_stopper_free(s);
    return r;
}

static void no_stop_strings_passes_everything_through(void **state) {
    (void)state;
    const char *chunks[] = {"Hello", ", ", "world", NULL};
    result r = run(NULL, 0, chunks);
    assert_string_equal(r.text, "Hello, world");
    assert_false(r.stopped);
}

static void stop_inside_one_chunk_cuts_right_before_it(void **state) {
    (void)state;
    const char *stops[] = {"STOP"};
    const char *chunks[] = {"abc STOP def", "more", NULL};
    result r = run(stops, 1, chunks);
    assert_string_equal(r.text, "abc ");
    assert_true(r.stopped);
    assert_int_equal(r.stop_calls, 2);
}

static void stop_straddling_chunks_is_found(void **state) {
    (void)state;
    const char *stops[] = {"</answer>"};
    const char *chunks[] = {"The answer is 42</", "ans", "w", "er>tail", NULL};
    result r = run(stops, 1, chunks);
    assert_string_equal(r.text, "The answer is 42");
    assert_true(r.stopped);
}

static void held_text_is_released_when_the_stop_does_not_complete(void **state) {
    (void)state;
    const char *stops[] = {"</answer>"};
    const char *chunks[] = {"a </ans", "x b", NULL};
    tok_stopper *s = tok_stopper_new(stops, 1);
    size_t n;
    int stopped;
    const char *out = tok_stopper_feed(s, chunks[0], strlen(chunks[0]), &n, &stopped);
    assert_int_equal(n, 2);               /* "</ans" is held back */
    assert_memory_equal(out, "a ", 2);
    out = tok_stopper_feed(s, chunks[1], strlen(chunks[1]), &n, &stopped);
    assert_int_equal(n, 8);
    assert_memory_equal(out, "</ansx b", 8);
    assert_false(stopped);
    tok_stopper_free(s);
}

static void unfinished_stop_prefix_is_emitted_at_flush(void **state) {
    (void)state;
    const char *stops[] = {"\n\nUser:"};
    const char *chunks[] = {"bye\n", "\nUs", NULL};
    result r = run(stops, 1, chunks);
    assert_string_equal(r.text, "bye\n\nUs");
    assert_false(r.stopped);
}

static void earliest_of_several_stops_wins(void **state) {
    (void)state;
    const char *stops[] = {"world", "lo, w", "xyz"};
    const char *chunks[] = {"hel", "lo, wor", "ld", NULL};
    result r = run(stops, 3, chunks);
    assert_string_equal(r.text, "hel");
    assert_true(r.stopped);
}

static void overlapping_prefixes_do_not_hide_a_match(void **state) {
    (void)state;
    /* "aab" must be found in "aaab" although the first "aa" was a false start. */
    const char *stops[] = {"aab"};
    const char *chunks[] = {"xa", "a", "a", "b", NULL};
    result r = run(stops, 1, chunks);
    assert_string_equal(r.text, "xa");
    assert_true(r.stopped);

    const char *stops2[] = {"abcd", "bce"};
    const char *chunks2[] = {"ab", "c", "e!", NULL};
    r = run(stops2, 2, chunks2);
    assert_string_equal(r.text, "a");
    assert_true(r.stopped);
}

static void stop_at_the_very_start_emits_nothing(void **state) {
    (void)state;
    const char *stops[] = {"###"};
    const char *chunks[] = {"#", "##", "after", NULL};
    result r = run(stops, 1, chunks);
    assert_int_equal(r.len, 0);
    assert_true(r.stopped);
}

static void empty_stop_strings_are_ignored(void **state) {
    (void)state;
    const char *stops[] = {"", "END"};
    const char *chunks[] = {"text", "END", NULL};
    result r = run(stops, 2, chunks);
    assert_string_equal(r.text, "text");
    assert_true(r.stopped);
}

static void multibyte_stop_split_inside_a_character(void **state) {
    (void)state;
    const char *stops[] = {"\xE2\x80\x94STOP"};   /* "—STOP" */
    const char *chunks[] = {"caf\xC3\xA9 \xE2\x80", "\x94ST", "OP!", NULL};
    result r = run(stops, 1, chunks);
    assert_string_equal(r.text, "caf\xC3\xA9 ");
    assert_true(r.stopped);
}

/* Every way of cutting a text into 1..3-byte chunks gives the same output. */
static void chunking_never_changes_the_output(void **state) {
    (void)state;
    const char *stops[] = {"<end>", "ndx", "e<"};
    const char *text = "the <en<end <e <end>d of it";
    const char *want = "the <en<end <e ";
    size_t len = strlen(text);
    uint64_t rng = 12345;
    for (int iter = 0; iter < 2000; iter++) {
        tok_stopper *s = tok_stopper_new(stops, 3);
        char got[256];
        size_t got_len = 0, n;
        int stopped = 0;
        for (size_t i = 0; i < len;) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t k = 1 + (rng >> 60) % 3;
            if (k > len - i) k = len - i;
            const char *out = tok_stopper_feed(s, text + i, k, &n, &stopped);
            memcpy(got + got_len, out, n);
            got_len += n;
            i += k;
        }
        const char *out = tok_stopper_flush(s, &n);
        memcpy(got + got_len, out, n);
        got_len += n;
        assert_true(stopped);
        assert_int_equal(got_len, strlen(want));
        assert_memory_equal(got, want, got_len);
        tok_stopper_free(s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_stop_strings_passes_everything_through),
        cmocka_unit_test(stop_inside_one_chunk_cuts_right_before_it),
        cmocka_unit_test(stop_straddling_chunks_is_found),
        cmocka_unit_test(held_text_is_released_when_the_stop_does_not_complete),
        cmocka_unit_test(unfinished_stop_prefix_is_emitted_at_flush),
        cmocka_unit_test(earliest_of_several_stops_wins),
        cmocka_unit_test(overlapping_prefixes_do_not_hide_a_match),
        cmocka_unit_test(stop_at_the_very_start_emits_nothing),
        cmocka_unit_test(empty_stop_strings_are_ignored),
        cmocka_unit_test(multibyte_stop_split_inside_a_character),
        cmocka_unit_test(chunking_never_changes_the_output),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_bytes_tok.c - the byte tokenizer (ids 0..255 are bytes) and opening a
 * model directory: config.json's "tokenizer": "bytes" and the errors when a
 * directory has no tokenizer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tokenizer.h"
#include "stream_check.h"

#define FFFD "\xEF\xBF\xBD"

static tok_tokenizer *open_bytes(void) {
    tok_tokenizer *t;
    assert_int_equal(tok_open_bytes(&t), 0);
    return t;
}

static void byte_tokenizer_has_256_ids_and_no_specials(void **state) {
    (void)state;
    tok_tokenizer *t = open_bytes();
    assert_int_equal(tok_vocab_size(t), 256);
    assert_int_equal(tok_bos_id(t), -1);
    assert_int_equal(tok_eos_id(t), -1);
    assert_true(tok_is_bytes(t));
    tok_close(t);
}

static void encode_gives_the_bytes_verbatim_even_invalid_utf8(void **state) {
    (void)state;
    tok_tokenizer *t = open_bytes();
    const char text[] = "A\xC3\xA9\xFF\0z";
    int32_t *ids;
    int n;
    char err[256];
    assert_int_equal(tok_encode(t, text, sizeof(text) - 1, 1, &ids, &n, err, sizeof(err)), 0);
    int32_t want[] = {0x41, 0xC3, 0xA9, 0xFF, 0x00, 0x7A};   /* add_bos: no BOS to add */
    assert_int_equal(n, 6);
    assert_memory_equal(ids, want, sizeof(want));
    free(ids);
    assert_int_equal(tok_encode(t, "", 0, 0, &ids, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 0);
    free(ids);
    tok_close(t);
}

static void decode_replaces_invalid_bytes_with_fffd(void **state) {
    (void)state;
    tok_tokenizer *t = open_bytes();
    int32_t ids[] = {'o', 'k', 0xE2, 0x82, 0xAC, 0xFF, 0xE2, 0x82, '!'};
    char *text, err[256];
    assert_int_equal(tok_decode(t, ids, 9, &text, err, sizeof(err)), 0);
    assert_string_equal(text, "ok\xE2\x82\xAC" FFFD FFFD FFFD "!");
    free(text);
    tok_close(t);
}

static void decode_rejects_ids_outside_the_vocabulary(void **state) {
    (void)state;
    tok_tokenizer *t = open_bytes();
    int32_t ids[] = {'a', 256};
    char *text = (char *)1, err[256] = "";
    assert_int_not_equal(tok_decode(t, ids, 2, &text, err, sizeof(err)), 0);
    assert_null(text);
    assert_non_null(strstr(err, "256"));
    int32_t neg[] = {-1};
    assert_int_not_equal(tok_decode(t, neg, 1, &text, err, sizeof(err)), 0);
    tok_close(t);
}

static void pieces_are_spelled_like_sentencepiece_byte_pieces(void **state) {
    (void)state;
    tok_tokenizer *t = open_bytes();
    assert_string_equal(tok_id_to_piece(t, 0x41), "<0x41>");
    assert_string_equal(tok_id_to_piece(t, 0xE2), "<0xE2>");
    assert_null(tok_id_to_piece(t, 256));
    assert_null(tok_id_to_piece(t, -1));
    for (int32_t id = 0; id < 256; id++) {
        assert_int_equal(tok_piece_to_id(t, tok_id_to_piece(t, id)), id);
        assert_true(tok_is_byte_piece(t, id));
    }
    assert_int_equal(tok_piece_to_id(t, "<0xe2>"), -1);
    assert_int_equal(tok_piece_to_id(t, "A"), -1);
    assert_int_equal(tok_piece_to_id(t, "<0x41"), -1);
    assert_int_equal(tok_piece_to_id(t, "<0x4142>"), -1);
    tok_close(t);
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static void stream_equals_one_shot_decode_on_random_bytes(void **state) {
    (void)state;
    tok_tokenizer *t = open_bytes();
    int32_t ids[64];
    for (int iter = 0; iter < 5000; iter++) {
        int n = (int)(next_rand() % 64);
        for (int i = 0; i < n; i++) {
            uint32_t r = next_rand() % 4;
            ids[i] = r == 0 ? (int32_t)(next_rand() % 128)
                   : r == 1 ? (int32_t)(0x80 + next_rand() % 64)
                            : (int32_t)(0xC0 + next_rand() % 64);
        }
        check_stream(t, ids, n);
    }
    /* Whole characters split across pushes come out whole. */
    int32_t emoji[] = {0xF0, 0x9F, 0x98, 0x80, 'x'};
    check_stream(t, emoji, 5);
    tok_close(t);
}

static void stream_holds_an_unfinished_character_until_it_completes(void **state) {
    (void)state;
    tok_tokenizer *t = open_bytes();
    tok_stream *s = tok_stream_new(t);
    size_t k;
    tok_stream_push(s, 0xE2, &k);
    assert_int_equal(k, 0);
    tok_stream_push(s, 0x82, &k);
    assert_int_equal(k, 0);
    const char *out = tok_stream_push(s, 0xAC, &k);
    assert_int_equal(k, 3);
    assert_memory_equal(out, "\xE2\x82\xAC", 3);
    tok_stream_push(s, 0xF0, &k);
    assert_int_equal(k, 0);
    out = tok_stream_flush(s, &k);                  /* cut short: one U+FFFD */
    assert_int_equal(k, 3);
    assert_memory_equal(out, FFFD, 3);
    out = tok_stream_push(s, 'a', &k);               /* flush resets the stream */
    assert_int_equal(k, 1);
    tok_stream_free(s);
    tok_close(t);
}

static char tmpdir[256];

static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void open_dir_uses_config_bytes(void **state) {
    (void)state;
    write_file(tmpdir, "config.json", "{\"model_type\": \"kda\", \"tokenizer\": \"bytes\", \"vocab_size\": 256}");
    tok_tokenizer *t;
    char err[512];
    assert_int_equal(tok_open_dir(&t, tmpdir, err, sizeof(err)), 0);
    assert_true(tok_is_bytes(t));
    assert_int_equal(tok_vocab_size(t), 256);
    tok_close(t);
}

static void open_dir_without_tokenizer_says_why(void **state) {
    (void)state;
    tok_tokenizer *t = (tok_tokenizer *)1;
    char err[512] = "";
    write_file(tmpdir, "config.json", "{\"model_type\": \"kda\"}");
    assert_int_not_equal(tok_open_dir(&t, tmpdir, err, sizeof(err)), 0);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer.model"));
    write_file(tmpdir, "config.json", "{not json");
    assert_int_not_equal(tok_open_dir(&t, tmpdir, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "config.json"));
    assert_int_not_equal(tok_open_dir(&t, "/nonexistent/model/dir", err, sizeof(err)), 0);
    assert_non_null(strstr(err, "/nonexistent/model/dir"));
}

static void open_dir_with_a_broken_tokenizer_model_fails(void **state) {
    (void)state;
    write_file(tmpdir, "tokenizer.model", "this is not a sentencepiece model");
    tok_tokenizer *t;
    char err[512] = "";
    assert_int_not_equal(tok_open_dir(&t, tmpdir, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "tokenizer.model"));
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizer.model", tmpdir);
    unlink(path);
}

static int make_tmpdir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tok_test_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/config.json", tmpdir);
    unlink(path);
    return rmdir(tmpdir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(byte_tokenizer_has_256_ids_and_no_specials),
        cmocka_unit_test(encode_gives_the_bytes_verbatim_even_invalid_utf8),
        cmocka_unit_test(decode_replaces_invalid_bytes_with_fffd),
        cmocka_unit_test(decode_rejects_ids_outside_the_vocabulary),
        cmocka_unit_test(pieces_are_spelled_like_sentencepiece_byte_pieces),
        cmocka_unit_test(stream_equals_one_shot_decode_on_random_bytes),
        cmocka_unit_test(stream_holds_an_unfinished_character_until_it_completes),
        cmocka_unit_test(open_dir_uses_config_bytes),
        cmocka_unit_test(open_dir_without_tokenizer_says_why),
        cmocka_unit_test(open_dir_with_a_broken_tokenizer_model_fails),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}

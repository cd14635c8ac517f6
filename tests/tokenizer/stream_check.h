/*
 * stream_check.h - the streaming contract, shared by the tokenizer tests:
 * pushing ids one at a time (then flushing) yields only whole UTF-8
 * characters per chunk, and the chunks concatenate to tok_decode's text.
 * Needs cmocka.h and tokenizer.h included first.
 */
#ifndef KDA_TEST_STREAM_CHECK_H
#define KDA_TEST_STREAM_CHECK_H

static void check_stream(const tok_tokenizer *t, const int32_t *ids, int n) {
    char *want, err[256];
    size_t want_len;
    assert_int_equal(tok_decode_len(t, ids, n, &want, &want_len, err, sizeof(err)), 0);
    tok_stream *s = tok_stream_new(t);
    assert_non_null(s);
    char *got = malloc(want_len + 1);
    assert_non_null(got);
    size_t got_len = 0, k;
    for (int i = 0; i <= n; i++) {
        const char *chunk = i < n ? tok_stream_push(s, ids[i], &k) : tok_stream_flush(s, &k);
        if (got_len + k > want_len || memcmp(want + got_len, chunk, k) != 0) {
            fprintf(stderr, "stream diverges at id %d of %d (emitted %zu of %zu bytes)\n", i, n,
                    got_len, want_len);
            fail();
        }
        for (size_t j = 0; j < k;) {
            int c = tok_utf8_char_len(chunk + j, k - j);
            assert_true(c > 0);
            j += (size_t)c;
        }
        memcpy(got + got_len, chunk, k);
        got_len += k;
    }
    assert_int_equal(got_len, want_len);
    free(got);
    free(want);
    tok_stream_free(s);
}

#endif

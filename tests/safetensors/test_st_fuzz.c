/*
 * test_st_fuzz.c - deterministic mini-fuzz of st_parse: a valid file with
 * mutated or truncated headers must be either accepted with sane views or
 * rejected with a message, never crash or read outside the buffer (CI runs
 * this under ASan/UBSan; every input lives in an exact-size allocation).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "st_writer.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;   /* fixed seed: failures reproduce */

static uint32_t next_u32(void) {              /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Dull) >> 32);
}

static stw_blob seed_file(void) {
    static const float f[6] = {1, 2, 3, 4, 5, 6};
    static const uint16_t h[4] = {1, 2, 3, 4};
    static const int64_t i[1] = {42};
    stw_file w = { .metadata = "{\"format\":\"pt\"}" };
    stw_add(&w, "layers.0.w", "F32", 2, (int64_t[]){2, 3}, f, sizeof f);
    stw_add(&w, "layers.0.b", "BF16", 1, (int64_t[]){4}, h, sizeof h);
    stw_add(&w, "empty", "F16", 2, (int64_t[]){0, 7}, NULL, 0);
    stw_add(&w, "step", "I64", 0, NULL, i, sizeof i);
    stw_add(&w, "norm", "F16", 3, (int64_t[]){1, 2, 2}, h, sizeof h);
    return stw_build(&w);
}

/* Bytes that steer the JSON parser into its other branches. */
static const char interesting[] = "{}[]\":,-.0123456789eE+ \\u\x80\xff\0tfn";

/* Returns 1 if accepted. An accepted set must satisfy the header contract. */
static int feed(const unsigned char *bytes, size_t size) {
    unsigned char *buf = malloc(size ? size : 1);
    if (size) memcpy(buf, bytes, size);
    st_set *s = calloc(1, sizeof *s);
    char err[512];
    err[0] = 0;
    int rc = st_parse(s, 0, buf, size, "fuzz", err, sizeof err);
    assert_true(rc == 0 || rc == -1);
    if (rc == -1) {
        assert_true(strncmp(err, "fuzz: ", 6) == 0);
        assert_int_equal(s->n_tensors, 0);
    } else {
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
        const unsigned char *lo = buf + 8 + hlen, *hi = buf + size;
        size_t covered = 0;
        for (int i = 0; i < s->n_tensors; i++) {
            const st_tensor *t = &s->tensors[i];
            if (i) assert_true(strcmp(s->tensors[i - 1].name, t->name) < 0);
            assert_true((unsigned)t->dtype < ST_N_DTYPES);
            assert_true(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            assert_int_equal(t->numel, numel);
            assert_int_equal(t->nbytes, (size_t)numel * st_dtype_size(t->dtype));
            const unsigned char *d = t->data;
            assert_true(d >= lo && d <= hi && t->nbytes <= (size_t)(hi - d));
            covered += t->nbytes;
        }
        assert_int_equal(covered, (size_t)(hi - lo));   /* ranges tile the data */
    }
    st_close(s);
    free(buf);
    return rc == 0;
}

static void seed_file_is_accepted(void **state) {
    (void)state;
    stw_blob b = seed_file();
    assert_int_equal(feed(b.buf, b.size), 1);
    stw_free(&b);
}

/* Exact coverage means any shorter file is invalid, however it is cut. */
static void every_truncation_is_rejected(void **state) {
    (void)state;
    stw_blob b = seed_file();
    for (size_t n = 0; n < b.size; n++) assert_int_equal(feed(b.buf, n), 0);
    stw_free(&b);
}

/* Each header byte replaced by each interesting byte, one at a time. */
static void single_byte_substitutions_never_crash(void **state) {
    (void)state;
    stw_blob b = seed_file();
    size_t hend = 8 + (size_t)b.buf[0] + ((size_t)b.buf[1] << 8);
    unsigned char *m = malloc(b.size);
    int accepted = 0, total = 0;
    for (size_t pos = 0; pos < hend; pos++)
        for (size_t k = 0; k < sizeof interesting - 1; k++) {
            memcpy(m, b.buf, b.size);
            m[pos] = (unsigned char)interesting[k];
            accepted += feed(m, b.size);
            total++;
        }
    /* Padding spaces and digits in unused spots allow some survivors, but
     * most substitutions must be caught. */
    assert_true(accepted < total / 2);
    free(m);
    stw_free(&b);
}

/* 2000 random multi-byte mutations: bit flips, random and interesting bytes,
 * header-length edits, then optionally a truncation or an extension. */
static void random_mutations_never_crash(void **state) {
    (void)state;
    stw_blob b = seed_file();
    size_t hend = 8 + (size_t)b.buf[0] + ((size_t)b.buf[1] << 8);
    unsigned char *m = malloc(b.size + 64);
    int accepted = 0;
    for (int iter = 0; iter < 2000; iter++) {
        memcpy(m, b.buf, b.size);
        memset(m + b.size, 0, 64);
        size_t size = b.size;
        int nmut = 1 + (int)(next_u32() % 4);
        for (int j = 0; j < nmut; j++) {
            size_t pos = next_u32() % hend;
            switch (next_u32() % 5) {
            case 0: m[pos] ^= (unsigned char)(1u << (next_u32() % 8)); break;
            case 1: m[pos] = (unsigned char)next_u32(); break;
            case 2: m[pos] = (unsigned char)interesting[next_u32() % (sizeof interesting - 1)]; break;
            case 3: m[next_u32() % 8] = (unsigned char)next_u32(); break;   /* header length */
            default: {                                                     /* duplicate a run */
                size_t len = 1 + next_u32() % 16, to = next_u32() % hend;
                if (pos + len <= hend && to + len <= hend) memmove(m + to, m + pos, len);
            }
            }
        }
        switch (next_u32() % 4) {
        case 0: size = next_u32() % (b.size + 1); break;
        case 1: size = b.size + next_u32() % 64; break;
        default: break;
        }
        accepted += feed(m, size);
    }
    assert_true(accepted < 2000);
    free(m);
    stw_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seed_file_is_accepted),
        cmocka_unit_test(every_truncation_is_rejected),
        cmocka_unit_test(single_byte_substitutions_never_crash),
        cmocka_unit_test(random_mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_st_corrupt.c - the corrupt-file corpus: each file is rejected, through
 * st_parse and through st_open_file, with a message that names the file and
 * says what is wrong, and nothing is handed out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "st_writer.h"

typedef struct {
    const char *header;      /* header JSON text */
    size_t data_len;         /* zero bytes after it */
    const char *expect;      /* substring of the error */
} bad_case;

#define F32_W(offs) "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":" offs "}}"

static const bad_case corpus[] = {
    /* not a JSON object */
    {"{\"w\": {\"dtype\": \"F32\"", 0, "not valid JSON"},
    {"not json at all", 0, "not valid JSON"},
    {"[1, 2, 3]", 0, "not a JSON object"},
    {"\"w\"", 0, "not a JSON object"},
    {"{} x", 0, "trailing bytes"},
    {"{\"\xff\xfe\":1}", 0, "UTF-8"},
    /* entry fields */
    {"{\"w\":3}", 0, "tensor \"w\": entry is not a JSON object"},
    {"{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor \"w\": missing \"dtype\""},
    {"{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "tensor \"w\": missing \"shape\""},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor \"w\": missing \"data_offsets\""},
    {"{\"w\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype \"F7\""},
    {"{\"w\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype \"f32\""},
    {"{\"w\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype is not a string"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "shape is not an array"},
    /* shape dims */
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape dim 0"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1.5],\"data_offsets\":[0,8]}}", 8, "shape dim 1"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "shape dim 0"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[null],\"data_offsets\":[0,8]}}", 8, "shape dim 0"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[[2]],\"data_offsets\":[0,8]}}", 8, "shape dim 0"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1e999],\"data_offsets\":[0,8]}}", 8, "shape dim 0"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[9007199254740992],\"data_offsets\":[0,8]}}", 8,
     "shape dim 0"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
     "shape has 9 dims"},
    /* 2^62 x 4: the first dim is already past what a double holds exactly */
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", 4,
     "shape dim 0"},
    /* 2^40 x 2^40 elements; 2^31 x 2^31 F32 elements fit int64 but not in bytes */
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,4]}}",
     4, "element count overflows"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],\"data_offsets\":[0,4]}}", 4,
     "byte size overflows"},
    /* byte ranges */
    {F32_W("[0,12]"), 12, "needs 8 bytes"},
    {"{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     "data_offsets [0, 8] but BF16 shape [3] needs 6 bytes"},
    {F32_W("[0,8]"), 4, "end past the data section"},
    {F32_W("[8,0]"), 8, "begin > end"},
    {F32_W("[0]"), 8, "data_offsets must be"},
    {F32_W("[0,8,8]"), 8, "data_offsets must be"},
    {F32_W("[\"0\",8]"), 8, "data_offsets must be"},
    {F32_W("[-8,0]"), 8, "data_offsets must be"},
    {F32_W("[0.5,8.5]"), 9, "data_offsets must be"},
    {F32_W("{\"begin\":0}"), 8, "data_offsets must be"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "hole"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover only 4"},
    /* an empty tensor inside another one's bytes is an overlap too */
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, "overlap"},
    {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
     "tensor \"w\": name appears twice"},
    /* truncated: a valid header whose data section was cut short */
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 10,
     "tensor \"b\": data_offsets [8, 16] end past the data section"},
    /* __metadata__ must be a string map */
    {"{\"__metadata__\":[1]}", 0, "__metadata__ is not a JSON object"},
    {"{\"__metadata__\":{\"format\":1}}", 0, "__metadata__ value \"format\" is not a string"},
};

/* A failed st_parse reports label and what, and leaves the set empty. */
static void expect_parse_rejects(const void *buf, size_t size, const char *what) {
    unsigned char *copy = malloc(size ? size : 1);   /* exact size: ASan sees over-reads */
    if (size) memcpy(copy, buf, size);
    st_set *s = calloc(1, sizeof *s);
    char err[512] = "";
    int rc = st_parse(s, 0, copy, size, "bad.safetensors", err, sizeof err);
    if (rc != -1 || !strstr(err, "bad.safetensors: ") || !strstr(err, what))
        print_error("st_parse: rc %d, want -1 and \"%s\"; got \"%s\"\n", rc, what, err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "bad.safetensors: "));
    assert_non_null(strstr(err, what));
    assert_int_equal(s->n_tensors, 0);
    assert_null(s->tensors);
    st_close(s);
    free(copy);
}

/* The same bytes as a file, alone and as a model directory. */
static void expect_open_rejects(const void *buf, size_t size, const char *what) {
    char *dir = stw_tmpdir();
    char *path = stw_path(dir, "model.safetensors");
    stw_write(path, buf, size);
    st_set dummy, *s = &dummy;   /* must be overwritten with NULL */
    char err[512] = "";
    assert_int_equal(st_open_file(&s, path, err, sizeof err), -1);
    assert_null(s);
    if (!strstr(err, path) || !strstr(err, what))
        print_error("st_open_file: want \"%s\" and \"%s\"; got \"%s\"\n", path, what, err);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, what));
    err[0] = 0;
    assert_int_equal(st_open_dir(&s, dir, err, sizeof err), -1);
    assert_null(s);
    assert_non_null(strstr(err, what));
    free(path);
    stw_rmtree(dir);
}

static void every_corpus_header_is_rejected_with_its_reason(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof corpus / sizeof *corpus; i++) {
        stw_blob b = stw_raw(corpus[i].header, NULL, corpus[i].data_len);
        expect_parse_rejects(b.buf, b.size, corpus[i].expect);
        expect_open_rejects(b.buf, b.size, corpus[i].expect);
        stw_free(&b);
    }
}

static void empty_and_short_files_are_rejected(void **state) {
    (void)state;
    expect_parse_rejects("", 0, "0 bytes");
    expect_open_rejects("", 0, "0 bytes");
    expect_parse_rejects("\x02\0\0\0\0", 5, "5 bytes");
    expect_open_rejects("\x02\0\0\0\0", 5, "5 bytes");
}

static void header_length_past_eof_or_huge_or_zero_is_rejected(void **state) {
    (void)state;
    unsigned char b[8 + 10] = {0};
    memcpy(b + 8, "{}        ", 10);
    stw_put_u64le(b, 11);
    expect_parse_rejects(b, sizeof b, "header length 11 runs past end of file");
    expect_open_rejects(b, sizeof b, "runs past end of file");
    stw_put_u64le(b, (uint64_t)1 << 63);
    expect_parse_rejects(b, sizeof b, "header length 9223372036854775808");
    expect_open_rejects(b, sizeof b, "header length 9223372036854775808");
    stw_put_u64le(b, UINT64_MAX);
    expect_parse_rejects(b, sizeof b, "runs past end of file");
    stw_put_u64le(b, 0);
    expect_parse_rejects(b, sizeof b, "header length is 0");
}

/* The reference caps headers at 100 MB; a length over it is rejected even
 * when the file really is that long. */
static void header_over_100mb_is_rejected(void **state) {
    (void)state;
    size_t hl = 100000001;
    unsigned char *b = calloc(1, 8 + hl);
    assert_non_null(b);
    stw_put_u64le(b, hl);
    b[8] = '{';
    b[9] = '}';
    memset(b + 10, ' ', hl - 2);
    expect_parse_rejects(b, 8 + hl, "exceeds the 100000000-byte limit");
    free(b);
}

/* JSON allows no raw control characters; cJSON alone would take them. */
static void control_bytes_inside_header_are_rejected(void **state) {
    (void)state;
    stw_blob b = stw_raw("{\"w\" :{}}", NULL, 0);
    b.buf[8 + 4] = 0;
    expect_parse_rejects(b.buf, b.size, "control byte 0x00 at byte 4");
    stw_free(&b);
    b = stw_raw("{\"a\x01" "b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", NULL, 4);
    expect_parse_rejects(b.buf, b.size, "control byte 0x01 at byte 3");
    stw_free(&b);
}

/* The message format the issue asks for, word for word. */
static void size_mismatch_message_names_file_tensor_offsets_and_need(void **state) {
    (void)state;
    stw_blob b = stw_raw("{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2048],"
                         "\"data_offsets\":[0,100]}}", NULL, 100);
    st_set *s = calloc(1, sizeof *s);
    char err[512] = "";
    assert_int_equal(st_parse(s, 0, b.buf, b.size, "model.safetensors", err, sizeof err), -1);
    assert_string_equal(err, "model.safetensors: tensor \"model.norm.weight\": data_offsets "
                             "[0, 100] but F32 shape [2048] needs 8192 bytes");
    st_close(s);
    stw_free(&b);
}

/* A short error buffer truncates the message but is still terminated; NULL
 * is allowed. */
static void small_or_missing_error_buffer_is_safe(void **state) {
    (void)state;
    stw_blob b = stw_raw("[]", NULL, 0);
    st_set *s = calloc(1, sizeof *s);
    char err[8];
    memset(err, 'x', sizeof err);
    assert_int_equal(st_parse(s, 0, b.buf, b.size, "bad.safetensors", err, sizeof err), -1);
    assert_int_equal(strlen(err), sizeof err - 1);
    assert_int_equal(st_parse(s, 0, b.buf, b.size, "bad.safetensors", NULL, 0), -1);
    st_close(s);
    stw_free(&b);
}

static void unopenable_paths_are_errors_with_the_reason(void **state) {
    (void)state;
    char *dir = stw_tmpdir();
    char *missing = stw_path(dir, "nope.safetensors");
    st_set *s = NULL;
    char err[512] = "";

    assert_int_equal(st_open_file(&s, missing, err, sizeof err), -1);
    assert_null(s);
    assert_non_null(strstr(err, missing));
    assert_non_null(strstr(err, "No such file"));

    assert_int_equal(st_open_file(&s, dir, err, sizeof err), -1);
    assert_null(s);
    assert_non_null(strstr(err, "is a directory"));

    /* A directory with neither file, one that does not exist, a file. */
    assert_int_equal(st_open_dir(&s, dir, err, sizeof err), -1);
    assert_null(s);
    assert_non_null(strstr(err, dir));
    assert_non_null(strstr(err, "neither model.safetensors nor model.safetensors.index.json"));
    assert_int_equal(st_open_dir(&s, missing, err, sizeof err), -1);
    assert_non_null(strstr(err, "No such file"));
    stw_write(missing, "x", 1);
    assert_int_equal(st_open_dir(&s, missing, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a directory"));

    /* model.safetensors that is a directory */
    char *sub = stw_path(dir, "model.safetensors");
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(st_open_dir(&s, dir, err, sizeof err), -1);
    assert_null(s);
    assert_non_null(strstr(err, "is a directory"));
    rmdir(sub);
    free(sub);
    free(missing);
    stw_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_corpus_header_is_rejected_with_its_reason),
        cmocka_unit_test(empty_and_short_files_are_rejected),
        cmocka_unit_test(header_length_past_eof_or_huge_or_zero_is_rejected),
        cmocka_unit_test(header_over_100mb_is_rejected),
        cmocka_unit_test(control_bytes_inside_header_are_rejected),
        cmocka_unit_test(size_mismatch_message_names_file_tensor_offsets_and_need),
        cmocka_unit_test(small_or_missing_error_buffer_is_safe),
        cmocka_unit_test(unopenable_paths_are_errors_with_the_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

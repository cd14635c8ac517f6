/*
 * test_st_valid.c - well-formed files load, and the views say what was written.
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

/* The fixture: every dtype the model contract allows (BF16/F16/F32) plus I64,
 * a 0-d scalar, two empty tensors, __metadata__, added out of name order. */
static const uint16_t embed_bf16[6] = {0x3F80, 0x4000, 0xBF80, 0x0000, 0x7F80, 0x3E80};
static const float norm_f32[4] = {1.0f, -2.5f, 3.25f, 1e-6f};
static const int64_t pos_i64[2] = {-5, (int64_t)1 << 40};
static const uint16_t half_f16[2] = {0x3C00, 0xC000};
static const float scale_f32 = 0.125f;

static stw_blob mixed_file(void) {
    stw_file f = { .metadata = "{\"format\":\"pt\",\"note\":\"x\"}" };
    stw_add(&f, "pos", "I64", 1, (int64_t[]){2}, pos_i64, sizeof pos_i64);  /* first: 8-aligned */
    stw_add(&f, "norm", "F32", 1, (int64_t[]){4}, norm_f32, sizeof norm_f32);
    stw_add(&f, "embed", "BF16", 2, (int64_t[]){2, 3}, embed_bf16, sizeof embed_bf16);
    stw_add(&f, "empty.a", "F32", 2, (int64_t[]){0, 16}, NULL, 0);
    stw_add(&f, "scale", "F32", 0, NULL, &scale_f32, sizeof scale_f32);
    stw_add(&f, "half", "F16", 2, (int64_t[]){1, 2}, half_f16, sizeof half_f16);
    stw_add(&f, "empty.b", "I64", 2, (int64_t[]){3, 0}, NULL, 0);
    return stw_build(&f);
}

static void expect_tensor(const st_set *s, const char *name, st_dtype dt, int ndim,
                          const int64_t *shape, const void *bytes, size_t nbytes) {
    const st_tensor *t = st_find(s, name);
    assert_non_null(t);
    assert_string_equal(t->name, name);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, ndim);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        assert_int_equal(t->shape[d], shape[d]);
        numel *= shape[d];
    }
    assert_int_equal(t->numel, numel);
    assert_int_equal(t->nbytes, nbytes);
    if (nbytes) assert_memory_equal(t->data, bytes, nbytes);
}

static void check_mixed(const st_set *s) {
    assert_int_equal(s->n_tensors, 7);   /* __metadata__ is not a tensor */
    expect_tensor(s, "embed", ST_BF16, 2, (int64_t[]){2, 3}, embed_bf16, sizeof embed_bf16);
    expect_tensor(s, "norm", ST_F32, 1, (int64_t[]){4}, norm_f32, sizeof norm_f32);
    expect_tensor(s, "pos", ST_I64, 1, (int64_t[]){2}, pos_i64, sizeof pos_i64);
    expect_tensor(s, "half", ST_F16, 2, (int64_t[]){1, 2}, half_f16, sizeof half_f16);
    expect_tensor(s, "scale", ST_F32, 0, NULL, &scale_f32, sizeof scale_f32);
    expect_tensor(s, "empty.a", ST_F32, 2, (int64_t[]){0, 16}, NULL, 0);
    expect_tensor(s, "empty.b", ST_I64, 2, (int64_t[]){3, 0}, NULL, 0);
    assert_int_equal(st_find(s, "scale")->numel, 1);
    assert_int_equal(st_find(s, "empty.a")->numel, 0);
    const int64_t *p = st_find(s, "pos")->data;
    assert_int_equal(p[1], (int64_t)1 << 40);
}

static void parse_from_memory_gives_views_into_the_buffer(void **state) {
    (void)state;
    stw_blob b = mixed_file();
    st_set *s = calloc(1, sizeof *s);
    char err[256] = "";
    assert_int_equal(st_parse(s, 3, b.buf, b.size, "mem", err, sizeof err), 0);
    check_mixed(s);
    for (int i = 0; i < s->n_tensors; i++) {
        const unsigned char *d = s->tensors[i].data;
        assert_int_equal(s->tensors[i].file, 3);
        assert_true(d >= b.buf + 8 && d + s->tensors[i].nbytes <= b.buf + b.size);
    }
    st_close(s);
    stw_free(&b);
}

static void open_file_maps_and_views_match_written_bytes(void **state) {
    (void)state;
    char *dir = stw_tmpdir();
    stw_blob b = mixed_file();
    stw_write_blob(dir, "model.safetensors", b);
    char *path = stw_path(dir, "model.safetensors");
    st_set *s = NULL;
    char err[256] = "";
    assert_int_equal(st_open_file(&s, path, err, sizeof err), 0);
    assert_int_equal(s->n_files, 1);
    assert_string_equal(s->files[0].path, path);
    assert_int_equal(s->files[0].map_size, b.size);
    check_mixed(s);
    st_close(s);

    /* The directory form finds the same single file. */
    assert_int_equal(st_open_dir(&s, dir, err, sizeof err), 0);
    check_mixed(s);
    st_close(s);
    free(path);
    stw_free(&b);
    stw_rmtree(dir);
}

static void tensors_are_sorted_and_find_misses_return_null(void **state) {
    (void)state;
    stw_blob b = mixed_file();
    st_set *s = calloc(1, sizeof *s);
    char err[256];
    assert_int_equal(st_parse(s, 0, b.buf, b.size, "mem", err, sizeof err), 0);
    for (int i = 1; i < s->n_tensors; i++)
        assert_true(strcmp(s->tensors[i - 1].name, s->tensors[i].name) < 0);
    for (int i = 0; i < s->n_tensors; i++)
        assert_ptr_equal(st_find(s, s->tensors[i].name), &s->tensors[i]);
    const char *misses[] = {"", "a", "zzz", "embe", "embed ", "norm.weight", "__metadata__",
                            "empty", "Pos"};
    for (size_t i = 0; i < sizeof misses / sizeof *misses; i++)
        assert_null(st_find(s, misses[i]));
    st_close(s);
    stw_free(&b);
}

static void find_on_empty_or_null_set_and_close_null_are_safe(void **state) {
    (void)state;
    st_set *s = calloc(1, sizeof *s);
    assert_null(st_find(s, "x"));
    assert_null(st_find(NULL, "x"));
    st_close(s);
    st_close(NULL);
}

static void header_with_only_metadata_is_an_empty_model(void **state) {
    (void)state;
    stw_blob b = stw_raw("{\"__metadata__\":{}}     ", NULL, 0);
    st_set *s = calloc(1, sizeof *s);
    char err[256];
    assert_int_equal(st_parse(s, 0, b.buf, b.size, "mem", err, sizeof err), 0);
    assert_int_equal(s->n_tensors, 0);
    st_close(s);
    stw_free(&b);
}

/* Offsets are per file; several parses into one set merge and stay sorted,
 * and a rejected parse leaves the set as it was. */
static void parses_into_one_set_merge_and_a_rejected_one_changes_nothing(void **state) {
    (void)state;
    const float a[2] = {1, 2}, c[1] = {3};
    stw_file f1 = {0}, f2 = {0};
    stw_add(&f1, "m.b", "F32", 1, (int64_t[]){2}, a, sizeof a);
    stw_add(&f2, "m.a", "F32", 1, (int64_t[]){1}, c, sizeof c);
    stw_blob b1 = stw_build(&f1), b2 = stw_build(&f2);
    st_set *s = calloc(1, sizeof *s);
    char err[256] = "";
    assert_int_equal(st_parse(s, 0, b1.buf, b1.size, "one", err, sizeof err), 0);
    assert_int_equal(st_parse(s, 1, b2.buf, b2.size, "two", err, sizeof err), 0);
    assert_int_equal(s->n_tensors, 2);
    assert_string_equal(s->tensors[0].name, "m.a");
    assert_int_equal(st_find(s, "m.a")->file, 1);
    assert_int_equal(st_find(s, "m.b")->file, 0);
    assert_memory_equal(st_find(s, "m.a")->data, c, sizeof c);

    assert_int_equal(st_parse(s, 2, b1.buf, b1.size, "three", err, sizeof err), -1);
    assert_non_null(strstr(err, "three"));
    assert_non_null(strstr(err, "\"m.b\""));
    assert_int_equal(s->n_tensors, 2);
    assert_int_equal(st_find(s, "m.b")->file, 0);
    st_close(s);
    stw_free(&b1);
    stw_free(&b2);
}

/* The dtype table as the safetensors format defines it. */
static void dtype_names_and_sizes_follow_the_format(void **state) {
    (void)state;
    static const struct { st_dtype t; const char *name; size_t size; } want[] = {
        {ST_BOOL, "BOOL", 1}, {ST_U8, "U8", 1}, {ST_I8, "I8", 1}, {ST_F8_E5M2, "F8_E5M2", 1},
        {ST_F8_E4M3, "F8_E4M3", 1}, {ST_I16, "I16", 2}, {ST_U16, "U16", 2}, {ST_F16, "F16", 2},
        {ST_BF16, "BF16", 2}, {ST_I32, "I32", 4}, {ST_U32, "U32", 4}, {ST_F32, "F32", 4},
        {ST_F64, "F64", 8}, {ST_I64, "I64", 8}, {ST_U64, "U64", 8},
    };
    assert_int_equal(sizeof want / sizeof *want, ST_N_DTYPES);
    for (int i = 0; i < ST_N_DTYPES; i++) {
        assert_string_equal(st_dtype_name(want[i].t), want[i].name);
        assert_int_equal(st_dtype_size(want[i].t), want[i].size);
        /* and each name parses back to its dtype */
        char hdr[160];
        snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%zu]}}",
                 want[i].name, 3 * want[i].size);
        stw_blob b = stw_raw(hdr, NULL, 3 * want[i].size);
        st_set *s = calloc(1, sizeof *s);
        char err[256] = "";
        assert_int_equal(st_parse(s, 0, b.buf, b.size, "mem", err, sizeof err), 0);
        assert_int_equal(st_find(s, "t")->dtype, want[i].t);
        st_close(s);
        stw_free(&b);
    }
    assert_int_equal(st_dtype_size(ST_N_DTYPES), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_from_memory_gives_views_into_the_buffer),
        cmocka_unit_test(open_file_maps_and_views_match_written_bytes),
        cmocka_unit_test(tensors_are_sorted_and_find_misses_return_null),
        cmocka_unit_test(find_on_empty_or_null_set_and_close_null_are_safe),
        cmocka_unit_test(header_with_only_metadata_is_an_empty_model),
        cmocka_unit_test(parses_into_one_set_merge_and_a_rejected_one_changes_nothing),
        cmocka_unit_test(dtype_names_and_sizes_follow_the_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

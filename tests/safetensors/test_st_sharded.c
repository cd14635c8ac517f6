/*
 * test_st_sharded.c - model directories: model.safetensors.index.json with
 * its shards merges into one set; an index that lies about its shards, or
 * points outside the directory, is rejected.
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

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static const float w_q[4] = {1, 2, 3, 4}, w_k[2] = {5, 6};
static const uint16_t w_emb[3] = {0x3F80, 0x4000, 0x4040};
static const float w_norm[1] = {7};

/* Two shards: shard 1 holds emb and q, shard 2 holds k and norm. An extra
 * tensor may be added to shard 2 to build conflicts. */
static char *make_model(const char *index_json, const char *extra2_name) {
    char *dir = stw_tmpdir();
    stw_file a = {0}, b = {0};
    stw_add(&a, "model.layers.0.q", "F32", 2, (int64_t[]){2, 2}, w_q, sizeof w_q);
    stw_add(&a, "model.embed", "BF16", 2, (int64_t[]){3, 1}, w_emb, sizeof w_emb);
    stw_add(&b, "model.layers.0.k", "F32", 1, (int64_t[]){2}, w_k, sizeof w_k);
    stw_add(&b, "model.norm", "F32", 1, (int64_t[]){1}, w_norm, sizeof w_norm);
    if (extra2_name) stw_add(&b, extra2_name, "F32", 1, (int64_t[]){1}, w_norm, sizeof w_norm);
    stw_blob ba = stw_build(&a), bb = stw_build(&b);
    stw_write_blob(dir, SHARD1, ba);
    stw_write_blob(dir, SHARD2, bb);
    stw_free(&ba);
    stw_free(&bb);
    char *ip = stw_path(dir, "model.safetensors.index.json");
    stw_write(ip, index_json, strlen(index_json));
    free(ip);
    return dir;
}

#define GOOD_INDEX \
    "{\"metadata\":{\"total_size\":36},\"weight_map\":{" \
    "\"model.embed\":\"" SHARD1 "\",\"model.layers.0.q\":\"" SHARD1 "\"," \
    "\"model.layers.0.k\":\"" SHARD2 "\",\"model.norm\":\"" SHARD2 "\"}}"

static void index_with_two_shards_merges_into_one_sorted_set(void **state) {
    (void)state;
    char *dir = make_model(GOOD_INDEX, NULL);
    st_set *s = NULL;
    char err[512] = "";
    assert_int_equal(st_open_dir(&s, dir, err, sizeof err), 0);
    assert_int_equal(s->n_files, 2);     /* each shard opened once */
    assert_int_equal(s->n_tensors, 4);
    for (int i = 1; i < s->n_tensors; i++)
        assert_true(strcmp(s->tensors[i - 1].name, s->tensors[i].name) < 0);

    const st_tensor *q = st_find(s, "model.layers.0.q"), *k = st_find(s, "model.layers.0.k");
    const st_tensor *e = st_find(s, "model.embed"), *n = st_find(s, "model.norm");
    assert_non_null(q); assert_non_null(k); assert_non_null(e); assert_non_null(n);
    assert_memory_equal(q->data, w_q, sizeof w_q);
    assert_memory_equal(k->data, w_k, sizeof w_k);
    assert_memory_equal(e->data, w_emb, sizeof w_emb);
    assert_memory_equal(n->data, w_norm, sizeof w_norm);
    assert_int_equal(e->dtype, ST_BF16);
    assert_int_equal(q->file, e->file);
    assert_int_equal(k->file, n->file);
    assert_int_not_equal(q->file, k->file);
    assert_non_null(strstr(s->files[q->file].path, SHARD1));
    assert_non_null(strstr(s->files[k->file].path, SHARD2));
    /* each view lies inside its own shard's mapping */
    for (int i = 0; i < s->n_tensors; i++) {
        const st_tensor *t = &s->tensors[i];
        const char *m = s->files[t->file].map;
        assert_true((const char *)t->data >= m &&
                    (const char *)t->data + t->nbytes <= m + s->files[t->file].map_size);
    }
    assert_null(st_find(s, "model.layers.1.q"));
    st_close(s);
    stw_rmtree(dir);
}

/* The index wins over a model.safetensors lying next to it. */
static void index_is_preferred_over_single_file(void **state) {
    (void)state;
    char *dir = make_model(GOOD_INDEX, NULL);
    stw_blob junk = stw_raw("not a safetensors file", NULL, 0);
    stw_write_blob(dir, "model.safetensors", junk);
    stw_free(&junk);
    st_set *s = NULL;
    char err[512] = "";
    assert_int_equal(st_open_dir(&s, dir, err, sizeof err), 0);
    assert_int_equal(s->n_tensors, 4);
    st_close(s);
    stw_rmtree(dir);
}

static void expect_dir_rejected(const char *index_json, const char *extra2, const char *w1,
                                const char *w2) {
    char *dir = make_model(index_json, extra2);
    st_set *s = NULL;
    char err[512] = "";
    int rc = st_open_dir(&s, dir, err, sizeof err);
    if (rc != -1 || !strstr(err, w1) || (w2 && !strstr(err, w2)))
        print_error("want \"%s\" / \"%s\", got rc %d \"%s\"\n", w1, w2 ? w2 : "", rc, err);
    assert_int_equal(rc, -1);
    assert_null(s);
    assert_non_null(strstr(err, w1));
    if (w2) assert_non_null(strstr(err, w2));
    stw_rmtree(dir);
}

static void index_pointing_to_missing_shard_is_rejected(void **state) {
    (void)state;
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":\"" SHARD1 "\","
                        "\"model.extra\":\"model-00003-of-00002.safetensors\"}}", NULL,
                        "model-00003-of-00002.safetensors", "No such file");
}

static void index_naming_tensor_the_shard_lacks_is_rejected(void **state) {
    (void)state;
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":\"" SHARD1 "\","
                        "\"model.layers.9.q\":\"" SHARD2 "\"}}", NULL,
                        "tensor \"model.layers.9.q\"", "has no such tensor");
    /* the tensor exists, but in the other shard */
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":\"" SHARD2 "\","
                        "\"model.norm\":\"" SHARD1 "\"}}", NULL,
                        "tensor \"model.embed\"", "found in " SHARD1);
}

static void shard_names_that_leave_the_directory_are_rejected(void **state) {
    (void)state;
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":\"../" SHARD1 "\"}}", NULL,
                        "../" SHARD1, "not a plain file name");
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":\"/etc/passwd\"}}", NULL,
                        "/etc/passwd", "not a plain file name");
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":\"..\"}}", NULL,
                        "not a plain file name", NULL);
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":\"\"}}", NULL,
                        "not a plain file name", NULL);
}

static void same_tensor_in_two_shards_is_rejected(void **state) {
    (void)state;
    expect_dir_rejected(GOOD_INDEX, "model.embed", "tensor \"model.embed\"", "also present in");
}

static void malformed_index_is_rejected(void **state) {
    (void)state;
    expect_dir_rejected("{\"weight_map\":", NULL, "not valid JSON", NULL);
    expect_dir_rejected("{\"metadata\":{}}", NULL, "no \"weight_map\" object", NULL);
    expect_dir_rejected("{\"weight_map\":[]}", NULL, "no \"weight_map\" object", NULL);
    expect_dir_rejected("{\"weight_map\":{}}", NULL, "weight_map is empty", NULL);
    expect_dir_rejected("{\"weight_map\":{\"model.embed\":1}}", NULL, "is not a string", NULL);
}

/* A corrupt shard is reported under the shard's path. */
static void corrupt_shard_is_reported_by_its_path(void **state) {
    (void)state;
    char *dir = make_model(GOOD_INDEX, NULL);
    stw_blob bad = stw_raw("[]", NULL, 0);
    stw_write_blob(dir, SHARD2, bad);
    stw_free(&bad);
    st_set *s = NULL;
    char err[512] = "";
    assert_int_equal(st_open_dir(&s, dir, err, sizeof err), -1);
    assert_null(s);
    char *p = stw_path(dir, SHARD2);
    assert_non_null(strstr(err, p));
    assert_non_null(strstr(err, "not a JSON object"));
    free(p);
    stw_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(index_with_two_shards_merges_into_one_sorted_set),
        cmocka_unit_test(index_is_preferred_over_single_file),
        cmocka_unit_test(index_pointing_to_missing_shard_is_rejected),
        cmocka_unit_test(index_naming_tensor_the_shard_lacks_is_rejected),
        cmocka_unit_test(shard_names_that_leave_the_directory_are_rejected),
        cmocka_unit_test(same_tensor_in_two_shards_is_rejected),
        cmocka_unit_test(malformed_index_is_rejected),
        cmocka_unit_test(corrupt_shard_is_reported_by_its_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_cli_tok.c - kda-cli tokenize / detokenize (cli/cli_tok.c, linked in
 * directly): the JSON they print, and their exit codes on bad input.
 *
 *   test_cli_tok [SPM_MODEL]   (SentencePiece checks run when given)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "cli.h"
#include "tokenizer.h"

static char bytes_dir[64];
static const char *spm_model;

/* Runs fn(argv) with stdout captured; returns the exit code, output in *out. */
static int run_cli(int (*fn)(int, char **), char **argv, int argc, char **out) {
    fflush(stdout);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int saved = dup(STDOUT_FILENO);
    dup2(fileno(tmp), STDOUT_FILENO);
    int rc = fn(argc, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    long n = ftell(tmp);
    if (n < 0) n = lseek(fileno(tmp), 0, SEEK_END);
    *out = calloc(1, (size_t)n + 1);
    lseek(fileno(tmp), 0, SEEK_SET);
    assert_int_equal(read(fileno(tmp), *out, (size_t)n), n);
    fclose(tmp);
    return rc;
}

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void tokenize_json_lists_the_ids(void **state) {
    (void)state;
    char *argv[] = {bytes_dir, "--text", "Hi \xC3\xA9", "--json"};
    char *out;
    assert_int_equal(run_cli(cli_tokenize, argv, ARGC(argv), &out), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    const cJSON *ids = cJSON_GetObjectItem(j, "ids");
    assert_true(cJSON_IsArray(ids));
    int want[] = {'H', 'i', ' ', 0xC3, 0xA9};   /* the byte tokenizer: ids are the bytes */
    assert_int_equal(cJSON_GetArraySize(ids), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(cJSON_GetArrayItem(ids, i)->valueint, want[i]);
    cJSON_Delete(j);
    free(out);
}

static void detokenize_json_gives_the_text(void **state) {
    (void)state;
    char *argv[] = {bytes_dir, "--ids", "72,105, 32,195,169", "--json"};
    char *out;
    assert_int_equal(run_cli(cli_detokenize, argv, ARGC(argv), &out), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "text")->valuestring, "Hi \xC3\xA9");
    cJSON_Delete(j);
    free(out);
}

static void plain_output_is_space_separated_ids(void **state) {
    (void)state;
    char *argv[] = {"--tokenizer", bytes_dir, "--text", "ab"};
    char *out;
    assert_int_equal(run_cli(cli_tokenize, argv, ARGC(argv), &out), 0);
    assert_string_equal(out, "97 98\n");
    free(out);
}

static void bad_usage_exits_2_and_failures_exit_1(void **state) {
    (void)state;
    char *out;
    char *no_text[] = {bytes_dir, "--json"};
    assert_int_equal(run_cli(cli_tokenize, no_text, ARGC(no_text), &out), 2);
    free(out);
    char *no_dir[] = {"--text", "x"};
    assert_int_equal(run_cli(cli_tokenize, no_dir, ARGC(no_dir), &out), 2);
    free(out);
    char *junk_ids[] = {bytes_dir, "--ids", "1,2,x3"};
    assert_int_equal(run_cli(cli_detokenize, junk_ids, ARGC(junk_ids), &out), 2);
    free(out);
    char *big_id[] = {bytes_dir, "--ids", "65,256"};
    assert_int_equal(run_cli(cli_detokenize, big_id, ARGC(big_id), &out), 1);
    assert_string_equal(out, "");
    free(out);
    char *no_model[] = {"/nonexistent/dir", "--text", "x"};
    assert_int_equal(run_cli(cli_tokenize, no_model, ARGC(no_model), &out), 1);
    free(out);
}

static void spm_round_trip_through_the_cli(void **state) {
    (void)state;
    if (!spm_model) skip();
    const char *text = "Hello  world,\n\t\xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80!";
    char *argv[] = {"--tokenizer", (char *)spm_model, "--text", (char *)text, "--bos", "--json"};
    char *out;
    assert_int_equal(run_cli(cli_tokenize, argv, ARGC(argv), &out), 0);
    cJSON *j = cJSON_Parse(out);
    const cJSON *ids = cJSON_GetObjectItem(j, "ids");
    tok_tokenizer *t;
    char err[256];
    assert_int_equal(tok_open_spm(&t, spm_model, err, sizeof(err)), 0);
    int32_t *want;
    int n;
    assert_int_equal(tok_encode(t, text, strlen(text), 1, &want, &n, err, sizeof(err)), 0);
    assert_int_equal(cJSON_GetArraySize(ids), n);
    assert_int_equal(cJSON_GetArrayItem(ids, 0)->valueint, tok_bos_id(t));
    char list[4096] = "";
    for (int i = 0; i < n; i++) {
        assert_int_equal(cJSON_GetArrayItem(ids, i)->valueint, want[i]);
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%d,", want[i]);
    }
    free(out);
    cJSON_Delete(j);

    char *back[] = {"--tokenizer", (char *)spm_model, "--ids", list, "--json"};
    assert_int_equal(run_cli(cli_detokenize, back, ARGC(back), &out), 0);
    j = cJSON_Parse(out);
    assert_string_equal(cJSON_GetObjectItem(j, "text")->valuestring, text);
    cJSON_Delete(j);
    free(out);
    free(want);
    tok_close(t);
}

static int setup(void **state) {
    (void)state;
    snprintf(bytes_dir, sizeof(bytes_dir), "/tmp/tok_cli_XXXXXX");
    if (!mkdtemp(bytes_dir)) return -1;
    char path[128];
    snprintf(path, sizeof(path), "%s/config.json", bytes_dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs("{\"tokenizer\": \"bytes\"}\n", f);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char path[128];
    snprintf(path, sizeof(path), "%s/config.json", bytes_dir);
    unlink(path);
    return rmdir(bytes_dir);
}

int main(int argc, char **argv) {
    spm_model = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tokenize_json_lists_the_ids),
        cmocka_unit_test(detokenize_json_gives_the_text),
        cmocka_unit_test(plain_output_is_space_separated_ids),
        cmocka_unit_test(bad_usage_exits_2_and_failures_exit_1),
        cmocka_unit_test(spm_round_trip_through_the_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * The engine API on generated checkpoints: step boundaries never change a
 * sequence's numbers, batching never changes a sequence's numbers, reused slots
 * start clean, and bad steps are refused without advancing anything.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine.h"

static char model_dir[512];

/* Runs scripts/gen_checkpoint.py into a fresh temp dir. */
static int make_checkpoint(char *dir, size_t n, const char *args)
{
    const char *src = getenv("KDA_SRC");
    char tmpl[] = "/tmp/kda-test-XXXXXX";
    if (!src || !mkdtemp(tmpl)) return -1;
    snprintf(dir, n, "%s/m", tmpl);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/scripts/gen_checkpoint.py %s %s > /dev/null", src, dir, args);
    return system(cmd) == 0 ? 0 : -1;
}

static int setup(void **st)
{
    (void)st;
    /* a layout with two GQA layers and a conv tail longer than one token */
    return make_checkpoint(model_dir, sizeof model_dir,
                           "--preset tiny --layers 8 --pattern KKKG --seed 7 --tokenizer bytes");
}

static kda_engine *open_tiny(int max_seqs)
{
    kda_engine *e = NULL;
    char err[512];
    kda_engine_opts o = {.model_dir = model_dir, .device = "cpu", .max_seqs = max_seqs, .max_seq_len = 512};
    if (kda_engine_open(&e, &o, err, sizeof err)) fail_msg("open: %s", err);
    return e;
}

static void random_tokens(int32_t *t, int n, int vocab, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % (unsigned)vocab);
    }
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* The CPU backend's invariant (cpu_backend.c): how a sequence's tokens are
 * split into steps never changes its numbers, so a 150-token prompt fed at
 * once, as a 100-token prompt then one token at a time, or in ragged chunks
 * gives the same logits bit for bit. The prefix cache relies on it. */
static void test_step_boundaries_never_change_the_logits(void **st)
{
    (void)st;
    kda_engine *e = open_tiny(2);
    const int V = kda_engine_info(e)->vocab_size, T = 150;
    int32_t toks[150];
    random_tokens(toks, T, V, 1);
    float *full = malloc(sizeof(float) * T * V), *inc = malloc(sizeof(float) * T * V);
    char err[512];
    int a, b;
    assert_int_equal(kda_seq_new(e, &a, err, sizeof err), 0);
    kda_batch_item it = {.seq = a, .tokens = toks, .n_tokens = T, .logits = full, .want_all_logits = 1};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    /* incremental: a 100-token prompt, then one token at a time */
    assert_int_equal(kda_seq_new(e, &b, err, sizeof err), 0);
    kda_batch_item p = {.seq = b, .tokens = toks, .n_tokens = 100, .logits = inc, .want_all_logits = 1};
    assert_int_equal(kda_engine_step(e, &p, 1, err, sizeof err), 0);
    for (int t = 100; t < T; t++) {
        kda_batch_item d = {.seq = b, .tokens = &toks[t], .n_tokens = 1, .logits = inc + (size_t)t * V};
        assert_int_equal(kda_engine_step(e, &d, 1, err, sizeof err), 0);
    }
    assert_int_equal(kda_seq_len(e, b), T);
    assert_memory_equal(full, inc, sizeof(float) * T * V);
    /* ragged chunks across the old 64-token chunked-form threshold */
    kda_seq_free(e, b);
    assert_int_equal(kda_seq_new(e, &b, err, sizeof err), 0);
    const int cuts[] = {0, 3, 67, 68, 131, 150};
    for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof cuts[0]); c++) {
        kda_batch_item q = {.seq = b, .tokens = toks + cuts[c], .n_tokens = cuts[c + 1] - cuts[c],
                            .logits = inc + (size_t)cuts[c] * V, .want_all_logits = 1};
        assert_int_equal(kda_engine_step(e, &q, 1, err, sizeof err), 0);
    }
    assert_memory_equal(full, inc, sizeof(float) * T * V);
    free(full), free(inc);
    kda_engine_close(e);
}

static void test_batched_step_equals_each_sequence_alone(void **st)
{
    (void)st;
    enum { NS = 5 };
    const int lens[NS] = {1, 7, 64, 90, 3};
    kda_engine *alone = open_tiny(NS), *batch = open_tiny(NS);
    const int V = kda_engine_info(alone)->vocab_size;
    int32_t toks[NS][100];
    float *la = malloc(sizeof(float) * NS * V), *lb = malloc(sizeof(float) * NS * V);
    char err[512];
    int ida[NS], idb[NS];
    kda_batch_item items[NS];
    for (int s = 0; s < NS; s++) {
        random_tokens(toks[s], 100, V, 100 + s);
        assert_int_equal(kda_seq_new(alone, &ida[s], err, sizeof err), 0);
        assert_int_equal(kda_seq_new(batch, &idb[s], err, sizeof err), 0);
    }
    /* step 1: prompts of different lengths; step 2..4: one token each */
    for (int step = 0; step < 4; step++) {
        for (int s = 0; s < NS; s++) {
            const int32_t *tk = step == 0 ? toks[s] : &toks[s][lens[s] + step - 1];
            int n = step == 0 ? lens[s] : 1;
            kda_batch_item one = {.seq = ida[s], .tokens = tk, .n_tokens = n, .logits = la + (size_t)s * V};
            assert_int_equal(kda_engine_step(alone, &one, 1, err, sizeof err), 0);
            items[s] = (kda_batch_item){.seq = idb[s], .tokens = tk, .n_tokens = n, .logits = lb + (size_t)s * V};
        }
        assert_int_equal(kda_engine_step(batch, items, NS, err, sizeof err), 0);
        /* same code path per element: identical, not just close */
        assert_memory_equal(la, lb, sizeof(float) * NS * V);
    }
    free(la), free(lb);
    kda_engine_close(alone);
    kda_engine_close(batch);
}

static void test_freed_slot_is_reused_with_clean_state(void **st)
{
    (void)st;
    kda_engine *e = open_tiny(1);
    const int V = kda_engine_info(e)->vocab_size;
    int32_t toks[40];
    random_tokens(toks, 40, V, 5);
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    char err[512];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    kda_batch_item it = {.seq = s, .tokens = toks, .n_tokens = 20, .logits = l1};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    kda_batch_item more = {.seq = s, .tokens = toks + 20, .n_tokens = 20};
    assert_int_equal(kda_engine_step(e, &more, 1, err, sizeof err), 0);
    kda_seq_free(e, s);
    int s2;
    assert_int_equal(kda_seq_new(e, &s2, err, sizeof err), 0);
    assert_int_equal(s2, s); /* only one slot: it must be the reused one */
    assert_int_equal(kda_seq_len(e, s2), 0);
    kda_batch_item again = {.seq = s2, .tokens = toks, .n_tokens = 20, .logits = l2};
    assert_int_equal(kda_engine_step(e, &again, 1, err, sizeof err), 0);
    assert_memory_equal(l1, l2, sizeof(float) * V);
    free(l1), free(l2);
    kda_engine_close(e);
}

static void test_bad_steps_are_refused_and_change_nothing(void **st)
{
    (void)st;
    kda_engine *e = open_tiny(2);
    const int V = kda_engine_info(e)->vocab_size;
    char err[512];
    int s, other;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    assert_int_equal(kda_seq_new(e, &other, err, sizeof err), 0);
    int32_t good[3] = {1, 2, 3}, bad[2] = {4, V};
    kda_batch_item items[2] = {{.seq = other, .tokens = good, .n_tokens = 3}, {.seq = s, .tokens = bad, .n_tokens = 2}};
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "outside the vocabulary"));
    assert_int_equal(kda_seq_len(e, other), 0); /* the valid item did not advance either */
    items[1] = (kda_batch_item){.seq = other, .tokens = good, .n_tokens = 1};
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "twice"));
    kda_batch_item ghost = {.seq = 9, .tokens = good, .n_tokens = 1};
    assert_int_equal(kda_engine_step(e, &ghost, 1, err, sizeof err), KDA_EINVAL);
    /* context capacity is 512 */
    int32_t *many = calloc(513, sizeof *many);
    kda_batch_item big = {.seq = s, .tokens = many, .n_tokens = 513};
    assert_int_equal(kda_engine_step(e, &big, 1, err, sizeof err), KDA_ECTX);
    assert_non_null(strstr(err, "512"));
    assert_int_equal(kda_seq_len(e, s), 0);
    /* reservations: within capacity fine (CPU slots are fixed-size), beyond it refused */
    assert_int_equal(kda_seq_reserve(e, s, 512, err, sizeof err), 0);
    assert_int_equal(kda_seq_reserve(e, s, 513, err, sizeof err), KDA_ECTX);
    assert_int_equal(kda_seq_reserve(e, 9, 10, err, sizeof err), KDA_EINVAL);
    /* slots exhausted */
    int third;
    assert_int_equal(kda_seq_new(e, &third, err, sizeof err), KDA_ENOMEM);
    assert_int_equal(kda_seqs_free_slots(e), 0);
    free(many);
    kda_engine_close(e);
}

/* Everything a backend relies on is checked by the engine before any work:
 * a bad sampling or output field on one item refuses the step and no
 * sequence in it advances, so a backend step can fail only for device reasons. */
static void test_sampling_and_output_fields_are_validated_before_any_work(void **st)
{
    (void)st;
    kda_engine *e = open_tiny(2);
    const int V = kda_engine_info(e)->vocab_size;
    char err[512];
    int s, other;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    assert_int_equal(kda_seq_new(e, &other, err, sizeof err), 0);
    int32_t good[3] = {1, 2, 3}, tok = 5, sampled = -1;
    kda_logit_bias bias[1] = {{V, 1.0f}};
    kda_sampling sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1, .n_prompt = 1,
                       .logit_bias = bias, .n_logit_bias = 1};
    kda_batch_item items[2] = {{.seq = other, .tokens = good, .n_tokens = 3},
                               {.seq = s, .tokens = &tok, .n_tokens = 1, .sampling = &sp, .sampled = &sampled}};
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "logit_bias"));
    bias[0] = (kda_logit_bias){3, NAN};
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), KDA_EINVAL);
    bias[0] = (kda_logit_bias){3, 1e4f};
    sp.n_prompt = 2; /* the sequence will hold 1 token after this step */
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "n_prompt"));
    sp.n_prompt = 1;
    items[1].n_top = KDA_MAX_TOP + 1;
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), KDA_EINVAL);
    items[1].n_top = 0;
    int32_t tg[3] = {2, V, -1};
    float lp[3];
    items[0].targets = tg, items[0].target_logprobs = lp;
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "target"));
    assert_int_equal(kda_seq_len(e, s), 0);
    assert_int_equal(kda_seq_len(e, other), 0);
    tg[1] = 3;
    assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), 0);
    assert_int_equal(sampled, 3); /* greedy after a +1e4 bias on token 3 */
    assert_int_equal(kda_seq_len(e, s), 1);
    kda_engine_close(e);
}

/* The engine keeps each sequence's history: a repetition penalty over the
 * prompt applies with nothing but n_prompt from the caller, and the per-token
 * draw counter is the number of tokens generated so far. */
static void test_penalties_read_the_sequence_history_kept_by_the_engine(void **st)
{
    (void)st;
    kda_engine *e = open_tiny(1);
    const int V = kda_engine_info(e)->vocab_size;
    char err[512];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    int32_t prompt[4] = {7, 8, 9, 10};
    float *lg = malloc((size_t)V * sizeof *lg);
    int32_t greedy = -1;
    kda_sampling g = {.temperature = 0, .top_p = 1, .repetition_penalty = 1, .n_prompt = 4};
    kda_batch_item it = {.seq = s, .tokens = prompt, .n_tokens = 4, .logits = lg, .sampling = &g, .sampled = &greedy};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    /* a second sequence whose prompt holds that token: with the penalty over
     * the history (kept by the engine, not passed in) the draw is the argmax
     * of the raw logits penalised at the prompt's ids, computed here */
    kda_seq_free(e, s);
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    int32_t p2[4] = {greedy, 8, 9, 10}, pen = -1;
    kda_sampling rp = {.temperature = 0, .top_p = 1, .repetition_penalty = 3.0f, .n_prompt = 4};
    it = (kda_batch_item){.seq = s, .tokens = p2, .n_tokens = 4, .logits = lg, .sampling = &rp, .sampled = &pen};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    for (int k = 0; k < 4; k++) {
        float *x = &lg[p2[k]];
        if (k == 0 || p2[k] != p2[0]) *x = *x > 0 ? *x / 3.0f : *x * 3.0f;
    }
    int best = 0;
    for (int v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
    assert_int_equal(pen, best);
    free(lg);
    kda_engine_close(e);
}

static void test_target_logprobs_equal_log_softmax_of_logits(void **st)
{
    (void)st;
    kda_engine *e = open_tiny(1);
    const int V = kda_engine_info(e)->vocab_size, T = 12;
    int32_t toks[12], tg[12];
    random_tokens(toks, T, V, 9);
    for (int i = 0; i < T; i++) tg[i] = i + 1 < T ? toks[i + 1] : -1;
    float *lg = malloc(sizeof(float) * T * V), lp[12];
    char err[512];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    kda_batch_item it = {.seq = s, .tokens = toks, .n_tokens = T, .logits = lg, .want_all_logits = 1, .targets = tg,
                         .target_logprobs = lp};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    for (int t = 0; t < T - 1; t++) {
        double m = -INFINITY, z = 0;
        for (int v = 0; v < V; v++) m = fmax(m, lg[(size_t)t * V + v]);
        for (int v = 0; v < V; v++) z += exp(lg[(size_t)t * V + v] - m);
        assert_true(fabs(lp[t] - (lg[(size_t)t * V + tg[t]] - m - log(z))) < 1e-4);
    }
    assert_true(lp[T - 1] == 0.0f);
    free(lg);
    kda_engine_close(e);
}

static void test_open_errors_name_the_problem(void **st)
{
    (void)st;
    kda_engine *e;
    char err[512];
    kda_engine_opts o = {.model_dir = "/nonexistent/model", .device = "cpu"};
    assert_int_equal(kda_engine_open(&e, &o, err, sizeof err), KDA_EIO);
    assert_non_null(strstr(err, "config.json"));
    o.model_dir = model_dir;
    o.device = "tpu";
    assert_int_equal(kda_engine_open(&e, &o, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "tpu"));
    o.device = "cpu";
    o.max_seq_len = 1 << 30;
    assert_int_equal(kda_engine_open(&e, &o, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "max_position_embeddings"));
}

static void test_wrong_tensor_shape_names_the_tensor(void **st)
{
    (void)st;
    char dir[512], err[512], cmd[1200];
    assert_int_equal(make_checkpoint(dir, sizeof dir, "--preset tiny --tokenizer bytes"), 0);
    /* claim a wider FFN than the tensors have */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"intermediate_size\": 128/\"intermediate_size\": 96/' %s/config.json", dir);
    assert_int_equal(system(cmd), 0);
    kda_engine *e;
    kda_engine_opts o = {.model_dir = dir, .device = "cpu"};
    assert_int_equal(kda_engine_open(&e, &o, err, sizeof err), KDA_EFORMAT);
    assert_non_null(strstr(err, "mlp.gate_proj.weight"));
    assert_non_null(strstr(err, "[96, 64]"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_boundaries_never_change_the_logits),
        cmocka_unit_test(test_batched_step_equals_each_sequence_alone),
        cmocka_unit_test(test_freed_slot_is_reused_with_clean_state),
        cmocka_unit_test(test_bad_steps_are_refused_and_change_nothing),
        cmocka_unit_test(test_sampling_and_output_fields_are_validated_before_any_work),
        cmocka_unit_test(test_penalties_read_the_sequence_history_kept_by_the_engine),
        cmocka_unit_test(test_target_logprobs_equal_log_softmax_of_logits),
        cmocka_unit_test(test_open_errors_name_the_problem),
        cmocka_unit_test(test_wrong_tensor_shape_names_the_tensor),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

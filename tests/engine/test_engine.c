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
    assert_int_equal(kda_engine_step_bad_item(e), 1); /* the caller can drop just that one */
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
    assert_int_equal(kda_engine_step_bad_item(e), -1);
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

/* ---- prefix snapshots ---- */

static kda_engine *open_with_snapshots(int max_seqs, int n_snaps)
{
    kda_engine *e = NULL;
    char err[512];
    kda_engine_opts o = {.model_dir = model_dir, .device = "cpu", .max_seqs = max_seqs, .max_seq_len = 512};
    if (kda_engine_open(&e, &o, err, sizeof err)) fail_msg("open: %s", err);
    o.snapshot_bytes = (size_t)n_snaps * kda_engine_info(e)->state_bytes_per_seq;
    kda_engine_close(e);
    if (kda_engine_open(&e, &o, err, sizeof err)) fail_msg("open: %s", err);
    assert_int_equal(kda_engine_info(e)->max_snapshots, n_snaps);
    return e;
}

/* all-position logits of toks[0..n) computed in one step on a fresh sequence */
static float *reference_logits(kda_engine *e, const int32_t *toks, int n)
{
    const int V = kda_engine_info(e)->vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)n * V);
    char err[512];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    kda_batch_item it = {.seq = s, .tokens = toks, .n_tokens = n, .logits = lg, .want_all_logits = 1};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    kda_seq_free(e, s);
    return lg;
}

/* a fresh sequence fed toks[0..m) in one step, snapshotted and freed */
static int snapshot_of(kda_engine *e, const int32_t *toks, int m)
{
    char err[512];
    int s, snap;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    kda_batch_item it = {.seq = s, .tokens = toks, .n_tokens = m};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    assert_int_equal(kda_snapshot_take(e, s, &snap, err, sizeof err), 0);
    assert_int_equal(kda_snapshot_len(e, snap), m);
    kda_seq_free(e, s);
    return snap;
}

/* A sequence restored from a snapshot at position m and fed the rest gives
 * the logits of computing everything from scratch, bit for bit: at a
 * position in the middle of the reference's one step (a hit ending inside a
 * prompt chunk), for a one-token continuation (restore at n-1, feed the last
 * prompt token), and with two sequences restored from the same snapshot. */
static void test_restored_snapshot_continues_bit_identically(void **st)
{
    (void)st;
    kda_engine *e = open_with_snapshots(3, 4);
    const int V = kda_engine_info(e)->vocab_size, n = 120;
    int32_t toks[120];
    random_tokens(toks, n, V, 21);
    float *ref = reference_logits(e, toks, n), *got = malloc(sizeof(float) * (size_t)n * V);
    char err[512];
    const int cuts[] = {37, n - 1, 1, 64};
    for (int c = 0; c < 4; c++) {
        const int m = cuts[c];
        const int snap = snapshot_of(e, toks, m);
        int a, b2;
        assert_int_equal(kda_seq_new(e, &a, err, sizeof err), 0);
        assert_int_equal(kda_seq_new(e, &b2, err, sizeof err), 0);
        assert_int_equal(kda_seq_restore(e, a, snap, toks, n, err, sizeof err), 0);
        assert_int_equal(kda_seq_restore(e, b2, snap, toks, n, err, sizeof err), 0);
        assert_int_equal(kda_seq_len(e, a), m);
        kda_batch_item items[2] = {
            {.seq = a, .tokens = toks + m, .n_tokens = n - m, .logits = got + (size_t)m * V, .want_all_logits = 1},
            {.seq = b2, .tokens = toks + m, .n_tokens = 1, .logits = got}};
        assert_int_equal(kda_engine_step(e, items, 2, err, sizeof err), 0);
        assert_memory_equal(got + (size_t)m * V, ref + (size_t)m * V, sizeof(float) * (size_t)(n - m) * V);
        assert_memory_equal(got, ref + (size_t)m * V, sizeof(float) * V);
        kda_seq_free(e, a);
        kda_seq_free(e, b2);
        kda_snapshot_drop(e, snap);
    }
    kda_usage u;
    kda_engine_usage(e, &u);
    assert_int_equal(u.snaps_used, 0);
    assert_int_equal(u.cache_bytes, 0);
    free(ref), free(got);
    kda_engine_close(e);
}

/* Snapshots along one conversation share their rows (a later snapshot keeps
 * only the rows added since the one its sequence continued): restoring the
 * later one is still exact after the earlier one is dropped, it holds less
 * than a full copy, and everything is given back when both are gone. */
static void test_chained_snapshots_share_rows_and_stay_exact(void **st)
{
    (void)st;
    kda_engine *e = open_with_snapshots(2, 4);
    const kda_model_info *in = kda_engine_info(e);
    const int V = in->vocab_size, n = 200;
    int32_t toks[200];
    random_tokens(toks, n, V, 33);
    float *ref = reference_logits(e, toks, n), *got = malloc(sizeof(float) * (size_t)n * V);
    char err[512];
    kda_usage u;
    int s1 = snapshot_of(e, toks, 50), s2, a;
    kda_engine_usage(e, &u);
    const size_t one = u.cache_bytes;
    assert_true(one >= in->state_bytes_per_seq + 50 * in->kv_bytes_per_token);
    /* turn 2: restore s1, add 100 tokens one by one (decode), snapshot at 150 */
    assert_int_equal(kda_seq_new(e, &a, err, sizeof err), 0);
    assert_int_equal(kda_seq_restore(e, a, s1, toks, n, err, sizeof err), 0);
    for (int t = 50; t < 150; t++) {
        kda_batch_item d = {.seq = a, .tokens = &toks[t], .n_tokens = 1};
        assert_int_equal(kda_engine_step(e, &d, 1, err, sizeof err), 0);
    }
    assert_int_equal(kda_snapshot_take(e, a, &s2, err, sizeof err), 0);
    kda_seq_free(e, a);
    kda_engine_usage(e, &u);
    /* the second holds its state and rows 50..149 only */
    assert_true(u.cache_bytes - one < in->state_bytes_per_seq + 101 * in->kv_bytes_per_token);
    kda_snapshot_drop(e, s1);
    assert_int_equal(kda_snapshot_len(e, s1), KDA_EINVAL);
    /* other tokens through the slot first, so its cache holds none of ours */
    int32_t junk[200];
    random_tokens(junk, n, V, 34);
    free(reference_logits(e, junk, n));
    assert_int_equal(kda_seq_new(e, &a, err, sizeof err), 0);
    assert_int_equal(kda_seq_restore(e, a, s2, toks, n, err, sizeof err), 0);
    kda_batch_item it = {.seq = a, .tokens = toks + 150, .n_tokens = 50, .logits = got, .want_all_logits = 1};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    assert_memory_equal(got, ref + (size_t)150 * V, sizeof(float) * 50 * V);
    kda_seq_free(e, a);
    kda_snapshot_drop(e, s2);
    kda_engine_usage(e, &u);
    assert_int_equal(u.cache_bytes, 0);
    assert_int_equal(u.snaps_used, 0);
    free(ref), free(got);
    kda_engine_close(e);
}

/* A restored sequence's history is the snapshot's: the repetition penalty
 * over the prompt and the draw counter after a restore are those of the
 * uncached sequence, so a seeded sampled continuation is the same. */
static void test_restored_sequence_samples_like_the_uncached_one(void **st)
{
    (void)st;
    kda_engine *e = open_with_snapshots(2, 2);
    const int V = kda_engine_info(e)->vocab_size, n = 30;
    int32_t toks[30], out_a[12], out_b[12];
    random_tokens(toks, n, V, 44);
    char err[512];
    kda_sampling sp = {.temperature = 0.9f, .top_p = 0.95f, .repetition_penalty = 1.7f, .seed = 5, .n_prompt = n};
    int32_t *outs[2] = {out_a, out_b};
    int snap = snapshot_of(e, toks, 20);
    for (int run = 0; run < 2; run++) {
        int s;
        assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
        int m = 0;
        if (run == 1) {
            assert_int_equal(kda_seq_restore(e, s, snap, toks, n, err, sizeof err), 0);
            m = 20;
        }
        int32_t tok = -1;
        kda_batch_item p = {.seq = s, .tokens = toks + m, .n_tokens = n - m, .sampling = &sp, .sampled = &tok};
        assert_int_equal(kda_engine_step(e, &p, 1, err, sizeof err), 0);
        for (int g = 0; g < 12; g++) {
            outs[run][g] = tok;
            kda_batch_item d = {.seq = s, .tokens = &outs[run][g], .n_tokens = 1, .sampling = &sp, .sampled = &tok};
            assert_int_equal(kda_engine_step(e, &d, 1, err, sizeof err), 0);
        }
        kda_seq_free(e, s);
    }
    assert_memory_equal(out_a, out_b, sizeof out_a);
    kda_engine_close(e);
}

/* Bad snapshot calls are refused with a reason and change nothing. */
static void test_snapshot_misuse_is_refused(void **st)
{
    (void)st;
    kda_engine *e = open_with_snapshots(3, 2);
    const int V = kda_engine_info(e)->vocab_size;
    int32_t toks[20], other[20];
    random_tokens(toks, 20, V, 55);
    memcpy(other, toks, sizeof other);
    other[3] = (other[3] + 1) % V;
    char err[512];
    int s, s2, snap;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    assert_int_equal(kda_snapshot_take(e, s, &snap, err, sizeof err), KDA_EINVAL); /* empty */
    assert_int_equal(kda_snapshot_take(e, 7, &snap, err, sizeof err), KDA_EINVAL);
    kda_seq_free(e, s);
    const int a = snapshot_of(e, toks, 10), b = snapshot_of(e, toks, 12);
    assert_int_equal(kda_snapshots_free(e), 0);
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    kda_batch_item it = {.seq = s, .tokens = toks, .n_tokens = 5};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    assert_int_equal(kda_snapshot_take(e, s, &snap, err, sizeof err), KDA_ENOMEM); /* table full */
    assert_non_null(strstr(err, "snapshot slots"));
    /* restore: only into an empty sequence, only a matching prefix, only a live snapshot */
    assert_int_equal(kda_seq_restore(e, s, a, toks, 20, err, sizeof err), KDA_EINVAL);
    assert_int_equal(kda_seq_new(e, &s2, err, sizeof err), 0);
    assert_int_equal(kda_seq_restore(e, s2, a, other, 20, err, sizeof err), KDA_EINVAL);
    assert_non_null(strstr(err, "not a prefix"));
    assert_int_equal(kda_seq_restore(e, s2, a, toks, 9, err, sizeof err), KDA_EINVAL);
    assert_int_equal(kda_seq_restore(e, s2, 5, toks, 20, err, sizeof err), KDA_EINVAL);
    assert_int_equal(kda_seq_len(e, s2), 0);
    kda_snapshot_drop(e, a);
    kda_snapshot_drop(e, a); /* twice: no-op */
    assert_int_equal(kda_seq_restore(e, s2, a, toks, 20, err, sizeof err), KDA_EINVAL);
    assert_int_equal(kda_snapshots_free(e), 1);
    assert_int_equal(kda_seq_restore(e, s2, b, toks, 20, err, sizeof err), 0);
    assert_int_equal(kda_seq_len(e, s2), 12);
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
        cmocka_unit_test(test_restored_snapshot_continues_bit_identically),
        cmocka_unit_test(test_chained_snapshots_share_rows_and_stay_exact),
        cmocka_unit_test(test_restored_sequence_samples_like_the_uncached_one),
        cmocka_unit_test(test_snapshot_misuse_is_refused),
        cmocka_unit_test(test_open_errors_name_the_problem),
        cmocka_unit_test(test_wrong_tensor_shape_names_the_tensor),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

/*
 * test_cuda_prefix.c - prefix snapshots on the CUDA backend (engine.h
 * kda_snapshot_take / kda_seq_restore): a sequence restored from a snapshot
 * continues like the same tokens computed from scratch on the GPU and like
 * the fp32 CPU reference, greedy output included; KV blocks are shared by
 * reference (a partial last block is copied) and every byte comes back.
 * Runs on the trained demo model (random weights amplify the 1-ulp bf16
 * differences of different GEMM row counts). Skips (77) without a GPU.
 *
 * Tolerance: the restored and the uncached GPU runs compute the same
 * positions with different row counts per step (other cuBLASLt plans and
 * attention splits), so they are not bit-identical; they must agree at least
 * as well as fp32 and bf16 activation storage agree on the same tokens on the
 * CPU (the yardstick of test_cuda_model's batch test), and the restored run
 * must meet MODEL_SPEC 7 against the fp32 CPU reference.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "engine.h"
#include "kt_util.h"

#define VOC 256 /* the demo model's byte vocabulary */

static char demo_dir[512];
static int32_t text_toks[600];
static int n_text;

static kda_engine *open_engine(const char *dev, int max_seqs, int n_snaps, int bf16_act)
{
    kda_tuning tn;
    char err[512];
    kda_tuning_defaults(&tn);
    assert_int_equal(kda_tuning_from_env(&tn, err, sizeof err), 0);
    tn.cpu_bf16_act = bf16_act;
    kda_engine_opts o = {.model_dir = demo_dir, .device = dev, .max_seqs = max_seqs, .max_seq_len = 1024,
                         .gpu_mem_fraction = 0.5, .tuning = &tn};
    kda_engine *e = NULL;
    int rc = kda_engine_open(&e, &o, err, sizeof err);
    if (!rc && n_snaps) {
        o.snapshot_bytes = (size_t)n_snaps * kda_engine_info(e)->snapshot_bytes_each;
        if (!o.snapshot_bytes) o.snapshot_bytes = (size_t)n_snaps * kda_engine_info(e)->state_bytes_per_seq;
        kda_engine_close(e);
        rc = kda_engine_open(&e, &o, err, sizeof err);
    }
    if (rc) fprintf(stderr, "open on %s: %s\n", dev, err);
    assert_int_equal(rc, 0);
    return e;
}

/* feeds toks[from..n) to seq (restored to `from` or fresh) in one step, all logits into lg[(n-from) * VOC] */
static void feed(kda_engine *e, int seq, const int32_t *toks, int from, int n, float *lg)
{
    char err[256];
    kda_batch_item it = {.seq = seq, .tokens = toks + from, .n_tokens = n - from, .logits = lg, .want_all_logits = 1};
    int rc = kda_engine_step(e, &it, 1, err, sizeof err);
    if (rc) fprintf(stderr, "step: %s\n", err);
    assert_int_equal(rc, 0);
}

static void all_logits(kda_engine *e, const int32_t *toks, int n, float *lg)
{
    char err[256];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    feed(e, s, toks, 0, n, lg);
    kda_seq_free(e, s);
}

static int argmax(const float *x)
{
    int b = 0;
    for (int i = 1; i < VOC; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* worst per-position rel L2 of a against b over rows [0, n) */
static double worst_rel(const float *a, const float *b, int n)
{
    double w = 0;
    for (int t = 0; t < n; t++) {
        const double e = kt_rel(a + (size_t)t * VOC, b + (size_t)t * VOC, VOC);
        w = e > w ? e : w;
    }
    return w;
}

/* greedy ids after the sequence's current state, starting with `first` fed */
static void greedy_from(kda_engine *e, int seq, int32_t first, int n, int32_t *out)
{
    char err[256];
    kda_sampling g = {.temperature = 0};
    int32_t tok = first;
    for (int i = 0; i < n; i++) {
        int32_t in = tok;
        kda_batch_item it = {.seq = seq, .tokens = &in, .n_tokens = 1, .sampling = &g, .sampled = &tok};
        assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
        out[i] = tok;
    }
}

/* Restores at a partial block inside a pass (37), at one block (16), at the
 * 256-row pass boundary (256) and one token short of the end (the one-token
 * continuation), each continued in one step and then greedily. */
static void test_restored_sequence_matches_uncached_and_cpu(void **st)
{
    (void)st;
    const int n = n_text;
    kda_engine *gpu = open_engine("cuda", 4, 4, 0), *cpu = open_engine("cpu", 1, 0, 0), *emu = open_engine("cpu", 1, 0, 1);
    float *ref = malloc((size_t)n * VOC * 4), *lc = malloc((size_t)n * VOC * 4), *le = malloc((size_t)n * VOC * 4);
    float *got = malloc((size_t)n * VOC * 4);
    all_logits(gpu, text_toks, n, ref);
    all_logits(cpu, text_toks, n, lc);
    all_logits(emu, text_toks, n, le);
    const double bf16_alone = worst_rel(le, lc, n);
    char err[256];
    int32_t g_ref[32], g_got[32];
    const int cuts[] = {37, 16, 256, n - 1};
    for (int c = 0; c < 4; c++) {
        const int m = cuts[c];
        int a, snap, r;
        assert_int_equal(kda_seq_new(gpu, &a, err, sizeof err), 0);
        kda_batch_item p = {.seq = a, .tokens = text_toks, .n_tokens = m};
        assert_int_equal(kda_engine_step(gpu, &p, 1, err, sizeof err), 0);
        assert_int_equal(kda_snapshot_take(gpu, a, &snap, err, sizeof err), 0);
        /* the original keeps writing into the block it shares with the snapshot */
        feed(gpu, a, text_toks, m, n, got);
        greedy_from(gpu, a, argmax(got + (size_t)(n - m - 1) * VOC), 32, g_ref);
        kda_seq_free(gpu, a);
        memset(got, 0xFF, (size_t)n * VOC * 4); /* poison */
        assert_int_equal(kda_seq_new(gpu, &r, err, sizeof err), 0);
        assert_int_equal(kda_seq_restore(gpu, r, snap, text_toks, n, err, sizeof err), 0);
        feed(gpu, r, text_toks, m, n, got);
        const double vs_gpu = worst_rel(got, ref + (size_t)m * VOC, n - m);
        const double vs_cpu = worst_rel(got, lc + (size_t)m * VOC, n - m);
        int agree = 0;
        for (int t = 0; t < n - m; t++) agree += argmax(got + (size_t)t * VOC) == argmax(lc + (size_t)(m + t) * VOC);
        greedy_from(gpu, r, argmax(got + (size_t)(n - m - 1) * VOC), 32, g_got);
        kda_seq_free(gpu, r);
        kda_snapshot_drop(gpu, snap);
        printf("restore at %3d: vs uncached GPU worst rel L2 %.2e, vs CPU fp32 %.2e (bf16 storage alone %.2e), "
               "top-1 %d/%d, greedy %s\n",
               m, vs_gpu, vs_cpu, bf16_alone, agree, n - m, memcmp(g_ref, g_got, sizeof g_ref) ? "DIFFERS" : "same");
        assert_true(vs_gpu <= bf16_alone + 1e-3);
        assert_true(vs_cpu <= 1e-2);
        assert_true(agree >= 0.99 * (n - m));
        assert_memory_equal(g_ref, g_got, sizeof g_ref);
    }
    kda_usage u;
    kda_engine_usage(gpu, &u);
    assert_int_equal(u.kv_bytes_used, 0);
    assert_int_equal(u.cache_bytes, 0);
    free(ref), free(lc), free(le), free(got);
    kda_engine_close(gpu), kda_engine_close(cpu), kda_engine_close(emu);
}

/* Memory: a snapshot of 100 tokens references 7 blocks (6 full + 1 partial);
 * each restore shares the 6 full ones and copies the partial one; the cache
 * holds its state plus what no sequence holds; all of it returns to zero. */
static void test_snapshot_blocks_are_shared_by_reference_and_given_back(void **st)
{
    (void)st;
    kda_engine *gpu = open_engine("cuda", 4, 2, 0);
    const kda_model_info *in = kda_engine_info(gpu);
    const size_t blk = 16 * in->kv_bytes_per_token, state = in->snapshot_bytes_each;
    char err[256];
    int a, snap, r1, r2;
    kda_usage u;
    assert_int_equal(kda_seq_new(gpu, &a, err, sizeof err), 0);
    kda_batch_item p = {.seq = a, .tokens = text_toks, .n_tokens = 100};
    assert_int_equal(kda_engine_step(gpu, &p, 1, err, sizeof err), 0);
    assert_int_equal(kda_snapshot_take(gpu, a, &snap, err, sizeof err), 0);
    kda_engine_usage(gpu, &u);
    assert_int_equal(u.kv_bytes_used, 7 * blk); /* shared with the snapshot, held by the sequence */
    assert_int_equal(u.cache_bytes, state);
    kda_seq_free(gpu, a);
    kda_engine_usage(gpu, &u);
    assert_int_equal(u.kv_bytes_used, 0);
    assert_int_equal(u.cache_bytes, state + 7 * blk);
    assert_int_equal(kda_seq_new(gpu, &r1, err, sizeof err), 0);
    assert_int_equal(kda_seq_new(gpu, &r2, err, sizeof err), 0);
    assert_int_equal(kda_seq_restore(gpu, r1, snap, text_toks, 200, err, sizeof err), 0);
    assert_int_equal(kda_seq_restore(gpu, r2, snap, text_toks, 200, err, sizeof err), 0);
    kda_engine_usage(gpu, &u);
    assert_int_equal(u.kv_bytes_used, (6 + 2) * blk); /* 6 shared + one private copy each */
    assert_int_equal(u.cache_bytes, state + blk);    /* the snapshot's own partial block */
    /* both continue differently in one batched decode step, each as if uncached */
    float l1[VOC], l2[VOC], ref1[VOC], ref2[VOC], *tmp = malloc((size_t)101 * VOC * 4);
    int32_t t1 = 7, t2 = 9;
    kda_batch_item d[2] = {{.seq = r1, .tokens = &t1, .n_tokens = 1, .logits = l1},
                           {.seq = r2, .tokens = &t2, .n_tokens = 1, .logits = l2}};
    assert_int_equal(kda_engine_step(gpu, d, 2, err, sizeof err), 0);
    int32_t seq1[101], seq2[101];
    memcpy(seq1, text_toks, 400), memcpy(seq2, text_toks, 400);
    seq1[100] = t1, seq2[100] = t2;
    all_logits(gpu, seq1, 101, tmp);
    memcpy(ref1, tmp + (size_t)100 * VOC, sizeof ref1);
    all_logits(gpu, seq2, 101, tmp);
    memcpy(ref2, tmp + (size_t)100 * VOC, sizeof ref2);
    printf("two restores decoding together: rel L2 %.2e and %.2e against uncached\n", kt_rel(l1, ref1, VOC),
           kt_rel(l2, ref2, VOC));
    assert_true(kt_rel(l1, ref1, VOC) < 1e-2 && kt_rel(l2, ref2, VOC) < 1e-2);
    assert_int_equal(argmax(l1), argmax(ref1));
    assert_int_equal(argmax(l2), argmax(ref2));
    kda_seq_free(gpu, r1);
    kda_seq_free(gpu, r2);
    kda_snapshot_drop(gpu, snap);
    kda_engine_usage(gpu, &u);
    assert_int_equal(u.kv_bytes_used, 0);
    assert_int_equal(u.cache_bytes, 0);
    assert_int_equal(u.snaps_used, 0);
    free(tmp);
    kda_engine_close(gpu);
}

int main(void)
{
    kt_skip_without_gpu();
    snprintf(demo_dir, sizeof demo_dir, "%s/models/demo", getenv("KDA_SRC") ? getenv("KDA_SRC") : ".");
    static const char text[] =
        "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
        "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
        "Sometime too hot the eye of heaven shines,\nAnd often is his gold complexion dimm'd;\n"
        "And every fair from fair sometime declines,\nBy chance or nature's changing course untrimm'd;\n"
        "But thy eternal summer shall not fade,\nNor lose possession of that fair thou ow'st;\n";
    n_text = (int)strlen(text);
    for (int i = 0; i < n_text; i++) text_toks[i] = (unsigned char)text[i];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restored_sequence_matches_uncached_and_cpu),
        cmocka_unit_test(test_snapshot_blocks_are_shared_by_reference_and_given_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_cuda_model.c - the whole CUDA backend against the CPU reference
 * backend: teacher-forced logits on the shipped demo model with English text
 * (MODEL_SPEC 7 budget as written) and on generated random-weight checkpoints
 * (scripts/gen_checkpoint.py; there against the error bf16 storage alone
 * causes, see check_teacher_forced_toks), greedy continuation, a batch of 64
 * sequences of different lengths vs each sequence alone, slot reuse from a clean state,
 * admission control when the KV pool is full, prefix snapshots (restore vs
 * uncached, block sharing), and every checkpoint fla itself wrote
 * (tests/fixtures/fla: each KDAForCausalLM / llama_kda option) against the
 * CPU, in one step and fed in several; the two-phase step (begin / end) against the
 * one-call step; mixed steps with the decode rows on a second stream against
 * one stream. KDA_TEST_MODEL_17B=DIR adds the
 * 1.7B-shaped checkpoint in DIR. Skips (77) without a GPU.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "engine.h"
#include "kt_util.h"

static char tiny_dir[256], llama_dir[256], k128_dir[256], demo_dir[512];

static int gen(char *dir, size_t n, const char *args)
{
    const char *src = getenv("KDA_SRC");
    if (!src) src = ".";
    snprintf(dir, n, "/tmp/kda_cuda_test_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s/scripts/gen_checkpoint.py %s %s > /dev/null", src, dir, args);
    return system(cmd) == 0 ? 0 : -1;
}

/* The engine under test; bf16_act: the CPU backend emulating the CUDA
 * backend's bf16 activation storage (tuning cpu_bf16_act); mixed_pass >= 0
 * sets that tuning. Other tuning from KDA_TUNING, as the programs take it. */
static int g_state_bf16; /* open_engine_tm: tuning kda_state_bf16 for the CUDA engine */
static kda_engine *open_engine_tm(const char *dir, const char *dev, int max_seqs, int max_len, int bf16_act,
                                  int mixed_pass)
{
    kda_tuning tn;
    char err[512];
    kda_tuning_defaults(&tn);
    assert_int_equal(kda_tuning_from_env(&tn, err, sizeof err), 0);
    tn.cpu_bf16_act = bf16_act;
    if (mixed_pass >= 0) tn.mixed_pass = mixed_pass;
    if (!strcmp(dev, "cuda")) tn.kda_state_bf16 = g_state_bf16;
    kda_engine_opts o = {.model_dir = dir, .device = dev, .max_seqs = max_seqs, .max_seq_len = max_len,
                         .gpu_mem_fraction = 0.5, .tuning = &tn};
    kda_engine *e = NULL;
    int rc = kda_engine_open(&e, &o, err, sizeof err);
    if (rc) fprintf(stderr, "open %s on %s: %s\n", dir, dev, err);
    assert_int_equal(rc, 0);
    return e;
}
static kda_engine *open_engine_t(const char *dir, const char *dev, int max_seqs, int max_len, int bf16_act)
{
    return open_engine_tm(dir, dev, max_seqs, max_len, bf16_act, -1);
}
static kda_engine *open_engine(const char *dir, const char *dev, int max_seqs, int max_len)
{
    return open_engine_t(dir, dev, max_seqs, max_len, 0);
}

static void rand_tokens(int32_t *t, int n, int vocab)
{
    for (int i = 0; i < n; i++) t[i] = (int32_t)(kt_u01() * vocab);
}

/* all-position logits of one sequence fed `toks` in one step */
static void teacher_forced(kda_engine *e, const int32_t *toks, int n, float *logits, float *tlp)
{
    char err[256];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    kda_batch_item it = {.seq = s, .tokens = toks, .n_tokens = n, .logits = logits, .want_all_logits = 1,
                         .targets = toks + 1, .target_logprobs = tlp};
    it.n_tokens = n;
    int32_t *tg = malloc((size_t)n * 4);
    memcpy(tg, toks + 1, (size_t)(n - 1) * 4);
    tg[n - 1] = -1;
    it.targets = tg;
    int rc = kda_engine_step(e, &it, 1, err, sizeof err);
    if (rc) fprintf(stderr, "step: %s\n", err);
    assert_int_equal(rc, 0);
    kda_seq_free(e, s);
    free(tg);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

typedef struct {
    double worst, mean; /* per-position relative L2 of the logits */
    int agree;          /* positions with the same argmax */
    double dlp;         /* mean |difference| of the next-token log-prob */
} cmp_stats;

static cmp_stats compare(const float *l, const float *ref, const float *tl, const float *tref, int n, int vocab)
{
    cmp_stats c = {0, 0, 0, 0};
    for (int t = 0; t < n; t++) {
        double e = kt_rel(l + (size_t)t * vocab, ref + (size_t)t * vocab, vocab);
        c.worst = e > c.worst ? e : c.worst;
        c.mean += e / n;
        c.agree += argmax(l + (size_t)t * vocab, vocab) == argmax(ref + (size_t)t * vocab, vocab);
        if (t < n - 1) c.dlp += fabs(tl[t] - tref[t]) / (n - 1);
    }
    return c;
}

/* Teacher-forced logits of the CUDA backend against the fp32 CPU reference.
 * contract = 1: the MODEL_SPEC 7 budget as stated (rel L2 <= 1e-2 at every
 * position, top-1 >= 99%, mean |dlogp| <= 0.05); used on the trained demo
 * model with real text.
 * contract = 0 (random-weight checkpoints): bf16 activation storage ALONE
 * already breaks that budget on these models (the CPU backend emulating it,
 * tuning cpu_bf16_act=1, is off by up to ~5e-2: random weights amplify 1-ulp
 * differences; an independent float64 check in PyTorch gives the same), so the
 * test asserts that the CUDA backend's deviation is no larger than what bf16
 * storage itself causes on the same tokens (mean within 1.5x, worst within
 * 2x): a wrong kernel shows up as an error far above the rounding level. */
static void check_teacher_forced_toks(const char *dir, const int32_t *toks, int n, int contract)
{
    kda_engine *cpu = open_engine(dir, "cpu", 4, 512), *gpu = open_engine(dir, "cuda", 4, 512);
    kda_engine *emu = open_engine_t(dir, "cpu", 4, 512, 1);
    const int vocab = kda_engine_info(cpu)->vocab_size;
    float *lc = malloc((size_t)n * vocab * 4), *lg = malloc((size_t)n * vocab * 4), *le = malloc((size_t)n * vocab * 4);
    float *tc = malloc((size_t)n * 4), *tg = malloc((size_t)n * 4), *te = malloc((size_t)n * 4);
    memset(lg, 0xFF, (size_t)n * vocab * 4);
    teacher_forced(cpu, toks, n, lc, tc);
    teacher_forced(gpu, toks, n, lg, tg);
    teacher_forced(emu, toks, n, le, te);
    const cmp_stats g = compare(lg, lc, tg, tc, n, vocab), e = compare(le, lc, te, tc, n, vocab);
    const cmp_stats ge = compare(lg, le, tg, te, n, vocab);
    printf("%s: %d positions\n", dir, n);
    printf("  cuda vs cpu fp32      : worst rel L2 %.2e mean %.2e top-1 %d/%d mean |dlogp| %.4f\n", g.worst, g.mean,
           g.agree, n, g.dlp);
    printf("  cpu bf16-act vs fp32  : worst rel L2 %.2e mean %.2e top-1 %d/%d mean |dlogp| %.4f\n", e.worst, e.mean,
           e.agree, n, e.dlp);
    printf("  cuda vs cpu bf16-act  : worst rel L2 %.2e mean %.2e top-1 %d/%d mean |dlogp| %.4f\n", ge.worst, ge.mean,
           ge.agree, n, ge.dlp);
    printf("  cuda vs fp32 by position:");
    for (int t = 0; t < n; t += (n / 8 > 0 ? n / 8 : 1))
        printf(" [%d] %.1e", t, kt_rel(lg + (size_t)t * vocab, lc + (size_t)t * vocab, vocab));
    printf("\n");
    if (contract) {
        assert_true(g.worst <= 1e-2);
        assert_true(g.agree >= 0.99 * n);
        assert_true(g.dlp <= 0.05);
    } else {
        assert_true(g.mean <= 1.5 * e.mean + 1e-3);
        assert_true(g.worst <= 2.0 * e.worst + 2e-3);
        assert_true(g.agree >= e.agree - 0.02 * n - 1);
        assert_true(g.dlp <= 1.5 * e.dlp + 0.01);
    }
    free(lc), free(lg), free(le), free(tc), free(tg), free(te);
    kda_engine_close(cpu);
    kda_engine_close(gpu);
    kda_engine_close(emu);
}

static void check_teacher_forced(const char *dir, int n)
{
    kda_engine *cpu = open_engine(dir, "cpu", 1, 64);
    const int vocab = kda_engine_info(cpu)->vocab_size;
    kda_engine_close(cpu);
    int32_t *toks = malloc((size_t)n * 4);
    rand_tokens(toks, n, vocab);
    check_teacher_forced_toks(dir, toks, n, 0);
    free(toks);
}

/* the shipped demo model (trained, byte-level) on English text: the budget of
 * MODEL_SPEC 7 as written */
static void test_teacher_forced_logits_match_cpu_demo_contract(void **st)
{
    (void)st;
    static const char text[] =
        "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
        "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
        "Sometime too hot the eye of heaven shines,\nAnd often is his gold complexion dimm'd;\n"
        "And every fair from fair sometime declines,\nBy chance or nature's changing course untrimm'd;\n";
    const int n = (int)strlen(text);
    int32_t toks[512];
    for (int i = 0; i < n; i++) toks[i] = (unsigned char)text[i];
    check_teacher_forced_toks(demo_dir, toks, n, 1);
}

static void test_teacher_forced_logits_match_cpu_tiny(void **st)
{
    (void)st;
    check_teacher_forced(tiny_dir, 300); /* > one KV block and > one attention split */
}

static void test_teacher_forced_logits_match_cpu_llama_family(void **st)
{
    (void)st;
    check_teacher_forced(llama_dir, 100);
}

static void test_teacher_forced_logits_match_cpu_17b(void **st)
{
    (void)st;
    const char *d = getenv("KDA_TEST_MODEL_17B");
    if (!d || access(d, R_OK)) {
        printf("KDA_TEST_MODEL_17B not set: 1.7B case skipped\n");
        skip();
    }
    check_teacher_forced(d, 12);
}

/* greedy decode of n tokens after a prompt, one token per step */
static void greedy(kda_engine *e, const int32_t *prompt, int np, int n, int32_t *out)
{
    char err[256];
    int s;
    kda_sampling greedy_s = {.temperature = 0};
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    int32_t tok;
    kda_batch_item it = {.seq = s, .tokens = prompt, .n_tokens = np, .sampling = &greedy_s, .sampled = &tok};
    assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    for (int i = 0; i < n; i++) {
        out[i] = tok;
        it.tokens = &out[i];
        it.n_tokens = 1;
        assert_int_equal(kda_engine_step(e, &it, 1, err, sizeof err), 0);
    }
    kda_seq_free(e, s);
}

static void test_greedy_continuation_identical_to_cpu(void **st)
{
    (void)st;
    kda_engine *cpu = open_engine(tiny_dir, "cpu", 4, 512), *gpu = open_engine(tiny_dir, "cuda", 4, 512);
    int32_t prompt[12], a[48], b[48];
    rand_tokens(prompt, 12, 256);
    greedy(cpu, prompt, 12, 48, a);
    greedy(gpu, prompt, 12, 48, b);
    for (int i = 0; i < 48; i++) printf("%d%c", a[i] == b[i], i == 47 ? '\n' : ' ');
    assert_memory_equal(a, b, sizeof a);
    kda_engine_close(cpu);
    kda_engine_close(gpu);
}

static void test_batch_of_64_equals_each_sequence_alone(void **st)
{
    (void)st;
    enum { B = 64, STEPS = 6, VOC = 256 };
    /* the trained demo model: random-weight models amplify the 1-ulp bf16
     * differences of the two GEMM paths (~5e-3 on the tiny preset) */
    kda_engine *gpu = open_engine(demo_dir, "cuda", B, 512);
    char err[256];
    int32_t *prompts = malloc((size_t)B * 80 * 4);
    /* the same prompts whichever tests ran before (KDA_TEST_ONLY or not): the
     * bound below is a statistic of the input, so the input must not move */
    kt_rng = 0x12345678abcdefull;
    int plen[B], seq[B];
    rand_tokens(prompts, B * 80, VOC);
    for (int i = 0; i < B; i++) plen[i] = 1 + (i * 37) % 80;
    /* batched: all prompts in one step, then STEPS batched decode steps with greedy tokens */
    float *lb = malloc((size_t)B * STEPS * VOC * 4), *la = malloc((size_t)STEPS * VOC * 4);
    int32_t next[B], gen_b[B][STEPS];
    kda_sampling g = {.temperature = 0};
    kda_batch_item it[B];
    for (int i = 0; i < B; i++) {
        assert_int_equal(kda_seq_new(gpu, &seq[i], err, sizeof err), 0);
        it[i] = (kda_batch_item){.seq = seq[i], .tokens = prompts + i * 80, .n_tokens = plen[i], .sampling = &g,
                                 .sampled = &next[i]};
    }
    assert_int_equal(kda_engine_step(gpu, it, B, err, sizeof err), 0);
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < B; i++) {
            gen_b[i][s] = next[i];
            it[i] = (kda_batch_item){.seq = seq[i], .tokens = &gen_b[i][s], .n_tokens = 1,
                                     .logits = lb + ((size_t)i * STEPS + s) * VOC, .sampling = &g, .sampled = &next[i]};
        }
        int rc = kda_engine_step(gpu, it, B, err, sizeof err);
        if (rc) fprintf(stderr, "%s\n", err);
        assert_int_equal(rc, 0);
    }
    for (int i = 0; i < B; i++) kda_seq_free(gpu, seq[i]);
    /* each alone: same tokens, one sequence per step; the same sequence on
     * the CPU in fp32 and with bf16 activation storage emulated gives the
     * scale of difference that bf16 rounding alone makes on this input */
    kda_engine *cpu = open_engine(demo_dir, "cpu", 1, 512);
    kda_engine *emu = open_engine_t(demo_dir, "cpu", 1, 512, 1);
    float *lc = malloc((size_t)STEPS * VOC * 4), *le = malloc((size_t)STEPS * VOC * 4);
    double worst = 0, worst_round = 0, worst_bc = 0, worst_ac = 0, sum_r = 0, sum_b = 0, sum_a = 0;
    int worst_i = -1;
    const int diag = getenv("KDA_TEST_DIAG") != NULL;
    for (int i = 0; i < B; i++) {
        const double before = worst;
        int s1;
        int32_t nx;
        assert_int_equal(kda_seq_new(gpu, &s1, err, sizeof err), 0);
        kda_batch_item one = {.seq = s1, .tokens = prompts + i * 80, .n_tokens = plen[i], .sampling = &g, .sampled = &nx};
        assert_int_equal(kda_engine_step(gpu, &one, 1, err, sizeof err), 0);
        assert_int_equal(nx, gen_b[i][0]);
        for (int s = 0; s < STEPS; s++) {
            one = (kda_batch_item){.seq = s1, .tokens = &gen_b[i][s], .n_tokens = 1, .logits = la + (size_t)s * VOC,
                                   .sampling = &g, .sampled = &nx};
            assert_int_equal(kda_engine_step(gpu, &one, 1, err, sizeof err), 0);
            double e = kt_rel(la + (size_t)s * VOC, lb + ((size_t)i * STEPS + s) * VOC, VOC);
            worst = e > worst ? e : worst;
            if (s + 1 < STEPS) assert_int_equal(nx, gen_b[i][s + 1]);
        }
        kda_seq_free(gpu, s1);
        if (worst > before) worst_i = i;
        kda_engine *ce[2] = {cpu, emu};
        float *lce[2] = {lc, le};
        for (int k = 0; k < 2; k++) {
            int sc;
            assert_int_equal(kda_seq_new(ce[k], &sc, err, sizeof err), 0);
            kda_batch_item c1 = {.seq = sc, .tokens = prompts + i * 80, .n_tokens = plen[i]};
            assert_int_equal(kda_engine_step(ce[k], &c1, 1, err, sizeof err), 0);
            for (int s = 0; s < STEPS; s++) {
                c1 = (kda_batch_item){.seq = sc, .tokens = &gen_b[i][s], .n_tokens = 1, .logits = lce[k] + (size_t)s * VOC};
                assert_int_equal(kda_engine_step(ce[k], &c1, 1, err, sizeof err), 0);
            }
            kda_seq_free(ce[k], sc);
        }
        double wr = 0, wb = 0, wa = 0;
        for (int s = 0; s < STEPS; s++) {
            const double e = kt_rel(le + (size_t)s * VOC, lc + (size_t)s * VOC, VOC);
            const double eb = kt_rel(lb + ((size_t)i * STEPS + s) * VOC, lc + (size_t)s * VOC, VOC);
            const double ea = kt_rel(la + (size_t)s * VOC, lc + (size_t)s * VOC, VOC);
            wr = e > wr ? e : wr, wb = eb > wb ? eb : wb, wa = ea > wa ? ea : wa;
        }
        worst_round = wr > worst_round ? wr : worst_round;
        sum_r += wr, sum_b += wb, sum_a += wa;
        worst_bc = wb > worst_bc ? wb : worst_bc, worst_ac = wa > worst_ac ? wa : worst_ac;
        if (diag) printf("seq %2d len %2d: emu-fp32 %.2e batch-fp32 %.2e alone-fp32 %.2e\n", i, plen[i], wr, wb, wa);
    }
    /* where the worst sequence sat in the batched prompt step: the backend
     * processes prompts in passes of at most 256 rows, in item order */
    int start = 0;
    if (worst_i < 0) worst_i = 0;
    for (int i = 0; i < worst_i; i++) start += plen[i];
    printf("batch of %d vs alone: worst rel L2 %.2e (sequence %d, prompt rows %d..%d%s); bf16 storage alone "
           "(cpu emulation vs fp32) on the same sequences: worst %.2e; vs the cpu in fp32: batch %.2e, alone %.2e; "
           "means over the sequences: emulation %.2e, batch %.2e, alone %.2e\n",
           B, worst, worst_i, start, start + plen[worst_i] - 1,
           start / 256 != (start + plen[worst_i] - 1) / 256 ? ", across a pass" : "", worst_round, worst_bc, worst_ac,
           sum_r / B, sum_b / B, sum_a / B);
    /* Batched and single rows run different kernels (cuBLASLt plans vs the
     * GEMV, the streamed vs the per-item KDA state step, other attention
     * splits), so fp32 sums differ in order and some bf16-stored activations
     * round the other way: not bit-identical. Each GPU path is a bf16 path
     * like the CPU emulation, but rounds in more places than it models (tf32
     * products in the chunked KDA kernel, the MLP's bf16 gate|up), so either
     * may sit up to twice as far from fp32 as the emulation does; the two
     * then differ by at most that (measured on the H200, these prompts:
     * emulation 1.05e-2, batch 1.38e-2, alone 1.08e-2, batch vs alone
     * 1.38e-2; other prompts 1.47e-2 / 5.29e-3 between the paths): the
     * worst sequence is a tail statistic, per-sequence ratios to the
     * emulation range 0.3-3.5x. Their means are the sharper check: a path
     * that lost precision everywhere moves the mean (measured 3.58e-3
     * emulation, 3.82e-3 batch, 3.47e-3 alone). A structural error (a wrong
     * row, state or position) is O(1) and the greedy tokens above differ. */
    assert_true(sum_b <= 1.5 * sum_r);
    assert_true(sum_a <= 1.5 * sum_r);
    assert_true(worst_bc <= 2 * worst_round + 1e-3);
    assert_true(worst_ac <= 2 * worst_round + 1e-3);
    assert_true(worst <= 2 * worst_round + 1e-3);
    free(lc), free(le);
    kda_engine_close(cpu);
    kda_engine_close(emu);
    free(prompts), free(lb), free(la);
    kda_engine_close(gpu);
}

static void test_freed_slot_reused_starts_clean(void **st)
{
    (void)st;
    kda_engine *gpu = open_engine(tiny_dir, "cuda", 1, 512); /* one slot: reuse is certain */
    int32_t a[40], b[20];
    rand_tokens(a, 40, 256);
    rand_tokens(b, 20, 256);
    float *first = malloc(20 * 256 * 4), *again = malloc(20 * 256 * 4), *tl = malloc(20 * 4);
    teacher_forced(gpu, b, 20, first, tl);
    teacher_forced(gpu, a, 40, malloc(40 * 256 * 4), malloc(40 * 4)); /* dirties the slot (leaks in a test: fine) */
    teacher_forced(gpu, b, 20, again, tl);
    double e = kt_rel(again, first, 20 * 256);
    printf("slot reuse: rel %.2e\n", e);
    assert_true(e == 0.0);
    free(first), free(again), free(tl);
    kda_engine_close(gpu);
}

static void test_context_overflow_refused_without_corrupting_others(void **st)
{
    (void)st;
    /* the pool holds at most max_seqs full contexts; two sequences each taking
     * most of the context then a third asking for more must fail cleanly */
    kda_engine *gpu = open_engine(tiny_dir, "cuda", 2, 64);
    char err[256];
    int s0, s1;
    int32_t t[64];
    rand_tokens(t, 64, 256);
    assert_int_equal(kda_seq_new(gpu, &s0, err, sizeof err), 0);
    assert_int_equal(kda_seq_new(gpu, &s1, err, sizeof err), 0);
    float l0[256], l0b[256];
    kda_batch_item it = {.seq = s0, .tokens = t, .n_tokens = 10, .logits = l0};
    assert_int_equal(kda_engine_step(gpu, &it, 1, err, sizeof err), 0);
    /* beyond the context: refused with KDA_ECTX, nothing advanced */
    kda_batch_item big = {.seq = s1, .tokens = t, .n_tokens = 64};
    assert_int_equal(kda_engine_step(gpu, &big, 1, err, sizeof err), 0);
    kda_batch_item over = {.seq = s1, .tokens = t, .n_tokens = 1};
    assert_int_equal(kda_engine_step(gpu, &over, 1, err, sizeof err), KDA_ECTX);
    /* s0 continues as a fresh sequence would: s0 (a 10-token prompt pass
     * then a decode step) and s2 (one 11-token prompt pass) run different
     * kernels, so they agree to the rounding level of bf16 storage, which the
     * CPU (fp32 vs its bf16 emulation) measures on the same tokens; a
     * corrupted state or KV block would be far off */
    it = (kda_batch_item){.seq = s0, .tokens = t + 10, .n_tokens = 1, .logits = l0};
    assert_int_equal(kda_engine_step(gpu, &it, 1, err, sizeof err), 0);
    int s2;
    kda_seq_free(gpu, s1);
    assert_int_equal(kda_seq_new(gpu, &s2, err, sizeof err), 0);
    it = (kda_batch_item){.seq = s2, .tokens = t, .n_tokens = 11, .logits = l0b};
    assert_int_equal(kda_engine_step(gpu, &it, 1, err, sizeof err), 0);
    float lc[256], le[256];
    kda_engine *ce[2] = {open_engine(tiny_dir, "cpu", 1, 64), open_engine_t(tiny_dir, "cpu", 1, 64, 1)};
    float *lce[2] = {lc, le};
    for (int k = 0; k < 2; k++) {
        int sc;
        assert_int_equal(kda_seq_new(ce[k], &sc, err, sizeof err), 0);
        kda_batch_item c1 = {.seq = sc, .tokens = t, .n_tokens = 11, .logits = lce[k]};
        assert_int_equal(kda_engine_step(ce[k], &c1, 1, err, sizeof err), 0);
        kda_engine_close(ce[k]);
    }
    const double e_paths = kt_rel(l0b, l0, 256), e_round = kt_rel(le, lc, 256);
    const double e0 = kt_rel(l0, lc, 256), e2 = kt_rel(l0b, lc, 256);
    printf("kv pool full: continued vs fresh %.2e; vs cpu %.2e / %.2e; bf16 storage alone %.2e\n", e_paths, e0, e2,
           e_round);
    assert_true(e0 <= 2 * e_round + 2e-3 && e2 <= 2 * e_round + 2e-3);
    assert_true(e_paths <= 2 * e_round + 2e-3);
    kda_engine_close(gpu);
}

/* ---- prompt passes (fast prefill) ---- */

static const char sonnet[] =
    "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
    "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
    "Sometime too hot the eye of heaven shines,\nAnd often is his gold complexion dimm'd;\n"
    "And every fair from fair sometime declines,\nBy chance or nature's changing course untrimm'd;\n"
    "But thy eternal summer shall not fade,\nNor lose possession of that fair thou ow'st;\n"
    "Nor shall death brag thou wander'st in his shade,\nWhen in eternal lines to time thou grow'st:\n"
    "So long as men can breathe or eyes can see,\nSo long lives this, and this gives life to thee.\n";

/* byte tokens of the sonnet, repeated, from offset off */
static void text_tokens(int32_t *t, int n, int off)
{
    const int L = (int)strlen(sonnet);
    for (int i = 0; i < n; i++) t[i] = (unsigned char)sonnet[(off + i) % L];
}

/* log p(next) at every position of each text (the last entry 0): all texts in
 * one step (together), each alone in one step, or each alone fed in steps of
 * the sizes in split[] (then the rest) */
enum { SCORE_TOGETHER, SCORE_ALONE, SCORE_SPLIT };
static void score_texts(kda_engine *e, int32_t *const *toks, const int *len, int n, int mode, const int *split,
                        float **out)
{
    char err[256];
    int seq[16];
    kda_batch_item it[16];
    int32_t *tg[16];
    for (int i = 0; i < n; i++) {
        tg[i] = malloc((size_t)len[i] * 4);
        for (int t = 0; t < len[i]; t++) tg[i][t] = t + 1 < len[i] ? toks[i][t + 1] : -1;
    }
    if (mode == SCORE_TOGETHER) {
        for (int i = 0; i < n; i++) {
            assert_int_equal(kda_seq_new(e, &seq[i], err, sizeof err), 0);
            it[i] = (kda_batch_item){.seq = seq[i], .tokens = toks[i], .n_tokens = len[i], .targets = tg[i],
                                     .target_logprobs = out[i]};
        }
        int rc = kda_engine_step(e, it, n, err, sizeof err);
        if (rc) fprintf(stderr, "step: %s\n", err);
        assert_int_equal(rc, 0);
        for (int i = 0; i < n; i++) kda_seq_free(e, seq[i]);
    } else {
        for (int i = 0; i < n; i++) {
            assert_int_equal(kda_seq_new(e, &seq[0], err, sizeof err), 0);
            for (int done = 0, k = 0; done < len[i]; k++) {
                int m = mode == SCORE_SPLIT && split[k] ? split[k] : len[i] - done;
                if (m > len[i] - done) m = len[i] - done;
                it[0] = (kda_batch_item){.seq = seq[0], .tokens = toks[i] + done, .n_tokens = m,
                                         .targets = tg[i] + done, .target_logprobs = out[i] + done};
                int rc = kda_engine_step(e, it, 1, err, sizeof err);
                if (rc) fprintf(stderr, "step: %s\n", err);
                assert_int_equal(rc, 0);
                done += m;
                if (mode == SCORE_SPLIT && !split[k]) k--; /* stay on the 0 terminator: the rest in one */
            }
            kda_seq_free(e, seq[0]);
        }
    }
    for (int i = 0; i < n; i++) free(tg[i]);
}

static void lp_diff(float *const *a, float *const *b, const int *len, int n, double *mean, double *worst)
{
    double s = 0, w = 0;
    long cnt = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t + 1 < len[i]; t++) {
            const double d = fabs((double)a[i][t] - b[i][t]);
            s += d, cnt++;
            w = d > w ? d : w;
        }
    *mean = cnt ? s / cnt : 0, *worst = w;
}

/* The score of a text does not depend on how it reaches the engine: alone,
 * in one step with 7 other texts of mixed lengths (varlen packing), or fed in
 * several steps (the chunked KDA kernel continuing from a state and conv tail
 * left by the previous step, attention over a cached prefix). Each way agrees
 * with the fp32 CPU reference within MODEL_SPEC 7's mean log-prob budget, and
 * with the others much more closely. */
static void test_score_is_the_same_alone_batched_and_split(void **st)
{
    (void)st;
    enum { N = 8 };
    const int len[N] = {5, 63, 64, 65, 200, 333, 17, 700};
    const int split[] = {37, 100, 27, 64, 0};
    int32_t *toks[N];
    float *alone[N], *tog[N], *spl[N], *cpu[N];
    for (int i = 0; i < N; i++) {
        toks[i] = malloc((size_t)len[i] * 4);
        text_tokens(toks[i], len[i], 41 * i);
        alone[i] = calloc((size_t)len[i], 4), tog[i] = calloc((size_t)len[i], 4);
        spl[i] = calloc((size_t)len[i], 4), cpu[i] = calloc((size_t)len[i], 4);
    }
    kda_engine *gpu = open_engine(demo_dir, "cuda", N, 1024), *ce = open_engine(demo_dir, "cpu", N, 1024);
    score_texts(gpu, toks, len, N, SCORE_ALONE, NULL, alone);
    score_texts(gpu, toks, len, N, SCORE_TOGETHER, NULL, tog);
    score_texts(gpu, toks, len, N, SCORE_SPLIT, split, spl);
    score_texts(ce, toks, len, N, SCORE_ALONE, NULL, cpu);
    double m1, w1, m2, w2, m3, w3;
    lp_diff(tog, alone, len, N, &m1, &w1);
    lp_diff(spl, alone, len, N, &m2, &w2);
    lp_diff(alone, cpu, len, N, &m3, &w3);
    printf("score: together vs alone mean |dlp| %.2e worst %.2e; split vs alone %.2e / %.2e; gpu vs cpu %.2e / %.2e\n",
           m1, w1, m2, w2, m3, w3);
    assert_true(m3 <= 0.05);            /* MODEL_SPEC 7 */
    assert_true(m1 <= 0.5 * m3 + 1e-3); /* packing changes nothing beyond rounding */
    assert_true(m2 <= 0.5 * m3 + 1e-3);  /* nor does the step split */
    assert_true(w1 <= 0.1 && w2 <= 0.1);
    for (int i = 0; i < N; i++) free(toks[i]), free(alone[i]), free(tog[i]), free(spl[i]), free(cpu[i]);
    kda_engine_close(gpu);
    kda_engine_close(ce);
}

/* A 300-token prompt through the prompt pass, then 48 tokens one per step
 * through the decode kernels (while another sequence's prompt chunks share
 * every other step: in one pass with them, tuning mixed_pass=1, or in a
 * decode graph of their own, mixed_pass=0): the decode positions' logits meet
 * MODEL_SPEC 7 against the CPU reference, teacher-forced with the same
 * tokens, and the two ways agree. */
static void test_prefill_then_decode_matches_cpu(void **st)
{
    (void)st;
    enum { NP = 300, ND = 48, VOC = 256 };
    int32_t toks[NP + ND], other[ND * 9];
    text_tokens(toks, NP + ND, 5);
    text_tokens(other, ND * 9, 77);
    /* runs: mixed_pass 0, mixed_pass 1, and mixed_pass 1 with the KDA state
     * stored as bf16 (--kda-state-dtype bf16) */
    float *lg[3] = {malloc((size_t)ND * VOC * 4), malloc((size_t)ND * VOC * 4), malloc((size_t)ND * VOC * 4)};
    float *lc = malloc((size_t)(NP + ND) * VOC * 4), *tc = malloc((size_t)(NP + ND) * 4);
    char err[256];
    for (int run = 0; run < 3; run++) {
        const int mixed = run > 0;
        g_state_bf16 = run == 2;
        kda_engine *gpu = open_engine_tm(demo_dir, "cuda", 2, 1024, 0, mixed);
        g_state_bf16 = 0;
        int s, o;
        assert_int_equal(kda_seq_new(gpu, &s, err, sizeof err), 0);
        assert_int_equal(kda_seq_new(gpu, &o, err, sizeof err), 0);
        kda_batch_item it[2] = {{.seq = s, .tokens = toks, .n_tokens = NP}};
        assert_int_equal(kda_engine_step(gpu, it, 1, err, sizeof err), 0);
        for (int t = 0; t < ND; t++) {
            /* the prompt chunk first: the backend must put the one-token item first itself */
            kda_batch_item *dec = &it[t % 2 ? 1 : 0];
            *dec = (kda_batch_item){.seq = s, .tokens = toks + NP + t, .n_tokens = 1,
                                    .logits = lg[run] + (size_t)t * VOC};
            if (t % 2) it[0] = (kda_batch_item){.seq = o, .tokens = other + 9 * t, .n_tokens = 9};
            int rc = kda_engine_step(gpu, t % 2 ? it : dec, t % 2 ? 2 : 1, err, sizeof err);
            if (rc) fprintf(stderr, "step: %s\n", err);
            assert_int_equal(rc, 0);
        }
        kda_engine_close(gpu);
    }
    kda_engine *cpu = open_engine(demo_dir, "cpu", 1, 1024);
    teacher_forced(cpu, toks, NP + ND, lc, tc);
    kda_engine_close(cpu);
    /* the GPU's logits at position NP + t predict token NP + t + 1 */
    float *ref = lc + (size_t)NP * VOC;
    for (int run = 0; run < 3; run++) {
        double worst = 0, apart = 0;
        int agree = 0;
        for (int t = 0; t < ND; t++) {
            const double e = kt_rel(lg[run] + (size_t)t * VOC, ref + (size_t)t * VOC, VOC);
            const double m = kt_rel(lg[run] + (size_t)t * VOC, lg[0] + (size_t)t * VOC, VOC);
            worst = e > worst ? e : worst;
            apart = m > apart ? m : apart;
            agree += argmax(lg[run] + (size_t)t * VOC, VOC) == argmax(ref + (size_t)t * VOC, VOC);
        }
        printf("prefill %d then decode %d (mixed_pass=%d%s): worst rel L2 %.2e, top-1 %d/%d; vs mixed_pass=0 %.2e\n",
               NP, ND, run > 0, run == 2 ? ", bf16 KDA state" : "", worst, agree, ND, apart);
        if (run < 2) {
            assert_true(worst <= 1e-2);
            assert_true(agree >= ND - 1);
            /* the same kernels on the same rows: only the GEMMs' row count differs */
            assert_true(apart <= 5e-3);
        } else {
            /* the state rounded to bf16 after every step (2^-9 relative), on
             * top of the bf16 activations: looser, and still the same top-1 */
            assert_true(worst <= 3e-2);
            assert_true(agree >= ND - 2);
        }
    }
    free(lg[0]), free(lg[1]), free(lg[2]);
    free(lc), free(tc);
}

/* ---- prefix snapshots (engine.h kda_snapshot_take / kda_seq_restore) on the
 * demo model: a restored sequence continues like the same tokens computed from
 * scratch on the GPU and like the fp32 CPU reference, greedy output included;
 * KV blocks are shared by reference (a partial last block copied) and every
 * byte comes back. Tolerance: the restored and the uncached runs compute the
 * same positions with different row counts per step (other cuBLASLt plans and
 * attention splits), so they must agree as well as fp32 and bf16 storage
 * agree on the CPU (the batch test's yardstick), and meet MODEL_SPEC 7
 * against the fp32 CPU reference. KDA_TEST_ONLY=prefix runs just these. */

#define PX_VOC 256 /* the demo model's byte vocabulary */
static int32_t px_toks[600];
static int px_n;

static kda_engine *px_open(const char *dev, int max_seqs, int n_snaps, int bf16_act)
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

/* feeds toks[from..n) to seq (restored to `from` or fresh) in one step, all logits into lg[(n-from) * PX_VOC] */
static void px_feed(kda_engine *e, int seq, const int32_t *toks, int from, int n, float *lg)
{
    char err[256];
    kda_batch_item it = {.seq = seq, .tokens = toks + from, .n_tokens = n - from, .logits = lg, .want_all_logits = 1};
    int rc = kda_engine_step(e, &it, 1, err, sizeof err);
    if (rc) fprintf(stderr, "step: %s\n", err);
    assert_int_equal(rc, 0);
}

static void px_all_logits(kda_engine *e, const int32_t *toks, int n, float *lg)
{
    char err[256];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    px_feed(e, s, toks, 0, n, lg);
    kda_seq_free(e, s);
}

static int px_argmax(const float *x)
{
    int b = 0;
    for (int i = 1; i < PX_VOC; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* worst per-position rel L2 of a against b over rows [0, n) */
static double px_worst_rel(const float *a, const float *b, int n)
{
    double w = 0;
    for (int t = 0; t < n; t++) {
        const double e = kt_rel(a + (size_t)t * PX_VOC, b + (size_t)t * PX_VOC, PX_VOC);
        w = e > w ? e : w;
    }
    return w;
}

/* greedy ids after the sequence's current state, starting with `first` fed */
static void px_greedy_from(kda_engine *e, int seq, int32_t first, int n, int32_t *out)
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
static void test_prefix_restore_matches_uncached_and_cpu(void **st)
{
    (void)st;
    const int n = px_n;
    kda_engine *gpu = px_open("cuda", 4, 4, 0), *cpu = px_open("cpu", 1, 0, 0), *emu = px_open("cpu", 1, 0, 1);
    float *ref = malloc((size_t)n * PX_VOC * 4), *lc = malloc((size_t)n * PX_VOC * 4), *le = malloc((size_t)n * PX_VOC * 4);
    float *got = malloc((size_t)n * PX_VOC * 4);
    px_all_logits(gpu, px_toks, n, ref);
    px_all_logits(cpu, px_toks, n, lc);
    px_all_logits(emu, px_toks, n, le);
    const double bf16_alone = px_worst_rel(le, lc, n);
    char err[256];
    int32_t g_ref[32], g_got[32];
    const int cuts[] = {37, 16, 256, n - 1};
    for (int c = 0; c < 4; c++) {
        const int m = cuts[c];
        int a, snap, r;
        assert_int_equal(kda_seq_new(gpu, &a, err, sizeof err), 0);
        kda_batch_item p = {.seq = a, .tokens = px_toks, .n_tokens = m};
        assert_int_equal(kda_engine_step(gpu, &p, 1, err, sizeof err), 0);
        assert_int_equal(kda_snapshot_take(gpu, a, &snap, err, sizeof err), 0);
        /* the original keeps writing into the block it shares with the snapshot */
        px_feed(gpu, a, px_toks, m, n, got);
        px_greedy_from(gpu, a, px_argmax(got + (size_t)(n - m - 1) * PX_VOC), 32, g_ref);
        kda_seq_free(gpu, a);
        memset(got, 0xFF, (size_t)n * PX_VOC * 4); /* poison */
        assert_int_equal(kda_seq_new(gpu, &r, err, sizeof err), 0);
        assert_int_equal(kda_seq_restore(gpu, r, snap, px_toks, n, err, sizeof err), 0);
        px_feed(gpu, r, px_toks, m, n, got);
        const double vs_gpu = px_worst_rel(got, ref + (size_t)m * PX_VOC, n - m);
        const double vs_cpu = px_worst_rel(got, lc + (size_t)m * PX_VOC, n - m);
        const double ref_cpu = px_worst_rel(ref + (size_t)m * PX_VOC, lc + (size_t)m * PX_VOC, n - m);
        int agree = 0;
        for (int t = 0; t < n - m; t++) agree += px_argmax(got + (size_t)t * PX_VOC) == px_argmax(lc + (size_t)(m + t) * PX_VOC);
        px_greedy_from(gpu, r, px_argmax(got + (size_t)(n - m - 1) * PX_VOC), 32, g_got);
        kda_seq_free(gpu, r);
        kda_snapshot_drop(gpu, snap);
        printf("restore at %3d: vs uncached GPU worst rel L2 %.2e, vs CPU fp32 %.2e (uncached GPU %.2e, bf16 storage "
               "alone %.2e), top-1 %d/%d, greedy %s\n",
               m, vs_gpu, vs_cpu, ref_cpu, bf16_alone, agree, n - m, memcmp(g_ref, g_got, sizeof g_ref) ? "DIFFERS" : "same");
        /* The restored and the uncached run round to bf16 at different step boundaries:
         * two realizations of the storage noise, each up to bf16_alone from fp32, so
         * they may differ by twice that (a wrong state or conv tail moves logits by
         * ~1e-1). bf16_alone + 1e-3 was tighter than that and failed at 5.4e-3 (bound
         * 4.5e-3) when the prompt pass's RMSNorm reordered its fp32 sum of squares,
         * with the restored run still 4.0e-3 from the CPU in fp32. */
        assert_true(vs_gpu <= 2 * bf16_alone);
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
static void test_prefix_snapshot_blocks_are_shared_and_given_back(void **st)
{
    (void)st;
    kda_engine *gpu = px_open("cuda", 4, 2, 0);
    const kda_model_info *in = kda_engine_info(gpu);
    const size_t blk = 16 * in->kv_bytes_per_token, state = in->snapshot_bytes_each;
    char err[256];
    int a, snap, r1, r2;
    kda_usage u;
    assert_int_equal(kda_seq_new(gpu, &a, err, sizeof err), 0);
    kda_batch_item p = {.seq = a, .tokens = px_toks, .n_tokens = 100};
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
    assert_int_equal(kda_seq_restore(gpu, r1, snap, px_toks, 200, err, sizeof err), 0);
    assert_int_equal(kda_seq_restore(gpu, r2, snap, px_toks, 200, err, sizeof err), 0);
    kda_engine_usage(gpu, &u);
    assert_int_equal(u.kv_bytes_used, (6 + 2) * blk); /* 6 shared + one private copy each */
    assert_int_equal(u.cache_bytes, state + blk);    /* the snapshot's own partial block */
    /* both continue differently in one batched decode step, each as if uncached */
    float l1[PX_VOC], l2[PX_VOC], ref1[PX_VOC], ref2[PX_VOC], *tmp = malloc((size_t)101 * PX_VOC * 4);
    int32_t t1 = 7, t2 = 9;
    kda_batch_item d[2] = {{.seq = r1, .tokens = &t1, .n_tokens = 1, .logits = l1},
                           {.seq = r2, .tokens = &t2, .n_tokens = 1, .logits = l2}};
    assert_int_equal(kda_engine_step(gpu, d, 2, err, sizeof err), 0);
    int32_t seq1[101], seq2[101];
    memcpy(seq1, px_toks, 400), memcpy(seq2, px_toks, 400);
    seq1[100] = t1, seq2[100] = t2;
    px_all_logits(gpu, seq1, 101, tmp);
    memcpy(ref1, tmp + (size_t)100 * PX_VOC, sizeof ref1);
    px_all_logits(gpu, seq2, 101, tmp);
    memcpy(ref2, tmp + (size_t)100 * PX_VOC, sizeof ref2);
    printf("two restores decoding together: rel L2 %.2e and %.2e against uncached\n", kt_rel(l1, ref1, PX_VOC),
           kt_rel(l2, ref2, PX_VOC));
    assert_true(kt_rel(l1, ref1, PX_VOC) < 1e-2 && kt_rel(l2, ref2, PX_VOC) < 1e-2);
    assert_int_equal(px_argmax(l1), px_argmax(ref1));
    assert_int_equal(px_argmax(l2), px_argmax(ref2));
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

/* ---- checkpoints written by fla itself (tests/fixtures/fla/<option>) ----
 * Each folder holds one fla / llama_kda config option (README "What loads").
 * For each: the fixture's 256 tokens teacher-forced on the CUDA backend in one
 * step (the prompt path) and fed in 13 steps mixing one-token steps (decode
 * graphs) with chunks (prompt passes), against the fp32 CPU reference.
 * Yardstick: the CUDA backend stores every matrix (embedding, projections,
 * lm-head) as bf16 and keeps vectors, conv taps and biases in fp32. The
 * fixtures are bf16 but for `plain` (fp32, where rounding the matrices alone
 * doubles the CPU's error: 5.9e-2 worst rel L2 against 3.4e-2 for the
 * activations alone), so the error bf16 storage alone causes is measured by
 * the CPU backend with cpu_bf16_act=1 on a copy of the fixture whose F32
 * matrices (the rank-2 tensors: fla's conv weights are [C, 1, taps]) are
 * rounded to bf16: it rounds the same weights and activations the GPU does.
 * The CUDA backend must stay within 1.5x that emulation's mean error and 2x
 * its worst (plus 1e-3 / 2e-3 absolute), the contract of
 * check_teacher_forced_toks on random-weight models. A fixture the backend
 * still refuses is reported as refused by name and not counted. */

/* dst = src with every rank-2 F32 tensor rounded to bf16 (same layout) */
static int st_round_matrices(const char *src, const char *dst)
{
    FILE *f = fopen(src, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    int rc = buf && fread(buf, 1, (size_t)n, f) == (size_t)n ? 0 : -1;
    fclose(f);
    uint64_t hl = 0;
    if (!rc) memcpy(&hl, buf, 8); /* little-endian header length */
    cJSON *h = rc ? NULL : cJSON_ParseWithLength((const char *)buf + 8, (size_t)hl);
    if (!h) rc = -1;
    for (cJSON *t = h ? h->child : NULL; t && !rc; t = t->next) {
        const cJSON *dt = cJSON_GetObjectItem(t, "dtype"), *sh = cJSON_GetObjectItem(t, "shape");
        const cJSON *off = cJSON_GetObjectItem(t, "data_offsets");
        if (!cJSON_IsString(dt) || strcmp(dt->valuestring, "F32") || cJSON_GetArraySize(sh) != 2) continue;
        const size_t a = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, b = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        if (8 + hl + b > (size_t)n) rc = -1;
        else kt_bf16_round((float *)(void *)(buf + 8 + hl + a), (b - a) / 4);
    }
    cJSON_Delete(h);
    FILE *o = rc ? NULL : fopen(dst, "wb");
    if (!rc && (!o || fwrite(buf, 1, (size_t)n, o) != (size_t)n)) rc = -1;
    if (o) fclose(o);
    free(buf);
    return rc;
}

/* a copy of fixture folder src at dst with its matrices bf16-rounded */
static int fixture_bf16_copy(const char *src, const char *dst)
{
    if (mkdir(dst, 0755)) return -1;
    DIR *d = opendir(src);
    if (!d) return -1;
    int rc = 0;
    for (struct dirent *e; (e = readdir(d)) && !rc;) {
        if (e->d_name[0] == '.') continue;
        char a[2048], b[2048];
        snprintf(a, sizeof a, "%s/%s", src, e->d_name);
        snprintf(b, sizeof b, "%s/%s", dst, e->d_name);
        if (strstr(e->d_name, ".safetensors")) {
            rc = st_round_matrices(a, b);
        } else {
            FILE *fi = fopen(a, "rb"), *fo = fopen(b, "wb");
            char blk[65536];
            size_t k;
            if (!fi || !fo) rc = -1;
            while (!rc && (k = fread(blk, 1, sizeof blk, fi)) > 0) rc = fwrite(blk, 1, k, fo) == k ? 0 : -1;
            if (fi) fclose(fi);
            if (fo) fclose(fo);
        }
    }
    closedir(d);
    return rc;
}

/* the fixture's scored tokens (expected.json "tokens") */
static int fixture_tokens(const char *dir, int32_t *toks, int max)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/expected.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    static char text[1 << 20];
    const size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    cJSON *j = cJSON_Parse(text);
    const cJSON *t = cJSON_GetObjectItem(j, "tokens");
    int n = 0;
    for (const cJSON *x = t ? t->child : NULL; x && n < max; x = x->next) toks[n++] = (int32_t)x->valuedouble;
    cJSON_Delete(j);
    return n;
}

/* all-position logits of toks fed to one sequence in the steps sizes[] (cycled) */
static void fed_in_steps(kda_engine *e, const int32_t *toks, int n, const int *sizes, int n_sizes, float *logits)
{
    char err[256];
    int s;
    assert_int_equal(kda_seq_new(e, &s, err, sizeof err), 0);
    const int vocab = kda_engine_info(e)->vocab_size;
    for (int p = 0, k = 0; p < n; k++) {
        const int m = sizes[k % n_sizes] < n - p ? sizes[k % n_sizes] : n - p;
        kda_batch_item it = {.seq = s, .tokens = toks + p, .n_tokens = m, .logits = logits + (size_t)p * vocab,
                             .want_all_logits = 1};
        int rc = kda_engine_step(e, &it, 1, err, sizeof err);
        if (rc) fprintf(stderr, "step at %d (+%d): %s\n", p, m, err);
        assert_int_equal(rc, 0);
        p += m;
    }
    kda_seq_free(e, s);
}

static void test_fla_fixtures_match_cpu_one_step_and_stepped(void **st)
{
    (void)st;
    char root[600];
    snprintf(root, sizeof root, "%s/tests/fixtures/fla", getenv("KDA_SRC") ? getenv("KDA_SRC") : ".");
    DIR *d = opendir(root);
    if (!d) fail_msg("no fixtures at %s (run from the repository root or set KDA_SRC)", root);
    char tmp[] = "/tmp/kda_fla_bf16_XXXXXX";
    assert_non_null(mkdtemp(tmp));
    /* one-token steps (decode graphs) between chunks of 5..64 (prompt passes) */
    static const int sizes[] = {1, 5, 1, 1, 40, 1, 1, 1, 64, 1, 17, 1, 64};
    int compared = 0, refused = 0;
    char refused_names[1024] = "";
    struct dirent **names;
    const int nd = scandir(root, &names, NULL, alphasort);
    closedir(d);
    for (int di = 0; di < nd; di++) {
        const char *name = names[di]->d_name;
        char dir[1024], cfg[1200], copy[1024];
        snprintf(dir, sizeof dir, "%s/%s", root, name);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        if (name[0] == '.' || access(cfg, R_OK)) continue;
        int32_t toks[256];
        const int n = fixture_tokens(dir, toks, 256);
        assert_true(n >= 64);
        kda_tuning tn;
        char err[512];
        kda_tuning_defaults(&tn);
        assert_int_equal(kda_tuning_from_env(&tn, err, sizeof err), 0);
        kda_engine_opts o = {.model_dir = dir, .device = "cuda", .max_seqs = 2, .max_seq_len = 512,
                             .gpu_mem_fraction = 0.5, .tuning = &tn};
        kda_engine *gpu = NULL;
        const int rc = kda_engine_open(&gpu, &o, err, sizeof err);
        if (rc == KDA_EUNSUP) {
            printf("fla fixture %-22s REFUSED by name on cuda: %s\n", name, err);
            assert_non_null(strstr(err, "CUDA backend"));
            refused++;
            snprintf(refused_names + strlen(refused_names), sizeof refused_names - strlen(refused_names), " %s", name);
            continue;
        }
        if (rc) fail_msg("%s on cuda: %s", name, err);
        snprintf(copy, sizeof copy, "%s/%s", tmp, name);
        assert_int_equal(fixture_bf16_copy(dir, copy), 0);
        kda_engine *cpu = open_engine(dir, "cpu", 2, 512), *emu = open_engine_t(copy, "cpu", 2, 512, 1);
        const int vocab = kda_engine_info(cpu)->vocab_size;
        float *lc = malloc((size_t)n * vocab * 4), *le = malloc((size_t)n * vocab * 4);
        float *l1 = malloc((size_t)n * vocab * 4), *ls = malloc((size_t)n * vocab * 4);
        float *tc = malloc((size_t)n * 4), *te = malloc((size_t)n * 4), *t1 = malloc((size_t)n * 4);
        float *ts = malloc((size_t)n * 4);
        memset(l1, 0xFF, (size_t)n * vocab * 4), memset(ls, 0xFF, (size_t)n * vocab * 4); /* poison */
        teacher_forced(cpu, toks, n, lc, tc);
        teacher_forced(emu, toks, n, le, te);
        teacher_forced(gpu, toks, n, l1, t1);
        fed_in_steps(gpu, toks, n, sizes, (int)(sizeof sizes / sizeof sizes[0]), ls);
        /* the stepped run's next-token log-probs from its logits */
        for (int t = 0; t < n - 1; t++) ts[t] = ls[(size_t)t * vocab + toks[t + 1]] - logsumexp_f32(ls + (size_t)t * vocab, vocab);
        const cmp_stats e = compare(le, lc, te, tc, n, vocab), g1 = compare(l1, lc, t1, tc, n, vocab);
        const cmp_stats gs = compare(ls, lc, ts, tc, n, vocab), ge = compare(l1, le, t1, te, n, vocab);
        printf("fla fixture %-22s cuda vs cpu fp32: one step worst %.2e mean %.2e top-1 %d/%d |dlogp| %.5f; "
               "stepped worst %.2e mean %.2e top-1 %d/%d; bf16 storage alone worst %.2e mean %.2e top-1 %d/%d "
               "|dlogp| %.5f; cuda vs bf16 emulation worst %.2e\n",
               name, g1.worst, g1.mean, g1.agree, n, g1.dlp, gs.worst, gs.mean, gs.agree, n, e.worst, e.mean, e.agree,
               n, e.dlp, ge.worst);
        const cmp_stats *runs[2] = {&g1, &gs};
        for (int r = 0; r < 2; r++) {
            const cmp_stats *g = runs[r];
            if (!(g->mean <= 1.5 * e.mean + 1e-3 && g->worst <= 2.0 * e.worst + 2e-3 &&
                  g->agree >= e.agree - 0.02 * n - 1 && g->dlp <= 1.5 * e.dlp + 0.01))
                fail_msg("fla fixture %s (%s): cuda beyond the bf16-storage yardstick", name, r ? "stepped" : "one step");
        }
        compared++;
        free(lc), free(le), free(l1), free(ls), free(tc), free(te), free(t1), free(ts);
        kda_engine_close(cpu), kda_engine_close(emu), kda_engine_close(gpu);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", copy);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", copy);
    }
    for (int di = 0; di < nd; di++) free(names[di]);
    free(names);
    rmdir(tmp);
    printf("fla fixtures: %d compared on cuda vs cpu and within the yardstick, %d refused by name%s%s\n", compared,
           refused, refused ? ":" : "", refused_names);
    assert_true(compared > 0);
}


/* kda_engine_step_begin / _end give what kda_engine_step gives, and another
 * engine call between them ends the step first without losing its result.
 * Two sets of B sequences with the same tokens on one engine: set 0 through
 * kda_engine_step, set 1 through begin / end, step for step in the same
 * batch shapes (a prompt step with echo targets and per-position top-n, a
 * mixed step of decoding sequences and prompt chunks, decode steps), the
 * second set's steps interrupted by kda_seq_new / kda_seq_free /
 * kda_engine_usage. Same kernels on the same shapes: the outputs must be
 * identical (sampled ids, their log-probs and top-n, target log-probs,
 * per-position alternatives). */
static void test_step_begin_end_equals_step(void **st)
{
    (void)st;
    enum { B = 8, P = 40, STEPS = 5, NT = 3 };
    kda_engine *gpu = open_engine(demo_dir, "cuda", 2 * B + 1, 256);
    assert_true(kda_engine_info(gpu)->async_step);
    char err[256];
    int32_t prompts[B * P];
    rand_tokens(prompts, B * P, 256);
    int seq[2][B], plen[B];
    for (int i = 0; i < B; i++) plen[i] = 1 + (i * 13) % P;
    kda_sampling samp[B];
    for (int i = 0; i < B; i++)
        samp[i] = (kda_sampling){.temperature = i % 2 ? 0.8f : 0.0f, .top_p = 1.0f, .repetition_penalty = i % 3 ? 1.0f : 1.3f,
                                 .seed = 11u + (unsigned)i, .n_prompt = plen[i]};
    static int32_t tg[2][B][P], ptop[2][B][P * NT], tok[2][B][STEPS + 2], top[2][B][NT];
    static float tlp[2][B][P], ptoplp[2][B][P * NT], toplp[2][B][NT];
    int32_t nx[2][B];
    float nlp[2][B];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < B; i++) assert_int_equal(kda_seq_new(gpu, &seq[k][i], err, sizeof err), 0);
    kda_batch_item it[2][B];
    /* step 0: the even sequences' prompts (echo: targets + alternatives), the odd ones' first half */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < B; i++) {
            const int n = i % 2 ? (plen[i] + 1) / 2 : plen[i];
            for (int j = 0; j < n; j++) tg[k][i][j] = j + 1 < plen[i] ? prompts[i * P + j + 1] : -1;
            it[k][i] = (kda_batch_item){.seq = seq[k][i], .tokens = prompts + i * P, .n_tokens = n,
                                        .targets = tg[k][i], .target_logprobs = tlp[k][i], .n_top = NT,
                                        .pos_top_ids = ptop[k][i], .pos_top_logprobs = ptoplp[k][i]};
            if (n == plen[i]) {
                it[k][i].sampling = &samp[i];
                it[k][i].sampled = &nx[k][i];
                it[k][i].sampled_logprob = &nlp[k][i];
                it[k][i].top_ids = top[k][i];
                it[k][i].top_logprobs = toplp[k][i];
            }
        }
    assert_int_equal(kda_engine_step(gpu, it[0], B, err, sizeof err), 0);
    assert_int_equal(kda_engine_step_begin(gpu, it[1], B, err, sizeof err), 0);
    int extra;
    assert_int_equal(kda_seq_new(gpu, &extra, err, sizeof err), 0); /* ends the step in flight */
    assert_int_equal(kda_engine_step_end(gpu, err, sizeof err), 0);
    for (int i = 0; i < B; i++) {
        const int n = i % 2 ? (plen[i] + 1) / 2 : plen[i];
        assert_int_equal(kda_seq_len(gpu, seq[1][i]), n);
        assert_memory_equal(tlp[0][i], tlp[1][i], (size_t)n * 4);
        assert_memory_equal(ptop[0][i], ptop[1][i], (size_t)n * NT * 4);
        assert_memory_equal(ptoplp[0][i], ptoplp[1][i], (size_t)n * NT * 4);
        if (n == plen[i]) {
            assert_int_equal(nx[0][i], nx[1][i]);
            assert_memory_equal(&nlp[0][i], &nlp[1][i], 4);
            assert_memory_equal(top[0][i], top[1][i], NT * 4);
            assert_memory_equal(toplp[0][i], toplp[1][i], NT * 4);
            tok[0][i][0] = nx[0][i];
            tok[1][i][0] = nx[1][i];
        }
    }
    /* then mixed steps (decoding even sequences, the odd ones' second half), then decode steps */
    int have[B];
    for (int i = 0; i < B; i++) have[i] = i % 2 ? 0 : 1;
    for (int s = 0; s < STEPS; s++) {
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < B; i++) {
                if (i % 2 && s == 0) {
                    const int h = (plen[i] + 1) / 2;
                    it[k][i] = (kda_batch_item){.seq = seq[k][i], .tokens = prompts + i * P + h,
                                                .n_tokens = plen[i] - h};
                    if (plen[i] - h == 0) it[k][i].tokens = &tok[k][i][0], it[k][i].n_tokens = 0;
                } else {
                    it[k][i] = (kda_batch_item){.seq = seq[k][i], .tokens = &tok[k][i][have[i] - 1], .n_tokens = 1};
                }
                it[k][i].sampling = &samp[i];
                it[k][i].sampled = &nx[k][i];
                it[k][i].sampled_logprob = &nlp[k][i];
                it[k][i].n_top = NT;
                it[k][i].top_ids = top[k][i];
                it[k][i].top_logprobs = toplp[k][i];
            }
        int n = 0; /* items with tokens (a 1-token prompt has no second half) */
        kda_batch_item use[2][B];
        int who[B];
        for (int i = 0; i < B; i++)
            if (it[0][i].n_tokens > 0) {
                use[0][n] = it[0][i], use[1][n] = it[1][i];
                who[n++] = i;
            }
        assert_int_equal(kda_engine_step(gpu, use[0], n, err, sizeof err), 0);
        assert_int_equal(kda_engine_step_begin(gpu, use[1], n, err, sizeof err), 0);
        if (s == 1) kda_seq_free(gpu, extra); /* ends it too */
        kda_usage u;
        kda_engine_usage(gpu, &u); /* a read: leaves it in flight */
        assert_int_equal(kda_engine_step_end(gpu, err, sizeof err), 0);
        for (int j = 0; j < n; j++) {
            const int i = who[j];
            assert_int_equal(nx[0][i], nx[1][i]);
            assert_memory_equal(&nlp[0][i], &nlp[1][i], 4);
            assert_memory_equal(top[0][i], top[1][i], NT * 4);
            assert_memory_equal(toplp[0][i], toplp[1][i], NT * 4);
            tok[0][i][have[i]] = nx[0][i];
            tok[1][i][have[i]] = nx[1][i];
            have[i]++;
        }
        for (int i = 0; i < B; i++) assert_int_equal(kda_seq_len(gpu, seq[0][i]), kda_seq_len(gpu, seq[1][i]));
    }
    /* a refused begin leaves nothing in flight: end returns at once */
    kda_batch_item bad = {.seq = seq[1][0], .tokens = prompts, .n_tokens = 1 << 20};
    assert_int_not_equal(kda_engine_step_begin(gpu, &bad, 1, err, sizeof err), 0);
    assert_int_equal(kda_engine_step_end(gpu, err, sizeof err), 0);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < B; i++) kda_seq_free(gpu, seq[k][i]);
    kda_engine_close(gpu);
}


/* Mixed steps with the decode rows' KDA step and attention on a second
 * stream beside the prompt items (tuning mixed_reserve, the state kernel on
 * all SMs but that many) against the same steps on one stream. The same
 * kernels compute the same values whatever the stream or the state kernel's
 * grid (each (item, head) pair is one block's, in any order), so every logit
 * must be identical; a race between the streams over a scratch buffer, a
 * missing wait, or a state read before its write would show. A K = V = 128
 * checkpoint, so the decode rows take the streamed state kernel (>= 16
 * items); prompt items of 1..200 tokens, one continued from its state every
 * step. */
static void mixed_run(int reserve, float *out, int n_out)
{
    enum { ND = 32, NP = 3, STEPS = 6, VOC = 256, CONT = 50 };
    kda_tuning tn;
    char err[512];
    kda_tuning_defaults(&tn);
    assert_int_equal(kda_tuning_from_env(&tn, err, sizeof err), 0);
    tn.mixed_reserve = reserve;
    kda_engine_opts o = {.model_dir = k128_dir, .device = "cuda", .max_seqs = ND + NP + 1, .max_seq_len = 1024,
                         .gpu_mem_fraction = 0.5, .tuning = &tn};
    kda_engine *e = NULL;
    assert_int_equal(kda_engine_open(&e, &o, err, sizeof err), 0);
    kt_rng = 99; /* the same tokens every run */
    static int32_t prompts[ND][160], fresh[NP][200], cont[CONT * STEPS], tok[ND];
    rand_tokens(&prompts[0][0], ND * 160, VOC);
    rand_tokens(&fresh[0][0], NP * 200, VOC);
    rand_tokens(cont, CONT * STEPS, VOC);
    int seq[ND], fs[NP], cs, k = 0;
    kda_sampling g = {.temperature = 0};
    kda_batch_item it[ND + NP + 1];
    for (int i = 0; i < ND; i++) {
        assert_int_equal(kda_seq_new(e, &seq[i], err, sizeof err), 0);
        it[i] = (kda_batch_item){.seq = seq[i], .tokens = prompts[i], .n_tokens = 1 + (i * 29) % 150, .sampling = &g,
                                 .sampled = &tok[i]};
    }
    assert_int_equal(kda_seq_new(e, &cs, err, sizeof err), 0);
    assert_int_equal(kda_engine_step(e, it, ND, err, sizeof err), 0);
    int32_t ftok[NP];
    for (int s = 0; s < STEPS; s++) {
        int n = 0;
        for (int i = 0; i < ND; i++, n++) {
            assert_true(k + VOC <= n_out);
            it[n] = (kda_batch_item){.seq = seq[i], .tokens = &tok[i], .n_tokens = 1, .sampling = &g,
                                     .sampled = &tok[i], .logits = out + k};
            k += VOC;
        }
        for (int j = 0; j < NP; j++, n++) {
            assert_int_equal(kda_seq_new(e, &fs[j], err, sizeof err), 0);
            const int len = j == 0 ? 2 + s : j == 1 ? 17 + 11 * s : 64 + 27 * s; /* 2..7, 17..72, 64..199 */
            assert_true(k + VOC <= n_out);
            it[n] = (kda_batch_item){.seq = fs[j], .tokens = fresh[j], .n_tokens = len, .sampling = &g,
                                     .sampled = &ftok[j], .logits = out + k};
            k += VOC;
        }
        assert_true(k + VOC <= n_out);
        it[n++] = (kda_batch_item){.seq = cs, .tokens = cont + CONT * s, .n_tokens = CONT, .sampling = &g,
                                   .sampled = &ftok[0], .logits = out + k}; /* continues from the last step's state */
        k += VOC;
        int rc = kda_engine_step(e, it, n, err, sizeof err);
        if (rc) fprintf(stderr, "mixed step: %s\n", err);
        assert_int_equal(rc, 0);
        for (int j = 0; j < NP; j++) kda_seq_free(e, fs[j]);
    }
    assert_int_equal(k, n_out);
    for (int i = 0; i < ND; i++) kda_seq_free(e, seq[i]);
    kda_seq_free(e, cs);
    kda_engine_close(e);
}

static void test_mixed_steps_on_two_streams_equal_one(void **st)
{
    (void)st;
    enum { N_OUT = 6 * (32 + 3 + 1) * 256 };
    float *one = malloc(N_OUT * 4), *two = malloc(N_OUT * 4);
    mixed_run(0, one, N_OUT);
    const int reserves[] = {16, 64, 1000}; /* 1000: the state kernel on one block */
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < N_OUT; i++) two[i] = NAN;
        mixed_run(reserves[r], two, N_OUT);
        int diff = 0;
        for (int i = 0; i < N_OUT; i++) diff += memcmp(&one[i], &two[i], 4) != 0;
        printf("mixed_reserve=%d: %d of %d logits differ from one stream\n", reserves[r], diff, N_OUT);
        assert_int_equal(diff, 0);
    }
    free(one), free(two);
}

/* Short prompts alone (tuning short_prompt, default 16) take the per-token
 * kernels instead of the chunked ones: the same function, so the logits of
 * the prompt's last row and of three decode steps after it (fixed tokens:
 * with sampled ones a greedy flip between near-equal logits of this random
 * model changes the input, which measured 1.02 on the rows after it) must
 * agree with the chunked path (short_prompt=0) within the MODEL_SPEC 7
 * budget, rel L2 <= 5e-2 per row (measured 1.4-2.1e-2: the two paths round
 * differently, tf32 chunk products against per-token fp32 state steps; a
 * wrong state or a lost token is O(1)), for 1..4 items of 2..16 tokens; a
 * 17-token item keeps the chunked path under both settings and must match
 * bit for bit. */
static void short_run(int sp, float *out, int n_out)
{
    enum { VOC = 256, DEC = 3 };
    static const int lens[4][4] = {{2}, {5}, {16}, {16, 9, 3, 16}};
    kda_tuning tn;
    char err[512];
    kda_tuning_defaults(&tn);
    assert_int_equal(kda_tuning_from_env(&tn, err, sizeof err), 0);
    tn.short_prompt = sp;
    kda_engine_opts o = {.model_dir = k128_dir, .device = "cuda", .max_seqs = 8, .max_seq_len = 512,
                         .gpu_mem_fraction = 0.5, .tuning = &tn};
    kda_engine *e = NULL;
    assert_int_equal(kda_engine_open(&e, &o, err, sizeof err), 0);
    kt_rng = 0x5107;
    static int32_t toks[4][32];
    rand_tokens(&toks[0][0], 4 * 32, VOC);
    kda_sampling g = {.temperature = 0};
    int k = 0;
    for (int c = 0; c < 5; c++) {
        int n = 0, seq[4];
        int32_t next[4];
        kda_batch_item it[4];
        for (int i = 0; i < 4; i++) {
            const int len = c == 4 ? (i == 0 ? 17 : 0) : lens[c][i];
            if (!len) continue;
            assert_int_equal(kda_seq_new(e, &seq[n], err, sizeof err), 0);
            assert_true(k + VOC <= n_out);
            it[n] = (kda_batch_item){.seq = seq[n], .tokens = toks[i], .n_tokens = len, .sampling = &g,
                                     .sampled = &next[n], .logits = out + k};
            k += VOC, n++;
        }
        assert_int_equal(kda_engine_step(e, it, n, err, sizeof err), 0);
        for (int s = 0; s < DEC; s++) {
            for (int i = 0; i < n; i++) {
                assert_true(k + VOC <= n_out);
                it[i] = (kda_batch_item){.seq = seq[i], .tokens = &toks[3 - i][20 + s], .n_tokens = 1,
                                         .logits = out + k};
                k += VOC;
            }
            assert_int_equal(kda_engine_step(e, it, n, err, sizeof err), 0);
        }
        for (int i = 0; i < n; i++) kda_seq_free(e, seq[i]);
    }
    assert_int_equal(k, n_out);
    kda_engine_close(e);
}

static void test_short_prompts_per_token_match_chunked(void **st)
{
    (void)st;
    enum { VOC = 256, ROWS = (1 + 1 + 1 + 4 + 1) * 4 }; /* items x (prompt + 3 decode steps) */
    float *a = malloc(ROWS * VOC * 4), *b = malloc(ROWS * VOC * 4);
    short_run(16, a, ROWS * VOC);
    short_run(0, b, ROWS * VOC);
    double worst = 0;
    const int chunked0 = (1 + 1 + 1 + 4) * 4; /* the rows of the 17-token case */
    for (int r = 0; r < ROWS; r++) {
        double d2 = 0, n2 = 0;
        for (int v = 0; v < VOC; v++) {
            const double x = a[r * VOC + v], y = b[r * VOC + v];
            assert_true(isfinite(x) && isfinite(y));
            d2 += (x - y) * (x - y), n2 += y * y;
        }
        const double rel = sqrt(d2 / (n2 > 0 ? n2 : 1));
        if (getenv("KDA_TEST_DIAG")) printf("row %d rel %.3e\n", r, rel);
        if (r < chunked0 && rel > worst) worst = rel;
        if (r >= chunked0) assert_memory_equal(a + r * VOC, b + r * VOC, VOC * 4);
    }
    printf("short prompts, per-token vs chunked: worst rel L2 %.2e over %d rows\n", worst, chunked0);
    assert_true(worst <= 5e-2);
    free(a), free(b);
}

int main(void)
{
    kt_skip_without_gpu();
    snprintf(demo_dir, sizeof demo_dir, "%s/models/demo", getenv("KDA_SRC") ? getenv("KDA_SRC") : ".");
    if (gen(tiny_dir, sizeof tiny_dir, "--preset tiny --seed 3") ||
        gen(llama_dir, sizeof llama_dir, "--preset llama-tiny --seed 4") ||
        gen(k128_dir, sizeof k128_dir, "--preset small --head-dim 128 --seed 5")) {
        fprintf(stderr, "checkpoint generation failed\n");
        return 1;
    }
    static const char text[] =
        "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
        "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
        "Sometime too hot the eye of heaven shines,\nAnd often is his gold complexion dimm'd;\n"
        "And every fair from fair sometime declines,\nBy chance or nature's changing course untrimm'd;\n"
        "But thy eternal summer shall not fade,\nNor lose possession of that fair thou ow'st;\n";
    px_n = (int)strlen(text);
    for (int i = 0; i < px_n; i++) px_toks[i] = (unsigned char)text[i];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_teacher_forced_logits_match_cpu_demo_contract),
        cmocka_unit_test(test_teacher_forced_logits_match_cpu_tiny),
        cmocka_unit_test(test_teacher_forced_logits_match_cpu_llama_family),
        cmocka_unit_test(test_greedy_continuation_identical_to_cpu),
        cmocka_unit_test(test_batch_of_64_equals_each_sequence_alone),
        cmocka_unit_test(test_freed_slot_reused_starts_clean),
        cmocka_unit_test(test_context_overflow_refused_without_corrupting_others),
        cmocka_unit_test(test_score_is_the_same_alone_batched_and_split),
        cmocka_unit_test(test_prefill_then_decode_matches_cpu),
        cmocka_unit_test(test_teacher_forced_logits_match_cpu_17b),
        cmocka_unit_test(test_prefix_restore_matches_uncached_and_cpu),
        cmocka_unit_test(test_prefix_snapshot_blocks_are_shared_and_given_back),
        cmocka_unit_test(test_fla_fixtures_match_cpu_one_step_and_stepped),
        cmocka_unit_test(test_step_begin_end_equals_step),
        cmocka_unit_test(test_mixed_steps_on_two_streams_equal_one),
        cmocka_unit_test(test_short_prompts_per_token_match_chunked),
    };
    /* KDA_TEST_ONLY=SUBSTRING runs only the tests whose name contains it */
    const char *only = getenv("KDA_TEST_ONLY");
    if (only && *only) {
        struct CMUnitTest sel[sizeof tests / sizeof tests[0]];
        size_t n = 0;
        for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
            if (strstr(tests[i].name, only)) sel[n++] = tests[i];
        return _cmocka_run_group_tests("selected", sel, n, NULL, NULL);
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * cli_bench.c - `kda-cli bench MODEL_DIR`: decode-step latency of the engine
 * at given (context, batch) pairs, plus (CUDA builds) each fused kernel's
 * bandwidth against a device-to-device copy measured in the same run. Writes
 * one JSON object (--json FILE) that scripts/bench_merge.py combines with the
 * PyTorch baseline of the same invocation (scripts/bench-gpu.sh).
 *
 * Decode: the contexts are filled by one prefill step (--fill prefill, the
 * default) or one token per step for all sequences (--fill decode), then
 * `steps` greedy decode steps are timed on the wall clock, sampled tokens fed
 * back, one host sync per step included.
 * Prefill (--prefill B:T,...): B new sequences of T random tokens in one
 * engine step, the first token sampled (time to first token of B prompts).
 * Score (--score B:T,...): the same with the log-prob of every next token
 * (what /score computes). B:T+C (either kind): the B sequences first take a
 * C-token context in an untimed step, then the T tokens are timed: a prompt
 * continued from a state, as one restored from the prefix cache (lm-eval's
 * continuations of a shared context). Each is the median of --reps timed steps after one
 * untimed. With --tuning prof=1 the device time is also split by kind of work
 * (GEMM, KDA, attention, lm-head + log-softmax, other).
 * Mixed (--mixed B:P:T,...): B sequences decoding (contexts of 128) and P new
 * prompts of T tokens in one step, what a serving step carries; each timed
 * mixed step is followed by a timed decode step of the same B alone, and the
 * medians of both are reported (the prompt rows' cost inside a decode step).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "engine.h"
#include "kc_bench.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The CPU's memory ceilings, measured in the same run as the decode figures:
 * a read of 1 GiB by every thread (what batch-1 decode needs: weights are only
 * read) and one memcpy (bytes read + written). Best of 3. */
static void cpu_ceilings(double *read_gbs, double *copy_gbs)
{
    const size_t n = (size_t)1 << 30;
    uint64_t *a = malloc(n), *b = malloc(n);
    *read_gbs = *copy_gbs = 0;
    if (!a || !b) goto out;
    memset(a, 1, n), memset(b, 2, n);
    uint64_t sum = 0;
    for (int r = 0; r < 3; r++) {
        double t = now_s();
#pragma omp parallel for simd reduction(+ : sum) schedule(static)
        for (size_t i = 0; i < n / 8; i++) sum += a[i];
        t = now_s() - t;
        if (n / t / 1e9 > *read_gbs) *read_gbs = n / t / 1e9;
        t = now_s();
        memcpy(b, a, n);
        t = now_s() - t;
        if (2.0 * n / t / 1e9 > *copy_gbs) *copy_gbs = 2.0 * n / t / 1e9;
    }
    if (sum == 42) fprintf(stderr, " "); /* keep the read */
out:
    free(a), free(b);
}

void cli_bench_usage(FILE *f)
{
    fprintf(f,
            "usage: kda-cli bench MODEL_DIR [--device cuda|cpu] [--pairs CTX:B,...] [--steps N]\n"
            "                     [--fill prefill|decode] [--prefill B:T,...] [--score B:T,...] [--reps N]\n"
            "                     [--json FILE] [--no-kernels] [--mem-fraction F] [--tuning k=v,...]\n"
            "                     [--kda-state-dtype fp32|bf16] [--mixed B:P:T,...]\n"
            "                     [--threads N]\n"
            "  default pairs 128:1,128:16,128:64,128:256,4096:1,4096:16,4096:64,4096:256 (\"\" = none);\n"
            "  steps 32; no prefill or score points; reps 5\n"
            "  --prefill / --score B:T+C: T tokens timed after a C-token context (an untimed step)\n"
            "  --mixed B:P:T: B sequences decoding at context 128 and P new prompts of T tokens in one\n"
            "  step, against a decode step of the same B alone (median of reps each, interleaved)\n");
}

static int usage(void)
{
    cli_bench_usage(stderr);
    return 2;
}

/* "a:b,a:b" with `arity` positive integers per item ("B:T", "CTX:B", "B:P:T"),
 * into out[item * arity + j]; returns the count or -1 */
static int parse_tuples(const char *s, int *out, int arity, int max)
{
    int n = 0;
    for (const char *p = s; *p; n++) {
        if (n == max) return -1;
        for (int j = 0; j < arity; j++) {
            int v, k = 0;
            if (sscanf(p, j ? ":%d%n" : "%d%n", &v, &k) != 1 || v < 1) return -1;
            out[n * arity + j] = v, p += k;
        }
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}
static int parse_pairs(const char *s, int (*out)[2], int max)
{
    return parse_tuples(s, &out[0][0], 2, max);
}

/* n random ids below vocab from the generator state *r */
static void rand_tokens(int32_t *t, size_t n, int vocab, unsigned *r)
{
    for (size_t i = 0; i < n; i++) {
        *r = *r * 1103515245u + 12345u;
        t[i] = (int32_t)((*r >> 8) % (unsigned)vocab);
    }
}

/* B decoding sequences' one-token items, sampled with g into next */
static void decode_items(kda_batch_item *it, const int *seq, int32_t *tok, int32_t *next, int B, const kda_sampling *g)
{
    for (int i = 0; i < B; i++)
        it[i] = (kda_batch_item){.seq = seq[i], .tokens = &tok[i], .n_tokens = 1, .sampling = g, .sampled = &next[i]};
}

typedef struct {
    int B, T, score, ctx; /* ctx: tokens each sequence holds before the timed step */
    double ms;
    kda_prof prof;
} bench_pt;

/* "B:T" or "B:T+C", comma-separated, into pts[n..]; returns the new count or -1 */
static int parse_points(const char *s, bench_pt *pts, int n, int max, int score)
{
    for (const char *p = s; *p;) {
        int b, t, c = 0, k = 0, k2 = 0;
        if (n == max || sscanf(p, "%d:%d%n", &b, &t, &k) != 2 || b < 1 || t < 1) return -1;
        p += k;
        if (*p == '+') {
            if (sscanf(p, "+%d%n", &c, &k2) != 1 || c < 1) return -1;
            p += k2;
        }
        pts[n++] = (bench_pt){.B = b, .T = t, .score = score, .ctx = c};
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the device time since the last take, added to *sum when count */
static void prof_add(kda_engine *e, kda_prof *sum, int count)
{
    kda_prof p;
    kda_engine_prof_take(e, &p);
    if (!count) return;
    for (int k = 0; k < KDA_PROF_N; k++) sum->ms[k] += p.ms[k];
    sum->steps += p.steps;
}

/* B fresh sequences of T random tokens in one step (after a C-token context
 * step, untimed, when ctx); median of reps. */
static int run_prefill(kda_engine *e, bench_pt *bp, int reps, char *err, size_t errlen)
{
    const int B = bp->B, T = bp->T, vocab = kda_engine_info(e)->vocab_size;
    const int C = bp->ctx;
    int32_t *tok = malloc((size_t)B * T * sizeof *tok), *tg = malloc((size_t)B * T * sizeof *tg);
    int32_t *ctok = C ? malloc((size_t)B * C * sizeof *ctok) : NULL;
    int32_t *next = malloc((size_t)B * sizeof *next);
    float *lp = malloc((size_t)B * T * sizeof *lp);
    int *seq = calloc((size_t)B, sizeof *seq);
    kda_batch_item *it = calloc((size_t)B, sizeof *it);
    double *ts = calloc((size_t)reps + 1, sizeof *ts);
    kda_sampling greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1, .n_prompt = T};
    int rc = 0;
    if (!tok || !tg || !next || !lp || !seq || !it || !ts || (C && !ctok)) {
        snprintf(err, errlen, "out of memory");
        rc = KDA_ENOMEM;
        goto done;
    }
    unsigned r = 777;
    rand_tokens(tok, (size_t)B * T, vocab, &r);
    if (C) rand_tokens(ctok, (size_t)B * C, vocab, &r);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) tg[(size_t)b * T + t] = t + 1 < T ? tok[(size_t)b * T + t + 1] : -1;
    kda_prof scratch, sum = {0};
    for (int rep = -1; rep < reps && !rc; rep++) {
        int made = 0;
        for (; made < B && !rc; made++) rc = kda_seq_new(e, &seq[made], err, errlen);
        if (rc) made--;
        for (int b = 0; b < B && !rc && C; b++) /* the context, untimed */
            it[b] = (kda_batch_item){.seq = seq[b], .tokens = ctok + (size_t)b * C, .n_tokens = C};
        if (!rc && C) rc = kda_engine_step(e, it, B, err, errlen);
        if (!rc && C) prof_add(e, &sum, 0);
        for (int b = 0; b < B && !rc; b++) {
            it[b] = (kda_batch_item){.seq = seq[b], .tokens = tok + (size_t)b * T, .n_tokens = T};
            if (bp->score) it[b].targets = tg + (size_t)b * T, it[b].target_logprobs = lp + (size_t)b * T;
            else it[b].sampling = &greedy, it[b].sampled = &next[b];
        }
        if (rep == 0 && !C) kda_engine_prof_take(e, &scratch); /* the warm-up's share is not counted */
        const double t0 = now_s();
        if (!rc) rc = kda_engine_step(e, it, B, err, errlen);
        if (rep >= 0) ts[rep] = (now_s() - t0) * 1e3;
        if (C) prof_add(e, &sum, rep >= 0); /* the timed steps' share alone */
        for (int b = 0; b < made; b++) kda_seq_free(e, seq[b]);
    }
    if (!rc) {
        if (C) bp->prof = sum;
        else kda_engine_prof_take(e, &bp->prof);
        qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
        bp->ms = ts[reps / 2];
    }
done:
    free(tok), free(tg), free(ctok), free(next), free(lp), free(seq), free(it), free(ts);
    return rc;
}

/* Matrix FLOPs of a prefill / score point: every row through the layers'
 * GEMMs, the lm-head for every row (score) or the last (prefill), and causal
 * attention (QK^T and PV) in the GQA layers. */
static double point_flops(const kda_model_info *mi, const bench_pt *p)
{
    const double lm = 2.0 * mi->vocab_size * mi->d_model, body = 2.0 * (double)mi->n_params - lm;
    int n_gqa = 0;
    for (int l = 0; l < mi->n_layers; l++) n_gqa += mi->layer_kind[l] == KDA_LAYER_GQA;
    const double attn = 4.0 * mi->gqa_heads * mi->gqa_head_dim * ((double)p->T * (p->T + 1) / 2) * n_gqa;
    return p->B * (p->T * body + (p->score ? p->T : 1) * lm + attn);
}

typedef struct {
    int ctx, B;
    double ms;
} bench_pair;

static int run_pair(kda_engine *e, bench_pair *bp, int steps, int fill_prefill, char *err, size_t errlen)
{
    const int B = bp->B, vocab = kda_engine_info(e)->vocab_size;
    int *seq = calloc((size_t)B, sizeof(int));
    int32_t *tok = calloc((size_t)B, sizeof(int32_t)), *next = calloc((size_t)B, sizeof(int32_t));
    kda_batch_item *it = calloc((size_t)B, sizeof *it);
    kda_sampling greedy = {.temperature = 0};
    int rc = 0, made = 0;
    if (!seq || !tok || !next || !it) {
        rc = KDA_ENOMEM;
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    for (; made < B; made++)
        if ((rc = kda_seq_new(e, &seq[made], err, errlen))) goto done;
    unsigned r = 12345;
    if (fill_prefill) { /* fill the contexts: one prefill step */
        int32_t *ctx = malloc((size_t)B * bp->ctx * sizeof *ctx);
        if (!ctx) {
            rc = KDA_ENOMEM;
            snprintf(err, errlen, "out of memory");
            goto done;
        }
        rand_tokens(ctx, (size_t)B * bp->ctx, vocab, &r);
        for (int i = 0; i < B; i++) it[i] = (kda_batch_item){.seq = seq[i], .tokens = ctx + (size_t)i * bp->ctx,
                                                             .n_tokens = bp->ctx};
        rc = kda_engine_step(e, it, B, err, errlen);
        for (int i = 0; i < B; i++) tok[i] = ctx[(size_t)i * bp->ctx + bp->ctx - 1];
        free(ctx);
        if (rc) goto done;
    }
    for (int p = 0; p < bp->ctx && !fill_prefill; p++) { /* fill the context, a token per step */
        rand_tokens(tok, (size_t)B, vocab, &r);
        for (int i = 0; i < B; i++) it[i] = (kda_batch_item){.seq = seq[i], .tokens = &tok[i], .n_tokens = 1};
        if ((rc = kda_engine_step(e, it, B, err, errlen))) goto done;
    }
    double t0 = 0;
    for (int s = -4; s < steps; s++) { /* 4 warm-up steps */
        if (s == 0) t0 = now_s();
        decode_items(it, seq, tok, next, B, &greedy);
        if ((rc = kda_engine_step(e, it, B, err, errlen))) goto done;
        memcpy(tok, next, (size_t)B * sizeof *tok);
    }
    bp->ms = (now_s() - t0) * 1e3 / steps;
done:
    for (int i = 0; i < made; i++) kda_seq_free(e, seq[i]);
    free(seq), free(tok), free(next), free(it);
    return rc;
}

typedef struct {
    int B, P, T;
    double ms, dec_ms, launch_ms; /* launch_ms: kda_engine_step_begin's own time (the host's launches) */
    kda_prof pm, pd; /* tuning prof=1: device time of the timed mixed / decode steps */
} bench_mixed;


/* "B:P:T,..."; returns the count or -1 */
static int parse_mixed(const char *s, bench_mixed *out, int max)
{
    int v[32 * 3];
    const int n = parse_tuples(s, v, 3, max < 32 ? max : 32);
    for (int i = 0; i < n; i++) out[i] = (bench_mixed){.B = v[3 * i], .P = v[3 * i + 1], .T = v[3 * i + 2]};
    return n;
}

static int run_mixed(kda_engine *e, bench_mixed *bm, int reps, char *err, size_t errlen)
{
    enum { CTX = 128 };
    const int B = bm->B, P = bm->P, T = bm->T, vocab = kda_engine_info(e)->vocab_size;
    const int n = B + P;
    int *seq = calloc((size_t)n, sizeof *seq), made = 0, rc = 0;
    int32_t *ctx = malloc((size_t)B * CTX * sizeof *ctx), *prm = malloc((size_t)P * T * sizeof *prm);
    int32_t *tok = calloc((size_t)n, sizeof *tok), *next = calloc((size_t)n, sizeof *next);
    kda_batch_item *it = calloc((size_t)n, sizeof *it);
    double *tm = calloc((size_t)reps, sizeof *tm), *td = calloc((size_t)reps, sizeof *td);
    double *tl = calloc((size_t)reps, sizeof *tl);
    kda_sampling greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    if (!seq || !ctx || !prm || !tok || !next || !it || !tm || !td || !tl) {
        snprintf(err, errlen, "out of memory");
        rc = KDA_ENOMEM;
        goto done;
    }
    unsigned r = 4242;
    rand_tokens(ctx, (size_t)B * CTX, vocab, &r);
    rand_tokens(prm, (size_t)P * T, vocab, &r);
    for (; made < B; made++)
        if ((rc = kda_seq_new(e, &seq[made], err, errlen))) goto done;
    for (int i = 0; i < B; i++) it[i] = (kda_batch_item){.seq = seq[i], .tokens = ctx + (size_t)i * CTX, .n_tokens = CTX};
    if ((rc = kda_engine_step(e, it, B, err, errlen))) goto done;
    for (int i = 0; i < B; i++) tok[i] = ctx[(size_t)i * CTX + CTX - 1];
    for (int rep = -2; rep < reps; rep++) { /* two untimed */
        for (int j = 0; j < P; j++, made++)
            if ((rc = kda_seq_new(e, &seq[B + j], err, errlen))) goto done;
        decode_items(it, seq, tok, next, B, &greedy);
        for (int j = 0; j < P; j++)
            it[B + j] = (kda_batch_item){.seq = seq[B + j], .tokens = prm + (size_t)j * T, .n_tokens = T,
                                         .sampling = &greedy, .sampled = &next[B + j]};
        prof_add(e, &bm->pd, 0);
        double t0 = now_s();
        if ((rc = kda_engine_step_begin(e, it, n, err, errlen))) goto done;
        const double t1 = now_s();
        if ((rc = kda_engine_step_end(e, err, errlen))) goto done;
        if (rep >= 0) tm[rep] = (now_s() - t0) * 1e3, tl[rep] = (t1 - t0) * 1e3;
        prof_add(e, &bm->pm, rep >= 0);
        memcpy(tok, next, (size_t)B * sizeof *tok);
        for (int j = 0; j < P; j++, made--) kda_seq_free(e, seq[B + j]);
        decode_items(it, seq, tok, next, B, &greedy);
        t0 = now_s();
        if ((rc = kda_engine_step(e, it, B, err, errlen))) goto done;
        if (rep >= 0) td[rep] = (now_s() - t0) * 1e3;
        prof_add(e, &bm->pd, rep >= 0);
        memcpy(tok, next, (size_t)B * sizeof *tok);
    }
    qsort(tm, (size_t)reps, sizeof *tm, cmp_double);
    qsort(td, (size_t)reps, sizeof *td, cmp_double);
    qsort(tl, (size_t)reps, sizeof *tl, cmp_double);
    bm->ms = tm[reps / 2], bm->dec_ms = td[reps / 2], bm->launch_ms = tl[reps / 2];
done:
    for (int i = 0; i < made; i++) kda_seq_free(e, seq[i]);
    free(seq), free(ctx), free(prm), free(tok), free(next), free(it), free(tm), free(td), free(tl);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    if (argc < 1 || argv[0][0] == '-') return usage();
    const char *dir = argv[0], *device = "cuda", *json_path = NULL, *tuning = NULL, *fill = "prefill";
    const char *state_dtype = NULL;
    const char *pairs_s = "128:1,128:16,128:64,128:256,4096:1,4096:16,4096:64,4096:256";
    const char *prefill_s = "", *score_s = "", *mixed_s = "";
    int steps = 32, kernels = 1, reps = 5, threads = 0;
    double frac = 0.9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs_s = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--mem-fraction") && i + 1 < argc) frac = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-kernels")) kernels = 0;
        else if (!strcmp(argv[i], "--tuning") && i + 1 < argc) tuning = argv[++i];
        else if (!strcmp(argv[i], "--kda-state-dtype") && i + 1 < argc) state_dtype = argv[++i];
        else if (!strcmp(argv[i], "--fill") && i + 1 < argc) fill = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) prefill_s = argv[++i];
        else if (!strcmp(argv[i], "--score") && i + 1 < argc) score_s = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mixed") && i + 1 < argc) mixed_s = argv[++i];
        else return usage();
    }
    bench_pair pairs[64];
    bench_pt pts[64];
    int pp[64][2], np = 0, npt = 0, max_b = 1, max_ctx = 1;
    const int n_dec = parse_pairs(pairs_s, pp, 64);
    if (n_dec < 0) return usage();
    for (int i = 0; i < n_dec; i++) {
        pairs[np++] = (bench_pair){.ctx = pp[i][0], .B = pp[i][1]};
        max_b = pp[i][1] > max_b ? pp[i][1] : max_b;
        max_ctx = pp[i][0] > max_ctx ? pp[i][0] : max_ctx;
    }
    for (int sc = 0; sc < 2; sc++) {
        const int n0 = npt;
        if ((npt = parse_points(sc ? score_s : prefill_s, pts, npt, 64, sc)) < 0) return usage();
        for (int i = n0; i < npt; i++) {
            max_b = pts[i].B > max_b ? pts[i].B : max_b;
            max_ctx = pts[i].T + pts[i].ctx > max_ctx ? pts[i].T + pts[i].ctx : max_ctx;
        }
    }
    bench_mixed mx[32];
    const int nmx = parse_mixed(mixed_s, mx, 32);
    if (nmx < 0) return usage();
    for (int i = 0; i < nmx; i++) {
        max_b = mx[i].B + mx[i].P > max_b ? mx[i].B + mx[i].P : max_b;
        max_ctx = mx[i].T > max_ctx ? mx[i].T : max_ctx;
        max_ctx = 128 + 2 * (reps + 2) + 8 > max_ctx ? 128 + 2 * (reps + 2) + 8 : max_ctx;
    }
    if (steps < 1 || reps < 1 || (strcmp(fill, "prefill") && strcmp(fill, "decode"))) return usage();
    kc_bench_row krows[64];
    int nk = 0;
    if (kernels && !strcmp(device, "cuda")) {
        printf("per-kernel bandwidth (1.7B shapes):\n");
        nk = kc_bench_kernels(krows, 64);
        if (nk < 0) {
            fprintf(stderr, "kernel benchmark unavailable or failed\n");
            nk = 0;
        }
        for (int i = 0; i < nk; i++)
            printf("  %-44s %8.4f ms %9.1f MB %6.3f TB/s %5.1f%% of copy\n", krows[i].name, krows[i].ms,
                   krows[i].bytes / 1e6, krows[i].tbps, 100 * krows[i].of_copy);
    }
    kda_tuning tn;
    char err[512];
    kda_tuning_defaults(&tn);
    if (kda_tuning_from_env(&tn, err, sizeof err) || kda_tuning_parse(&tn, tuning, err, sizeof err) ||
        kda_state_dtype_parse(&tn, state_dtype, err, sizeof err)) {
        fprintf(stderr, "bench: %s\n", err);
        return 2;
    }
    /* threads: CPU engine threads (0 = all cores), as kda-server --threads, so a serving
     * benchmark compares the server with the engine on the same threads */
    /* contexts: the longest decode context plus its steps, or the longest
     * prompt; a model whose max_position_embeddings is shorter than that
     * keeps its own (the points beyond it then fail one by one, said so) */
    int need = max_ctx;
    for (int i = 0; i < np; i++) need = pairs[i].ctx + steps + 8 > need ? pairs[i].ctx + steps + 8 : need;
    kda_engine_opts o = {.model_dir = dir, .device = device, .threads = threads, .max_seqs = max_b,
                         .max_seq_len = need, .gpu_mem_fraction = frac, .tuning = &tn, .verbose = 1};
    kda_engine *e = NULL;
    int rc = kda_engine_open(&e, &o, err, sizeof err);
    if (rc == KDA_EINVAL && strstr(err, "max_position_embeddings")) {
        fprintf(stderr, "bench: %s: using the model's own context\n", err);
        o.max_seq_len = 0;
        rc = kda_engine_open(&e, &o, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    const kda_model_info *mi = kda_engine_info(e);
    double read_gbs = 0, copy_gbs = 0;
    if (!strcmp(device, "cpu")) {
        cpu_ceilings(&read_gbs, &copy_gbs);
        printf("memory: read %.1f GB/s (all threads), memcpy %.1f GB/s (read + write)\n", read_gbs, copy_gbs);
    }
    printf("decode on %s (%s), %lld params, %d steps per point:\n", mi->device_name, device, (long long)mi->n_params,
           steps);
    for (int i = 0; i < np; i++) {
        rc = run_pair(e, &pairs[i], steps, !strcmp(fill, "prefill"), err, sizeof err);
        if (rc) {
            fprintf(stderr, "bench ctx %d B %d: %s\n", pairs[i].ctx, pairs[i].B, err);
            pairs[i].ms = -1;
            continue;
        }
        printf("  decode B=%-4d ctx=%-5d %8.3f ms/step %10.0f tok/s  weights %.1f GB/s\n", pairs[i].B, pairs[i].ctx,
               pairs[i].ms, pairs[i].B / pairs[i].ms * 1e3, mi->weight_bytes / pairs[i].ms / 1e6);
        fflush(stdout);
    }
    static const char *const prof_names[KDA_PROF_N] = {"gemm", "kda", "attention", "lm_head", "other"};
    for (int i = 0; i < npt; i++) {
        bench_pt *p = &pts[i];
        rc = run_prefill(e, p, reps, err, sizeof err);
        if (rc) {
            fprintf(stderr, "bench %s %d x %d: %s\n", p->score ? "score" : "prefill", p->B, p->T, err);
            p->ms = -1;
            continue;
        }
        printf("  %-7s %3d x %-5d", p->score ? "score" : "prefill", p->B, p->T);
        if (p->ctx) printf(" after %d", p->ctx);
        printf(" %9.2f ms %10.0f tok/s %7.1f TFLOP/s", p->ms, p->B * p->T / p->ms * 1e3, point_flops(mi, p) / p->ms / 1e9);
        double tot = 0;
        for (int k = 0; k < KDA_PROF_N; k++) tot += p->prof.ms[k];
        if (tot > 0) {
            printf("  device time:");
            for (int k = 0; k < KDA_PROF_N; k++) printf(" %s %.0f%%", prof_names[k], 100 * p->prof.ms[k] / tot);
        }
        printf("\n");
        fflush(stdout);
    }
    for (int i = 0; i < nmx; i++) {
        bench_mixed *m = &mx[i];
        rc = run_mixed(e, m, reps, err, sizeof err);
        if (rc) {
            fprintf(stderr, "bench mixed %d:%d:%d: %s\n", m->B, m->P, m->T, err);
            m->ms = m->dec_ms = -1;
            continue;
        }
        printf("  mixed   B=%-4d + %d x %-5d %8.3f ms (launches %.3f)  decode alone %8.3f ms  prompt rows %6.2f us/token",
               m->B, m->P, m->T, m->ms, m->launch_ms, m->dec_ms, (m->ms - m->dec_ms) * 1e3 / ((double)m->P * m->T));
        if (m->pm.steps && m->pd.steps) {
            printf("  device ms mixed / decode:");
            for (int k = 0; k < KDA_PROF_N; k++)
                printf(" %s %.3f/%.3f", prof_names[k], m->pm.ms[k] / m->pm.steps, m->pd.ms[k] / m->pd.steps);
        }
        printf("\n");
        fflush(stdout);
    }
    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !json) {
        perror(json_path);
        kda_engine_close(e);
        return 1;
    }
    if (json) {
        fprintf(json, "{\n  \"kernels\": [");
        for (int i = 0; i < nk; i++)
            fprintf(json, "%s\n    {\"kernel\": \"%s\", \"ms\": %.4f, \"MB\": %.1f, \"TBps\": %.3f, \"of_copy\": %.3f}",
                    i ? "," : "", krows[i].name, krows[i].ms, krows[i].bytes / 1e6, krows[i].tbps, krows[i].of_copy);
        fprintf(json, "\n  ],\n");
        if (nk) fprintf(json, "  \"copy_TBps\": %.3f,\n", krows[0].tbps);
        fprintf(json, "  \"device\": \"%s\",\n  \"params\": %lld,\n  \"weight_bytes\": %zu,\n  \"steps\": %d,\n",
                mi->device_name, (long long)mi->n_params, mi->weight_bytes, steps);
        fprintf(json, "  \"tuning\": \"");
        kda_tuning_describe(&tn, json);
        fprintf(json, "\",\n");
        if (read_gbs > 0)
            fprintf(json, "  \"cpu_ceiling\": {\"read_GBps\": %.2f, \"memcpy_GBps\": %.2f},\n", read_gbs, copy_gbs);
        fprintf(json, "  \"decode\": [");
        for (int i = 0; i < np; i++)
            fprintf(json, "%s\n    {\"B\": %d, \"ctx\": %d, \"ms_step\": %.4f, \"tok_s\": %.1f, \"weight_GBps\": %.2f}",
                    i ? "," : "", pairs[i].B, pairs[i].ctx, pairs[i].ms,
                    pairs[i].ms > 0 ? pairs[i].B / pairs[i].ms * 1e3 : 0,
                    pairs[i].ms > 0 ? mi->weight_bytes / pairs[i].ms / 1e6 : 0);
        fprintf(json, "\n  ],\n  \"prefill\": [");
        for (int i = 0, first = 1; i < npt; i++) {
            const bench_pt *p = &pts[i];
            fprintf(json, "%s\n    {\"kind\": \"%s\", \"B\": %d, \"T\": %d, \"ctx\": %d, \"ms\": %.3f, \"tok_s\": %.0f, "
                    "\"TFLOPs\": %.1f, \"flops\": %.4g",
                    first ? "" : ",", p->score ? "score" : "prefill", p->B, p->T, p->ctx, p->ms,
                    p->ms > 0 ? p->B * p->T / p->ms * 1e3 : 0, p->ms > 0 ? point_flops(mi, p) / p->ms / 1e9 : 0,
                    point_flops(mi, p));
            if (p->prof.steps) {
                fprintf(json, ", \"device_ms_per_step\": {");
                for (int k = 0; k < KDA_PROF_N; k++)
                    fprintf(json, "%s\"%s\": %.3f", k ? ", " : "", prof_names[k], p->prof.ms[k] / p->prof.steps);
                fprintf(json, "}");
            }
            fprintf(json, "}");
            first = 0;
        }
        fprintf(json, "\n  ],\n  \"mixed\": [");
        for (int i = 0; i < nmx; i++)
            fprintf(json, "%s\n    {\"B\": %d, \"P\": %d, \"T\": %d, \"ms\": %.4f, \"launch_ms\": %.4f, \"decode_ms\": %.4f}",
                    i ? "," : "", mx[i].B, mx[i].P, mx[i].T, mx[i].ms, mx[i].launch_ms, mx[i].dec_ms);
        fprintf(json, "\n  ]\n}\n");
        fclose(json);
    }
    kda_engine_close(e);
    return 0;
}

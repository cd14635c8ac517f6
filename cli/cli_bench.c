/*
 * cli_bench.c - `kda-cli bench MODEL_DIR`: decode-step latency of the engine
 * at given (context, batch) pairs, plus (CUDA builds) each fused kernel's
 * bandwidth against a device-to-device copy measured in the same run. Writes
 * one JSON object (--json FILE) that scripts/bench_merge.py combines with the
 * PyTorch baseline of the same invocation (scripts/bench-gpu.sh).
 *
 * The contexts are filled by decoding the prompt one token per step for all
 * sequences at once (this path is the one being measured; the fast prefill is
 * a separate piece of work). Then `steps` greedy decode steps are timed on the
 * wall clock, sampled tokens fed back, one host sync per step included.
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
            "                     [--json FILE] [--no-kernels] [--mem-fraction F] [--tuning k=v,...]\n"
            "                     [--threads N]\n"
            "  default pairs 128:1,128:16,128:64,128:256,4096:1,4096:16,4096:64,4096:256; steps 32\n");
}

static int usage(void)
{
    cli_bench_usage(stderr);
    return 2;
}

typedef struct {
    int ctx, B;
    double ms;
} bench_pair;

static int run_pair(kda_engine *e, bench_pair *bp, int steps, char *err, size_t errlen)
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
    for (int p = 0; p < bp->ctx; p++) { /* fill the context */
        for (int i = 0; i < B; i++) {
            r = r * 1103515245u + 12345u;
            tok[i] = (int32_t)((r >> 8) % (unsigned)vocab);
            it[i] = (kda_batch_item){.seq = seq[i], .tokens = &tok[i], .n_tokens = 1};
        }
        if ((rc = kda_engine_step(e, it, B, err, errlen))) goto done;
    }
    double t0 = 0;
    for (int s = -4; s < steps; s++) { /* 4 warm-up steps */
        if (s == 0) t0 = now_s();
        for (int i = 0; i < B; i++)
            it[i] = (kda_batch_item){.seq = seq[i], .tokens = &tok[i], .n_tokens = 1, .sampling = &greedy,
                                     .sampled = &next[i]};
        if ((rc = kda_engine_step(e, it, B, err, errlen))) goto done;
        memcpy(tok, next, (size_t)B * sizeof *tok);
    }
    bp->ms = (now_s() - t0) * 1e3 / steps;
done:
    for (int i = 0; i < made; i++) kda_seq_free(e, seq[i]);
    free(seq), free(tok), free(next), free(it);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    if (argc < 1 || argv[0][0] == '-') return usage();
    const char *dir = argv[0], *device = "cuda", *json_path = NULL, *tuning = NULL;
    const char *pairs_s = "128:1,128:16,128:64,128:256,4096:1,4096:16,4096:64,4096:256";
    int steps = 32, kernels = 1, threads = 0;
    double frac = 0.9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs_s = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--mem-fraction") && i + 1 < argc) frac = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-kernels")) kernels = 0;
        else if (!strcmp(argv[i], "--tuning") && i + 1 < argc) tuning = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else return usage();
    }
    bench_pair pairs[64];
    int np = 0, max_b = 1, max_ctx = 1;
    for (const char *p = pairs_s; *p && np < 64;) {
        int c, b, n = 0;
        if (sscanf(p, "%d:%d%n", &c, &b, &n) != 2 || c < 1 || b < 1) return usage();
        pairs[np++] = (bench_pair){.ctx = c, .B = b};
        max_b = b > max_b ? b : max_b;
        max_ctx = c > max_ctx ? c : max_ctx;
        p += n;
        if (*p == ',') p++;
    }
    if (steps < 1) return usage();
    kc_bench_row krows[32];
    int nk = 0;
    if (kernels && !strcmp(device, "cuda")) {
        printf("per-kernel bandwidth (1.7B shapes):\n");
        nk = kc_bench_kernels(krows, 32);
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
    if (kda_tuning_from_env(&tn, err, sizeof err) || kda_tuning_parse(&tn, tuning, err, sizeof err)) {
        fprintf(stderr, "bench: %s\n", err);
        return 2;
    }
    /* threads: CPU engine threads (0 = all cores), as kda-server --threads, so a serving
     * benchmark compares the server with the engine on the same threads */
    kda_engine_opts o = {.model_dir = dir, .device = device, .threads = threads, .max_seqs = max_b,
                         .max_seq_len = max_ctx + steps + 8, .gpu_mem_fraction = frac, .tuning = &tn, .verbose = 1};
    kda_engine *e = NULL;
    int rc = kda_engine_open(&e, &o, err, sizeof err);
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
        rc = run_pair(e, &pairs[i], steps, err, sizeof err);
        if (rc) {
            fprintf(stderr, "bench ctx %d B %d: %s\n", pairs[i].ctx, pairs[i].B, err);
            pairs[i].ms = -1;
            continue;
        }
        printf("  decode B=%-4d ctx=%-5d %8.3f ms/step %10.0f tok/s  weights %.1f GB/s\n", pairs[i].B, pairs[i].ctx,
               pairs[i].ms, pairs[i].B / pairs[i].ms * 1e3, mi->weight_bytes / pairs[i].ms / 1e6);
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
        fprintf(json, "\n  ]\n}\n");
        fclose(json);
    }
    kda_engine_close(e);
    return 0;
}

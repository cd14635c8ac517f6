/*
 * kda-cli - offline driver of the engine: inspect, score, generate,
 * tokenize, detokenize, bench. Uses only engine.h and tokenizer.h.
 * With --json the output is one JSON document on stdout (other tools parse it);
 * diagnostics go to stderr.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "engine.h"
#include "kda_version.h"
#include "tokenizer.h"

#define SCORE_CHUNK 512   /* tokens per engine step when scoring long texts */

typedef struct {
    const char *dir, *device, *tokens, *text, *name_map, *config_map, *tuning, *state_dtype;
    int json, max_tokens, top_k, seed_set, threads, no_bos, ignore_eos, verbose, max_seq_len;
    float temperature, top_p, min_p, rep_pen, pres_pen, freq_pen;
    uint64_t seed;
} cli_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kda-cli COMMAND MODEL_DIR [options]\n"
            "commands:\n"
            "  inspect DIR [--json] [--name-map FILE]      family, dims, layers, tensors, parameter count\n"
            "  score DIR (--tokens 1,2,3 | --text T) [--json] [--no-bos]\n"
            "        token_logprobs[i] = log p(tokens[i+1] | tokens[0..i]); nll = mean -logprob; ppl = exp(nll)\n"
            "  generate DIR (--tokens ... | --text T) [--max-tokens 32] [--temperature 0] [--top-k K]\n"
            "        [--top-p P] [--min-p P] [--repetition-penalty R] [--presence-penalty P]\n"
            "        [--frequency-penalty F] [--seed S] [--ignore-eos] [--json]\n"
            "  tokenize DIR --text T [--bos] [--json]       detokenize DIR --ids 1,2,3 [--json]\n"
            "  bench DIR [...]                              decode/prefill benchmark (kda-cli bench --help)\n"
            "common options: --device cpu|cuda|auto  --threads N  --max-seq-len N  --verbose\n"
            "  --tuning k=v,...  kernel variants and switches (also from $KDA_TUNING; --tuning wins):\n"
            "                    gemv_max_t graphs pdl gemm_lt gemm_verbose gemm_tune_flush gemm_splitk\n"
            "                    gemm_skinny gemm_pad gemv_persist gu_bf16 attn_split kda_stream\n"
            "                    fast_prefill mixed_pass mixed_reserve short_prompt prefill_rows attn_prefill_variant\n"
            "                    attn_prefill_split kda_chunk_gemm kda_chunk_bv\n"
            "                    kda_chunk_split prof cpu_bf16_act kda_state_bf16 poison (engine/engine.h, kda_tuning,\n"
            "                    says what each does)\n"
            "  --kda-state-dtype fp32|bf16  CUDA: how the KDA recurrent state is stored (default fp32)\n"
            "  --name-map FILE    tensor names of another layout (configs/README.md)\n"
            "  --config-map PATH  config.json keys of another layout: a map file, or a folder of\n"
            "                     *.configmap.json chosen by model_type (configs/README.md)\n"
            "kda-cli COMMAND --help: that command's usage; kda-cli --version\n");
}

/* kda-cli SUB --help: the subcommand's own usage, on stdout. */
static int sub_usage(const char *cmd)
{
    if (!strcmp(cmd, "tokenize") || !strcmp(cmd, "detokenize")) { cli_tok_usage(stdout, cmd); return 0; }
    if (!strcmp(cmd, "bench")) { cli_bench_usage(stdout); return 0; }
    if (!strcmp(cmd, "inspect")) {
        printf("usage: kda-cli inspect DIR [--json] [--name-map FILE] [--config-map PATH]\n"
               "  family, dims, layers, tensors and parameter count of a checkpoint, without loading a backend\n");
    } else if (!strcmp(cmd, "score")) {
        printf("usage: kda-cli score DIR (--tokens 1,2,3 | --text T) [--json] [--no-bos]\n"
               "  token_logprobs[i] = log p(tokens[i+1] | tokens[0..i]); nll = mean -logprob; ppl = exp(nll)\n"
               "  options: --device cpu|cuda|auto --threads N --max-seq-len N --name-map FILE --config-map PATH\n"
               "           --tuning k=v,... --verbose\n");
    } else {
        printf("usage: kda-cli generate DIR (--tokens ... | --text T) [--max-tokens 32] [--temperature 0] [--top-k K]\n"
               "       [--top-p P] [--min-p P] [--repetition-penalty R] [--presence-penalty P]\n"
               "       [--frequency-penalty F] [--seed S] [--ignore-eos] [--json] [--no-bos]\n"
               "  options: --device cpu|cuda|auto --threads N --max-seq-len N --name-map FILE --config-map PATH\n"
               "           --tuning k=v,... --verbose\n");
    }
    return 0;
}

static int parse_int(const char *s, const char *flag, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "kda-cli: %s must be an integer in [%ld, %ld] (got \"%s\")\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *s, const char *flag, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s) {
        fprintf(stderr, "kda-cli: %s must be a number (got \"%s\")\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->max_tokens = 32;
    o->top_p = 1.0f;
    o->rep_pen = 1.0f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
#define NEEDV() do { if (!v) { fprintf(stderr, "kda-cli: %s needs a value\n", a); return -1; } i++; } while (0)
        if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--no-bos")) o->no_bos = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--verbose")) o->verbose = 1;
        else if (!strcmp(a, "--device")) { NEEDV(); o->device = v; }
        else if (!strcmp(a, "--tokens")) { NEEDV(); o->tokens = v; }
        else if (!strcmp(a, "--text")) { NEEDV(); o->text = v; }
        else if (!strcmp(a, "--name-map")) { NEEDV(); o->name_map = v; }
        else if (!strcmp(a, "--tuning")) { NEEDV(); o->tuning = v; }
        else if (!strcmp(a, "--kda-state-dtype")) { NEEDV(); o->state_dtype = v; }
        else if (!strcmp(a, "--config-map")) { NEEDV(); o->config_map = v; }
        else if (!strcmp(a, "--max-tokens")) { NEEDV(); if (parse_int(v, a, 0, 1 << 24, &n)) return -1; o->max_tokens = (int)n; }
        else if (!strcmp(a, "--threads")) { NEEDV(); if (parse_int(v, a, 0, 1024, &n)) return -1; o->threads = (int)n; }
        else if (!strcmp(a, "--max-seq-len")) { NEEDV(); if (parse_int(v, a, 1, INT_MAX, &n)) return -1; o->max_seq_len = (int)n; }
        else if (!strcmp(a, "--top-k")) { NEEDV(); if (parse_int(v, a, 0, INT_MAX, &n)) return -1; o->top_k = (int)n; }
        else if (!strcmp(a, "--seed")) { NEEDV(); if (parse_int(v, a, 0, LONG_MAX, &n)) return -1; o->seed = (uint64_t)n; o->seed_set = 1; }
        else if (!strcmp(a, "--temperature")) { NEEDV(); if (parse_float(v, a, &o->temperature)) return -1; }
        else if (!strcmp(a, "--top-p")) { NEEDV(); if (parse_float(v, a, &o->top_p)) return -1; }
        else if (!strcmp(a, "--min-p")) { NEEDV(); if (parse_float(v, a, &o->min_p)) return -1; }
        else if (!strcmp(a, "--repetition-penalty")) { NEEDV(); if (parse_float(v, a, &o->rep_pen)) return -1; }
        else if (!strcmp(a, "--presence-penalty")) { NEEDV(); if (parse_float(v, a, &o->pres_pen)) return -1; }
        else if (!strcmp(a, "--frequency-penalty")) { NEEDV(); if (parse_float(v, a, &o->freq_pen)) return -1; }
        else if (a[0] == '-') { fprintf(stderr, "kda-cli: unknown option %s\n", a); return -1; }
        else if (!o->dir) o->dir = a;
        else { fprintf(stderr, "kda-cli: unexpected argument \"%s\"\n", a); return -1; }
#undef NEEDV
    }
    if (!o->dir) {
        fprintf(stderr, "kda-cli: missing MODEL_DIR\n");
        return -1;
    }
    return 0;
}

/* "1,450,4996" -> ids */
static int parse_ids(const char *s, int32_t **out, int *n)
{
    int cap = 16, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = s;
    while (ids && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "kda-cli: --tokens must be comma-separated non-negative integers (at \"%s\")\n", p);
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *r = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!r) break;
            ids = r;
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!ids) return -1;
    *out = ids;
    *n = k;
    return 0;
}

static kda_engine *open_engine(const cli_opts *o)
{
    char err[512];
    kda_engine *e;
    kda_tuning tn;
    kda_tuning_defaults(&tn);
    if (kda_tuning_from_env(&tn, err, sizeof err) || kda_tuning_parse(&tn, o->tuning, err, sizeof err) ||
        kda_state_dtype_parse(&tn, o->state_dtype, err, sizeof err)) {
        fprintf(stderr, "kda-cli: %s\n", err);
        return NULL;
    }
    kda_engine_opts eo = {.model_dir = o->dir, .device = o->device, .threads = o->threads, .max_seqs = 1,
                          .max_seq_len = o->max_seq_len, .name_map = o->name_map,
                          .config_map = o->config_map, .tuning = &tn, .verbose = o->verbose};
    if (kda_engine_open(&e, &eo, err, sizeof err)) {
        fprintf(stderr, "kda-cli: %s: %s\n", o->dir, err);
        return NULL;
    }
    return e;
}

/* Input ids from --tokens or --text (tokenized with the model's tokenizer). */
static int input_ids(const cli_opts *o, const kda_engine *e, int32_t **ids, int *n)
{
    if (!!o->tokens == !!o->text) {
        fprintf(stderr, "kda-cli: give exactly one of --tokens and --text\n");
        return -1;
    }
    if (o->tokens) return parse_ids(o->tokens, ids, n);
    char err[512];
    tok_tokenizer *t;
    if (tok_open_dir(&t, o->dir, err, sizeof err)) {
        fprintf(stderr, "kda-cli: tokenizer: %s\n", err);
        return -1;
    }
    if (tok_vocab_size(t) != kda_engine_info(e)->vocab_size) {
        fprintf(stderr, "kda-cli: tokenizer has %d ids but the model's embedding has %d rows\n", tok_vocab_size(t),
                kda_engine_info(e)->vocab_size);
        tok_close(t);
        return -1;
    }
    int rc = tok_encode(t, o->text, strlen(o->text), !o->no_bos, ids, n, err, sizeof err);
    tok_close(t);
    if (rc) fprintf(stderr, "kda-cli: tokenize: %s\n", err);
    return rc ? -1 : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_ids(cJSON *o, const char *key, const int32_t *ids, int n)
{
    cJSON *a = cJSON_AddArrayToObject(o, key);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
}

static void emit_json(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

static int cmd_inspect(const cli_opts *o)
{
    char err[512];
    int rc = kda_inspect(o->dir, o->name_map, o->config_map, o->json, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "kda-cli: %s: %s\n", o->dir, err);
    return rc ? 1 : 0;
}

static int cmd_score(const cli_opts *o)
{
    kda_engine *e = open_engine(o);
    if (!e) return 1;
    int32_t *ids = NULL;
    int n = 0, seq, ret = 1;
    char err[512];
    float *lp = NULL;
    if (input_ids(o, e, &ids, &n)) goto out;
    if (n < 1) {
        fprintf(stderr, "kda-cli: nothing to score\n");
        goto out;
    }
    lp = calloc((size_t)n, sizeof *lp);
    if (!lp || kda_seq_new(e, &seq, err, sizeof err)) {
        fprintf(stderr, "kda-cli: %s\n", lp ? err : "out of memory");
        goto out;
    }
    double t0 = now_s();
    /* targets[i] = tokens[i+1]; the last token has no target */
    for (int s = 0; s < n; s += SCORE_CHUNK) {
        int m = n - s < SCORE_CHUNK ? n - s : SCORE_CHUNK;
        int32_t *tg = malloc((size_t)m * sizeof *tg);
        if (!tg) goto out;
        for (int i = 0; i < m; i++) tg[i] = s + i + 1 < n ? ids[s + i + 1] : -1;
        kda_batch_item it = {.seq = seq, .tokens = ids + s, .n_tokens = m, .targets = tg, .target_logprobs = lp + s};
        int rc = kda_engine_step(e, &it, 1, err, sizeof err);
        free(tg);
        if (rc) {
            fprintf(stderr, "kda-cli: score: %s\n", err);
            goto out;
        }
    }
    double dt = now_s() - t0;
    double nll = 0;
    for (int i = 0; i < n - 1; i++) nll -= lp[i];
    nll = n > 1 ? nll / (n - 1) : 0.0;
    if (o->verbose) fprintf(stderr, "scored %d tokens in %.3f s (%.1f tok/s)\n", n, dt, n / dt);
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        print_ids(j, "tokens", ids, n);
        cJSON *a = cJSON_AddArrayToObject(j, "token_logprobs");
        for (int i = 0; i < n - 1; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(lp[i]));
        cJSON_AddNumberToObject(j, "nll", nll);
        cJSON_AddNumberToObject(j, "ppl", exp(nll));
        emit_json(j);
    } else {
        for (int i = 0; i < n - 1; i++) printf("%6d -> %6d  %10.5f\n", ids[i], ids[i + 1], lp[i]);
        printf("tokens %d  nll %.6f  ppl %.4f\n", n, nll, exp(nll));
    }
    ret = 0;
out:
    free(ids);
    free(lp);
    kda_engine_close(e);
    return ret;
}

static int cmd_generate(const cli_opts *o)
{
    kda_engine *e = open_engine(o);
    if (!e) return 1;
    const kda_model_info *info = kda_engine_info(e);
    int32_t *ids = NULL, *gen = NULL;
    int n = 0, seq, ret = 1, n_gen = 0;
    char err[512];
    tok_tokenizer *tok = NULL;
    if (input_ids(o, e, &ids, &n)) goto out;
    if (n < 1) {
        fprintf(stderr, "kda-cli: empty prompt\n");
        goto out;
    }
    if (o->text || !o->json) tok_open_dir(&tok, o->dir, err, sizeof err); /* for printing text; optional */
    gen = malloc((size_t)(o->max_tokens + 1) * sizeof *gen);
    if (!gen || kda_seq_new(e, &seq, err, sizeof err)) {
        fprintf(stderr, "kda-cli: %s\n", gen ? err : "out of memory");
        goto out;
    }
    kda_sampling sp = {.temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p, .min_p = o->min_p,
                       .repetition_penalty = o->rep_pen, .presence_penalty = o->pres_pen,
                       .frequency_penalty = o->freq_pen, .seed = o->seed_set ? o->seed : (uint64_t)time(NULL),
                       .n_prompt = n};
    double t0 = now_s(), t_first = 0;
    /* prompt in chunks; the last chunk samples the first token */
    int32_t next = -1;
    for (int s = 0; s < n && o->max_tokens > 0; s += SCORE_CHUNK) {
        int m = n - s < SCORE_CHUNK ? n - s : SCORE_CHUNK;
        int last = s + m == n;
        kda_batch_item it = {.seq = seq, .tokens = ids + s, .n_tokens = m, .sampling = last ? &sp : NULL,
                             .sampled = &next};
        if (kda_engine_step(e, &it, 1, err, sizeof err)) {
            fprintf(stderr, "kda-cli: generate: %s\n", err);
            goto out;
        }
    }
    t_first = now_s();
    while (n_gen < o->max_tokens) {
        gen[n_gen++] = next;
        if ((!o->ignore_eos && next == info->eos_id) || n_gen == o->max_tokens) break;
        kda_batch_item it = {.seq = seq, .tokens = &next, .n_tokens = 1, .sampling = &sp, .sampled = &next};
        if (kda_engine_step(e, &it, 1, err, sizeof err)) {
            fprintf(stderr, "kda-cli: generate: %s\n", err);
            goto out;
        }
    }
    double t1 = now_s();
    if (o->verbose)
        fprintf(stderr, "prompt %d tokens in %.3f s; %d tokens generated, decode %.2f tok/s\n", n, t_first - t0, n_gen,
                n_gen > 1 ? (n_gen - 1) / (t1 - t_first) : 0.0);
    char *text = NULL;
    if (tok) tok_decode(tok, gen, n_gen, &text, err, sizeof err);
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        print_ids(j, "tokens", gen, n_gen);
        if (text) cJSON_AddStringToObject(j, "text", text);
        emit_json(j);
    } else if (text) {
        printf("%s\n", text);
    } else {
        for (int i = 0; i < n_gen; i++) printf("%s%d", i ? "," : "", gen[i]);
        printf("\n");
    }
    free(text);
    ret = 0;
out:
    tok_close(tok);
    free(ids);
    free(gen);
    kda_engine_close(e);
    return ret;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kda-cli %s (git %s)\n", KDA_PROJECT_VERSION, KDA_GIT_DESCRIBE);
        return 0;
    }
    const char *cmd = argv[1];
    int known = !strcmp(cmd, "tokenize") || !strcmp(cmd, "detokenize") || !strcmp(cmd, "bench") ||
                !strcmp(cmd, "inspect") || !strcmp(cmd, "score") || !strcmp(cmd, "generate");
    for (int i = 2; known && i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return sub_usage(cmd);
    if (!strcmp(cmd, "tokenize")) return cli_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "detokenize")) return cli_detokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 2, argv + 2);
    cli_opts o;
    if (strcmp(cmd, "inspect") && strcmp(cmd, "score") && strcmp(cmd, "generate")) {
        fprintf(stderr, "kda-cli: unknown command \"%s\"\n", cmd);
        usage(stderr);
        return 2;
    }
    if (parse_opts(argc - 2, argv + 2, &o)) return 2;
    if (!strcmp(cmd, "inspect")) return cmd_inspect(&o);
    if (!strcmp(cmd, "score")) return cmd_score(&o);
    return cmd_generate(&o);
}

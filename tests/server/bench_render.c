/*
 * bench_render.c - the server's own cost of a large response, without the engine or HTTP:
 * api_parse of the request body and api_render of the finished job, timed on the CPU for
 * /score and /v1/completions (echo, logprobs K, max_tokens 1: lm-eval's loglikelihood
 * request) at the prompt lengths of issues #12 and #17. The job's results (log-probs,
 * alternatives) are random, filled where the scheduler would fill them.
 *
 *   bench_render TOKENIZER.model [--text FILE] [--reps N] [--json OUT] [--reference] [--point I]
 *                [--render-threads N]
 *
 * Prints one line per point: median ms of parse and render (the thread's CPU time, which
 * other load on a shared machine disturbs less than wall time; wall medians in the JSON),
 * and the response's bytes.
 * --render-threads N: api_ctx.render_threads (default 1: the render on this thread alone,
 * so its CPU time is all of it; with N > 1 compare the wall medians, render_wall).
 * --reference: time render_reference.c (the cJSON-tree renderer before json_out.c)
 * instead, and check that both give the same bytes. --point I: only the I-th point (perf).
 * Ids are uniform over the vocabulary (every lookup of the token strings misses the
 * cache: the worst case), or with --text the tokens of that text, alternatives drawn
 * from the same tokens (as frequent as in text).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "log.h"
#include "render_reference.h"

typedef struct { const char *route; int kind, T, n_top, prompts; } point;

/* prompts > 1: a list of that many prompts of T ids each (lm-eval's batch_size=8) */
static const point points[] = {
    {"/score", API_SCORE, 1044, 0, 1},
    {"/score", API_SCORE, 8192, 0, 1},
    {"/v1/completions", API_COMPLETIONS, 1044, 1, 1},
    {"/v1/completions", API_COMPLETIONS, 1044, 5, 1},
    {"/v1/completions", API_COMPLETIONS, 8192, 1, 1},
    {"/v1/completions", API_COMPLETIONS, 8192, 5, 1},
    {"/v1/completions", API_COMPLETIONS, 1044, 1, 8},
};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float rand_lp(void) { float u = (float)(next_u32() % 1000000) / 1e6f; return -12.0f * u * u; }

/* "{...prompt/tokens: [ids]...}": what the client sends */
static char *request_body(const point *p, const int32_t *ids, size_t *len)
{
    api_buf b = {0};
    char tmp[64];
    if (p->kind == API_SCORE) api_buf_put(&b, "{\"tokens\":[", 11);
    else api_buf_put(&b, "{\"model\":\"bench\",\"prompt\":[", 28);
    for (int k = 0; k < p->prompts; k++) {
        if (p->prompts > 1) api_buf_put(&b, k ? ",[" : "[", k ? 2 : 1);
        for (int i = 0; i < p->T; i++) {   /* each prompt its own rotation of the ids */
            int n = snprintf(tmp, sizeof tmp, i ? ",%d" : "%d", (int)ids[(i + k * 131) % p->T]);
            api_buf_put(&b, tmp, (size_t)n);
        }
        if (p->prompts > 1) api_buf_put(&b, "]", 1);
    }
    int n = p->kind == API_SCORE ? snprintf(tmp, sizeof tmp, "]}")
                                 : snprintf(tmp, sizeof tmp, "],\"echo\":true,\"logprobs\":%d,\"max_tokens\":1}", p->n_top);
    api_buf_put(&b, tmp, (size_t)n);
    *len = b.len;
    return b.p;
}

static const int32_t *text_ids;   /* --text: the text's tokens */
static int n_text_ids;

static int32_t random_id(int vocab)
{
    return n_text_ids ? text_ids[next_u32() % (uint32_t)n_text_ids] : (int32_t)(next_u32() % (uint32_t)vocab);
}

/* Fills what the scheduler writes once a task is finished. */
static void finish_task(sched_task *t, int vocab)
{
    int k = t->n_top;
    t->prompt_lps = calloc((size_t)t->n_prompt, sizeof *t->prompt_lps);
    for (int i = 0; i + 1 < t->n_prompt; i++) t->prompt_lps[i] = rand_lp();
    if (t->prompt_logprobs && k) {
        t->prompt_top_ids = calloc((size_t)t->n_prompt * (size_t)k, sizeof *t->prompt_top_ids);
        t->prompt_top_lps = calloc((size_t)t->n_prompt * (size_t)k, sizeof *t->prompt_top_lps);
        for (size_t i = 0; i < (size_t)t->n_prompt * (size_t)k; i++) {
            t->prompt_top_ids[i] = random_id(vocab);
            t->prompt_top_lps[i] = rand_lp();
        }
    }
    if (t->max_tokens > 0) {
        sched_out *o = &t->out;
        o->cap = 4;
        o->ids = calloc(4, sizeof *o->ids);
        o->lps = calloc(4, sizeof *o->lps);
        o->top_ids = calloc(4 * (size_t)(k ? k : 1), sizeof *o->top_ids);
        o->top_lps = calloc(4 * (size_t)(k ? k : 1), sizeof *o->top_lps);
        o->ids[0] = random_id(vocab);
        o->lps[0] = rand_lp();
        for (int a = 0; a < k; a++) o->top_ids[a] = random_id(vocab), o->top_lps[a] = rand_lp();
        o->n = 1;
        sched_out_text(o, " the", 4);
        t->n_gen = 1;
    }
    t->finish = SCHED_FINISH_LENGTH;
    t->t_admit = t->t_submit + 1e-4;
    t->t_first = t->t_admit + 1e-2;
    t->t_end = t->t_first;
}

static int cmp_double(const void *a, const void *b);

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: %s TOKENIZER.model [--reps N] [--json OUT]\n", argv[0]); return 2; }
    int reps = 0;
    const char *json_out = NULL, *text_file = NULL;
    int reference = 0, only = -1, render_threads = 1;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_out = argv[++i];
        else if (!strcmp(argv[i], "--reference")) reference = 1;
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text_file = argv[++i];
        else if (!strcmp(argv[i], "--point") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--render-threads") && i + 1 < argc) render_threads = atoi(argv[++i]);
    }
    char err[512];
    tok_tokenizer *tok;
    if (tok_open_spm(&tok, argv[1], err, sizeof err)) { fprintf(stderr, "%s: %s\n", argv[1], err); return 1; }
    api_ctx ctx = {.tok = tok, .vocab_size = tok_vocab_size(tok), .bos_id = tok_bos_id(tok), .eos_id = tok_eos_id(tok),
                   .max_seq_len = 16384, .model_name = "bench", .max_tasks = 64,
                   .render_threads = render_threads, .render_min_work = 4096};
    if (api_ctx_init(&ctx, "/nonexistent", NULL, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    int32_t *tids = NULL;
    if (text_file) {   /* the first 1 MB of the text */
        FILE *f = fopen(text_file, "rb");
        if (!f) { perror(text_file); return 1; }
        char *txt = malloc(1 << 20);
        size_t n = fread(txt, 1, (1 << 20) - 1, f);
        fclose(f);
        if (tok_encode(tok, txt, n, 0, &tids, &n_text_ids, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        free(txt);
        text_ids = tids;
    }
    FILE *js = json_out ? fopen(json_out, "w") : NULL;
    if (js) fprintf(js, "[\n");
    printf("%-16s %6s %5s %3s %10s %10s %11s %10s\n", "route", "T", "top", "n", "parse_cpu", "render_cpu", "render_wall",
           "bytes");
    for (size_t pi = 0; pi < sizeof points / sizeof points[0]; pi++) {
        const point *p = &points[pi];
        if (only >= 0 && (size_t)only != pi) continue;
        int n_reps = reps ? reps : p->T * p->prompts > 2000 ? 15 : 60;
        int32_t *ids = malloc((size_t)p->T * sizeof *ids);
        for (int i = 0; i < p->T; i++)
            ids[i] = n_text_ids > p->T ? text_ids[(pi * 9973 + (size_t)i) % (size_t)n_text_ids]
                                       : (int32_t)(3 + next_u32() % (uint32_t)(ctx.vocab_size - 3));
        size_t blen;
        char *body = request_body(p, ids, &blen);
        double *tp = calloc((size_t)n_reps, sizeof *tp), *tr = calloc((size_t)n_reps, sizeof *tr);
        double *cp = calloc((size_t)n_reps, sizeof *cp), *cr = calloc((size_t)n_reps, sizeof *cr);
        size_t out_len = 0;
        for (int r = 0; r < n_reps; r++) {
            api_job *j;
            api_error e = {0};
            double c0 = cpu_now(), t0 = srv_now();
            if (api_parse(&ctx, p->kind, body, blen, &j, &e)) { fprintf(stderr, "parse: %s\n", e.message); return 1; }
            double t1 = srv_now(), c1 = cpu_now();
            for (int i = 0; i < j->client->n_tasks; i++) finish_task(&j->client->tasks[i], ctx.vocab_size);
            int status;
            double c2 = cpu_now(), t2 = srv_now();
            char *res = reference ? ref_render(j, &status, &out_len) : api_render(j, &status, &out_len);
            double t3 = srv_now(), c3 = cpu_now();
            if (!res || status != 200) { fprintf(stderr, "render failed (%d)\n", status); return 1; }
            if (reference) {
                size_t n_new = 0;
                char *res_new = api_render(j, &status, &n_new);
                if (!res_new || n_new != out_len || memcmp(res, res_new, n_new)) {
                    fprintf(stderr, "%s T=%d: api_render differs from the reference\n", p->route, p->T);
                    return 1;
                }
                free(res_new);
            }
            free(res);
            api_job_free(j);
            tp[r] = (t1 - t0) * 1e3;
            tr[r] = (t3 - t2) * 1e3;
            cp[r] = (c1 - c0) * 1e3;
            cr[r] = (c3 - c2) * 1e3;
        }
        double mp = median(tp, n_reps), mr = median(tr, n_reps), mcp = median(cp, n_reps), mcr = median(cr, n_reps);
        printf("%-16s %6d %5d %3d %10.3f %10.3f %11.3f %10zu\n", p->route, p->T, p->n_top, p->prompts, mcp, mcr, mr,
               out_len);
        if (js)
            fprintf(js, "  {\"route\": \"%s\", \"T\": %d, \"prompts\": %d, \"render_threads\": %d, \"logprobs\": %d, \"reps\": %d, \"parse_cpu_ms\": %.3f, "
                        "\"render_cpu_ms\": %.3f, \"parse_wall_ms\": %.3f, \"render_wall_ms\": %.3f, \"renderer\": \"%s\", \"ids\": \"%s\", \"request_bytes\": %zu, \"response_bytes\": %zu}%s\n",
                    p->route, p->T, p->prompts, render_threads, p->n_top, n_reps, mcp, mcr, mp, mr, reference ? "cjson-tree" : "json_out", n_text_ids ? "text" : "uniform", blen, out_len,
                    pi + 1 < sizeof points / sizeof points[0] ? "," : "");
        free(tp);
        free(tr);
        free(cp);
        free(cr);
        free(body);
        free(ids);
    }
    if (js) { fprintf(js, "]\n"); fclose(js); }
    free(tids);
    api_ctx_free(&ctx);
    tok_close(tok);
    return 0;
}

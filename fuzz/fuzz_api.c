/*
 * fuzz_api.c - the request side of every JSON route (server/api.c, fields.c,
 * chat.c with the Jinja engine) without HTTP, and the response side fed with
 * what the scheduler would have produced.
 *
 * Input: a route byte, an options byte, then the request body.
 *   route % 6: /generate, /score, /v1/completions, /v1/chat/completions,
 *              /tokenize, /detokenize
 *   (route / 6) % 2: byte tokenizer, or SentencePiece (when the build has
 *              a model for it, FUZZ_SPM_MODEL)
 *   (route / 12) % 4: chat template chatml, llama-2, plain, none
 *   options: how the simulated generation ends and how many ids it makes
 * A parsed job gets outputs as the scheduler writes them (valid ids from its
 * prompt, log-probs, alternatives, text through the stream detokenizer) and
 * is rendered whole and as SSE. Checks: errors carry a 4xx status, a
 * message and valid JSON; every response body and SSE event is valid JSON
 * in valid UTF-8 without NULs; a stream ends with "data: [DONE]".
 */
#include "fuzz_common.h"

#include <cjson/cJSON.h>

#include "api.h"
#include "scheduler.h"
#include "tokenizer.h"

static tok_tokenizer *toks[2];
static chat_template *templates[3];
static api_ctx base[2];
static const char *const template_names[3] = {"chatml", "llama-2", "plain"};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    char err[512];
    if (tok_open_bytes(&toks[0])) abort();
#ifdef FUZZ_SPM_MODEL
    if (tok_open_spm(&toks[1], FUZZ_SPM_MODEL, err, sizeof err)) {
        fprintf(stderr, "fuzz_api: %s (SentencePiece inputs use the byte tokenizer)\n", err);
        toks[1] = NULL;
    }
#endif
    for (int i = 0; i < 3; i++)
        if (chat_template_load(template_names[i], "/nonexistent", &templates[i], NULL, err, sizeof err)) {
            fprintf(stderr, "fuzz_api: template %s: %s\n", template_names[i], err);
            abort();
        }
    for (int k = 0; k < 2; k++) {
        const tok_tokenizer *t = toks[k] ? toks[k] : toks[0];
        api_ctx *c = &base[k];
        c->tok = t;
        c->vocab_size = tok_vocab_size(t);
        c->bos_id = tok_bos_id(t);
        c->eos_id = tok_eos_id(t);
        c->max_seq_len = 96;   /* small, so context limits are reachable */
        c->model_name = "demo";
        c->max_tasks = 8;
        /* as the server fills it: the special-token strings, the token strings the
         * renderers look up (no template in /nonexistent; each input picks one) */
        if (api_ctx_init(c, "/nonexistent", NULL, err, sizeof err)) {
            fprintf(stderr, "fuzz_api: %s\n", err);
            abort();
        }
    }
    return 0;
}

static void check_utf8(const char *s, size_t n, const char *what)
{
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_char_len(s + i, n - i);
        FZ_CHECK(k > 0 && s[i] != 0, "%s: invalid UTF-8 or NUL at byte %zu of %zu: %.200s", what, i, n, s);
        i += (size_t)k;
    }
}

static void check_json(const char *s, size_t n, const char *what)
{
    FZ_CHECK(s != NULL, "%s: no body", what);
    FZ_CHECK(strlen(s) == n, "%s: length %zu but strlen %zu", what, n, strlen(s));
    check_utf8(s, n, what);
    cJSON *o = cJSON_ParseWithLength(s, n);
    FZ_CHECK(cJSON_IsObject(o), "%s: not a JSON object: %.300s", what, s);
    cJSON_Delete(o);
}

static void check_error(const api_error *e, const char *what)
{
    FZ_CHECK(e->status >= 400 && e->status < 500, "%s: status %d (%s)", what, e->status, e->message);
    FZ_CHECK(e->message[0], "%s: error without a message", what);
    size_t n = 0;
    char *body = api_error_json_param(e->status, e->message, e->param, &n);
    check_json(body, n, "error body");
    free(body);
}

static int out_id(sched_out *o, int n_top, int32_t id, float lp, const int32_t *ti, const float *tl)
{
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 8;
        o->ids = realloc(o->ids, (size_t)cap * sizeof *o->ids);
        o->lps = realloc(o->lps, (size_t)cap * sizeof *o->lps);
        o->top_ids = realloc(o->top_ids, (size_t)cap * (size_t)(n_top ? n_top : 1) * sizeof *o->top_ids);
        o->top_lps = realloc(o->top_lps, (size_t)cap * (size_t)(n_top ? n_top : 1) * sizeof *o->top_lps);
        if (!o->ids || !o->lps || !o->top_ids || !o->top_lps) abort();
        o->cap = cap;
    }
    o->ids[o->n] = id;
    o->lps[o->n] = lp;
    if (n_top) {
        memcpy(o->top_ids + (size_t)o->n * n_top, ti, (size_t)n_top * sizeof *ti);
        memcpy(o->top_lps + (size_t)o->n * n_top, tl, (size_t)n_top * sizeof *tl);
    }
    o->n++;
    return 0;
}

/* What the scheduler leaves in a task: n ids drawn from its prompt (so
 * valid), their text through the stream detokenizer and stop-string rule
 * left out, log-probs and alternatives when asked, prompt log-probs for
 * scoring and echo, and an end. */
static void simulate(const api_ctx *ctx, sched_task *t, unsigned opt, int task_index)
{
    int n = t->max_tokens < (int)(opt % 6) ? t->max_tokens : (int)(opt % 6);
    int32_t ti[32];
    float tl[32];
    tok_stream *ts = tok_stream_new(ctx->tok);
    if (!ts) abort();
    for (int k = 0; k < n; k++) {
        int32_t id = t->prompt[(k * 7 + task_index) % t->n_prompt];
        if (k == n - 1 && (opt >> 3) % 5 == 1 && t->eos_id >= 0) id = t->eos_id;
        for (int m = 0; m < t->n_top && m < 32; m++) {
            ti[m] = t->prompt[(k + m) % t->n_prompt];
            tl[m] = -0.25f * (float)(m + 1);
        }
        out_id(&t->out, t->n_top, id, -0.5f * (float)k, ti, tl);
        size_t len;
        const char *s = tok_stream_push(ts, id, &len);
        if (len && sched_out_text(&t->out, s, len)) abort();
    }
    size_t len;
    const char *s = tok_stream_flush(ts, &len);
    if (len && sched_out_text(&t->out, s, len)) abort();
    tok_stream_free(ts);
    if (t->prompt_logprobs) {
        t->prompt_lps = calloc((size_t)t->n_prompt, sizeof *t->prompt_lps);
        for (int i = 0; i + 1 < t->n_prompt; i++) t->prompt_lps[i] = -1.0f - (float)i;
        if (t->n_top) {
            t->prompt_top_ids = calloc((size_t)t->n_prompt * t->n_top, sizeof *t->prompt_top_ids);
            t->prompt_top_lps = calloc((size_t)t->n_prompt * t->n_top, sizeof *t->prompt_top_lps);
            for (size_t i = 0; i < (size_t)t->n_prompt * t->n_top; i++) t->prompt_top_ids[i] = t->prompt[i % t->n_prompt];
        }
    }
    static const int finishes[5] = {SCHED_FINISH_LENGTH, SCHED_FINISH_EOS, SCHED_FINISH_STOP, SCHED_FINISH_ABORT,
                                    SCHED_FINISH_ERROR};
    t->finish = finishes[(opt >> 3) % 5];
    if (t->finish == SCHED_FINISH_ERROR) snprintf(t->error, sizeof t->error, "engine failure \xff (simulated)");
    t->n_gen = n;
    t->t_admit = t->t_submit + 0.001;
    t->t_first = n ? t->t_admit + 0.002 : 0;
    t->t_end = t->t_admit + 0.01;
}

/* Each "data: ..." event of an SSE body is a JSON object or [DONE]. */
static void check_sse(const char *s, size_t n)
{
    check_utf8(s, n, "SSE");
    const char *p = s, *end = s + n;
    while (p < end) {
        const char *nl = strstr(p, "\n\n");
        FZ_CHECK(nl, "SSE: event not terminated: %.200s", p);
        if (!strncmp(p, "data: ", 6) && strncmp(p, "data: [DONE]", 12)) {
            cJSON *o = cJSON_ParseWithLength(p + 6, (size_t)(nl - p - 6));
            FZ_CHECK(cJSON_IsObject(o), "SSE: event is not a JSON object: %.300s", p);
            cJSON_Delete(o);
        } else {
            FZ_CHECK(!strncmp(p, "data: [DONE]", 12) || p[0] == ':', "SSE: unexpected line %.100s", p);
        }
        p = nl + 2;
    }
}

static void render(api_job *j, unsigned opt)
{
    sched_client *c = j->client;
    FZ_CHECK(c && c->n_tasks == j->n_inputs * j->n && c->n_tasks > 0, "job with %d tasks, %d inputs x %d",
             c ? c->n_tasks : -1, j->n_inputs, j->n);
    for (int i = 0; i < c->n_tasks; i++) {
        const sched_task *t = &c->tasks[i];
        FZ_CHECK(t->n_prompt > 0 && t->n_prompt + t->max_tokens <= j->ctx->max_seq_len,
                 "task %d: %d prompt + %d tokens, context %d", i, t->n_prompt, t->max_tokens, j->ctx->max_seq_len);
        for (int k = 0; k < t->n_prompt; k++)
            FZ_CHECK(t->prompt[k] >= 0 && t->prompt[k] < j->ctx->vocab_size, "task %d: prompt id %d", i, t->prompt[k]);
        FZ_CHECK(t->n_top >= 0 && t->n_top <= 20, "task %d: n_top %d", i, t->n_top);
    }
    size_t bound = api_response_bound(j);   /* --max-response-bytes refuses above it: never exceeded */
    FZ_CHECK(!j->ctx->max_response_bytes || bound <= j->ctx->max_response_bytes, "accepted a bound of %zu over the cap %zu",
             bound, j->ctx->max_response_bytes);
    if (!j->stream) {
        for (int i = 0; i < c->n_tasks; i++) simulate(j->ctx, &c->tasks[i], opt, i);
        int status = 0;
        size_t n = 0;
        char *body = api_render(j, &status, &n);
        check_json(body, n, "response");
        FZ_CHECK(n <= bound, "response of %zu bytes above its bound of %zu", n, bound);
        free(body);
        return;
    }
    api_buf out = {0};
    c->heartbeat = 1;
    FZ_CHECK(api_render_stream(j, &out) == 0, "stream ended before any output");
    for (int i = 0; i < c->n_tasks; i++) simulate(j->ctx, &c->tasks[i], opt, i);
    int done = 0;
    for (int round = 0; round < 3 && !done; round++) done = api_render_stream(j, &out);
    FZ_CHECK(done, "stream did not end after every task finished");
    check_sse(out.p, out.len);
    size_t sent = out.len;   /* keep-alive comments are left out of the bound */
    for (const char *p = out.p; (p = strstr(p, ": keep-alive\n\n")); p += 14) sent -= 14;
    FZ_CHECK(sent <= bound, "stream of %zu bytes above its bound of %zu", sent, bound);
    FZ_CHECK(out.len >= 14 && !strcmp(out.p + out.len - 14, "data: [DONE]\n\n"), "stream does not end with [DONE]");
    api_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader r = {data, size};
    unsigned route = fz_byte(&r), opt = fz_byte(&r);
    api_ctx ctx = base[(route / 6) % 2];
    unsigned tk = (route / 12) % 4;
    ctx.chat = tk < 3 ? templates[tk] : NULL;
    /* half the inputs under a small --max-response-bytes: refusals, and chat's cut to what fits */
    ctx.max_response_bytes = opt & 0x80 ? 3000 + 500 * (size_t)(opt & 0x1f) : 0;
    char *body = fz_strndup(r.p, r.n);   /* the HTTP layer hands over a terminated copy */
    api_error e;
    memset(&e, 0, sizeof e);
    size_t n = 0;
    static const int kinds[4] = {API_GENERATE, API_SCORE, API_COMPLETIONS, API_CHAT};
    switch (route % 6) {
    case 4:
    case 5: {
        char *res = route % 6 == 4 ? api_tokenize(&ctx, body, r.n, &e, &n) : api_detokenize(&ctx, body, r.n, &e, &n);
        if (res) check_json(res, n, route % 6 == 4 ? "tokenize" : "detokenize");
        else check_error(&e, route % 6 == 4 ? "tokenize" : "detokenize");
        free(res);
        break;
    }
    default: {
        api_job *j = NULL;
        if (api_parse(&ctx, kinds[route % 6], body, r.n, &j, &e) == 0) {
            FZ_CHECK(j != NULL, "api_parse succeeded without a job");
            render(j, opt);
            api_job_free(j);
        } else {
            FZ_CHECK(j == NULL, "api_parse failed but returned a job");
            check_error(&e, "api_parse");
        }
    }
    }
    free(body);
    return 0;
}

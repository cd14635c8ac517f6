/*
 * render_reference.c - the oracle for tests/server/test_render.c: kda-server's response
 * rendering as it was before server/json_out.c (commit 1dc4d7b, server/api.c), one cJSON
 * node per value printed by cJSON_PrintUnformatted. Kept verbatim but for the names
 * (ref_ prefix) so the test can hold the new writer to the old bytes, and for the
 * float32 log-probs, which kda-server prints with 9 significant digits since 2026-12-07
 * (server/json_out.h): here by printf's "%.9g" (ref_float).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "render_reference.h"

/* Copies n bytes into a NUL-terminated string, replacing each invalid byte
 * (and NUL) by U+FFFD, so clients' JSON parsers never choke. */
static char *utf8_clean(const char *s, size_t n)
{
    char *out = malloc(n * 3 + 1), *o = out;
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        unsigned c = *p;
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && c != 0 && p + len <= end;
        for (int k = 1; ok && k < len; k++) ok = (p[k] & 0xC0) == 0x80;
        if (ok && len > 1) {
            unsigned cp = c & (0x7F >> len);
            for (int k = 1; k < len; k++) cp = (cp << 6) | (p[k] & 0x3F);
            ok = !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) &&
                 !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (ok) {
            memcpy(o, p, (size_t)len);
            o += len;
            p += len;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            p++;
        }
    }
    *o = '\0';
    return out;
}

/* cJSON_CreateIntArray gives NULL (and the member is dropped) for no ids. */
/* A float32 log-prob: NaN and infinities null, an integer below 10^15 as cJSON prints
 * it (its digits), anything else printf's "%.9g". */
static cJSON *ref_float(float f)
{
    double d = f;
    if (!isfinite(d) || (fabs(d) < 1e15 && d == floor(d))) return cJSON_CreateNumber(d);
    char t[40];
    snprintf(t, sizeof t, "%.9g", d);
    return cJSON_CreateRaw(t);
}

static cJSON *int_array(const int32_t *ids, int n)
{
    return n > 0 ? cJSON_CreateIntArray((const int *)ids, n) : cJSON_CreateArray();
}

static void add_text(cJSON *obj, const char *name, const char *s, size_t n)
{
    char *clean = utf8_clean(s ? s : "", s ? n : 0);
    cJSON_AddStringToObject(obj, name, clean ? clean : "");
    free(clean);
}

/* The text one id stands for, as OpenAI's logprobs "tokens" list shows it:
 * SentencePiece's word marker becomes a space and byte pieces their byte. */
static size_t token_text(const api_ctx *ctx, int32_t id, char *buf, size_t cap)
{
    const char *piece = tok_id_to_piece(ctx->tok, id);
    if (!piece) return 0;
    unsigned v;
    char tail;
    if (strlen(piece) == 6 && sscanf(piece, "<0x%2X%c", &v, &tail) == 2 && tail == '>') {
        buf[0] = (char)v;
        return 1;
    }
    size_t n = 0;
    for (const char *p = piece; *p && n + 4 < cap;) {
        if ((unsigned char)p[0] == 0xE2 && (unsigned char)p[1] == 0x96 && (unsigned char)p[2] == 0x81) {
            buf[n++] = ' ';
            p += 3;
        } else {
            buf[n++] = *p++;
        }
    }
    return n;
}
/* ---- rendering ---- */

static const char *finish_name(int kind, int finish)
{
    switch (finish) {
    case SCHED_FINISH_LENGTH: return "length";
    case SCHED_FINISH_EOS: return kind == API_GENERATE ? "eos" : "stop";   /* OpenAI has no "eos" */
    case SCHED_FINISH_STOP: return "stop";
    case SCHED_FINISH_ABORT: return "abort";
    case SCHED_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

static char *print_json(cJSON *o, size_t *len)
{
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) *len = strlen(s);
    return s;
}

/* error bodies: api_error_json itself (unchanged, still cJSON) */

/* Every digit of a 64-bit integer (cJSON prints numbers as doubles). */
static void add_i64(cJSON *o, const char *name, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    cJSON_AddRawToObject(o, name, buf);
}

/* cached: prompt tokens served from the prefix cache rather than computed
 * (OpenAI's usage.prompt_tokens_details.cached_tokens) */
static cJSON *usage(long prompt, long completion, long cached)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", (double)cached);
    return u;
}

static cJSON *timings(const sched_task *t)
{
    cJSON *o = cJSON_CreateObject();
    double first = t->t_first > 0 ? t->t_first : t->t_end;
    double admit = t->t_admit > 0 ? t->t_admit : t->t_end;
    cJSON_AddNumberToObject(o, "queue_ms", (admit - t->t_submit) * 1e3);
    cJSON_AddNumberToObject(o, "prompt_ms", (first - admit) * 1e3);
    cJSON_AddNumberToObject(o, "generation_ms", (t->t_end - first) * 1e3);
    cJSON_AddNumberToObject(o, "total_ms", (t->t_end - t->t_submit) * 1e3);
    if (t->t_first > 0) cJSON_AddNumberToObject(o, "ttft_ms", (t->t_first - t->t_submit) * 1e3);
    if (t->n_gen > 1 && t->t_end > t->t_first)
        cJSON_AddNumberToObject(o, "tokens_per_second", (t->n_gen - 1) / (t->t_end - t->t_first));
    return o;
}

/* /generate logprobs: ids, not strings, so nothing is lost to decoding. */
static cJSON *generate_logprobs(const sched_out *o, int n_top)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON *tl = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = n_top ? cJSON_AddArrayToObject(lp, "top_logprobs") : NULL;
    for (int i = 0; i < o->n; i++) {
        cJSON_AddItemToArray(tl, ref_float(o->lps[i]));
        if (!top) continue;
        cJSON *alts = cJSON_CreateArray();
        for (int k = 0; k < n_top; k++) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", o->top_ids[(size_t)i * n_top + k]);
            cJSON_AddItemToObject(a, "logprob", ref_float(o->top_lps[(size_t)i * n_top + k]));
            cJSON_AddItemToArray(alts, a);
        }
        cJSON_AddItemToArray(top, alts);
    }
    return lp;
}

/* OpenAI completions logprobs block, appended to across prompt and output. */
typedef struct { cJSON *obj, *tokens, *lps, *top, *offs; } oa_logprobs;

static void oa_init(oa_logprobs *l)
{
    l->obj = cJSON_CreateObject();
    l->tokens = cJSON_AddArrayToObject(l->obj, "tokens");
    l->lps = cJSON_AddArrayToObject(l->obj, "token_logprobs");
    l->top = cJSON_AddArrayToObject(l->obj, "top_logprobs");
    l->offs = cJSON_AddArrayToObject(l->obj, "text_offset");
}

/* One position: its id and log-prob (has_lp 0 for the first prompt token,
 * which nothing predicts) and its alternatives, the chosen id included as
 * vLLM does (lm-eval's is_greedy compares against max(top)). */
static void oa_add(const api_ctx *ctx, oa_logprobs *l, int32_t id, int has_lp, float lp, const int32_t *top_ids,
                   const float *top_lps, int n_top, size_t *off)
{
    char buf[256];
    size_t n = token_text(ctx, id, buf, sizeof buf);
    char *s = utf8_clean(buf, n);
    cJSON_AddItemToArray(l->tokens, cJSON_CreateString(s ? s : ""));
    cJSON_AddItemToArray(l->offs, cJSON_CreateNumber((double)*off));
    *off += s ? strlen(s) : 0;
    if (!has_lp) {
        cJSON_AddItemToArray(l->lps, cJSON_CreateNull());
        cJSON_AddItemToArray(l->top, cJSON_CreateNull());
        free(s);
        return;
    }
    cJSON_AddItemToArray(l->lps, ref_float(lp));
    cJSON *d = cJSON_CreateObject();
    cJSON_AddItemToObject(d, s ? s : "", ref_float(lp));
    for (int k = 0; k < n_top; k++) {
        size_t m = token_text(ctx, top_ids[k], buf, sizeof buf);
        char *a = utf8_clean(buf, m);
        if (a && !cJSON_GetObjectItemCaseSensitive(d, a)) cJSON_AddItemToObject(d, a, ref_float(top_lps[k]));
        free(a);
    }
    cJSON_AddItemToArray(l->top, d);
    free(s);
}

static void oa_add_prompt(const api_ctx *ctx, oa_logprobs *l, const sched_task *t, size_t *off)
{
    for (int i = 0; i < t->n_prompt; i++) {
        /* position 0 has no alternatives (nothing predicts it): no pointer before the array */
        const int32_t *ti = t->prompt_top_ids && i > 0 ? t->prompt_top_ids + (size_t)(i - 1) * t->n_top : NULL;
        const float *tl = t->prompt_top_lps && i > 0 ? t->prompt_top_lps + (size_t)(i - 1) * t->n_top : NULL;
        oa_add(ctx, l, t->prompt[i], i > 0, i > 0 ? t->prompt_lps[i - 1] : 0, ti, tl, i > 0 ? t->n_top : 0, off);
    }
}

static void oa_add_out(const api_ctx *ctx, oa_logprobs *l, const sched_out *o, int n_top, size_t *off)
{
    for (int i = 0; i < o->n; i++)
        oa_add(ctx, l, o->ids[i], 1, o->lps[i], n_top ? o->top_ids + (size_t)i * n_top : NULL,
               n_top ? o->top_lps + (size_t)i * n_top : NULL, n_top, off);
}

static cJSON *oa_envelope(const api_job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->kind == API_CHAT ? (j->stream ? "chat.completion.chunk" : "chat.completion")
                                                             : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->ctx->model_name);
    if (j->kind != API_SCORE) add_i64(o, "seed", j->seed);   /* not OpenAI's: what repeats the run */
    return o;
}

/* Chat logprobs: one {token, logprob, bytes, top_logprobs} per id; token is
 * the id's text (U+FFFD where it is not whole UTF-8), bytes its exact bytes. */
static cJSON *chat_token(const api_ctx *ctx, int32_t id, float lp, int with_top)
{
    char buf[256];
    size_t n = token_text(ctx, id, buf, sizeof buf);
    cJSON *t = cJSON_CreateObject();
    add_text(t, "token", buf, n);
    cJSON_AddItemToObject(t, "logprob", ref_float(lp));
    cJSON *b = cJSON_AddArrayToObject(t, "bytes");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
    if (with_top) cJSON_AddArrayToObject(t, "top_logprobs");
    return t;
}

static cJSON *chat_logprobs(const api_ctx *ctx, const sched_out *o, int n_top)
{
    cJSON *lp = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(lp, "content");
    for (int i = 0; i < o->n; i++) {
        cJSON *t = chat_token(ctx, o->ids[i], o->lps[i], 1), *top = cJSON_GetObjectItem(t, "top_logprobs");
        for (int k = 0; k < n_top; k++)
            cJSON_AddItemToArray(top, chat_token(ctx, o->top_ids[(size_t)i * n_top + k], o->top_lps[(size_t)i * n_top + k], 0));
        cJSON_AddItemToArray(content, t);
    }
    return lp;
}

/* Text of one choice: the echoed prompt (if any) and the output. */
static void add_choice_text(cJSON *ch, const char *name, const char *echo, const char *s, size_t n)
{
    size_t el = strlen(echo);
    char *text = malloc(el + n + 1);
    if (text) {
        memcpy(text, echo, el);
        if (n) memcpy(text + el, s, n);
    }
    add_text(ch, name, text, text ? el + n : 0);
    free(text);
}

/* a prompt counts once, and its cached tokens as its first choice got them */
static void usage_totals(const api_job *j, long *np, long *ng, long *nc)
{
    *np = *ng = *nc = 0;
    for (int i = 0; i < j->client->n_tasks; i++) {
        if (i % j->n == 0) *np += j->client->tasks[i].n_prompt, *nc += j->client->tasks[i].n_cached;
        *ng += j->client->tasks[i].n_gen;
    }
}

static cJSON *score_result(const sched_task *t)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "tokens", int_array(t->prompt, t->n_prompt));
    cJSON *lps = cJSON_AddArrayToObject(r, "token_logprobs");
    double sum = 0;
    for (int i = 0; i + 1 < t->n_prompt; i++) {
        cJSON_AddItemToArray(lps, ref_float(t->prompt_lps[i]));
        sum += t->prompt_lps[i];
    }
    int n = t->n_prompt - 1;
    cJSON_AddNumberToObject(r, "sum_logprob", sum);
    cJSON_AddNumberToObject(r, "nll", -sum / n);        /* mean over predicted tokens */
    cJSON_AddNumberToObject(r, "ppl", exp(-sum / n));
    return r;
}

char *ref_render(api_job *j, int *status, size_t *len)
{
    sched_client *c = j->client;
    /* A failed or aborted task fails the request: partial results would be
     * mistaken for complete ones. */
    for (int i = 0; i < c->n_tasks; i++) {
        const sched_task *t = &c->tasks[i];
        if (t->finish == SCHED_FINISH_ERROR) {
            *status = 500;
            return api_error_json(500, t->error[0] ? t->error : "engine error", len);
        }
        if (t->finish == SCHED_FINISH_ABORT) {
            *status = 503;
            return api_error_json(503, t->error[0] ? t->error : "request aborted", len);
        }
    }
    *status = 200;
    const api_ctx *ctx = j->ctx;
    cJSON *o;
    if (j->kind == API_GENERATE) {
        const sched_task *t = &c->tasks[0];
        o = cJSON_CreateObject();
        add_text(o, "text", t->out.text, t->out.len);
        cJSON_AddItemToObject(o, "tokens", int_array(t->out.ids, t->out.n));
        cJSON_AddStringToObject(o, "finish_reason", finish_name(j->kind, t->finish));
        if (j->logprobs) cJSON_AddItemToObject(o, "logprobs", generate_logprobs(&t->out, t->n_top));
        cJSON_AddItemToObject(o, "usage", usage(t->n_prompt, t->n_gen, t->n_cached));
        cJSON_AddItemToObject(o, "timings", timings(t));
        add_i64(o, "seed", j->seed);
    } else if (j->kind == API_SCORE) {
        long n_tok = 0, n_cached = 0;
        for (int i = 0; i < c->n_tasks; i++) n_tok += c->tasks[i].n_prompt, n_cached += c->tasks[i].n_cached;
        if (j->single) {
            o = score_result(&c->tasks[0]);
        } else {
            o = cJSON_CreateObject();
            cJSON *res = cJSON_AddArrayToObject(o, "results");
            for (int i = 0; i < c->n_tasks; i++) cJSON_AddItemToArray(res, score_result(&c->tasks[i]));
        }
        cJSON_AddItemToObject(o, "usage", usage(n_tok, 0, n_cached));
    } else {
        o = oa_envelope(j);
        cJSON *choices = cJSON_AddArrayToObject(o, "choices");
        for (int i = 0; i < c->n_tasks; i++) {
            const sched_task *t = &c->tasks[i];
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddNumberToObject(ch, "index", i);
            if (j->kind == API_CHAT) {
                cJSON *msg = cJSON_AddObjectToObject(ch, "message");
                cJSON_AddStringToObject(msg, "role", "assistant");
                add_text(msg, "content", t->out.text, t->out.len);
                if (j->logprobs) cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(ctx, &t->out, t->n_top));
                else cJSON_AddNullToObject(ch, "logprobs");
            } else {
                add_choice_text(ch, "text", j->echo ? j->echo_text[i / j->n] : "", t->out.text, t->out.len);
                if (j->logprobs) {
                    oa_logprobs l;
                    size_t off = 0;
                    oa_init(&l);
                    if (j->echo) oa_add_prompt(ctx, &l, t, &off);
                    oa_add_out(ctx, &l, &t->out, t->n_top, &off);
                    cJSON_AddItemToObject(ch, "logprobs", l.obj);
                } else {
                    cJSON_AddNullToObject(ch, "logprobs");
                }
            }
            cJSON_AddStringToObject(ch, "finish_reason", finish_name(j->kind, t->finish));
            cJSON_AddItemToArray(choices, ch);
        }
        long np, ng, nc;
        usage_totals(j, &np, &ng, &nc);
        cJSON_AddItemToObject(o, "usage", usage(np, ng, nc));
    }
    return print_json(o, len);
}

static void sse(api_buf *out, cJSON *o)
{
    size_t n = 0;
    char *s = print_json(o, &n);
    if (!s) return;
    api_buf_put(out, "data: ", 6);
    api_buf_put(out, s, n);
    api_buf_put(out, "\n\n", 2);
    free(s);
}

/* One SSE chunk of an OpenAI stream with a single choice; the caller fills
 * the choice. Non-final chunks carry "usage": null, or with
 * continuous_usage_stats the choice's usage so far. */
static cJSON *stream_chunk(const api_job *j, int i, cJSON **choice)
{
    cJSON *ev = oa_envelope(j), *choices = cJSON_AddArrayToObject(ev, "choices");
    *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(*choice, "index", i);
    cJSON_AddItemToArray(choices, *choice);
    const sched_task *t = &j->client->tasks[i];
    if (j->continuous_usage) cJSON_AddItemToObject(ev, "usage", usage(t->n_prompt, t->n_gen, t->n_cached));
    else cJSON_AddNullToObject(ev, "usage");
    return ev;
}

static void stream_completion(api_job *j, int i, const sched_out *o, int fin, int echo_now, api_buf *out)
{
    const api_ctx *ctx = j->ctx;
    sched_task *t = &j->client->tasks[i];
    cJSON *ch, *ev = stream_chunk(j, i, &ch);
    add_choice_text(ch, "text", echo_now ? j->echo_text[i / j->n] : "", o->text, o->len);
    if (j->logprobs) {
        oa_logprobs l;
        oa_init(&l);
        if (echo_now) oa_add_prompt(ctx, &l, t, &j->text_off[i]);
        oa_add_out(ctx, &l, o, t->n_top, &j->text_off[i]);
        cJSON_AddItemToObject(ch, "logprobs", l.obj);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (fin) cJSON_AddStringToObject(ch, "finish_reason", finish_name(j->kind, fin));
    else cJSON_AddNullToObject(ch, "finish_reason");
    sse(out, ev);
}

/* Chat: the first chunk of a choice is its role, then content deltas, then
 * an empty delta with the finish reason (OpenAI's sequence). */
static void stream_chat(api_job *j, int i, const sched_out *o, int fin, api_buf *out)
{
    const api_ctx *ctx = j->ctx;
    sched_task *t = &j->client->tasks[i];
    cJSON *ch, *ev;
    if (!j->started[i]) {
        ev = stream_chunk(j, i, &ch);
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        sse(out, ev);
        j->started[i] = 1;
    }
    if (o->n || o->len) {
        ev = stream_chunk(j, i, &ch);
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        add_text(d, "content", o->text, o->len);
        if (j->logprobs) cJSON_AddItemToObject(ch, "logprobs", chat_logprobs(ctx, o, t->n_top));
        else cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddNullToObject(ch, "finish_reason");
        sse(out, ev);
    }
    if (fin) {
        ev = stream_chunk(j, i, &ch);
        cJSON_AddObjectToObject(ch, "delta");
        cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason", finish_name(j->kind, fin));
        sse(out, ev);
    }
}

int ref_render_stream(api_job *j, api_buf *out)
{
    sched_client *c = j->client;
    int n = c->n_tasks, heartbeat;
    int fin[n];
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        fin[i] = 0;
        if (j->reported[i]) continue;
        sched_out tmp = c->tasks[i].out;
        c->tasks[i].out = j->spare[i];
        j->spare[i] = tmp;
        fin[i] = c->tasks[i].finish;
    }
    heartbeat = c->heartbeat;
    c->heartbeat = 0;
    c->dirty = 0;
    pthread_mutex_unlock(&c->mu);

    size_t before = out->len;
    int n_reported = 0;
    for (int i = 0; i < n; i++) {
        if (j->reported[i]) { n_reported++; continue; }
        sched_task *t = &c->tasks[i];
        sched_out *o = &j->spare[i];
        /* The echo chunk waits for the first output (or the end): the
         * scheduler fills the prompt's log-probs before it publishes the
         * first id, so they are final by then. */
        int echo_now = j->echo && !j->started[i] && (o->n || fin[i]);
        if (!o->n && !o->len && !fin[i] && !(j->kind == API_CHAT && !j->started[i])) continue;
        if (j->kind != API_CHAT) j->started[i] |= echo_now || !j->echo;
        if (fin[i] == SCHED_FINISH_ERROR || (fin[i] == SCHED_FINISH_ABORT && t->error[0])) {
            size_t el = 0;
            char *ej = api_error_json(fin[i] == SCHED_FINISH_ERROR ? 500 : 503, t->error, &el);
            if (ej) {
                api_buf_put(out, "data: ", 6);
                api_buf_put(out, ej, el);
                api_buf_put(out, "\n\n", 2);
                free(ej);
            }
        } else if (j->kind == API_GENERATE) {
            cJSON *ev = cJSON_CreateObject();
            add_text(ev, "text", o->text, o->len);
            cJSON_AddItemToObject(ev, "tokens", int_array(o->ids, o->n));
            if (j->logprobs) cJSON_AddItemToObject(ev, "logprobs", generate_logprobs(o, t->n_top));
            if (fin[i]) {
                cJSON_AddStringToObject(ev, "finish_reason", finish_name(j->kind, fin[i]));
                cJSON_AddItemToObject(ev, "usage", usage(t->n_prompt, t->n_gen, t->n_cached));
                cJSON_AddItemToObject(ev, "timings", timings(t));
                add_i64(ev, "seed", j->seed);
            }
            sse(out, ev);
        } else if (j->kind == API_CHAT) {
            stream_chat(j, i, o, fin[i], out);
        } else {
            stream_completion(j, i, o, fin[i], echo_now, out);
        }
        o->len = 0;
        o->n = 0;
        if (fin[i]) { j->reported[i] = 1; n_reported++; }
    }
    if (n_reported == n) {
        if ((j->kind == API_COMPLETIONS || j->kind == API_CHAT) && j->include_usage) {
            long np, ng, nc;
            usage_totals(j, &np, &ng, &nc);
            cJSON *ev = oa_envelope(j);
            cJSON_AddArrayToObject(ev, "choices");
            cJSON_AddItemToObject(ev, "usage", usage(np, ng, nc));
            sse(out, ev);
        }
        api_buf_put(out, "data: [DONE]\n\n", 14);
        j->ended = 1;
        return 1;
    }
    if (out->len == before && heartbeat) api_buf_put(out, ": keep-alive\n\n", 14);
    return 0;
}


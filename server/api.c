/*
 * api.c - request parsing/validation and response rendering (see api.h).
 *
 * Field conventions: JSON null means "not given" (clients send it for unset
 * optional fields). Text inputs get BOS when add_bos (default true); token
 * inputs are used verbatim unless add_bos is explicitly true. In text, the
 * tokenizer's BOS/EOS strings ("<s>", "</s>") stand for their ids, as Hugging
 * Face tokenizers (and so vLLM) read them. Defaults follow the OpenAI
 * completions API: max_tokens 16, temperature 1. A sampling field this server
 * does not implement is a 400 naming it (never silently ignored); other
 * unknown fields are ignored, as OpenAI-compatible servers do.
 */
#include "api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fields.h"
#include "json_body.h"
#include "json_text.h"
#include "json_out.h"
#include "log.h"

#define API_MAX_STOPS 16
#define API_MAX_STOP_LEN 256
#define API_MAX_TOP 20
#define API_MAX_N 16
#define API_MAX_BIAS (KDA_MAX_LOGIT_BIAS - 1)   /* one entry is kept for min_tokens' EOS ban */

int api_buf_put(api_buf *b, const char *s, size_t n)
{
    json_raw(b, s, n);
    return b->failed ? -1 : 0;
}

void api_buf_free(api_buf *b) { json_buf_free(b); }

static int fail(api_error *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(api_error *e, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = status;
    e->param[0] = '\0';
    return -1;
}

/* Same, naming the request field at fault (error.param). */
static int fail_p(api_error *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail_p(api_error *e, int status, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param);
    return -1;
}

/* "[1,2,3]", malloc'd. */
static char *ids_json(const int32_t *ids, int n)
{
    char *s = malloc((size_t)n * 12 + 3), *p = s;
    if (!s) return NULL;
    *p++ = '[';
    for (int i = 0; i < n; i++) p += sprintf(p, i ? ",%d" : "%d", (int)ids[i]);
    *p++ = ']';
    *p = '\0';
    return s;
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

/* ---- field readers: NULL / 0 when absent, -1 with a message when invalid ---- */

/* "prompt[3]" -> "prompt": error.param names the request field. */
static const char *field_root(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%.*s", (int)strcspn(name, "["), name);
    return buf;
}


static cJSON *field(const cJSON *o, const char *name)
{
    cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static int get_num(const cJSON *o, const char *name, double lo, double hi, int lo_open, double *v, api_error *e)
{
    cJSON *f = field(o, name);
    if (!f) return 0;
    double x = f->valuedouble;
    if (!cJSON_IsNumber(f) || !isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return fail_p(e, 400, name, "\"%s\" must be a number in %c%g, %g]", name, lo_open ? '(' : '[', lo, hi);
    *v = x;
    return 0;
}

static int get_int(const cJSON *o, const char *name, long lo, long hi, long *v, api_error *e)
{
    cJSON *f = field(o, name);
    if (!f) return 0;
    double x = f->valuedouble;
    if (!cJSON_IsNumber(f) || x != floor(x) || x < (double)lo || x > (double)hi)
        return fail_p(e, 400, name, "\"%s\" must be an integer in [%ld, %ld]", name, lo, hi);
    *v = (long)x;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *v, api_error *e)
{
    cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return fail_p(e, 400, name, "\"%s\" must be true or false", name);
    *v = cJSON_IsTrue(f);
    return 0;
}

static int get_tokens(const api_ctx *ctx, const cJSON *arr, const char *name, int32_t **ids, int *n, api_error *e)
{
    int count = cJSON_GetArraySize(arr);
    int32_t *out = malloc((size_t)(count + 1) * sizeof *out);
    if (!out) return fail(e, 500, "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double x = it->valuedouble;
        if (!cJSON_IsNumber(it) || x != floor(x) || x < 0 || x >= ctx->vocab_size) {
            free(out);
            char root[48];
            return fail_p(e, 400, field_root(name, root, sizeof root), "\"%s[%d]\" must be an integer token id in [0, %d]",
                          name, i, ctx->vocab_size - 1);
        }
        out[i++] = (int32_t)x;
    }
    *ids = out;
    *n = i;
    return 0;
}

/* The next occurrence of a special-token string at or after p: its id and
 * length, or NULL. */
static const char *next_special(const api_ctx *ctx, const char *p, int32_t *id, size_t *len)
{
    const char *best = NULL;
    const struct { const char *s; int id; } sp[2] = {{ctx->specials.bos, ctx->bos_id}, {ctx->specials.eos, ctx->eos_id}};
    for (int k = 0; k < 2; k++) {
        if (!sp[k].s[0] || sp[k].id < 0) continue;
        const char *q = strstr(p, sp[k].s);
        if (q && (!best || q < best)) { best = q; *id = sp[k].id; *len = strlen(sp[k].s); }
    }
    return best;
}

/* Room for `need` ids in *out (capacity *cap), doubling as it grows. */
static int ids_reserve(int32_t **out, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap * 2 > need ? *cap * 2 : need;
    int32_t *o = realloc(*out, c * sizeof *o);
    if (!o) return -1;
    *out = o;
    *cap = c;
    return 0;
}

/* Text -> ids, with the model's BOS in front when asked. Special-token
 * strings become their ids; the text between them is encoded piece by piece
 * (SentencePiece then adds its word-start marker to each piece, as Hugging
 * Face's Llama tokenizer does after a special token). */
/* max_tokens: a text certain to need more is refused unencoded; cap_name
 * says where the cap comes from. */
static int encode_capped(const api_ctx *ctx, const char *text, int add_bos, int max_tokens, const char *cap_name,
                         int32_t **ids, int *n, api_error *e)
{
    char err[256] = "";
    int bos = add_bos && ctx->bos_id >= 0;
    size_t text_len = strlen(text);
    /* refused before the ids (4 bytes each, twice over) are built */
    if (max_tokens > 0 && ctx->max_piece_bytes > 0 && text_len / (size_t)ctx->max_piece_bytes > (size_t)max_tokens)
        return fail_p(e, 400, "prompt", "the text is %zu bytes, so at least %zu tokens: it exceeds %s (%d tokens)",
                      text_len, text_len / (size_t)ctx->max_piece_bytes, cap_name, max_tokens);
    size_t cap = text_len + 2;
    int32_t *out = malloc(cap * sizeof *out);
    if (!out) return fail(e, 500, "out of memory");
    int k = 0;
    if (bos) out[k++] = ctx->bos_id;
    const char *p = text;
    while (*p) {
        int32_t sid = -1;
        size_t slen = 0;
        const char *sp = next_special(ctx, p, &sid, &slen);
        size_t seg = sp ? (size_t)(sp - p) : strlen(p);
        if (seg) {
            int32_t *raw = NULL;
            int n_raw = 0;
            if (tok_encode(ctx->tok, p, seg, 0, &raw, &n_raw, err, sizeof err) != 0) {
                free(out);
                return fail(e, 400, "could not tokenize the prompt: %s", err);
            }
            if (ids_reserve(&out, &cap, (size_t)k + (size_t)n_raw) != 0) {
                free(raw);
                free(out);
                return fail(e, 500, "out of memory");
            }
            if (n_raw) memcpy(out + k, raw, (size_t)n_raw * sizeof *out);
            k += n_raw;
            free(raw);
        }
        if (!sp) break;
        /* a run of special tokens with no text between them ("</s><s><s>")
         * needs room too: the segment's reserve may have left exactly none */
        if (ids_reserve(&out, &cap, (size_t)k + 1) != 0) {
            free(out);
            return fail(e, 500, "out of memory");
        }
        out[k++] = sid;
        p = sp + slen;
    }
    *ids = out;
    *n = k;
    return 0;
}

/* Prompts: a text that cannot fit the context is refused unencoded. */
static int encode(const api_ctx *ctx, const char *text, int add_bos, int32_t **ids, int *n, api_error *e)
{
    return encode_capped(ctx, text, add_bos, ctx->max_seq_len, "the context length", ids, n, e);
}

/* "cache_prompt": false bypasses the prefix cache for every task of the
 * request (the llama.cpp server's name for the same switch). */
static int read_cache_prompt(const cJSON *o, api_job *j, api_error *e)
{
    int on = 1;
    if (get_bool(o, "cache_prompt", &on, e)) return -1;
    for (int i = 0; i < j->client->n_tasks; i++) j->client->tasks[i].no_cache = !on;
    return 0;
}

/* ---- generation parameters shared by /generate and /v1/completions ---- */

typedef struct {
    long max_tokens;
    double temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    long top_k;
    int has_seed;
    int64_t seed;
    char *stops[API_MAX_STOPS];
    int n_stops;
    int ignore_eos;
    long min_tokens;
    kda_logit_bias *bias;
    int n_bias;
} gen_params;

static void gen_params_free(gen_params *g)
{
    for (int i = 0; i < g->n_stops; i++) free(g->stops[i]);
    g->n_stops = 0;
    free(g->bias);
    g->bias = NULL;
    g->n_bias = 0;
}

/* OpenAI logit_bias: {"token id": bias in [-100, 100]}. */
static int parse_logit_bias(const api_ctx *ctx, const cJSON *o, gen_params *g, api_error *e)
{
    const cJSON *lb = field(o, "logit_bias");
    if (!lb) return 0;
    if (!cJSON_IsObject(lb))
        return fail_p(e, 400, "logit_bias", "\"logit_bias\" must be an object mapping token ids to biases in [-100, 100]");
    int n = cJSON_GetArraySize(lb);
    if (n > API_MAX_BIAS) return fail_p(e, 400, "logit_bias", "\"logit_bias\" may hold at most %d entries", API_MAX_BIAS);
    g->bias = malloc((size_t)(n ? n : 1) * sizeof *g->bias);
    if (!g->bias) return fail(e, 500, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, lb) {
        char *end;
        long id = strtol(it->string, &end, 10);
        if (!it->string[0] || *end || id < 0 || id >= ctx->vocab_size)
            return fail_p(e, 400, "logit_bias", "\"logit_bias\" key \"%.40s\" must be a token id in [0, %d]", it->string,
                          ctx->vocab_size - 1);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return fail_p(e, 400, "logit_bias", "\"logit_bias\" value for token %ld must be a number in [-100, 100]", id);
        g->bias[g->n_bias++] = (kda_logit_bias){(int32_t)id, (float)it->valuedouble};
    }
    return 0;
}

static int add_stop(gen_params *g, const cJSON *s, api_error *e)
{
    if (!cJSON_IsString(s))
        return fail_p(e, 400, "stop", "\"stop\" must be a string or an array of up to %d strings", API_MAX_STOPS);
    size_t n = strlen(s->valuestring);
    if (n == 0 || n > API_MAX_STOP_LEN)
        return fail_p(e, 400, "stop", "\"stop\" strings must be 1 to %d bytes long", API_MAX_STOP_LEN);
    if (g->n_stops == API_MAX_STOPS) return fail_p(e, 400, "stop", "\"stop\" may hold at most %d strings", API_MAX_STOPS);
    g->stops[g->n_stops] = strdup(s->valuestring);
    if (!g->stops[g->n_stops]) return fail(e, 500, "out of memory");
    g->n_stops++;
    return 0;
}

/* The request body's text, for what cJSON's doubles lose (json_body.h). */
typedef struct { const char *p; size_t n; } body_src;

/* Seeds are int64 as vLLM takes them (negative ones too), read exactly from
 * the body's text: cJSON's double would round anything beyond 2^53. */
static int get_seed(const body_src *src, const cJSON *o, gen_params *g, api_error *e)
{
    const cJSON *s = field(o, "seed");
    if (!s) return 0;
    const char *text;
    size_t n;
    int64_t v;
    if (!cJSON_IsNumber(s) || json_body_member_text(src->p, src->n, o, "seed", &text, &n) || json_exact_int64(text, n, &v))
        return fail_p(e, 400, "seed", "\"seed\" must be an integer in [-9223372036854775808, 9223372036854775807]");
    g->has_seed = 1;
    g->seed = v;
    return 0;
}

static int parse_gen_params(const api_ctx *ctx, const cJSON *o, const body_src *src, gen_params *g, api_error *e)
{
    *g = (gen_params){.max_tokens = 16, .temperature = 1, .top_p = 1, .repetition_penalty = 1};
    if (get_int(o, "max_tokens", 0, ctx->max_seq_len, &g->max_tokens, e) ||
        get_num(o, "temperature", 0, 100, 0, &g->temperature, e) ||
        get_num(o, "top_p", 0, 1, 1, &g->top_p, e) ||
        get_num(o, "min_p", 0, 1, 0, &g->min_p, e) ||
        get_num(o, "repetition_penalty", 0, 10, 1, &g->repetition_penalty, e) ||
        get_num(o, "presence_penalty", -2, 2, 0, &g->presence_penalty, e) ||
        get_num(o, "frequency_penalty", -2, 2, 0, &g->frequency_penalty, e) ||
        get_int(o, "top_k", -1, ctx->vocab_size, &g->top_k, e) ||
        get_bool(o, "ignore_eos", &g->ignore_eos, e) ||
        get_int(o, "min_tokens", 0, ctx->max_seq_len, &g->min_tokens, e) || get_seed(src, o, g, e))
        return -1;
    if (g->top_k < 0) g->top_k = 0;   /* vLLM spells "off" as -1 */
    if (parse_logit_bias(ctx, o, g, e)) { gen_params_free(g); return -1; }
    cJSON *stop = field(o, "stop");
    if (stop) {
        if (cJSON_IsArray(stop)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, stop)
                if (add_stop(g, it, e)) { gen_params_free(g); return -1; }
        } else if (add_stop(g, stop, e)) {
            gen_params_free(g);
            return -1;
        }
    }
    return 0;
}

static int check_min_tokens(const gen_params *g, api_error *e)
{
    if (g->min_tokens <= g->max_tokens) return 0;
    return fail_p(e, 400, "min_tokens", "\"min_tokens\" (%ld) must not exceed max_tokens (%ld)", g->min_tokens,
                  g->max_tokens);
}

/* Requests without a seed still get a distinct one each, echoed so the run
 * can be repeated. Below 2^53, so clients that read JSON numbers as doubles
 * (JavaScript, the playground) can send it back unchanged. */
static int64_t random_seed(void)
{
    static _Atomic uint64_t counter;
    uint64_t c = atomic_fetch_add(&counter, 1);
    return (int64_t)(kda_splitmix64((uint64_t)(srv_wall() * 1e9) ^ kda_splitmix64(c)) >> 11);
}

/* The seed the request's tasks draw with: the one sent, else a fresh one;
 * choice c of n draws with seed + c (mod 2^64), so the one echoed seed
 * repeats every choice. */
static int64_t request_seed(api_job *j, const gen_params *g)
{
    j->seed = g->has_seed ? g->seed : random_seed();
    return j->seed;
}

static uint64_t choice_seed(int64_t base, int c) { return (uint64_t)base + (uint64_t)c; }

static int check_context(const api_ctx *ctx, int n_prompt, long max_tokens, int index, int many, api_error *e)
{
    char which[32] = "";
    if (many) snprintf(which, sizeof which, " %d", index);
    if (n_prompt == 0) {
        if (ctx->bos_id >= 0)
            return fail_p(e, 400, "prompt", "prompt%s is empty and there is no BOS token to start from (set \"add_bos\": true)",
                          which);
        return fail_p(e, 400, "prompt", "prompt%s is empty: this model has no BOS token, so a prompt needs at least one token",
                      which);
    }
    if ((long)n_prompt + max_tokens > ctx->max_seq_len)
        return fail_p(e, 400, n_prompt > ctx->max_seq_len ? "prompt" : "max_tokens", "prompt%s (%d tokens) + max_tokens (%ld) = %ld exceeds the context length %d",
                      which, n_prompt, max_tokens, (long)n_prompt + max_tokens, ctx->max_seq_len);
    return 0;
}

/* ---- jobs ---- */

void api_job_free(api_job *j)
{
    if (!j) return;
    if (j->client) {
        if (j->spare)
            for (int i = 0; i < j->client->n_tasks; i++) sched_out_free(&j->spare[i]);
        sched_client_unref(j->client);
    }
    if (j->echo_text)
        for (int i = 0; i < j->n_inputs; i++) free(j->echo_text[i]);
    free(j->echo_text);
    free(j->spare);
    free(j->reported);
    free(j->started);
    free(j->text_off);
    free(j);
}

/* One prompt as ids plus (for echo) its text. */
typedef struct {
    int32_t *ids;
    int n;
    char *text;             /* sent as text: that text; sent as ids: "" until echo_text decodes them */
    int from_ids;
} input;

/* The text echo shows for a prompt sent as ids: decoding 8192 ids costs more than the
 * rest of the request's parse, so only echo pays for it. "" where they do not decode. */
static int echo_text(const api_ctx *ctx, input *in, api_error *e)
{
    char err[256], *text = NULL;
    if (!in->from_ids) return 0;
    if (tok_decode(ctx->tok, in->ids, in->n, &text, err, sizeof err) != 0) return 0;
    free(in->text);
    in->text = text;
    return in->text ? 0 : fail(e, 500, "out of memory");
}

static int job_alloc(api_job *j, int n_tasks)
{
    j->client = sched_client_new(n_tasks);
    j->spare = calloc((size_t)n_tasks, sizeof *j->spare);
    j->reported = calloc((size_t)n_tasks, sizeof *j->reported);
    j->started = calloc((size_t)n_tasks, sizeof *j->started);
    j->text_off = calloc((size_t)n_tasks, sizeof *j->text_off);
    j->echo_text = calloc((size_t)j->n_inputs, sizeof *j->echo_text);
    return j->client && j->spare && j->reported && j->started && j->text_off && j->echo_text ? 0 : -1;
}

static void fill_task(const api_ctx *ctx, sched_task *t, const gen_params *g, const input *in, uint64_t seed)
{
    t->min_tokens = (int)g->min_tokens;
    t->max_tokens = (int)g->max_tokens;
    t->temperature = (float)g->temperature;
    t->top_p = (float)g->top_p;
    t->min_p = (float)g->min_p;
    t->repetition_penalty = (float)g->repetition_penalty;
    t->presence_penalty = (float)g->presence_penalty;
    t->frequency_penalty = (float)g->frequency_penalty;
    t->top_k = (int)g->top_k;
    t->seed = seed;
    t->ignore_eos = g->ignore_eos;
    t->eos_id = ctx->eos_id;
    t->t_submit = srv_now();
    (void)in;
}

static int copy_prompt(sched_task *t, const input *in)
{
    t->prompt = malloc((size_t)(in->n ? in->n : 1) * sizeof *t->prompt);
    if (!t->prompt) return -1;
    memcpy(t->prompt, in->ids, (size_t)in->n * sizeof *t->prompt);
    t->n_prompt = in->n;
    return 0;
}

static int copy_stops_and_bias(sched_task *t, const gen_params *g)
{
    if (g->n_bias) {
        t->logit_bias = malloc((size_t)g->n_bias * sizeof *t->logit_bias);
        if (!t->logit_bias) return -1;
        memcpy(t->logit_bias, g->bias, (size_t)g->n_bias * sizeof *t->logit_bias);
        t->n_logit_bias = g->n_bias;
    }
    if (!g->n_stops) return 0;
    t->stops = calloc((size_t)g->n_stops, sizeof *t->stops);
    if (!t->stops) return -1;
    for (int k = 0; k < g->n_stops; k++) {
        t->stops[k] = strdup(g->stops[k]);
        if (!t->stops[k]) return -1;
        t->n_stops = k + 1;
    }
    return 0;
}

/* Reads one prompt: a string (tokenized) or an array of ids. */
static int read_input(const api_ctx *ctx, const cJSON *v, const char *name, int add_bos, int bos_given,
                      input *in, api_error *e)
{
    char root[48];
    if (cJSON_IsString(v)) {
        if (encode(ctx, v->valuestring, add_bos, &in->ids, &in->n, e)) return -1;
        in->text = strdup(v->valuestring);
    } else if (cJSON_IsArray(v)) {
        int32_t *ids;
        int n;
        if (get_tokens(ctx, v, name, &ids, &n, e)) return -1;
        int bos = bos_given && add_bos && ctx->bos_id >= 0;
        in->ids = malloc((size_t)(n + bos + 1) * sizeof *in->ids);
        if (!in->ids) { free(ids); return fail(e, 500, "out of memory"); }
        if (bos) in->ids[0] = ctx->bos_id;
        memcpy(in->ids + bos, ids, (size_t)n * sizeof *ids);
        free(ids);
        in->n = n + bos;
        in->from_ids = 1;
    } else {
        return fail_p(e, 400, field_root(name, root, sizeof root), "\"%s\" must be a string or an array of token ids", name);
    }
    if (!in->text) in->text = strdup("");
    return in->text ? 0 : fail(e, 500, "out of memory");
}

/* Each element of the JSON array arr into ins[i], named "FIELD[i]" in errors;
 * strings_only: every element must be a string (else text or token ids). */
static int read_input_list(const api_ctx *ctx, const cJSON *arr, const char *field, int add_bos, int bos_given,
                           int strings_only, input *ins, api_error *e)
{
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        char name[48];
        snprintf(name, sizeof name, "%s[%d]", field, i);
        if (strings_only && !cJSON_IsString(it)) return fail_p(e, 400, field, "\"%s\" must be a string", name);
        if (read_input(ctx, it, name, add_bos, bos_given, &ins[i], e)) return -1;
        i++;
    }
    return 0;
}

static void inputs_free(input *ins, int n)
{
    if (!ins) return;
    for (int i = 0; i < n; i++) { free(ins[i].ids); free(ins[i].text); }
    free(ins);
}

/* One model per server: a request naming another one is a 404, as vLLM
 * answers. Fields read only to be ignored (user, parallel_tool_calls) still
 * get their type checked, so a malformed request is never a 200. */
static int check_model(const api_ctx *ctx, const cJSON *o, api_error *e)
{
    const cJSON *u = field(o, "user"), *ptc = field(o, "parallel_tool_calls");
    if (u && !cJSON_IsString(u)) return fail_p(e, 400, "user", "\"user\" must be a string");
    if (ptc && !cJSON_IsBool(ptc)) return fail_p(e, 400, "parallel_tool_calls", "\"parallel_tool_calls\" must be true or false");
    const cJSON *m = field(o, "model");
    if (m && !cJSON_IsString(m)) return fail_p(e, 400, "model", "\"model\" must be a string");
    if (m && strcmp(m->valuestring, ctx->model_name))
        return fail_p(e, 404, "model", "The model `%.200s` does not exist (this server serves \"%s\")", m->valuestring,
                      ctx->model_name);
    return 0;
}

static int parse_generate(const api_ctx *ctx, const cJSON *o, const body_src *src, api_job *j, api_error *e)
{
    gen_params g;
    int add_bos = 1, bos_given = 0, rc = -1;
    long n_top = 0;
    if (check_model(ctx, o, e)) return -1;
    input *in = calloc(1, sizeof *in);
    if (!in) return fail(e, 500, "out of memory");
    if (parse_gen_params(ctx, o, src, &g, e)) { free(in); return -1; }
    if (check_min_tokens(&g, e) || get_bool(o, "stream", &j->stream, e) || get_bool(o, "add_bos", &add_bos, e)) goto out;
    bos_given = field(o, "add_bos") != NULL;
    cJSON *lp = field(o, "logprobs");
    if (lp) {
        if (cJSON_IsBool(lp)) j->logprobs = cJSON_IsTrue(lp);
        else if (get_int(o, "logprobs", 0, API_MAX_TOP, &n_top, e)) {
            snprintf(e->message, sizeof e->message,
                     "\"logprobs\" must be true, false or an integer in [0, %d] (alternatives per token)", API_MAX_TOP);
            goto out;
        } else j->logprobs = 1;
    }
    j->n_top = (int)n_top;
    cJSON *p = field(o, "prompt"), *t = field(o, "tokens");
    if (!!p == !!t) { fail(e, 400, "exactly one of \"prompt\" (string) or \"tokens\" (array of ids) is required"); goto out; }
    if (p && !cJSON_IsString(p)) { fail_p(e, 400, "prompt", "\"prompt\" must be a string"); goto out; }
    if (t && !cJSON_IsArray(t)) { fail_p(e, 400, "tokens", "\"tokens\" must be an array of token ids"); goto out; }
    if (read_input(ctx, p ? p : t, p ? "prompt" : "tokens", add_bos, p ? 1 : bos_given, in, e)) goto out;
    if (check_context(ctx, in->n, g.max_tokens, 0, 0, e)) goto out;
    j->n_inputs = 1;
    j->n = 1;
    if (job_alloc(j, 1)) { fail(e, 500, "out of memory"); goto out; }
    sched_task *task = &j->client->tasks[0];
    fill_task(ctx, task, &g, in, choice_seed(request_seed(j, &g), 0));
    task->logprobs = j->logprobs;
    task->n_top = j->n_top;
    if (copy_prompt(task, in) || copy_stops_and_bias(task, &g)) { fail(e, 500, "out of memory"); goto out; }
    if (read_cache_prompt(o, j, e)) goto out;
    rc = 0;
out:
    gen_params_free(&g);
    inputs_free(in, 1);
    return rc;
}

static int parse_score(const api_ctx *ctx, const cJSON *o, api_job *j, api_error *e)
{
    int add_bos = 1, rc = -1, n = 0;
    input *ins = NULL;
    if (check_model(ctx, o, e) || get_bool(o, "add_bos", &add_bos, e)) return -1;
    int bos_given = field(o, "add_bos") != NULL;
    cJSON *text = field(o, "text"), *toks = field(o, "tokens"), *texts = field(o, "texts");
    if (!!text + !!toks + !!texts != 1)
        return fail(e, 400, "exactly one of \"text\" (string), \"tokens\" (array of ids) or \"texts\" (array of strings) is required");
    if (text && !cJSON_IsString(text)) return fail_p(e, 400, "text", "\"text\" must be a string");
    if (toks && !cJSON_IsArray(toks)) return fail_p(e, 400, "tokens", "\"tokens\" must be an array of token ids");
    if (texts && (!cJSON_IsArray(texts) || cJSON_GetArraySize(texts) == 0 ||
                  cJSON_GetArraySize(texts) > ctx->max_tasks))
        return fail_p(e, 400, "texts", "\"texts\" must be an array of 1 to %d strings", ctx->max_tasks);
    n = texts ? cJSON_GetArraySize(texts) : 1;
    ins = calloc((size_t)n, sizeof *ins);
    if (!ins) return fail(e, 500, "out of memory");
    j->single = !texts;
    if (texts) {
        if (read_input_list(ctx, texts, "texts", add_bos, 1, 1, ins, e)) goto out;
    } else if (read_input(ctx, text ? text : toks, text ? "text" : "tokens", add_bos, text ? 1 : bos_given, &ins[0], e)) {
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (ins[i].n < 2) {
            if (texts) fail(e, 400, "\"texts[%d]\" must have at least 2 tokens (BOS included) to score", i);
            else fail(e, 400, "the input must have at least 2 tokens (BOS included) to score");
            goto out;
        }
        if (check_context(ctx, ins[i].n, 0, i, n > 1, e)) goto out;
    }
    j->n_inputs = n;
    j->n = 1;
    if (job_alloc(j, n)) { fail(e, 500, "out of memory"); goto out; }
    gen_params g = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    for (int i = 0; i < n; i++) {
        sched_task *t = &j->client->tasks[i];
        fill_task(ctx, t, &g, &ins[i], 0);
        t->prompt_logprobs = 1;
        if (copy_prompt(t, &ins[i])) { fail(e, 500, "out of memory"); goto out; }
    }
    if (read_cache_prompt(o, j, e)) goto out;
    rc = 0;
out:
    inputs_free(ins, n);
    return rc;
}

/* stream_options: include_usage adds a final usage chunk; with
 * continuous_usage_stats too, every chunk carries its choice's usage so far
 * (vLLM's rule: the second needs the first). */
static int parse_stream_options(const cJSON *o, api_job *j, api_error *e)
{
    cJSON *so = field(o, "stream_options");
    if (!so) return 0;
    if (!cJSON_IsObject(so)) return fail_p(e, 400, "stream_options", "\"stream_options\" must be an object");
    int cont = 0;
    if (get_bool(so, "include_usage", &j->include_usage, e) || get_bool(so, "continuous_usage_stats", &cont, e))
        return -1;
    j->continuous_usage = cont && j->include_usage;
    return 0;
}

static int parse_completions(const api_ctx *ctx, const cJSON *o, const body_src *src, api_job *j, api_error *e)
{
    gen_params g;
    long n = 1, n_top = -1;
    int rc = -1, n_in = 0;
    input *ins = NULL;
    if (check_model(ctx, o, e)) return -1;
    if (parse_gen_params(ctx, o, src, &g, e)) return -1;
    if (check_min_tokens(&g, e) || get_int(o, "n", 1, API_MAX_N, &n, e) || get_int(o, "logprobs", 0, API_MAX_TOP, &n_top, e) ||
        get_bool(o, "echo", &j->echo, e) || get_bool(o, "stream", &j->stream, e))
        goto out;
    if (field(o, "best_of") && (!cJSON_IsNumber(field(o, "best_of")) || field(o, "best_of")->valuedouble != n)) {
        fail_p(e, 400, "best_of", "\"best_of\" is not supported (only best_of == n)");
        goto out;
    }
    if (field(o, "suffix")) { fail_p(e, 400, "suffix", "\"suffix\" is not supported"); goto out; }
    if (parse_stream_options(o, j, e)) goto out;
    j->logprobs = n_top >= 0;
    j->n_top = n_top > 0 ? (int)n_top : 0;

    cJSON *p = field(o, "prompt");
    if (!p) { fail_p(e, 400, "prompt", "\"prompt\" is required (a string, an array of strings or of token ids)"); goto out; }
    /* string | [string] | [id] | [[id]] */
    int list_of_prompts = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 &&
                          (cJSON_IsString(cJSON_GetArrayItem(p, 0)) || cJSON_IsArray(cJSON_GetArrayItem(p, 0)));
    n_in = list_of_prompts ? cJSON_GetArraySize(p) : 1;
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 0) { fail_p(e, 400, "prompt", "\"prompt\" must not be an empty array"); goto out; }
    if ((long)n_in * n > ctx->max_tasks) {
        fail_p(e, 400, "n", "prompts x n = %ld sequences; at most %d per request", (long)n_in * n, ctx->max_tasks);
        goto out;
    }
    ins = calloc((size_t)n_in, sizeof *ins);
    if (!ins) { fail(e, 500, "out of memory"); goto out; }
    if (list_of_prompts) {
        if (read_input_list(ctx, p, "prompt", 1, 0, 0, ins, e)) goto out;
    } else if (read_input(ctx, p, "prompt", 1, 0, &ins[0], e)) {
        goto out;
    }
    for (int i = 0; i < n_in; i++)
        if (check_context(ctx, ins[i].n, g.max_tokens, i, n_in > 1, e)) goto out;
    j->n_inputs = n_in;
    j->n = (int)n;
    if (job_alloc(j, n_in * (int)n)) { fail(e, 500, "out of memory"); goto out; }
    int64_t base = request_seed(j, &g);
    for (int i = 0; i < n_in; i++) {
        if (j->echo && echo_text(ctx, &ins[i], e)) goto out;
        j->echo_text[i] = ins[i].text;
        ins[i].text = NULL;
        for (int c = 0; c < n; c++) {
            sched_task *t = &j->client->tasks[i * n + c];
            fill_task(ctx, t, &g, &ins[i], choice_seed(base, c));
            t->logprobs = j->logprobs;
            t->n_top = j->n_top;
            t->prompt_logprobs = j->echo && j->logprobs;
            if (copy_prompt(t, &ins[i]) || copy_stops_and_bias(t, &g)) { fail(e, 500, "out of memory"); goto out; }
        }
    }
    if (read_cache_prompt(o, j, e)) goto out;
    rc = 0;
out:
    gen_params_free(&g);
    inputs_free(ins, n_in);
    return rc;
}

/* ---- chat ---- */

/* messages -> the array the template sees: role a string; content a string
 * (text parts joined by newlines, as vLLM does), or null (an assistant turn
 * with tool_calls); other members (name, tool_calls, ...) kept as sent. */
static int chat_messages(const cJSON *o, cJSON **out, api_error *e)
{
    const cJSON *ms = field(o, "messages");
    if (!ms || !cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0)
        return fail_p(e, 400, "messages", "\"messages\" must be a non-empty array of {\"role\", \"content\"} objects");
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return fail(e, 500, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            cJSON_Delete(arr);
            return fail_p(e, 400, "messages", "\"messages[%d]\" must be an object with a string \"role\"", i);
        }
        cJSON *c = cJSON_Duplicate(m, 1);
        if (!c) { cJSON_Delete(arr); return fail(e, 500, "out of memory"); }
        cJSON_AddItemToArray(arr, c);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!content || cJSON_IsNull(content) || cJSON_IsString(content)) {
            if (!content) cJSON_AddNullToObject(c, "content");
            i++;
            continue;
        }
        if (!cJSON_IsArray(content)) {
            cJSON_Delete(arr);
            return fail_p(e, 400, "messages",
                          "\"messages[%d].content\" must be a string, null or an array of {\"type\": \"text\"} parts", i);
        }
        api_buf text = {0};
        int k = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t)) {
                api_buf_free(&text);
                cJSON_Delete(arr);
                return fail_p(e, 400, "messages",
                              "\"messages[%d].content[%d]\": only {\"type\": \"text\", \"text\": ...} parts are supported (this "
                              "is a text model)", i, k);
            }
            if (k++ && api_buf_put(&text, "\n", 1)) { api_buf_free(&text); cJSON_Delete(arr); return fail(e, 500, "out of memory"); }
            if (api_buf_put(&text, t->valuestring, strlen(t->valuestring))) {
                api_buf_free(&text);
                cJSON_Delete(arr);
                return fail(e, 500, "out of memory");
            }
        }
        cJSON_ReplaceItemInObjectCaseSensitive(c, "content", cJSON_CreateString(text.p ? text.p : ""));
        api_buf_free(&text);
        i++;
    }
    *out = arr;
    return 0;
}

/* The prompt text of a chat request (also used by /tokenize with messages). */
static int chat_prompt(const api_ctx *ctx, const cJSON *o, char **text, api_error *e)
{
    if (!ctx->chat)
        return fail(e, 400, "this model has no chat template (no chat_template in its tokenizer_config.json, no "
                            "chat_template.jinja), so chat requests cannot be formatted; start kda-server with "
                            "--chat-template NAME (%s) or --chat-template FILE.jinja", chat_builtin_names());
    int add_gen = 1, cont = 0;
    if (get_bool(o, "add_generation_prompt", &add_gen, e) || get_bool(o, "continue_final_message", &cont, e)) return -1;
    if (add_gen && cont && field(o, "add_generation_prompt"))
        return fail_p(e, 400, "continue_final_message",
                      "\"continue_final_message\" and \"add_generation_prompt\" cannot both be true");
    if (cont) add_gen = 0;
    const cJSON *kw = field(o, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw)) return fail_p(e, 400, "chat_template_kwargs", "\"chat_template_kwargs\" must be an object");
    cJSON *msgs = NULL;
    if (chat_messages(o, &msgs, e)) return -1;
    cJSON *extra = kw ? cJSON_Duplicate(kw, 1) : cJSON_CreateObject();
    const cJSON *tools = field(o, "tools");
    if (extra && tools) cJSON_AddItemToObject(extra, "tools", cJSON_Duplicate(tools, 1));
    char err[400] = "";
    int rc = extra ? chat_render(ctx->chat, msgs, add_gen, cont, extra, &ctx->specials, text, err, sizeof err) : -1;
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    if (rc == -2) return fail_p(e, 400, "messages", "%s", err);
    if (rc) return fail_p(e, 400, "messages", "chat template %s: %s", chat_template_name(ctx->chat), err);
    return 0;
}

static int parse_chat(const api_ctx *ctx, const cJSON *o, const body_src *src, api_job *j, api_error *e)
{
    gen_params g;
    long n = 1, n_top = 0, mct = -1;
    int rc = -1, add_special = 0, lp = 0;
    input *in = NULL;
    char *text = NULL;
    if (check_model(ctx, o, e)) return -1;
    if (parse_gen_params(ctx, o, src, &g, e)) return -1;
    if (get_int(o, "max_completion_tokens", 0, ctx->max_seq_len, &mct, e) || get_int(o, "n", 1, API_MAX_N, &n, e) ||
        get_bool(o, "logprobs", &lp, e) || get_int(o, "top_logprobs", 0, API_MAX_TOP, &n_top, e) ||
        get_bool(o, "stream", &j->stream, e) || get_bool(o, "echo", &j->echo, e) ||
        get_bool(o, "add_special_tokens", &add_special, e) || parse_stream_options(o, j, e))
        goto out;
    if (field(o, "top_logprobs") && !lp) {
        fail_p(e, 400, "top_logprobs", "\"top_logprobs\" needs \"logprobs\": true");
        goto out;
    }
    if (j->echo) { fail_p(e, 400, "echo", "\"echo\" is not supported on /v1/chat/completions"); goto out; }
    const cJSON *rf = field(o, "response_format");
    if (rf) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(type) || strcmp(type->valuestring, "text")) {
            fail_p(e, 400, "response_format", "\"response_format\": only {\"type\": \"text\"} is supported (no "
                                              "structured output)");
            goto out;
        }
    }
    const cJSON *tools = field(o, "tools"), *tc = field(o, "tool_choice");
    if (tools && !cJSON_IsArray(tools)) { fail_p(e, 400, "tools", "\"tools\" must be an array"); goto out; }
    if ((tools && cJSON_GetArraySize(tools) > 0) || tc) {
        if (!tc || !cJSON_IsString(tc) || strcmp(tc->valuestring, "none")) {
            fail_p(e, 400, "tool_choice", "tool calls are not supported: with \"tools\", \"tool_choice\" must be \"none\"");
            goto out;
        }
    }
    j->logprobs = lp;
    j->n_top = (int)n_top;
    if (chat_prompt(ctx, o, &text, e)) goto out;
    in = calloc(1, sizeof *in);
    if (!in) { fail(e, 500, "out of memory"); goto out; }
    if (encode(ctx, text, add_special, &in->ids, &in->n, e)) goto out;
    /* max_completion_tokens is OpenAI's newer name; without either, the
     * reply may fill the context (vLLM's default) */
    if (mct >= 0 && field(o, "max_tokens") && mct != g.max_tokens) {
        fail_p(e, 400, "max_completion_tokens", "\"max_tokens\" and \"max_completion_tokens\" disagree");
        goto out;
    }
    if (mct >= 0) g.max_tokens = mct;
    else if (!field(o, "max_tokens")) {
        g.max_tokens = ctx->max_seq_len - in->n > 0 ? ctx->max_seq_len - in->n : 0;
        j->implicit_max_tokens = 1;
    }
    if (check_min_tokens(&g, e) || check_context(ctx, in->n, g.max_tokens, 0, 0, e)) goto out;
    if (n > ctx->max_tasks) { fail_p(e, 400, "n", "n = %ld sequences; at most %d per request", n, ctx->max_tasks); goto out; }
    j->n_inputs = 1;
    j->n = (int)n;
    if (job_alloc(j, (int)n)) { fail(e, 500, "out of memory"); goto out; }
    int64_t base = request_seed(j, &g);
    for (int c = 0; c < n; c++) {
        sched_task *t = &j->client->tasks[c];
        fill_task(ctx, t, &g, in, choice_seed(base, c));
        t->logprobs = j->logprobs;
        t->n_top = j->n_top;
        if (copy_prompt(t, in) || copy_stops_and_bias(t, &g)) { fail(e, 500, "out of memory"); goto out; }
    }
    if (read_cache_prompt(o, j, e)) goto out;
    rc = 0;
out:
    free(text);
    gen_params_free(&g);
    inputs_free(in, in ? 1 : 0);
    return rc;
}

/* --max-response-bytes: what the answer could take, worked out before any of
 * it is computed (response_bound.c). */
static int check_response_bound(const api_ctx *ctx, api_job *j, api_error *e)
{
    if (!ctx->max_response_bytes) return 0;
    size_t bound = api_response_bound(j);
    if (bound <= ctx->max_response_bytes) return 0;
    sched_client *c = j->client;
    if (j->implicit_max_tokens) {
        /* A chat request without max_tokens asked for nothing in particular: it
         * gets the most tokens that fit (the bound grows by the same amount per
         * token of max_tokens), ending with "length" there. */
        int asked = c->tasks[0].max_tokens;
        for (int i = 0; i < c->n_tasks; i++) c->tasks[i].max_tokens = 0;
        size_t b0 = api_response_bound(j);
        for (int i = 0; i < c->n_tasks; i++) c->tasks[i].max_tokens = 1;
        size_t per_token = api_response_bound(j) - b0;
        long fit = b0 < ctx->max_response_bytes ? (long)((ctx->max_response_bytes - b0) / per_token) : 0;
        if (fit > asked) fit = asked;
        for (int i = 0; i < c->n_tasks; i++) c->tasks[i].max_tokens = (int)fit;
        if (fit >= 1 && fit >= c->tasks[0].min_tokens) return 0;
        for (int i = 0; i < c->n_tasks; i++) c->tasks[i].max_tokens = asked;
    }
    long prompt = 0;
    for (int i = 0; i < c->n_tasks; i++) prompt += c->tasks[i].n_prompt;
    if (j->kind == API_SCORE)
        return fail_p(e, 400, j->single ? "tokens" : "texts",
                      "the response could take up to %zu bytes (%d texts, %ld tokens with their log-probs): above the "
                      "limit of %zu bytes (--max-response-bytes); send fewer texts", bound, c->n_tasks, prompt,
                      ctx->max_response_bytes);
    return fail_p(e, 400, "max_tokens",
                  "the response could take up to %zu bytes (%d choices x (max_tokens %d%s%s)%s): above the limit of "
                  "%zu bytes (--max-response-bytes); lower max_tokens, n, the number of prompts%s",
                  bound, c->n_tasks, c->tasks[0].max_tokens, j->echo ? " + the echoed prompt" : "",
                  j->logprobs && j->n_top ? ", with log-probs and top alternatives" : j->logprobs ? ", with log-probs" : "",
                  j->stream ? ", streamed" : "", ctx->max_response_bytes,
                  j->logprobs ? " or the alternatives per token (logprobs / top_logprobs)" : "");
}

/* Every body: one JSON object, nothing after it, no NUL in any string. */
static cJSON *parse_object(const char *body, size_t len, api_error *e)
{
    cJSON *o = json_body_parse(body, len, e->message, sizeof e->message, e->param, sizeof e->param);
    if (!o) e->status = 400;
    return o;
}

int api_parse(const api_ctx *ctx, int kind, const char *body, size_t len, api_job **out, api_error *e)
{
    *out = NULL;
    cJSON *o = parse_object(body, len, e);
    if (!o) return -1;
    const body_src src = {body, len};
    api_job *j = calloc(1, sizeof *j);
    if (!j) { cJSON_Delete(o); return fail(e, 500, "out of memory"); }
    j->kind = kind;
    j->ctx = ctx;
    j->created = (long)srv_wall();
    static _Atomic unsigned long next_id;
    snprintf(j->id, sizeof j->id, "%s-%016llx", kind == API_COMPLETIONS ? "cmpl" : kind == API_CHAT ? "chatcmpl" : "req",
             (unsigned long long)kda_splitmix64((uint64_t)random_seed() ^ atomic_fetch_add(&next_id, 1)));
    int rc = api_check_fields(kind, o, e);
    if (!rc)
        rc = kind == API_GENERATE ? parse_generate(ctx, o, &src, j, e)
           : kind == API_SCORE ? parse_score(ctx, o, j, e)
           : kind == API_CHAT ? parse_chat(ctx, o, &src, j, e)
           : parse_completions(ctx, o, &src, j, e);
    cJSON_Delete(o);
    if (!rc) rc = check_response_bound(ctx, j, e);
    if (rc) { api_job_free(j); return -1; }
    j->client->stream = j->stream;
    *out = j;
    return 0;
}

/* ---- rendering ----
 *
 * Responses are written straight into one growing buffer (json_out.h), byte for byte
 * what cJSON_PrintUnformatted gave for the same members (tests/server/test_render.c
 * holds them to the cJSON renderer they replaced): a cJSON node per log-prob cost
 * more than scoring 8192 tokens on the GPU. Members are in the order clients have seen. */

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

char *api_error_json_param(int status, const char *message, const char *param, size_t *len)
{
    const char *type = status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 503 ? "service_unavailable"
                     : status >= 500 ? "server_error" : "invalid_request_error";
    cJSON *o = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(o, "error");
    add_text(err, "message", message, strlen(message));
    cJSON_AddStringToObject(err, "type", type);
    if (param && param[0]) add_text(err, "param", param, strlen(param));   /* may be a client's field name, cut at 64 bytes */
    else cJSON_AddNullToObject(err, "param");
    cJSON_AddNumberToObject(err, "code", status);
    return print_json(o, len);
}

char *api_error_json(int status, const char *message, size_t *len)
{
    return api_error_json_param(status, message, NULL, len);
}

/* A token's text, cached at load (api_ctx_init): its JSON string and the length of
 * the text it stands for. */
static const api_token_entry *token_entry(const api_ctx *ctx, int32_t id)
{
    static const api_token_entry empty = {0, 2, 0, "\"\""};
    const api_token_strings *ts = ctx->strings;
    return id >= 0 && id < ts->n ? &ts->ids[id] : &empty;
}

static const char *token_json(const api_ctx *ctx, const api_token_entry *t)
{
    return t->json_len <= API_TOKEN_HEAD ? t->head : ctx->strings->json + t->json;
}

static void put_key(json_buf *b, const char *key)   /* "key": for the fixed member names */
{
    json_char(b, '"');
    json_lit(b, key);
    json_raw(b, "\":", 2);
}

/* s (n bytes, NULL for none) as cleaned UTF-8, like add_text */
static void put_text(json_buf *b, const char *s, size_t n) { json_text(b, s ? s : "", s ? n : 0); }

/* Hot loops write through a pointer into room reserved per element: at most
 * ELEM_ROOM bytes for a number or punctuation, plus a token string's length. */
enum { ELEM_ROOM = JSON_NUMBER_MAX + 8 };

static char *put_end(json_buf *b, char *o)   /* the pointer back into the buffer */
{
    *o = '\0';
    b->len = (size_t)(o - b->p);
    return o;
}

/* the token's JSON string (room: its length + 32); most from the entry itself */
static char *put_token(const api_ctx *ctx, char *o, const api_token_entry *t)
{
    if (t->json_len <= API_TOKEN_HEAD) memcpy(o, t->head, API_TOKEN_HEAD);
    else memcpy(o, ctx->strings->json + t->json, t->json_len);
    return o + t->json_len;
}

static void put_ids(json_buf *b, const int32_t *ids, int n)
{
    if (json_reserve(b, (size_t)n * 12 + 2)) return;
    char *o = b->p + b->len;
    *o++ = '[';
    for (int i = 0; i < n; i++) {
        if (i) *o++ = ',';
        o = json_put_int(o, ids[i]);
    }
    *o++ = ']';
    put_end(b, o);
}

static void put_floats(json_buf *b, const float *v, int n)
{
    if (json_reserve(b, (size_t)n * (JSON_NUMBER_MAX + 1) + 2)) return;
    char *o = b->p + b->len;
    *o++ = '[';
    for (int i = 0; i < n; i++) {
        if (i) *o++ = ',';
        o = json_put_float(o, v[i]);
    }
    *o++ = ']';
    put_end(b, o);
}

/* A count, as cJSON prints (double)v. */
static void put_count(json_buf *b, long long v)
{
    if (v > -1000000000000000LL && v < 1000000000000000LL) json_int(b, v);
    else json_number(b, (double)v);
}

/* cached: prompt tokens served from the prefix cache rather than computed
 * (OpenAI's usage.prompt_tokens_details.cached_tokens) */
static void put_usage(json_buf *b, long prompt, long completion, long cached)
{
    json_lit(b, "{\"prompt_tokens\":");
    put_count(b, prompt);
    json_lit(b, ",\"completion_tokens\":");
    put_count(b, completion);
    json_lit(b, ",\"total_tokens\":");
    put_count(b, prompt + completion);
    json_lit(b, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    put_count(b, cached);
    json_lit(b, "}}");
}

static void put_timings(json_buf *b, const sched_task *t)
{
    double first = t->t_first > 0 ? t->t_first : t->t_end;
    double admit = t->t_admit > 0 ? t->t_admit : t->t_end;
    json_lit(b, "{\"queue_ms\":");
    json_number(b, (admit - t->t_submit) * 1e3);
    json_lit(b, ",\"prompt_ms\":");
    json_number(b, (first - admit) * 1e3);
    json_lit(b, ",\"generation_ms\":");
    json_number(b, (t->t_end - first) * 1e3);
    json_lit(b, ",\"total_ms\":");
    json_number(b, (t->t_end - t->t_submit) * 1e3);
    if (t->t_first > 0) {
        json_lit(b, ",\"ttft_ms\":");
        json_number(b, (t->t_first - t->t_submit) * 1e3);
    }
    if (t->n_gen > 1 && t->t_end > t->t_first) {
        json_lit(b, ",\"tokens_per_second\":");
        json_number(b, (t->n_gen - 1) / (t->t_end - t->t_first));
    }
    json_char(b, '}');
}

/* Every digit of a 64-bit integer (a double would round it). */
static void put_i64_member(json_buf *b, const char *name, int64_t v)
{
    json_char(b, ',');
    put_key(b, name);
    json_int(b, v);
}

/* /generate logprobs: ids, not strings, so nothing is lost to decoding. */
static void put_generate_logprobs(json_buf *b, const sched_out *o, int n_top)
{
    json_lit(b, "{\"token_logprobs\":[");
    for (int i = 0; i < o->n; i++) {
        if (i) json_char(b, ',');
        json_float(b, o->lps[i]);
    }
    json_char(b, ']');
    if (n_top) {
        json_lit(b, ",\"top_logprobs\":[");
        for (int i = 0; i < o->n; i++) {
            json_raw(b, i ? ",[" : "[", i ? 2 : 1);
            for (int k = 0; k < n_top; k++) {
                json_lit(b, k ? ",{\"id\":" : "{\"id\":");
                json_int(b, o->top_ids[(size_t)i * n_top + k]);
                json_lit(b, ",\"logprob\":");
                json_float(b, o->top_lps[(size_t)i * n_top + k]);
                json_char(b, '}');
            }
            json_char(b, ']');
        }
        json_char(b, ']');
    }
    json_char(b, '}');
}

/* OpenAI completions logprobs over a run of positions: the prompt's (echo; position 0
 * has no log-prob, nothing predicts it) then the output's. */
typedef struct {
    const sched_task *prompt;   /* NULL: no prompt positions */
    const sched_out *out;
    int n_top;                  /* alternatives of the output positions */
} oa_positions;

typedef struct { int32_t id; int has_lp; float lp; const int32_t *top_ids; const float *top_lps; int n_top; } oa_pos;

static int oa_count(const oa_positions *ps) { return (ps->prompt ? ps->prompt->n_prompt : 0) + ps->out->n; }

static oa_pos oa_at(const oa_positions *ps, int i)
{
    const sched_task *t = ps->prompt;
    int np = t ? t->n_prompt : 0;
    if (i < np) {
        if (i == 0) return (oa_pos){t->prompt[0], 0, 0, NULL, NULL, 0};
        /* no pointer before the arrays: position i's alternatives are at i - 1 */
        return (oa_pos){t->prompt[i], 1, t->prompt_lps[i - 1],
                        t->prompt_top_ids ? t->prompt_top_ids + (size_t)(i - 1) * t->n_top : NULL,
                        t->prompt_top_lps ? t->prompt_top_lps + (size_t)(i - 1) * t->n_top : NULL, t->n_top};
    }
    const sched_out *o = ps->out;
    int k = i - np, n = ps->n_top;
    return (oa_pos){o->ids[k], 1, o->lps[k], n ? o->top_ids + (size_t)k * n : NULL, n ? o->top_lps + (size_t)k * n : NULL, n};
}

/* Two alternatives are one key of the JSON object when their texts are equal, byte
 * for byte, as a Python dict (vLLM's) keeps them. ("The" and "the" are two keys: the
 * cJSON renderer this replaced folded ASCII case, which dropped the second, and with it
 * lm-eval's is_greedy saw no better alternative when the model preferred the other case.)
 * Compared on the escaped JSON strings, which are equal exactly when the texts are. */
static int same_key(const api_ctx *ctx, const api_token_entry *a, const api_token_entry *b)
{
    if (a == b) return 1;
    return a->json_len == b->json_len && !memcmp(token_json(ctx, a), token_json(ctx, b), a->json_len);
}

/* One position's alternatives, the chosen id first as vLLM does (lm-eval's is_greedy
 * compares against max(top)); an alternative whose text is already a key is left out.
 * Room: (1 + n_top) * (max_json + ELEM_ROOM). */
static char *oa_put_top(const api_ctx *ctx, char *o, const oa_pos *p)
{
    const api_token_entry *keys[API_MAX_TOP + 1];
    int n_keys = 0;
    const api_token_entry *s = token_entry(ctx, p->id);
    *o++ = '{';
    o = put_token(ctx, o, s);
    *o++ = ':';
    o = json_put_float(o, p->lp);
    keys[n_keys++] = s;
    for (int k = 0; k < p->n_top; k++) {
        const api_token_entry *a = token_entry(ctx, p->top_ids[k]);
        int dup = 0;
        for (int q = 0; q < n_keys && !dup; q++) dup = same_key(ctx, keys[q], a);
        if (dup) continue;
        keys[n_keys++] = a;
        *o++ = ',';
        o = put_token(ctx, o, a);
        *o++ = ':';
        o = json_put_float(o, p->top_lps[k]);
    }
    *o++ = '}';
    return o;
}

/* The entries a position a few ahead will read: random ids of a large vocabulary miss
 * the cache, and these loops do little else. */
static void oa_prefetch(const api_ctx *ctx, const oa_positions *ps, int i, int n, int with_top)
{
    if (i >= n) return;
    oa_pos p = oa_at(ps, i);
    __builtin_prefetch(token_entry(ctx, p.id));
    if (with_top && p.has_lp)
        for (int k = 0; k < p.n_top; k++) __builtin_prefetch(token_entry(ctx, p.top_ids[k]));
}

/* {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; *off is the text offset
 * of the first position, and afterwards of the one after the last. */
static void put_oa_logprobs(const api_ctx *ctx, json_buf *b, const oa_positions *ps, size_t *off)
{
    int n = oa_count(ps), most_top = ps->n_top > (ps->prompt ? ps->prompt->n_top : 0) ? ps->n_top : ps->prompt ? ps->prompt->n_top : 0;
    size_t tok_room = ctx->strings->max_json + ELEM_ROOM, top_room = (size_t)(1 + most_top) * tok_room + 4;
    char *o;
    json_lit(b, "{\"tokens\":[");
    for (int i = 0; i < n; i++) {
        oa_prefetch(ctx, ps, i + 8, n, 0);
        if (json_reserve(b, tok_room)) return;
        o = b->p + b->len;
        if (i) *o++ = ',';
        put_end(b, put_token(ctx, o, token_entry(ctx, oa_at(ps, i).id)));
    }
    json_lit(b, "],\"token_logprobs\":[");
    if (json_reserve(b, (size_t)n * ELEM_ROOM)) return;
    o = b->p + b->len;
    for (int i = 0; i < n; i++) {
        oa_pos p = oa_at(ps, i);
        if (i) *o++ = ',';
        if (p.has_lp) o = json_put_float(o, p.lp);
        else memcpy(o, "null", 4), o += 4;
    }
    put_end(b, o);
    json_lit(b, "],\"top_logprobs\":[");
    for (int i = 0; i < n; i++) {
        oa_prefetch(ctx, ps, i + 4, n, 1);
        if (json_reserve(b, top_room)) return;
        o = b->p + b->len;
        oa_pos p = oa_at(ps, i);
        if (i) *o++ = ',';
        if (p.has_lp) o = oa_put_top(ctx, o, &p);
        else memcpy(o, "null", 4), o += 4;
        put_end(b, o);
    }
    json_lit(b, "],\"text_offset\":[");
    if (json_reserve(b, (size_t)n * ELEM_ROOM)) return;
    o = b->p + b->len;
    for (int i = 0; i < n; i++) {
        if (i) *o++ = ',';
        o = json_put_int(o, (int64_t)*off);   /* below 10^15: what cJSON printed */
        *off += token_entry(ctx, oa_at(ps, i).id)->text_len;
    }
    put_end(b, o);
    json_lit(b, "]}");
}

/* {"id", "object", "created", "model", "seed" (not OpenAI's: what repeats the run), */
static void put_envelope(json_buf *b, const api_job *j)
{
    json_lit(b, "{\"id\":");
    json_str(b, j->id, strlen(j->id));
    json_lit(b, ",\"object\":");
    json_lit(b, j->kind == API_CHAT ? (j->stream ? "\"chat.completion.chunk\"" : "\"chat.completion\"")
                                    : "\"text_completion\"");
    json_lit(b, ",\"created\":");
    put_count(b, j->created);
    json_lit(b, ",\"model\":");
    json_str(b, j->ctx->model_name, strlen(j->ctx->model_name));
    if (j->kind != API_SCORE) put_i64_member(b, "seed", j->seed);
}

/* Chat logprobs: one {token, logprob, bytes, top_logprobs} per id; token is the id's
 * text (U+FFFD where it is not whole UTF-8), bytes its exact bytes. */
static void put_chat_token(const api_ctx *ctx, json_buf *b, int32_t id, float lp)
{
    char buf[256];
    size_t n = token_text(ctx, id, buf, sizeof buf);
    json_lit(b, "{\"token\":");
    json_text(b, buf, n);
    json_lit(b, ",\"logprob\":");
    json_float(b, lp);
    json_lit(b, ",\"bytes\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) json_char(b, ',');
        json_int(b, (unsigned char)buf[i]);
    }
    json_char(b, ']');
}

static void put_chat_logprobs(const api_ctx *ctx, json_buf *b, const sched_out *o, int n_top)
{
    json_lit(b, "{\"content\":[");
    for (int i = 0; i < o->n; i++) {
        if (i) json_char(b, ',');
        put_chat_token(ctx, b, o->ids[i], o->lps[i]);
        json_lit(b, ",\"top_logprobs\":[");
        for (int k = 0; k < n_top; k++) {
            if (k) json_char(b, ',');
            put_chat_token(ctx, b, o->top_ids[(size_t)i * n_top + k], o->top_lps[(size_t)i * n_top + k]);
            json_char(b, '}');
        }
        json_lit(b, "]}");
    }
    json_lit(b, "]}");
}

/* Text of one choice: the echoed prompt (if any) and the output, cleaned as one text
 * (a character may straddle the two). */
static void put_choice_text(json_buf *b, const char *echo, const char *s, size_t n)
{
    size_t el = strlen(echo);
    if (!n) { json_text(b, echo, el); return; }
    char *text = malloc(el + n + 1);
    if (!text) { b->failed = 1; return; }
    memcpy(text, echo, el);
    memcpy(text + el, s, n);
    json_text(b, text, el + n);
    free(text);
}

static void put_finish(json_buf *b, int kind, int finish)
{
    const char *name = finish_name(kind, finish);
    if (!name) return;   /* cJSON dropped a member whose string was NULL */
    json_lit(b, ",\"finish_reason\":\"");
    json_lit(b, name);
    json_char(b, '"');
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

/* "tokens", "token_logprobs", "sum_logprob", "nll", "ppl" (no braces) */
static void put_score_result(json_buf *b, const sched_task *t)
{
    json_lit(b, "\"tokens\":");
    put_ids(b, t->prompt, t->n_prompt);
    json_lit(b, ",\"token_logprobs\":");
    int n = t->n_prompt - 1;
    put_floats(b, t->prompt_lps, n > 0 ? n : 0);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t->prompt_lps[i];
    json_lit(b, ",\"sum_logprob\":");
    json_number(b, sum);
    json_lit(b, ",\"nll\":");
    json_number(b, -sum / n);   /* mean over predicted tokens */
    json_lit(b, ",\"ppl\":");
    json_number(b, exp(-sum / n));
}

static void put_generate(json_buf *b, const api_job *j, const sched_task *t, const sched_out *o, int fin)
{
    json_lit(b, "{\"text\":");
    put_text(b, o->text, o->len);
    json_lit(b, ",\"tokens\":");
    put_ids(b, o->ids, o->n);
    if (!j->stream) put_finish(b, j->kind, fin);
    if (j->logprobs) {
        json_lit(b, ",\"logprobs\":");
        put_generate_logprobs(b, o, t->n_top);
    }
    if (j->stream) {
        if (!fin) { json_char(b, '}'); return; }
        put_finish(b, j->kind, fin);
    }
    json_lit(b, ",\"usage\":");
    put_usage(b, t->n_prompt, t->n_gen, t->n_cached);
    json_lit(b, ",\"timings\":");
    put_timings(b, t);
    put_i64_member(b, "seed", j->seed);
    json_char(b, '}');
}

static void put_choice(json_buf *b, const api_job *j, int i)
{
    const api_ctx *ctx = j->ctx;
    const sched_task *t = &j->client->tasks[i];
    json_lit(b, "{\"index\":");
    json_int(b, i);
    if (j->kind == API_CHAT) {
        json_lit(b, ",\"message\":{\"role\":\"assistant\",\"content\":");
        put_text(b, t->out.text, t->out.len);
        json_lit(b, "},\"logprobs\":");
        if (j->logprobs) put_chat_logprobs(ctx, b, &t->out, t->n_top);
        else json_lit(b, "null");
    } else {
        json_lit(b, ",\"text\":");
        put_choice_text(b, j->echo ? j->echo_text[i / j->n] : "", t->out.text, t->out.len);
        json_lit(b, ",\"logprobs\":");
        if (j->logprobs) {
            oa_positions ps = {j->echo ? t : NULL, &t->out, t->n_top};
            size_t off = 0;
            put_oa_logprobs(ctx, b, &ps, &off);
        } else {
            json_lit(b, "null");
        }
    }
    put_finish(b, j->kind, t->finish);
    json_char(b, '}');
}

static void put_score_item(json_buf *b, const api_job *j, int i)
{
    json_char(b, '{');
    put_score_result(b, &j->client->tasks[i]);
    json_char(b, '}');
}

/* What rendering task i writes, in values (a position's token, log-prob and offset,
 * each alternative): what decides whether a response is rendered in parallel. */
static long render_work(const api_job *j, int i)
{
    const sched_task *t = &j->client->tasks[i];
    if (j->kind == API_SCORE) return t->n_prompt;
    if (!j->logprobs) return t->out.n;
    long n = t->out.n + (j->echo && j->kind == API_COMPLETIONS ? t->n_prompt : 0);
    return n * (2 + t->n_top);
}

/* Large bodies of several choices (or /score results) are rendered one item per
 * buffer by up to render_threads threads, this one included, then joined in
 * order: the bytes are those of the loop below. Helper threads are counted over
 * all responses, so a burst of large requests never holds more than
 * render_threads of them; where none is free, or one cannot start, this thread
 * renders what is left. */
static atomic_int render_helpers;
static atomic_long render_helpers_started;

long api_render_helpers_started(void) { return atomic_load(&render_helpers_started); }

typedef struct {
    const api_job *j;
    void (*put)(json_buf *, const api_job *, int);
    json_buf *bufs;
    atomic_int next;
} render_pool;

static void *render_items(void *arg)
{
    render_pool *w = arg;
    const int n = w->j->client->n_tasks;
    for (int i; (i = atomic_fetch_add(&w->next, 1)) < n;) w->put(&w->bufs[i], w->j, i);
    return NULL;
}

static void put_items(json_buf *b, const api_job *j, void (*put)(json_buf *, const api_job *, int))
{
    const int n = j->client->n_tasks;
    int helpers = 0;
    if (n > 1 && j->ctx->render_threads > 1) {
        long work = 0;
        for (int i = 0; i < n; i++) work += render_work(j, i);
        if (work >= j->ctx->render_min_work) {
            helpers = (n < j->ctx->render_threads ? n : j->ctx->render_threads) - 1;
            int held = atomic_fetch_add(&render_helpers, helpers);
            int free_ = j->ctx->render_threads - held;
            if (free_ < helpers) {
                const int give = helpers - (free_ > 0 ? free_ : 0);
                atomic_fetch_sub(&render_helpers, give);
                helpers -= give;
            }
        }
    }
    json_buf *bufs = helpers ? calloc((size_t)n, sizeof *bufs) : NULL;
    if (!bufs) {
        if (helpers) atomic_fetch_sub(&render_helpers, helpers);
        for (int i = 0; i < n; i++) {
            if (i) json_char(b, ',');
            put(b, j, i);
        }
        return;
    }
    render_pool w = {.j = j, .put = put, .bufs = bufs};
    atomic_init(&w.next, 0);
    pthread_t th[64];
    if (helpers > 64) atomic_fetch_sub(&render_helpers, helpers - 64), helpers = 64;
    int started = 0;
    for (; started < helpers; started++)
        if (pthread_create(&th[started], NULL, render_items, &w)) break;
    if (started < helpers) atomic_fetch_sub(&render_helpers, helpers - started);
    atomic_fetch_add(&render_helpers_started, started);
    render_items(&w);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    atomic_fetch_sub(&render_helpers, started);
    for (int i = 0; i < n; i++) {
        if (i) json_char(b, ',');
        if (bufs[i].failed) b->failed = 1;
        else if (bufs[i].len) json_raw(b, bufs[i].p, bufs[i].len);
        json_buf_free(&bufs[i]);
    }
    free(bufs);
}

char *api_render(api_job *j, int *status, size_t *len)
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
    json_buf b = {0};
    if (j->kind == API_GENERATE) {
        put_generate(&b, j, &c->tasks[0], &c->tasks[0].out, c->tasks[0].finish);
    } else if (j->kind == API_SCORE) {
        long n_tok = 0, n_cached = 0;
        for (int i = 0; i < c->n_tasks; i++) n_tok += c->tasks[i].n_prompt, n_cached += c->tasks[i].n_cached;
        if (j->single) {
            json_char(&b, '{');
            put_score_result(&b, &c->tasks[0]);
        } else {
            json_lit(&b, "{\"results\":[");
            put_items(&b, j, put_score_item);
            json_char(&b, ']');
        }
        json_lit(&b, ",\"usage\":");
        put_usage(&b, n_tok, 0, n_cached);
        json_char(&b, '}');
    } else {
        put_envelope(&b, j);
        json_lit(&b, ",\"choices\":[");
        put_items(&b, j, put_choice);
        long np, ng, nc;
        usage_totals(j, &np, &ng, &nc);
        json_lit(&b, "],\"usage\":");
        put_usage(&b, np, ng, nc);
        json_char(&b, '}');
    }
    if (b.failed) { json_buf_free(&b); return NULL; }
    *len = b.len;
    return b.p;
}

/* ---- streams: one "data: {...}\n\n" event per chunk ---- */

/* An OpenAI stream chunk with a single choice: put_chunk_begin writes up to the
 * choice's index, the caller its other members, put_chunk_end the rest. Non-final
 * chunks carry "usage": null, or with continuous_usage_stats the choice's usage so far. */
static void put_chunk_begin(json_buf *b, const api_job *j, int i)
{
    json_lit(b, "data: ");
    put_envelope(b, j);
    json_lit(b, ",\"choices\":[{\"index\":");
    json_int(b, i);
}

static void put_chunk_end(json_buf *b, const api_job *j, int i)
{
    const sched_task *t = &j->client->tasks[i];
    json_lit(b, "}],\"usage\":");
    if (j->continuous_usage) put_usage(b, t->n_prompt, t->n_gen, t->n_cached);
    else json_lit(b, "null");
    json_lit(b, "}\n\n");
}

static void put_stream_finish(json_buf *b, int kind, int fin)
{
    if (fin) put_finish(b, kind, fin);
    else json_lit(b, ",\"finish_reason\":null");
}

static void stream_completion(api_job *j, int i, const sched_out *o, int fin, int echo_now, api_buf *out)
{
    sched_task *t = &j->client->tasks[i];
    put_chunk_begin(out, j, i);
    json_lit(out, ",\"text\":");
    put_choice_text(out, echo_now ? j->echo_text[i / j->n] : "", o->text, o->len);
    json_lit(out, ",\"logprobs\":");
    if (j->logprobs) {
        oa_positions ps = {echo_now ? t : NULL, o, t->n_top};
        put_oa_logprobs(j->ctx, out, &ps, &j->text_off[i]);
    } else {
        json_lit(out, "null");
    }
    put_stream_finish(out, j->kind, fin);
    put_chunk_end(out, j, i);
}

/* Chat: the first chunk of a choice is its role, then content deltas, then
 * an empty delta with the finish reason (OpenAI's sequence). */
static void stream_chat(api_job *j, int i, const sched_out *o, int fin, api_buf *out)
{
    sched_task *t = &j->client->tasks[i];
    if (!j->started[i]) {
        put_chunk_begin(out, j, i);
        json_lit(out, ",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null");
        put_chunk_end(out, j, i);
        j->started[i] = 1;
    }
    if (o->n || o->len) {
        put_chunk_begin(out, j, i);
        json_lit(out, ",\"delta\":{\"content\":");
        put_text(out, o->text, o->len);
        json_lit(out, "},\"logprobs\":");
        if (j->logprobs) put_chat_logprobs(j->ctx, out, o, t->n_top);
        else json_lit(out, "null");
        json_lit(out, ",\"finish_reason\":null");
        put_chunk_end(out, j, i);
    }
    if (fin) {
        put_chunk_begin(out, j, i);
        json_lit(out, ",\"delta\":{},\"logprobs\":null");
        put_finish(out, j->kind, fin);
        put_chunk_end(out, j, i);
    }
}

int api_render_stream(api_job *j, api_buf *out)
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
            json_lit(out, "data: ");
            put_generate(out, j, t, o, fin[i]);
            json_lit(out, "\n\n");
        } else if (j->kind == API_CHAT) {
            stream_chat(j, i, o, fin[i], out);
        } else {
            stream_completion(j, i, o, fin[i], echo_now, out);
        }
        o->len = 0;
        o->n = 0;
        if (fin[i]) { j->reported[i] = 1; n_reported++; }
    }
    int done = n_reported == n;
    if (done) {
        if ((j->kind == API_COMPLETIONS || j->kind == API_CHAT) && j->include_usage) {
            long np, ng, nc;
            usage_totals(j, &np, &ng, &nc);
            json_lit(out, "data: ");
            put_envelope(out, j);
            json_lit(out, ",\"choices\":[],\"usage\":");
            put_usage(out, np, ng, nc);
            json_lit(out, "}\n\n");
        }
        api_buf_put(out, "data: [DONE]\n\n", 14);
        j->ended = 1;
    } else if (out->len == before && heartbeat) {
        api_buf_put(out, ": keep-alive\n\n", 14);
    }
    if (out->failed) {   /* out of memory: these events are lost, the buffer stays usable */
        srv_log(SRV_LOG_WARN, "%s: out of memory rendering stream events", j->id);
        out->failed = 0;
        out->len = before;
        if (out->p) out->p[before] = '\0';
    }
    return done;
}

/* ---- small endpoints ---- */

static cJSON *pieces_of(const api_ctx *ctx, const int32_t *ids, int n)
{
    cJSON *p = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        const char *s = tok_id_to_piece(ctx->tok, ids[i]);
        char *clean = utf8_clean(s ? s : "", s ? strlen(s) : 0);
        cJSON_AddItemToArray(p, cJSON_CreateString(clean ? clean : ""));
        free(clean);
    }
    return p;
}

/* vLLM's /tokenize (prompt or messages; add_special_tokens; token_strs;
 * max_model_len) plus our own spellings (text, add_bos, with_pieces). */
char *api_tokenize(const api_ctx *ctx, const char *body, size_t len, api_error *e, size_t *out_len)
{
    cJSON *o = parse_object(body, len, e);
    if (!o) return NULL;
    int add_bos = 1, add_special = 1, with_pieces = 0, token_strs = 0;
    cJSON *text = field(o, "prompt");
    if (!text) text = field(o, "text");
    if (!text) text = field(o, "content");
    const cJSON *msgs = field(o, "messages");
    char *res = NULL, *chat_text = NULL;
    int32_t *ids = NULL;
    int n = 0;
    if (check_model(ctx, o, e) || get_bool(o, "add_bos", &add_bos, e) ||
        get_bool(o, "add_special_tokens", &add_special, e) || get_bool(o, "with_pieces", &with_pieces, e) ||
        get_bool(o, "return_token_strs", &token_strs, e))
        goto out;
    /* add_special_tokens is vLLM's name for add_bos; messages default to
     * none, as the template writes its own BOS */
    static const char *const spellings[] = {"prompt", "text", "content"};
    for (int i = 0; i < 3; i++)
        if (field(o, spellings[i]) && !cJSON_IsString(field(o, spellings[i]))) {
            fail_p(e, 400, spellings[i], "\"%s\" must be a string", spellings[i]);
            goto out;
        }
    int ignored;
    const cJSON *kw = field(o, "chat_template_kwargs");
    if (get_bool(o, "add_generation_prompt", &ignored, e) || get_bool(o, "continue_final_message", &ignored, e)) goto out;
    if (kw && !cJSON_IsObject(kw)) { fail_p(e, 400, "chat_template_kwargs", "\"chat_template_kwargs\" must be an object"); goto out; }
    int add = field(o, "add_special_tokens") ? add_special : field(o, "add_bos") ? add_bos : !msgs;
    if (msgs) {
        if (text) { fail_p(e, 400, "messages", "give \"prompt\" or \"messages\", not both"); goto out; }
        if (chat_prompt(ctx, o, &chat_text, e)) goto out;
    } else if (!text || !cJSON_IsString(text)) {
        fail_p(e, 400, "prompt", "\"prompt\" (or \"text\") must be a string, or give \"messages\"");
        goto out;
    }
    if (encode_capped(ctx, chat_text ? chat_text : text->valuestring, add, ctx->max_tokenize_tokens,
                      "the /tokenize limit of --max-tokenize-tokens", &ids, &n, e))
        goto out;
    if (ctx->max_tokenize_tokens > 0 && n > ctx->max_tokenize_tokens) {
        fail_p(e, 400, "prompt", "the text is %d tokens: more than the %d /tokenize returns (--max-tokenize-tokens)", n,
               ctx->max_tokenize_tokens);
        goto out;
    }
    if (ctx->max_response_bytes) {   /* exact but for the envelope: the ids' digits, the pieces once or twice */
        size_t bound = 256;
        for (int i = 0; i < n; i++) {
            bound += 2 + (ids[i] >= 10) + (ids[i] >= 100) + (ids[i] >= 1000) + (ids[i] >= 10000) + (ids[i] >= 100000) +
                     (ids[i] >= 1000000) + (ids[i] >= 10000000) + (ids[i] >= 100000000) + (ids[i] >= 1000000000);
            if (!token_strs && !with_pieces) continue;
            const char *piece = tok_id_to_piece(ctx->tok, ids[i]);
            bound += (size_t)(token_strs + with_pieces) * (json_text_bytes(piece ? piece : "", piece ? strlen(piece) : 0) + 3);
        }
        if (bound > ctx->max_response_bytes) {
            fail_p(e, 400, token_strs ? "return_token_strs" : with_pieces ? "with_pieces" : "prompt",
                   "the response would take %zu bytes (%d tokens%s): above the limit of %zu bytes "
                   "(--max-response-bytes); send a shorter text%s", bound, n,
                   token_strs || with_pieces ? " with their pieces" : "", ctx->max_response_bytes,
                   token_strs || with_pieces ? " or leave the pieces out" : "");
            goto out;
        }
    }
    cJSON *r = cJSON_CreateObject();
    /* the ids as one raw string: a cJSON node per id would cost 64 bytes each */
    char *list = ids_json(ids, n);
    if (!list) { fail(e, 500, "out of memory"); cJSON_Delete(r); goto out; }
    cJSON_AddRawToObject(r, "tokens", list);
    free(list);
    cJSON_AddNumberToObject(r, "count", n);
    cJSON_AddNumberToObject(r, "max_model_len", ctx->max_seq_len);
    if (token_strs) cJSON_AddItemToObject(r, "token_strs", pieces_of(ctx, ids, n));
    else cJSON_AddNullToObject(r, "token_strs");
    if (with_pieces) cJSON_AddItemToObject(r, "pieces", pieces_of(ctx, ids, n));
    res = print_json(r, out_len);
out:
    free(ids);
    free(chat_text);
    cJSON_Delete(o);
    return res;
}

/* vLLM answers {"prompt"}; "text" is ours. */
char *api_detokenize(const api_ctx *ctx, const char *body, size_t len, api_error *e, size_t *out_len)
{
    cJSON *o = parse_object(body, len, e);
    if (!o) return NULL;
    char *res = NULL, *text = NULL, err[256];
    int32_t *ids = NULL;
    int n = 0;
    if (check_model(ctx, o, e)) goto out;
    cJSON *t = field(o, "tokens");
    if (!t || !cJSON_IsArray(t)) { fail_p(e, 400, "tokens", "\"tokens\" must be an array of token ids"); goto out; }
    if (get_tokens(ctx, t, "tokens", &ids, &n, e)) goto out;
    size_t tlen = 0;
    if (tok_decode_len(ctx->tok, ids, n, &text, &tlen, err, sizeof err) != 0) { fail_p(e, 400, "tokens", "\"tokens\": %s", err); goto out; }
    size_t bound = 64 + 2 * json_text_bytes(text, tlen);   /* the text twice, "prompt" and "text" */
    if (ctx->max_response_bytes && bound > ctx->max_response_bytes) {
        fail_p(e, 400, "tokens", "the response would take %zu bytes (%d tokens): above the limit of %zu bytes "
                                 "(--max-response-bytes); send fewer tokens", bound, n, ctx->max_response_bytes);
        goto out;
    }
    /* by length: an id that stands for a NUL byte (the byte tokenizer's 0) becomes
     * U+FFFD like any other byte JSON text cannot carry, rather than ending the text */
    json_buf b = {0};
    json_lit(&b, "{\"prompt\":");
    json_text(&b, text, tlen);
    json_lit(&b, ",\"text\":");
    json_text(&b, text, tlen);
    json_char(&b, '}');
    if (b.failed) {
        json_buf_free(&b);
        fail(e, 500, "out of memory");
        goto out;
    }
    res = b.p;
    *out_len = b.len;
out:
    free(ids);
    free(text);
    cJSON_Delete(o);
    return res;
}

static void add_token_string(cJSON *r, const char *name, const char *s)
{
    if (s && s[0]) cJSON_AddStringToObject(r, name, s);
    else cJSON_AddNullToObject(r, name);
}

/* vLLM's /tokenizer_info: the tokenizer's configuration (lm-eval's remote
 * tokenizer reads bos/eos/pad tokens and the chat template from it). */
char *api_tokenizer_info(const api_ctx *ctx, size_t *out_len)
{
    cJSON *r = cJSON_CreateObject();
    int bytes = tok_is_bytes(ctx->tok);
    cJSON_AddStringToObject(r, "tokenizer_class", bytes ? "ByteTokenizer" : "LlamaTokenizer");
    cJSON_AddStringToObject(r, "kda_tokenizer", bytes ? "bytes" : "sentencepiece");
    char eos[8] = "";
    if (bytes && ctx->eos_id > 0 && ctx->eos_id < 0x80) eos[0] = (char)ctx->eos_id;   /* its text is the byte */
    add_token_string(r, "bos_token", bytes ? NULL : ctx->specials.bos);
    add_token_string(r, "eos_token", bytes ? eos : ctx->specials.eos);
    cJSON_AddNullToObject(r, "pad_token");
    const char *unk = bytes ? NULL : tok_id_to_piece(ctx->tok, 0);
    add_token_string(r, "unk_token", unk && !strcmp(unk, "<unk>") ? unk : NULL);
    if (ctx->bos_id >= 0) cJSON_AddNumberToObject(r, "bos_token_id", ctx->bos_id);
    else cJSON_AddNullToObject(r, "bos_token_id");
    if (ctx->eos_id >= 0) cJSON_AddNumberToObject(r, "eos_token_id", ctx->eos_id);
    else cJSON_AddNullToObject(r, "eos_token_id");
    cJSON_AddBoolToObject(r, "add_bos_token", ctx->bos_id >= 0);
    cJSON_AddBoolToObject(r, "add_eos_token", 0);
    cJSON_AddNumberToObject(r, "vocab_size", ctx->vocab_size);
    cJSON_AddNumberToObject(r, "model_max_length", ctx->max_seq_len);
    if (ctx->chat) cJSON_AddStringToObject(r, "chat_template", chat_template_source(ctx->chat));
    else cJSON_AddNullToObject(r, "chat_template");
    return print_json(r, out_len);
}

static cJSON *model_object(const api_ctx *ctx)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", ctx->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)ctx->created);
    cJSON_AddStringToObject(m, "owned_by", "kda");
    cJSON_AddStringToObject(m, "root", ctx->model_name);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", ctx->max_seq_len);
    return m;
}

char *api_models(const api_ctx *ctx, size_t *out_len)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_object(ctx));
    return print_json(o, out_len);
}

char *api_model(const api_ctx *ctx, const char *id, api_error *e, size_t *out_len)
{
    if (strcmp(id, ctx->model_name)) {
        fail_p(e, 404, "model", "The model `%.200s` does not exist (this server serves \"%s\")", id, ctx->model_name);
        return NULL;
    }
    return print_json(model_object(ctx), out_len);
}

void api_ctx_measure_tokens(api_ctx *ctx)
{
    ctx->max_piece_bytes = 1;
    ctx->max_token_bytes = ctx->max_token_json = 1;
    for (int id = 0; id < ctx->vocab_size; id++) {
        const char *piece = tok_id_to_piece(ctx->tok, id);
        int len = piece ? (int)strlen(piece) : 0;
        if (!tok_is_bytes(ctx->tok) && len > ctx->max_piece_bytes) ctx->max_piece_bytes = len;
        char buf[256];
        size_t n = token_text(ctx, id, buf, sizeof buf);
        int json = (int)json_text_bytes(buf, n);
        if ((int)n > ctx->max_token_bytes) ctx->max_token_bytes = (int)n;
        if (json > ctx->max_token_json) ctx->max_token_json = json;
    }
}

static void token_strings_free(api_token_strings *ts)
{
    if (!ts) return;
    free(ts->json);
    free(ts->ids);
    free(ts);
}

/* Two passes over the vocabulary: the sizes, then the strings into one pool each. */
static api_token_strings *token_strings_build(const api_ctx *ctx)
{
    api_token_strings *ts = calloc(1, sizeof *ts);
    if (!ts) return NULL;
    int n = ctx->vocab_size > 0 ? ctx->vocab_size : 0;
    ts->n = n;
    ts->ids = calloc((size_t)n + 1, sizeof *ts->ids);
    json_buf json = {0};
    if (!ts->ids) goto fail;
    for (int id = 0; id < n; id++) {
        char buf[256];
        size_t len = token_text(ctx, id, buf, sizeof buf);
        char *clean = utf8_clean(buf, len);
        if (!clean) goto fail;
        api_token_entry *t = &ts->ids[id];
        t->json = (uint32_t)json.len;
        t->text_len = (uint16_t)strlen(clean);   /* token_text: < 256 bytes, each at most 3 when cleaned */
        free(clean);
        json_text(&json, buf, len);
        if (json.failed || json.len > UINT32_MAX) goto fail;
        t->json_len = (uint16_t)(json.len - t->json);   /* < 6 * 256 + 2 */
        memcpy(t->head, json.p + t->json, t->json_len < API_TOKEN_HEAD ? t->json_len : API_TOKEN_HEAD);
        if (t->json_len > ts->max_json) ts->max_json = t->json_len;
    }
    ts->json = json.p;
    return ts;
fail:
    json_buf_free(&json);
    token_strings_free(ts);
    return NULL;
}

int api_ctx_init(api_ctx *ctx, const char *model_dir, const char *chat_template_flag, char *err, size_t errlen)
{
    memset(&ctx->specials, 0, sizeof ctx->specials);
    ctx->created = (long)srv_wall();
    if (chat_template_load(chat_template_flag, model_dir, &ctx->chat, &ctx->specials, err, errlen)) return -1;
    api_ctx_measure_tokens(ctx);
    /* without tokenizer_config.json, SentencePiece's own control pieces */
    if (!tok_is_bytes(ctx->tok)) {
        const char *b = ctx->bos_id >= 0 ? tok_id_to_piece(ctx->tok, ctx->bos_id) : NULL;
        const char *s = ctx->eos_id >= 0 ? tok_id_to_piece(ctx->tok, ctx->eos_id) : NULL;
        if (!ctx->specials.bos[0] && b && strlen(b) < sizeof ctx->specials.bos)
            snprintf(ctx->specials.bos, sizeof ctx->specials.bos, "%s", b);
        if (!ctx->specials.eos[0] && s && strlen(s) < sizeof ctx->specials.eos)
            snprintf(ctx->specials.eos, sizeof ctx->specials.eos, "%s", s);
    } else {
        /* bytes: every id is a byte; no string stands for another id */
        ctx->specials.bos[0] = ctx->specials.eos[0] = '\0';
    }
    ctx->strings = token_strings_build(ctx);
    if (!ctx->strings) {
        snprintf(err, errlen, "out of memory for the token strings of %d ids", ctx->vocab_size);
        chat_template_free(ctx->chat);
        ctx->chat = NULL;
        return -1;
    }
    return 0;
}

void api_ctx_free(api_ctx *ctx)
{
    token_strings_free(ctx->strings);
    ctx->strings = NULL;
    chat_template_free(ctx->chat);
    ctx->chat = NULL;
}

/*
 * test_render.c - the response writer (server/json_out.c, api_render, api_render_stream)
 * against independent renderings of the same data, byte for byte:
 *  - numbers and strings against the cJSON library's own printing, on random doubles
 *    of every exponent (NaN, infinities, -0, subnormals, integers included) and random
 *    byte strings (quotes, backslashes, control bytes, invalid UTF-8, NUL); float32
 *    log-probs against printf's "%.9g" (cJSON's for NaN, infinities and integers), and
 *    each must read back (strtof) as the float it came from;
 *  - whole responses of every route kind (generate, score, completions with echo and
 *    alternatives, chat; whole bodies and SSE streams in two parts) against
 *    render_reference.c, the cJSON-tree renderer the writer replaced, on random jobs:
 *    large and negative-looking ids, NaN/-inf log-probs, invalid UTF-8 output text.
 *
 *   test_render [SPM.model]   (the byte tokenizer always; a SentencePiece model too if given)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "json_out.h"
#include "render_reference.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int rnd_int(int n) { return (int)(rnd() % (uint64_t)n); }

static char *cjson_number_text(double d)
{
    cJSON *n = cJSON_CreateNumber(d);
    char *s = cJSON_PrintUnformatted(n);
    cJSON_Delete(n);
    return s;
}

/* A float of any kind: random bits (every exponent, NaN, inf, subnormal), log-prob-like
 * values, integers, decimal-looking values and the edges of json_float's fast range. */
static float random_float(void)
{
    static const float edges[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-28f, -1e-28f, 1e14f, -1e14f, 99999999999999.0f,
                                  1e15f, 0.1f, -0.5f, 0.25f, 1e-5f, -9.999999e-5f, 123456.7f, 3.4028235e38f,
                                  1.17549435e-38f, 1.4e-45f, -3.0f, -1e-10f, 9.9999999e-29f, 1e-36f, -9.999999e-37f,
                                  0.0078125f, 8388607.5f, -0.99999994f};
    float f;
    uint32_t bits;
    switch (rnd_int(6)) {
    case 0: bits = (uint32_t)rnd(); memcpy(&f, &bits, sizeof f); return f;
    case 1: return -(float)((double)(rnd() >> 11) / 9007199254740992.0 * 20.0);
    case 2: return -(float)ldexp((double)(rnd() >> 40), -rnd_int(60));
    case 3: return (float)((int64_t)(rnd() % 2000001) - 1000000) / (float)(1 + rnd_int(10000));
    case 4: return edges[rnd_int((int)(sizeof edges / sizeof edges[0]))];
    default: return (float)((double)(int64_t)rnd() * ldexp(1.0, -rnd_int(120)));
    }
}

static void check_float(float f)
{
    json_buf b = {0};
    json_float(&b, f);
    const double d = f;
    char want[40];
    if (!isfinite(d) || (fabs(d) < 1e15 && d == floor(d))) {
        char *c = cjson_number_text(d);
        snprintf(want, sizeof want, "%s", c);
        free(c);
    } else {
        snprintf(want, sizeof want, "%.9g", d);
    }
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (strcmp(b.p, want)) fail_msg("float 0x%08x (%.9g): json_float wrote %s, want %s", bits, d, b.p, want);
    if (isfinite(d)) {
        float back = strtof(b.p, NULL);
        uint32_t bb;
        memcpy(&bb, &back, sizeof bb);
        if (bb != bits) fail_msg("float 0x%08x: json_float wrote %s, which reads back as 0x%08x", bits, b.p, bb);
    }
    json_buf_free(&b);
}

static void test_floats_print_as_9_digits(void **state)
{
    (void)state;
    float specials[] = {NAN, -NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 4; i++) check_float(specials[i]);
    for (int i = 0; i < 400000; i++) check_float(random_float());
    /* every float of a few binades around the log-probs users see, and at the edges
     * of the fast path (1e-36) and of the normal range */
    for (float f = -4.0f; f < -3.999f; f = nextafterf(f, 0)) check_float(f);
    for (float f = 1e-7f; f < 1.001e-7f; f = nextafterf(f, 1)) check_float(f);
    for (float f = 0.9999e-36f; f < 1.0001e-36f; f = nextafterf(f, 1)) check_float(f);
    for (float f = 1.1754e-38f; f < 1.1756e-38f; f = nextafterf(f, 1)) check_float(f);
    for (float f = -8388600.5f; f > -8388610.0f; f = nextafterf(f, -1e9f)) check_float(f);
}

static void test_doubles_and_ints_print_as_cjson_prints_them(void **state)
{
    (void)state;
    for (int i = 0; i < 100000; i++) {
        double d;
        uint64_t bits = rnd();
        if (i % 3 == 0) memcpy(&d, &bits, sizeof d);
        else if (i % 3 == 1) d = (double)((int64_t)rnd() >> rnd_int(63));
        else d = (double)random_float() * 1.0000001;
        json_buf b = {0};
        json_number(&b, d);
        char *want = cjson_number_text(d);
        if (strcmp(b.p, want)) fail_msg("double %.17g: json_number wrote %s, cJSON %s", d, b.p, want);
        free(want);
        json_buf_free(&b);
        int64_t v = (int64_t)rnd() >> rnd_int(64);
        if (llabs(v) < 1000000000000000LL) {   /* json_int matches "%1.15g" below 10^15 (ids, counts) */
            json_int(&b, v);
            want = cjson_number_text((double)v);
            if (strcmp(b.p, want)) fail_msg("int %lld: json_int wrote %s, cJSON %s", (long long)v, b.p, want);
            free(want);
            json_buf_free(&b);
        }
    }
}

/* Bytes a JSON string writer can get wrong: quotes, backslashes, every control byte,
 * DEL, lone continuation bytes, truncated and overlong sequences, surrogates, NUL. */
static size_t random_bytes(char *s, size_t cap)
{
    static const char *const pieces[] = {"\"", "\\", "\x7f", "\xc3\xa9", "\xe2\x96\x81", "\xf0\x9f\x98\x80", "\xc3",
                                         "\xe2\x96", "\x80", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xff",
                                         "/", "a", "The", "the", " ", "\n", "\t", "\x01"};
    size_t n = 0, want = (size_t)rnd_int((int)cap / 8);
    while (n < want) {
        if (rnd_int(4) == 0) { s[n++] = (char)rnd_int(256); continue; }
        const char *p = pieces[rnd_int((int)(sizeof pieces / sizeof pieces[0]))];
        size_t len = strlen(p);
        if (n + len > cap) break;
        memcpy(s + n, p, len);
        n += len;
    }
    return n;
}

static void test_strings_escape_as_cjson_does(void **state)
{
    (void)state;
    for (int i = 0; i < 20000; i++) {
        char s[512];
        size_t n = random_bytes(s, sizeof s);
        /* the reference: U+FFFD for what is not UTF-8 (as the server always did), then cJSON */
        json_buf clean = {0};
        for (size_t k = 0; k < n;) {
            int len = utf8_sequence_len((const unsigned char *)s + k, (const unsigned char *)s + n);
            if (len) json_raw(&clean, s + k, (size_t)len), k += (size_t)len;
            else json_raw(&clean, "\xEF\xBF\xBD", 3), k++;
        }
        cJSON *str = cJSON_CreateString(clean.p ? clean.p : "");
        char *want = cJSON_PrintUnformatted(str);
        json_buf b = {0};
        json_text(&b, s, n);
        assert_string_equal(b.p, want);
        json_buf_free(&b);
        json_str(&b, clean.p ? clean.p : "", clean.len);
        assert_string_equal(b.p, want);
        json_buf_free(&b);
        cJSON_Delete(str);
        free(want);
        json_buf_free(&clean);
    }
}

/* A check for the one hand-made oracle in this file: the cases written out by hand. */
static void test_known_values(void **state)
{
    (void)state;
    static const struct { float f; const char *want; } cases[] = {
        /* the floats' exact values: 0.1f = 0.100000001490116119384765625,
         * 1e-5f = 9.99999974737875163555145263671875e-6, -1.2345678f = -1.2345677614212036...,
         * 1e20f = 100000002004087734272 */
        {-0.0f, "-0"}, {1.0f, "1"}, {0.1f, "0.100000001"}, {-2.5f, "-2.5"}, {1e-5f, "9.99999975e-06"},
        {-1.2345678f, "-1.23456776"}, {0.5f, "0.5"}, {1099511627776.0f, "1099511627776"}, {1e20f, "1.00000002e+20"},
        {-0.00390625f, "-0.00390625"}, {1e-36f, "1.00000004e-36"} /* = 1.0000000359391298...e-36 */,
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_buf b = {0};
        json_float(&b, cases[i].f);
        assert_string_equal(b.p, cases[i].want);
        json_buf_free(&b);
    }
    json_buf b = {0};
    json_text(&b, "a\"\\\n\x01\xff\xc3\xa9", 8);
    assert_string_equal(b.p, "\"a\\\"\\\\\\n\\u0001\xEF\xBF\xBD\xc3\xa9\"");
    json_buf_free(&b);
}

/* ---- whole responses ---- */

static float random_lp(void)
{
    switch (rnd_int(40)) {
    case 0: return NAN;
    case 1: return -INFINITY;
    case 2: return 0.0f;
    case 3: return random_float();
    default: return -(float)((double)(rnd() >> 11) / 9007199254740992.0 * 15.0);
    }
}

/* an id of the vocabulary, biased to the few that share a text up to case */
static int32_t random_id(int vocab) { return rnd_int(8) ? (int32_t)rnd_int(vocab) : (int32_t)('A' + rnd_int(4) * 32); }

static void put_s(api_buf *b, const char *s) { api_buf_put(b, s, strlen(s)); }

static char *random_request(int kind, int vocab, int *stream)
{
    api_buf b = {0};
    char tmp[160];
    int n_ids = 2 + rnd_int(rnd_int(4) ? 40 : 600);
    *stream = rnd_int(2);
    api_buf_put(&b, "{", 1);
    if (kind == API_SCORE && rnd_int(3) == 0) {
        put_s(&b, "\"texts\":[\"To be, or not\",\"\\u00e9t\\u00e9 \\\"q\\\" \\\\\",\"abc\\n\\u0001x\"]");
        *stream = 0;
    } else if (kind == API_CHAT) {
        put_s(&b, "\"messages\":[{\"role\":\"user\",\"content\":\"Hi \\\"there\\\"\"}]");
    } else {
        int many = kind == API_COMPLETIONS && rnd_int(3) == 0;
        const char *name = kind == API_SCORE || (kind == API_GENERATE && rnd_int(2)) ? "tokens" : "prompt";
        if (kind == API_GENERATE && !strcmp(name, "prompt")) {
            put_s(&b, "\"prompt\":\"ROMEO: \\u00e9\\\\ \\\"x\\\"\"");
        } else {
            snprintf(tmp, sizeof tmp, "\"%s\":[%s", name, many ? "[" : "");
            api_buf_put(&b, tmp, strlen(tmp));
            for (int p = 0; p < (many ? 2 : 1); p++) {
                if (p) api_buf_put(&b, "],[", 3);
                for (int i = 0; i < n_ids; i++) {
                    snprintf(tmp, sizeof tmp, i ? ",%d" : "%d", (int)random_id(vocab));
                    api_buf_put(&b, tmp, strlen(tmp));
                }
            }
            api_buf_put(&b, many ? "]]" : "]", many ? 2 : 1);
        }
    }
    if (kind == API_SCORE) *stream = 0;
    if (kind != API_SCORE) {
        int top = rnd_int(3) ? rnd_int(21) : -1;
        int max_tokens = rnd_int(12);
        snprintf(tmp, sizeof tmp, ",\"max_tokens\":%d,\"stream\":%s", max_tokens, *stream ? "true" : "false");
        api_buf_put(&b, tmp, strlen(tmp));
        if (kind == API_CHAT && top >= 0) snprintf(tmp, sizeof tmp, ",\"logprobs\":true,\"top_logprobs\":%d", top);
        else if (kind == API_GENERATE && top >= 0) snprintf(tmp, sizeof tmp, ",\"logprobs\":%d", top);
        else if (kind == API_COMPLETIONS && top >= 0)
            snprintf(tmp, sizeof tmp, ",\"logprobs\":%d,\"echo\":%s,\"n\":%d", top, rnd_int(2) ? "true" : "false",
                     1 + rnd_int(2));
        else tmp[0] = '\0';
        api_buf_put(&b, tmp, strlen(tmp));
        if (*stream && kind != API_GENERATE && rnd_int(2)) {
            const char *so = rnd_int(2) ? ",\"stream_options\":{\"include_usage\":true}"
                                        : ",\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}";
            api_buf_put(&b, so, strlen(so));
        }
    }
    api_buf_put(&b, "}", 1);
    return b.p;
}

/* Output a scheduler could have produced so far: random ids, log-probs, alternatives
 * and text (invalid UTF-8 included). upto: how many of max_tokens are out by now. */
static void produce(sched_task *t, int vocab, int upto)
{
    sched_out *o = &t->out;
    int k = t->n_top, want = upto < t->max_tokens ? upto : t->max_tokens;
    if (!o->cap) {
        o->cap = t->max_tokens + 1;
        o->ids = calloc((size_t)o->cap, sizeof *o->ids);
        o->lps = calloc((size_t)o->cap, sizeof *o->lps);
        o->top_ids = calloc((size_t)o->cap * (size_t)(k ? k : 1), sizeof *o->top_ids);
        o->top_lps = calloc((size_t)o->cap * (size_t)(k ? k : 1), sizeof *o->top_lps);
    }
    while (t->n_gen < want) {
        o->ids[o->n] = random_id(vocab);
        o->lps[o->n] = random_lp();
        for (int a = 0; a < k; a++) {
            o->top_ids[(size_t)o->n * k + a] = a == 0 ? o->ids[o->n] : random_id(vocab);
            o->top_lps[(size_t)o->n * k + a] = random_lp();
        }
        char text[64];
        size_t n = random_bytes(text, sizeof text);
        sched_out_text(o, text, n);
        o->n++;
        t->n_gen++;
    }
}

static void fill_prompt(sched_task *t, int vocab)
{
    int k = t->n_top;
    t->prompt_lps = calloc((size_t)t->n_prompt, sizeof *t->prompt_lps);
    for (int i = 0; i + 1 < t->n_prompt; i++) t->prompt_lps[i] = random_lp();
    if (t->prompt_logprobs && k) {
        t->prompt_top_ids = calloc((size_t)t->n_prompt * (size_t)k, sizeof *t->prompt_top_ids);
        t->prompt_top_lps = calloc((size_t)t->n_prompt * (size_t)k, sizeof *t->prompt_top_lps);
        for (size_t i = 0; i < (size_t)t->n_prompt * (size_t)k; i++) {
            t->prompt_top_ids[i] = random_id(vocab);
            t->prompt_top_lps[i] = random_lp();
        }
    }
    t->n_cached = rnd_int(t->n_prompt + 1);
    t->t_admit = t->t_submit + (double)rnd_int(1000) * 1e-5;
}

static void finish(sched_task *t, int n_tasks)
{
    int r = rnd_int(n_tasks > 1 ? 60 : 20);
    t->finish = r == 0 ? SCHED_FINISH_ERROR : r == 1 ? SCHED_FINISH_ABORT : r < 8 ? SCHED_FINISH_EOS
              : r < 12 ? SCHED_FINISH_STOP : SCHED_FINISH_LENGTH;
    if (t->finish == SCHED_FINISH_ERROR || rnd_int(2)) snprintf(t->error, sizeof t->error, "engine \"failed\"\n here");
    if (t->n_gen) t->t_first = t->t_admit + (double)rnd_int(1000) * 1e-4;
    t->t_end = (t->t_first > 0 ? t->t_first : t->t_admit) + (double)rnd_int(100000) * 1e-6;
}

/* The same random results into both jobs (equal seeds). */
static void run_phase(api_job *a, api_job *b, int vocab, int phase, uint64_t seed)
{
    api_job *jobs[2] = {a, b};
    for (int w = 0; w < 2; w++) {
        rng_state = seed;
        sched_client *c = jobs[w]->client;
        for (int i = 0; i < c->n_tasks; i++) {
            sched_task *t = &c->tasks[i];
            if (phase == 0) fill_prompt(t, vocab);
            produce(t, vocab, phase == 0 ? t->max_tokens / 2 : t->max_tokens);
            if (phase == 1) finish(t, c->n_tasks);
        }
    }
}

static const api_ctx *cur_ctx;

static void check_job(int kind)
{
    int stream;
    char *body = random_request(kind, cur_ctx->vocab_size, &stream);
    api_job *a = NULL, *b = NULL;
    api_error e = {0};
    if (api_parse(cur_ctx, kind, body, strlen(body), &a, &e) || api_parse(cur_ctx, kind, body, strlen(body), &b, &e))
        fail_msg("api_parse of %s: %s", body, e.message);
    /* a twin: what differs between two parses is drawn per request */
    memcpy(b->id, a->id, sizeof a->id);
    b->created = a->created;
    b->seed = a->seed;
    /* and the submit time (srv_now at parse): the timings are differences
     * from it, so two parses a tick apart could print them a last digit
     * apart (a rare CI failure of the stream comparison, 2026-12-08) */
    for (int i = 0; i < a->client->n_tasks; i++) b->client->tasks[i].t_submit = a->client->tasks[i].t_submit;
    uint64_t seed = rnd();
    if (a->stream) {
        api_buf out_new = {0}, out_ref = {0};
        for (int phase = 0; phase < 2; phase++) {
            run_phase(a, b, cur_ctx->vocab_size, phase, seed + (uint64_t)phase);
            if (phase == 0) { a->client->heartbeat = b->client->heartbeat = 1; }
            int done_new = api_render_stream(a, &out_new), done_ref = ref_render_stream(b, &out_ref);
            assert_int_equal(done_new, done_ref);
            if (out_new.len != out_ref.len || memcmp(out_new.p ? out_new.p : "", out_ref.p ? out_ref.p : "", out_new.len))
                fail_msg("stream of %s, phase %d:\n new: %s\n ref: %s", body, phase, out_new.p, out_ref.p);
        }
        api_buf_free(&out_new);
        api_buf_free(&out_ref);
    } else {
        run_phase(a, b, cur_ctx->vocab_size, 0, seed);
        run_phase(a, b, cur_ctx->vocab_size, 1, seed + 1);
        int st_new = 0, st_ref = 0;
        size_t n_new = 0, n_ref = 0;
        char *r_new = api_render(a, &st_new, &n_new), *r_ref = ref_render(b, &st_ref, &n_ref);
        assert_non_null(r_new);
        assert_int_equal(st_new, st_ref);
        if (n_new != n_ref || strcmp(r_new, r_ref)) fail_msg("body of %s:\n new: %s\n ref: %s", body, r_new, r_ref);
        free(r_new);
        free(r_ref);
    }
    api_job_free(a);
    api_job_free(b);
    free(body);
}

/* Alternatives whose texts differ only in case are two keys ("a" and "A"); the same text
 * twice is one, the chosen token's own log-prob first. Byte tokenizer: id 97 is "a". */
static void test_alternatives_differing_in_case_are_two_keys(void **state)
{
    const api_ctx *ctx = *state;
    const char *body = "{\"prompt\":[66,67],\"max_tokens\":1,\"logprobs\":3}";
    api_job *j = NULL;
    api_error e = {0};
    assert_int_equal(api_parse(ctx, API_COMPLETIONS, body, strlen(body), &j, &e), 0);
    sched_task *t = &j->client->tasks[0];
    assert_int_equal(t->n_top, 3);
    sched_out *o = &t->out;
    o->cap = 1;
    o->ids = calloc(1, sizeof *o->ids), o->lps = calloc(1, sizeof *o->lps);
    o->top_ids = calloc(3, sizeof *o->top_ids), o->top_lps = calloc(3, sizeof *o->top_lps);
    o->ids[0] = 'a', o->lps[0] = -0.75f;
    const int32_t top[3] = {'a', 'A', 'a'};
    const float top_lp[3] = {-0.75f, -0.5f, -0.75f};
    memcpy(o->top_ids, top, sizeof top), memcpy(o->top_lps, top_lp, sizeof top_lp);
    sched_out_text(o, "a", 1);
    o->n = 1, t->n_gen = 1, t->finish = SCHED_FINISH_LENGTH;
    t->prompt_lps = calloc((size_t)t->n_prompt, sizeof *t->prompt_lps);
    int st = 0;
    size_t n = 0;
    char *r = api_render(j, &st, &n);
    assert_non_null(r);
    cJSON *doc = cJSON_Parse(r);
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "choices"), 0),
                                         "logprobs"), "top_logprobs");
    const cJSON *d = cJSON_GetArrayItem(tl, 0);
    if (cJSON_GetArraySize(d) != 2) fail_msg("top_logprobs[0] of %s", r);
    assert_true(cJSON_GetObjectItemCaseSensitive(d, "a")->valuedouble == -0.75);
    assert_true(cJSON_GetObjectItemCaseSensitive(d, "A")->valuedouble == -0.5);
    cJSON_Delete(doc);
    free(r);
    api_job_free(j);
}

static void test_responses_match_the_cjson_renderer(void **state)
{
    cur_ctx = *state;
    static const int kinds[] = {API_GENERATE, API_SCORE, API_COMPLETIONS, API_CHAT};
    for (int i = 0; i < 1200; i++) check_job(kinds[i % 4]);
}

static int open_ctx(api_ctx *ctx, tok_tokenizer *tok)
{
    char err[256];
    *ctx = (api_ctx){.tok = tok, .vocab_size = tok_vocab_size(tok), .bos_id = tok_bos_id(tok), .eos_id = tok_eos_id(tok),
                     .max_seq_len = 4096, .model_name = "m\"odel", .max_tasks = 64};
    if (api_ctx_init(ctx, "/nonexistent", "chatml", err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest values[] = {
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_floats_print_as_9_digits),
        cmocka_unit_test(test_doubles_and_ints_print_as_cjson_prints_them),
        cmocka_unit_test(test_strings_escape_as_cjson_does),
    };
    int failed = cmocka_run_group_tests_name("json_out", values, NULL, NULL);
    tok_tokenizer *toks[2] = {NULL, NULL};
    char err[256];
    if (tok_open_bytes(&toks[0])) return 1;
    if (argc > 1 && tok_open_spm(&toks[1], argv[1], err, sizeof err)) { fprintf(stderr, "%s: %s\n", argv[1], err); return 1; }
    for (int k = 0; k < 2 && toks[k]; k++) {
        api_ctx ctx;
        if (open_ctx(&ctx, toks[k])) return 1;
        const struct CMUnitTest whole[] = {
            cmocka_unit_test_prestate(test_responses_match_the_cjson_renderer, &ctx),
        };
        if (!k) {
            const struct CMUnitTest keys[] = {
                cmocka_unit_test_prestate(test_alternatives_differing_in_case_are_two_keys, &ctx),
            };
            failed += cmocka_run_group_tests_name("alternatives (bytes)", keys, NULL, NULL);
        }
        failed += cmocka_run_group_tests_name(k ? "responses (sentencepiece)" : "responses (bytes)", whole, NULL, NULL);
        /* every response of several choices or results through the threaded render */
        long before = api_render_helpers_started();
        ctx.render_threads = 3, ctx.render_min_work = 0;
        failed += cmocka_run_group_tests_name(k ? "responses, threaded (sentencepiece)" : "responses, threaded (bytes)",
                                              whole, NULL, NULL);
        if (api_render_helpers_started() == before) {
            fprintf(stderr, "no response was rendered by helper threads\n");
            failed++;
        }
        api_ctx_free(&ctx);
        tok_close(toks[k]);
    }
    return failed ? 1 : 0;
}

/*
 * response_bound.c - the most bytes a request's response can take (api.h,
 * api_response_bound), so that a request whose answer could outgrow
 * --max-response-bytes is refused before it runs rather than cut off or
 * held in memory whole.
 *
 * Every term bounds what api.c renders for the job as parsed:
 *  - a token's text in any JSON string (content, logprobs "tokens", the keys
 *    of alternatives, chat "token"): at most TOKEN_JSON bytes, the longest
 *    escaped token text of the vocabulary (api_ctx_init), and at least 6: the
 *    detokenizer turns a stray byte into U+FFFD (3 bytes) and a control byte is
 *    escaped as \u00XX (6). Its raw bytes (chat "bytes": up to "255," each) are
 *    at most ctx->max_token_bytes, and at least 3 (U+FFFD);
 *  - a number: NUM bytes as cJSON prints a double ("%1.17g": sign, 17 digits,
 *    point, e-308) and its comma; an id or an offset ID bytes;
 *  - an echoed prompt: its text's exact escaped length, and its tokens as
 *    positions (with their log-probs when asked);
 *  - a stream: at most one event per generated token, plus the first (chat's
 *    role, completions' echo) and the last, each with its envelope, and one
 *    error event per task (the whole error response when not streaming is
 *    smaller than REQUEST_FIXED). The
 *    keep-alive comments are not counted: one 14-byte comment per
 *    --heartbeat-seconds while the request waits, bounded by its time rather
 *    than its work.
 * The constants are generous on purpose: the bound must never be below what is
 * sent (tests/server/test_hostile.py checks it against real responses).
 */
#include <stdint.h>
#include <string.h>

#include "api.h"
#include "json_text.h"

#define NUM 26              /* a double and its comma */
#define ID 12               /* an int32 (or an offset below 10^11) and its comma */
#define REQUEST_FIXED 2048  /* envelope, usage, timings, seed, finish reasons of a whole response */
#define CHOICE_FIXED 256    /* one choice's own keys: index, finish_reason, logprobs, message */
#define EVENT_FIXED 320     /* one SSE event: "data: ", envelope (id, object, created, seed), choice keys, "\n\n" */
#define USAGE 256           /* one usage object */
#define ALT_GENERATE 60     /* one /generate alternative: {"id":ID,"logprob":NUM}, */
#define ENTRY_CHAT 64       /* the keys of one chat logprobs entry: token, logprob, bytes, top_logprobs */

static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

static size_t mul_sat(size_t a, size_t b) { return a && b > SIZE_MAX / a ? SIZE_MAX : a * b; }

/* Bytes of one position (a generated or, with logprobs, an echoed token) in
 * the kind's format; text: the position's text is in the response too (echoed
 * text is counted whole, from the prompt itself). */
static size_t position_bytes(const api_job *j, int text)
{
    const api_ctx *ctx = j->ctx;
    size_t tj = ctx->max_token_json > 6 ? (size_t)ctx->max_token_json : 6;
    size_t tb = ctx->max_token_bytes > 3 ? (size_t)ctx->max_token_bytes : 3;
    size_t top = (size_t)j->n_top, b = text ? tj : 0;
    switch (j->kind) {
    case API_GENERATE:
        b += ID;
        if (j->logprobs) b += NUM + 4 + top * ALT_GENERATE;
        return b;
    case API_COMPLETIONS:   /* tokens, token_logprobs, text_offset, top_logprobs {"text": lp, ...} with the chosen id */
        if (j->logprobs) b += (tj + 3) + NUM + ID + 4 + (top + 1) * (tj + 4 + NUM);
        return b;
    case API_CHAT:          /* {"token", "logprob", "bytes", "top_logprobs": [the same without it]} */
        if (j->logprobs) b += (ENTRY_CHAT + tj + NUM + 4 * tb) * (top + 1);
        return b;
    default:                /* score: tokens and token_logprobs */
        return ID + NUM;
    }
}

size_t api_response_bound(const api_job *j)
{
    const sched_client *c = j->client;
    size_t total = REQUEST_FIXED + strlen(j->ctx->model_name);
    size_t gen = position_bytes(j, 1), echo = position_bytes(j, 0);
    size_t event = j->stream ? EVENT_FIXED + strlen(j->ctx->model_name) + (j->continuous_usage ? USAGE : 0) : 0;
    if (j->stream && j->kind == API_GENERATE) event += USAGE + 512;   /* each event may be the last: usage, timings */
    for (int i = 0; i < c->n_tasks; i++) {
        const sched_task *t = &c->tasks[i];
        size_t b = CHOICE_FIXED;
        if (j->kind == API_SCORE) {
            b = add_sat(b, mul_sat((size_t)t->n_prompt, gen));
        } else {
            b = add_sat(b, mul_sat((size_t)t->max_tokens, gen));
            if (j->echo) {
                const char *et = j->echo_text[i / j->n];
                b = add_sat(b, json_text_bytes(et, strlen(et)));
                if (j->logprobs) b = add_sat(b, mul_sat((size_t)t->n_prompt, echo));
            }
            b = add_sat(b, mul_sat((size_t)t->max_tokens + 3, event));
        }
        if (j->stream) b = add_sat(b, EVENT_FIXED + 6 * sizeof t->error);   /* a task's error event, escaped */
        total = add_sat(total, b);
    }
    if (j->stream) total = add_sat(total, event + USAGE);   /* the usage chunk and [DONE] */
    return total;
}

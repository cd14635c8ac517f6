/*
 * api.h - the JSON side of each endpoint: parse and validate request bodies
 * into scheduler tasks, render results (whole bodies or SSE chunks).
 * Nothing here knows about sockets or libmicrohttpd; every function runs on
 * an HTTP thread. Validation errors name the field and its allowed range.
 */
#ifndef SRV_API_H
#define SRV_API_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"
#include "json_out.h"
#include "scheduler.h"
#include "tokenizer.h"

/* Every id's token text as the logprobs "tokens" lists show it, built once at load
 * (api_ctx_init) so a response of 8192 positions looks each one up instead of asking
 * the tokenizer 8192 x (1 + alternatives) times. */
enum { API_TOKEN_HEAD = 24 };

/* 32 bytes: a lookup is one cache line, and most tokens' strings are in head. */
typedef struct {
    uint32_t json;                  /* offset of the JSON string in the pool */
    uint16_t json_len;              /* its bytes, quotes included */
    uint16_t text_len;              /* bytes of the text (U+FFFD for what is not UTF-8): text_offset steps */
    char head[API_TOKEN_HEAD];      /* the JSON string's first bytes (all of it when json_len <= 24) */
} api_token_entry;

typedef struct {
    int n;                  /* ids covered: the model's vocabulary */
    size_t max_json;        /* the longest JSON string (room to reserve per token) */
    char *json;             /* each id's text as a JSON string (quotes included), back to back */
    api_token_entry *ids;   /* [n] */
} api_token_strings;

/* What the endpoints need to know about the loaded model. Set once before
 * the server reports ready (api_ctx_init); read-only afterwards. */
typedef struct {
    const tok_tokenizer *tok;
    int vocab_size;
    int bos_id, eos_id;     /* -1: none */
    int max_seq_len;
    const char *model_name; /* served in /v1/models and responses */
    int max_tasks;          /* sequences one request may create (prompts x n) */
    int max_tokenize_tokens;   /* longest /tokenize result (0: no cap) */
    int max_piece_bytes;    /* most text bytes one token stands for (api_ctx_init): a text longer
                             * than N times this needs more than N tokens, known before encoding */
    int max_token_bytes;    /* most bytes of one token's text as responses show it (api_ctx_init) */
    int max_token_json;     /* ... once escaped in a JSON string */
    size_t max_response_bytes;   /* a request whose response could be larger gets 400 (0: no cap) */
    const kda_model_info *info;   /* family, device, sizes: for /props */
    chat_template *chat;    /* NULL: chat requests get a 400 saying why */
    chat_specials specials; /* bos/eos token strings; in text they stand for the ids (as HF tokenizers parse them) */
    long created;           /* /v1/models "created": when the model was loaded */
    api_token_strings *strings;   /* api_ctx_init */
    int render_threads;     /* threads that render one large response with several choices or
                             * results, this one included (--render-threads; <= 1: this one alone);
                             * also the most helper threads all responses hold at once */
    long render_min_work;   /* below this many rendered values (positions x (2 + alternatives),
                             * summed over choices) a response renders on this thread alone */
} api_ctx;

/* Fills the chat template (--chat-template flag, else the model directory's),
 * the special-token strings and the token strings. Returns 0, or -1 with err (a named template
 * that cannot be loaded: a setup error). */
int api_ctx_init(api_ctx *ctx, const char *model_dir, const char *chat_template_flag, char *err, size_t errlen);
void api_ctx_free(api_ctx *ctx);
/* The max_*_bytes sizes of the tokenizer's ids (part of api_ctx_init). */
void api_ctx_measure_tokens(api_ctx *ctx);

typedef struct {
    int status;             /* HTTP status */
    char message[400];
    char param[64];         /* the request field at fault, "" if none (OpenAI's error.param) */
} api_error;

enum { API_GENERATE, API_SCORE, API_COMPLETIONS, API_CHAT };

typedef json_buf api_buf;
int api_buf_put(api_buf *b, const char *s, size_t n);   /* 0, or -1 (out of memory: failed is set) */
void api_buf_free(api_buf *b);

typedef struct api_job api_job;
struct api_job {
    int kind;
    int stream, echo, include_usage, continuous_usage;
    int n;                  /* choices per prompt (completions) */
    int n_inputs;           /* prompts, or texts to score */
    int single;             /* score: "text"/"tokens" rather than "texts" */
    int logprobs;           /* report log-probs of generated ids */
    int n_top;              /* alternatives per id */
    int implicit_max_tokens;   /* chat without max_tokens: the context's rest, cut to --max-response-bytes */
    char **echo_text;       /* [n_inputs] prompt text for echo */
    char id[48];
    long created;
    int64_t seed;           /* sent or drawn; echoed in the response; choice c draws with seed + c */
    sched_client *client;   /* n_inputs * n tasks, prompt-major */
    sched_out *spare;       /* [n_tasks] drained output (streaming) */
    int *reported;          /* [n_tasks] final chunk rendered */
    int *started;           /* [n_tasks] first chunk rendered (echo; chat: the role delta) */
    size_t *text_off;       /* [n_tasks] characters streamed so far (logprobs text_offset) */
    int ended;              /* the last SSE event has been rendered */
    const api_ctx *ctx;
};

/* Parses a request body of the given kind into a job whose client is ready
 * to submit. Returns 0, or -1 with e filled. */
int api_parse(const api_ctx *ctx, int kind, const char *body, size_t len, api_job **out, api_error *e);
void api_job_free(api_job *j);

/* The most bytes the job's response (its SSE events, streaming) can take
 * (response_bound.c), known before it runs. */
size_t api_response_bound(const api_job *j);

/* The whole response of a finished job; *status is its HTTP status (a task
 * that failed or was aborted turns the response into an error). */
char *api_render(api_job *j, int *status, size_t *len);
/* Helper threads api_render has started since the process began (render_threads). */
long api_render_helpers_started(void);
/* Appends the SSE events for whatever the scheduler produced since the last
 * call (or a heartbeat comment). Returns 1 once "data: [DONE]" is appended. */
int api_render_stream(api_job *j, api_buf *out);

/* OpenAI error body: {"error": {"message", "type", "param", "code"}};
 * param NULL or "" is null. */
char *api_error_json(int status, const char *message, size_t *len);
char *api_error_json_param(int status, const char *message, const char *param, size_t *len);
/* Small endpoints: return a body or NULL with e filled. */
char *api_tokenize(const api_ctx *ctx, const char *body, size_t len, api_error *e, size_t *out_len);
char *api_detokenize(const api_ctx *ctx, const char *body, size_t len, api_error *e, size_t *out_len);
char *api_tokenizer_info(const api_ctx *ctx, size_t *out_len);
char *api_models(const api_ctx *ctx, size_t *out_len);
/* GET /v1/models/{id}: NULL with a 404 in e for another id. */
char *api_model(const api_ctx *ctx, const char *id, api_error *e, size_t *out_len);

#endif

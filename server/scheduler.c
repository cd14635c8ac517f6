/*
 * scheduler.c - the scheduler thread (see scheduler.h for the contract).
 *
 * One loop iteration = one step boundary:
 *   1. take newly submitted tasks into the FIFO wait list;
 *   2. end the step in flight and commit its results: prompt progress (and
 *      snapshots), each sampled id appended to its sequence, EOS and length
 *      decided (so no later step takes a finished sequence);
 *   3. drop sequences whose client went away (or everything, at shutdown)
 *      and release finished ones;
 *   4. admit waiting tasks while the batch and the engine have room;
 *   5. build and launch ONE engine step: one token for every decoding
 *      sequence, then prompt chunks (oldest first) while the budget lasts;
 *   6. turn the ids committed in 2 into text, apply stop strings, append the
 *      output to each task and wake its HTTP connection.
 * Overlap (sched_opts.overlap, on where the engine's steps are asynchronous):
 * 6 runs while the device computes the step launched in 5, so the host's
 * per-token work no longer sits between two steps. The price: a sequence
 * that a stop string ends in 6 is already in the step in flight, whose id for
 * it is dropped (its state is one token further, which its end-of-generation
 * snapshot accounts for), and finished sequences are released one step later.
 * Without overlap 6 runs right after 2 (the CPU backend computes inside the
 * launch, so overlapping would only deliver every token a step late). Every
 * call that changes the engine (3, 4, the snapshots of 2) happens while no
 * step is in flight.
 * Prompt chunks are cut at fixed positions (multiples of prefill_chunk) no
 * matter what else runs, so a request's arithmetic on the CPU, and therefore
 * its sampled output for a given seed, does not depend on its neighbours. On
 * the GPU a step takes as many whole chunks of a prompt as its budget allows
 * (never across a snapshot point). The budget of a step is step_tokens while
 * sequences decode, so a long prompt never holds their next token up for
 * long, and step_tokens_idle otherwise.
 *
 * Prefix cache (prefix_cache.h for the index, engine.h for snapshots). A
 * request starts from the longest snapshot of a prefix of its prompt (at
 * most n_prompt - 1 tokens: the last prompt token is always fed, since its
 * logits give the first generated token) and prefills only the rest; an echo
 * request also takes the cached prefix's per-row outputs from the index.
 * Snapshots are taken where later requests can hit them:
 *   - at branch points: one token before where the prompt leaves the longest
 *     path already in the index (so siblings that share the prefix, and echo
 *     requests that need the log-prob of the first diverging token, hit);
 *   - every `grid` prompt tokens, grid = the tokens whose KV is as large as
 *     one snapshot (rounded to prefill_chunk): snapshots then take at most
 *     as much memory as the KV they save from recomputation, and a later
 *     request sharing a long prefix recomputes fewer than grid tokens;
 *   - near the end of a long prompt (tail_point: one token before its last
 *     multiple of 64), where requests branching off late in it would
 *     otherwise recompute up to a whole grid interval;
 *   - at the end of a prompt-only (scoring) request, and of every finished
 *     generation (all fed tokens: the next turn of a chat hits).
 * A snapshot point cuts the prompt chunk there (the state must sit at an
 * exact token boundary), which costs a step only where it is not a chunk
 * boundary already. A waiting request that shares more than MIN_GAIN tokens
 * beyond its best snapshot with a running request that has not computed
 * them yet waits for that one's snapshot instead of computing them too.
 * Memory: the index keeps the engine's snapshot memory plus its own under
 * prefix_cache_bytes (LRU), and admission evicts cache entries whenever a
 * request needs KV room, so the cache never makes a request fail.
 * Exactness: on the CPU a sequence's numbers do not depend on step
 * boundaries, so a request served from the cache gives bit-identical
 * logits, log-probs and samples to the same request computed from scratch.
 */
#include "scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "prefix_cache.h"

#define MAX_POINTS 8   /* planned snapshot positions per request besides the grid (more are dropped) */
#define MIN_GAIN 16    /* tokens a waiting request must save to wait for a running one's snapshot */
#define TAIL_GRID 64   /* tail points sit on this grid (the KDA chunk length) ... */
#define TAIL_MIN 256   /* ... where they save at least this many tokens (tail_point) */

typedef struct run_seq run_seq;
struct run_seq {
    run_seq *next;              /* wait-list link */
    sched_client *c;
    sched_task *t;
    int seq;                    /* engine sequence id, -1 until admitted */
    int n_done;                 /* prompt tokens consumed (restored from the cache included) */
    int cache;                  /* uses the prefix cache */
    unsigned serial;            /* admission number (a held request names its sibling by it) */
    unsigned hold_on;           /* waiting for the snapshot at hold_at of the running request with this serial */
    int hold_at;
    int points[MAX_POINTS];     /* prompt positions to snapshot at, ascending */
    int n_points;
    int32_t *gen; int n_gen;    /* [max_tokens] generated ids */
    kda_sampling samp;
    tok_stream *ts;
    tok_stopper *stopper;       /* NULL without stop strings */
    kda_logit_bias *bias;       /* [n_logit_bias + 1]: the task's, then EOS banned until min_tokens */
    int32_t sampled;            /* engine outputs of the current step */
    float sampled_lp;
    int32_t *top_ids;           /* [n_top] */
    float *top_lps;             /* [n_top] */
    double t_last;              /* last emitted id, for inter-token latency */
    int emit_pending;           /* gen[n_gen - 1] is committed, its text not yet delivered */
    int32_t emit_id;            /* ... that id, its log-prob, its alternatives and when it arrived */
    float emit_lp;
    int32_t *emit_top_ids;      /* [n_top]: copied at commit, since the next step writes top_ids */
    float *emit_top_lps;
    double emit_t;
    int final;                  /* the committed id ends it (EOS, length): no further step takes it */
    int finish;                 /* set during a step; the seq is removed after it */
    char error[256];
};

struct sched {
    kda_engine *e;
    const tok_tokenizer *tok;
    const kda_model_info *info;
    sched_opts o;
    pthread_t thread;

    pthread_mutex_t mu;         /* guards the fields up to the next comment */
    pthread_cond_t cv;
    run_seq *in_head, *in_tail; /* submitted, not yet taken by the thread */
    int n_queued;               /* submitted or waiting, not admitted */
    int n_running;
    int closed, stop, cancel_all;

    /* scheduler-thread private */
    run_seq *wait_head, *wait_tail;
    run_seq **running;          /* [max_batch], admission order */
    int n_run;
    kda_batch_item *items;      /* [max_batch] */
    run_seq **item_seq;         /* [max_batch] */
    double *itl;                /* [max_batch] inter-token gaps of one step, recorded together */
    int n_flight, n_flight_tok; /* items and tokens of the step in flight (items[], item_seq[]) */
    double t_flight;            /* when it began */
    double t_prev_end;          /* when the step before it ended (the debug step trace) */
    run_seq **emit_list;        /* [max_batch] sequences with emit_pending */
    int n_emit;
    int n_itl, n_gen_step;      /* gaps and generated tokens of the step so far */
    int32_t *targets;           /* [n_targets] prompt targets of one step, handed out in item order */
    int n_targets;
    sched_client **wake;        /* clients to wake after this iteration, one ref each */
    int n_wake, wake_cap;
    char *emit; size_t emit_len, emit_cap;  /* text of one token, stop strings applied */
    pc_cache *pc;               /* prefix cache, NULL = off */
    int grid;                   /* snapshot every grid prompt tokens */
    int32_t *key;               /* [max_seq_len] a finished sequence's fed tokens */
    unsigned next_serial;
    double t_mark;              /* phase accounting: when the current phase began */
    double phase_s[METRICS_SCHED_N];
};

/* ---- client ---- */

sched_client *sched_client_new(int n_tasks)
{
    sched_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->tasks = calloc((size_t)n_tasks, sizeof *c->tasks);
    if (!c->tasks) { free(c); return NULL; }
    pthread_mutex_init(&c->mu, NULL);
    c->n_tasks = n_tasks;
    c->refs = 1;
    for (int i = 0; i < n_tasks; i++) c->tasks[i].eos_id = -1;
    return c;
}

void sched_client_ref(sched_client *c)
{
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
}

void sched_out_free(sched_out *o)
{
    free(o->text); free(o->ids); free(o->lps); free(o->top_ids); free(o->top_lps);
    memset(o, 0, sizeof *o);
}

void sched_client_unref(sched_client *c)
{
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left) return;
    for (int i = 0; i < c->n_tasks; i++) {
        sched_task *t = &c->tasks[i];
        free(t->prompt);
        for (int k = 0; k < t->n_stops; k++) free(t->stops[k]);
        free(t->stops);
        free(t->logit_bias);
        sched_out_free(&t->out);
        free(t->prompt_lps); free(t->prompt_top_ids); free(t->prompt_top_lps);
    }
    free(c->tasks);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void sched_client_cancel(sched_client *c)
{
    pthread_mutex_lock(&c->mu);
    c->cancelled = 1;
    pthread_mutex_unlock(&c->mu);
}

int sched_out_text(sched_out *o, const char *s, size_t n)
{
    if (n == 0) return 0; /* nothing to add (and o->text may still be NULL: no memcpy to it) */
    if (o->len + n > o->text_cap) {
        size_t cap = o->text_cap ? o->text_cap : 256;
        while (cap < o->len + n) cap *= 2;
        char *p = realloc(o->text, cap);
        if (!p) return -1;
        o->text = p;
        o->text_cap = cap;
    }
    memcpy(o->text + o->len, s, n);
    o->len += n;
    return 0;
}

static int out_token(sched_out *o, int n_top, int32_t id, float lp, const int32_t *top_ids, const float *top_lps)
{
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 16;
        int32_t *ids = realloc(o->ids, (size_t)cap * sizeof *ids);
        if (ids) o->ids = ids;
        float *lps = realloc(o->lps, (size_t)cap * sizeof *lps);
        if (lps) o->lps = lps;
        if (!ids || !lps) return -1;
        if (n_top) {
            int32_t *ti = realloc(o->top_ids, (size_t)cap * (size_t)n_top * sizeof *ti);
            if (ti) o->top_ids = ti;
            float *tl = realloc(o->top_lps, (size_t)cap * (size_t)n_top * sizeof *tl);
            if (tl) o->top_lps = tl;
            if (!ti || !tl) return -1;
        }
        o->cap = cap;
    }
    o->ids[o->n] = id;
    o->lps[o->n] = lp;
    if (n_top) {
        memcpy(o->top_ids + (size_t)o->n * (size_t)n_top, top_ids, (size_t)n_top * sizeof *top_ids);
        memcpy(o->top_lps + (size_t)o->n * (size_t)n_top, top_lps, (size_t)n_top * sizeof *top_lps);
    }
    o->n++;
    return 0;
}

/* ---- wake list ---- */

/* Once per client and iteration; a flag rather than a search of the list,
 * which made a step of B streams cost B^2 / 2 comparisons. */
static void wake_add(sched *s, sched_client *c)
{
    if (c->wake_queued) return;
    if (s->n_wake == s->wake_cap) {
        int cap = s->wake_cap ? s->wake_cap * 2 : 64;
        sched_client **w = realloc(s->wake, (size_t)cap * sizeof *w);
        if (!w) return;   /* the client is woken by its next event */
        s->wake = w;
        s->wake_cap = cap;
    }
    sched_client_ref(c);
    c->wake_queued = 1;
    s->wake[s->n_wake++] = c;
}

static void wake_flush(sched *s)
{
    for (int i = 0; i < s->n_wake; i++) {
        sched_client *c = s->wake[i];
        c->wake_queued = 0;
        if (c->wake) c->wake(c);
        sched_client_unref(c);
    }
    s->n_wake = 0;
}

/* ---- sequences ---- */

static void run_seq_free(run_seq *r)
{
    if (!r) return;
    tok_stream_free(r->ts);
    if (r->stopper) tok_stopper_free(r->stopper);
    free(r->gen); free(r->top_ids); free(r->top_lps); free(r->emit_top_ids); free(r->emit_top_lps); free(r->bias);
    free(r);
}

/* min_tokens: EOS gets -inf after the task's own biases while fewer ids than
 * min_tokens exist; min_tokens_reached drops that entry. */
static int min_tokens_bias(run_seq *r)
{
    const sched_task *t = r->t;
    int ban = t->min_tokens > 0 && t->eos_id >= 0 && !t->ignore_eos;
    if (!t->n_logit_bias && !ban) return 0;
    r->bias = malloc((size_t)(t->n_logit_bias + 1) * sizeof *r->bias);
    if (!r->bias) return -1;
    if (t->n_logit_bias) memcpy(r->bias, t->logit_bias, (size_t)t->n_logit_bias * sizeof *r->bias);
    r->bias[t->n_logit_bias] = (kda_logit_bias){t->eos_id, -INFINITY};
    r->samp.logit_bias = r->bias;
    r->samp.n_logit_bias = t->n_logit_bias + ban;
    return 0;
}

static void min_tokens_reached(run_seq *r)
{
    if (r->n_gen >= r->t->min_tokens) r->samp.n_logit_bias = r->t->n_logit_bias;
}

static run_seq *run_seq_new(const tok_tokenizer *tok, sched_client *c, sched_task *t)
{
    run_seq *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->c = c;
    r->t = t;
    r->seq = -1;
    r->cache = !t->no_cache;
    r->gen = malloc((size_t)(t->max_tokens > 0 ? t->max_tokens : 1) * sizeof *r->gen);
    r->top_ids = malloc((size_t)(t->n_top > 0 ? t->n_top : 1) * sizeof *r->top_ids);
    r->top_lps = malloc((size_t)(t->n_top > 0 ? t->n_top : 1) * sizeof *r->top_lps);
    r->emit_top_ids = malloc((size_t)(t->n_top > 0 ? t->n_top : 1) * sizeof *r->emit_top_ids);
    r->emit_top_lps = malloc((size_t)(t->n_top > 0 ? t->n_top : 1) * sizeof *r->emit_top_lps);
    r->ts = tok_stream_new(tok);
    if (t->n_stops) r->stopper = tok_stopper_new((const char *const *)t->stops, t->n_stops);
    if (t->prompt_logprobs) {
        t->prompt_lps = calloc((size_t)t->n_prompt, sizeof *t->prompt_lps);
        if (t->n_top) {
            t->prompt_top_ids = calloc((size_t)t->n_prompt * (size_t)t->n_top, sizeof *t->prompt_top_ids);
            t->prompt_top_lps = calloc((size_t)t->n_prompt * (size_t)t->n_top, sizeof *t->prompt_top_lps);
        }
    }
    if (!r->gen || !r->top_ids || !r->top_lps || !r->emit_top_ids || !r->emit_top_lps || !r->ts || (t->n_stops && !r->stopper) ||
        (t->prompt_logprobs && !t->prompt_lps) ||
        (t->prompt_logprobs && t->n_top && (!t->prompt_top_ids || !t->prompt_top_lps))) {
        run_seq_free(r);
        return NULL;
    }
    r->samp = (kda_sampling){
        .temperature = t->temperature, .top_k = t->top_k, .top_p = t->top_p, .min_p = t->min_p,
        .repetition_penalty = t->repetition_penalty, .presence_penalty = t->presence_penalty,
        .frequency_penalty = t->frequency_penalty, .seed = t->seed, .n_prompt = t->n_prompt,
    };
    if (min_tokens_bias(r)) {
        run_seq_free(r);
        return NULL;
    }
    return r;
}

/* vLLM-style per-request figures; t's times are final (set under mu by
 * task_finish, which runs on this thread). */
static void report_finished(const sched_task *t, int finish)
{
    double admit = t->t_admit > 0 ? t->t_admit : t->t_end, first = t->t_first > 0 ? t->t_first : t->t_end;
    metrics_finished f = {
        .reason = finish == SCHED_FINISH_LENGTH ? "length" : finish == SCHED_FINISH_ABORT ? "abort"
                : finish == SCHED_FINISH_ERROR ? "error" : "stop",
        .queue_s = admit - t->t_submit, .prefill_s = first - admit, .decode_s = t->t_end - first,
        .e2e_s = t->t_end - t->t_submit, .n_prompt = t->n_prompt, .n_gen = t->n_gen, .max_tokens = t->max_tokens,
    };
    metrics_request_finished(&f);
}

/* Publishes the end of a task and schedules its wake-up. The engine
 * sequence is released by the caller (reap). */
static void task_finish(sched *s, run_seq *r, int finish, const char *error)
{
    sched_task *t = r->t;
    sched_client *c = r->c;
    pthread_mutex_lock(&c->mu);
    int first = !t->finish;
    if (first) {
        t->finish = finish;
        t->t_end = srv_now();
        if (error) snprintf(t->error, sizeof t->error, "%s", error);
        c->n_finished++;
        c->dirty = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (first) report_finished(t, finish);
    r->finish = finish;
    if (finish == SCHED_FINISH_ABORT) metrics_cancelled();
    wake_add(s, c);
}

static void cache_finished(sched *s, run_seq *r);

/* Frees a finished sequence and the scheduler's reference to its client. */
static void run_seq_release(sched *s, run_seq *r)
{
    cache_finished(s, r);
    if (r->seq >= 0) kda_seq_free(s->e, r->seq);
    sched_client_unref(r->c);
    run_seq_free(r);
}

static int emit_put(sched *s, const char *p, size_t n)
{
    if (!n) return 0;
    if (s->emit_len + n > s->emit_cap) {
        size_t cap = s->emit_cap ? s->emit_cap : 256;
        while (cap < s->emit_len + n) cap *= 2;
        char *e = realloc(s->emit, cap);
        if (!e) return -1;
        s->emit = e;
        s->emit_cap = cap;
    }
    memcpy(s->emit + s->emit_len, p, n);
    s->emit_len += n;
    return 0;
}

/* Text through the stop-string filter into s->emit; returns 1 once stopped.
 * The text of the first min_tokens ids is not searched for stop strings. */
static int emit_text(sched *s, run_seq *r, const char *p, size_t n)
{
    if (!n) return 0;
    if (!r->stopper || r->n_gen <= r->t->min_tokens) { emit_put(s, p, n); return 0; }
    size_t m = 0;
    int stopped = 0;
    const char *safe = tok_stopper_feed(r->stopper, p, n, &m, &stopped);
    emit_put(s, safe, m);
    return stopped;
}

/* One sampled id, the moment the step that made it ends: it joins the
 * sequence (the next step feeds it), and whether it ends the sequence by
 * EOS or length is decided here, so no further step takes a finished
 * sequence. Its text is made by emit_token, which may run while the next
 * step computes. */
static void commit_token(sched *s, run_seq *r, int32_t id, float lp)
{
    const sched_task *t = r->t;
    const double now = srv_now();
    r->gen[r->n_gen++] = id;
    min_tokens_reached(r);
    if (r->n_gen == 1) metrics_ttft(now - t->t_submit);
    else if (s->n_itl < s->o.max_batch) s->itl[s->n_itl++] = now - r->t_last;
    r->t_last = now;
    r->emit_id = id;
    r->emit_lp = lp;
    r->emit_t = now;
    if (t->n_top > 0) {
        memcpy(r->emit_top_ids, r->top_ids, (size_t)t->n_top * sizeof *r->top_ids);
        memcpy(r->emit_top_lps, r->top_lps, (size_t)t->n_top * sizeof *r->top_lps);
    }
    r->final = id == t->eos_id && !t->ignore_eos ? SCHED_FINISH_EOS
             : r->n_gen >= t->max_tokens ? SCHED_FINISH_LENGTH : 0;
    r->emit_pending = 1;
    s->emit_list[s->n_emit++] = r;
}

/* The committed id's text: detokenize, stop strings, the task's output,
 * the end of the task or a wake-up for its connection. */
static void emit_token(sched *s, run_seq *r)
{
    sched_task *t = r->t;
    const int32_t id = r->emit_id;
    s->emit_len = 0;
    int finish = r->final == SCHED_FINISH_EOS ? SCHED_FINISH_EOS : 0;
    if (!finish) {
        size_t n = 0;
        const char *p = tok_stream_push(r->ts, id, &n);
        if (emit_text(s, r, p, n)) finish = SCHED_FINISH_STOP;
    }
    if (!finish && r->final) finish = r->final;
    if (finish && finish != SCHED_FINISH_STOP) {
        /* The stream may hold an incomplete UTF-8 tail, the stopper a
         * possible stop-string prefix: both are text after all. */
        size_t n = 0;
        const char *p = tok_stream_flush(r->ts, &n);
        if (emit_text(s, r, p, n)) finish = SCHED_FINISH_STOP;
        else if (r->stopper) {
            p = tok_stopper_flush(r->stopper, &n);
            emit_put(s, p, n);
        }
    }

    sched_client *c = r->c;
    int oom = 0, slow = 0;
    pthread_mutex_lock(&c->mu);
    oom |= out_token(&t->out, t->n_top, id, r->emit_lp, r->emit_top_ids, r->emit_top_lps);
    if (s->emit_len) oom |= sched_out_text(&t->out, s->emit, s->emit_len);
    t->n_gen = r->n_gen;
    if (t->n_gen == 1) t->t_first = r->emit_t;
    c->dirty = 1;
    slow = c->stream && t->out.len > s->o.max_pending;
    pthread_mutex_unlock(&c->mu);
    s->n_gen_step++;

    if (oom) task_finish(s, r, SCHED_FINISH_ERROR, "out of memory while buffering output");
    else if (slow) task_finish(s, r, SCHED_FINISH_ABORT, "client is not reading its stream");
    else if (finish) task_finish(s, r, finish, NULL);
    else wake_add(s, c);
}

/* Every committed id's text (a sequence that ended meanwhile, by a
 * disconnect, drops its last one). */
static void emit_pending(sched *s)
{
    for (int i = 0; i < s->n_emit; i++) {
        run_seq *r = s->emit_list[i];
        r->emit_pending = 0;
        if (!r->finish) emit_token(s, r);
    }
    s->n_emit = 0;
    /* the metrics' lock once a step, not twice per token (HTTP threads take it too) */
    metrics_itl_many(s->itl, s->n_itl);
    if (s->n_gen_step) metrics_generated_tokens(s->n_gen_step);
    s->n_itl = s->n_gen_step = 0;
}

/* ---- prefix cache (see the top of this file) ---- */

static size_t engine_cache_bytes(void *arg)
{
    kda_usage u;
    kda_engine_usage((kda_engine *)arg, &u);
    return u.cache_bytes;
}

static void engine_drop(void *arg, int snap) { kda_snapshot_drop((kda_engine *)arg, snap); }

/* the echo alternatives a task's rows carry (-1: it does not echo) */
static int echo_ntop(const sched_task *t) { return t->prompt_logprobs ? t->n_top : -1; }

static void cache_gauges(sched *s)
{
    if (!s->pc) return;
    pc_stats st;
    pc_get_stats(s->pc, &st);
    metrics_prefix_cache_size(st.snaps, (double)(engine_cache_bytes(s->e) + st.index_bytes), st.evictions);
}

/* Snapshot of r's sequence as it stands, filed under key[0..n) (n = its
 * length). A full snapshot table first costs cache entries, LRU. */
static void cache_take(sched *s, run_seq *r, const int32_t *key, int n)
{
    if (kda_seq_len(s->e, r->seq) != n) return;
    if (pc_lookup(s->pc, key, n, n, -1).len == n) return; /* cached already */
    char err[256];
    int snap, rc = kda_snapshot_take(s->e, r->seq, &snap, err, sizeof err);
    while (rc == KDA_ENOMEM && kda_snapshots_free(s->e) == 0 && pc_evict_one(s->pc))
        rc = kda_snapshot_take(s->e, r->seq, &snap, err, sizeof err);
    if (rc) {
        srv_log(SRV_LOG_DEBUG, "prefix cache: no snapshot of %d tokens: %s", n, err);
        return;
    }
    pc_store(s->pc, key, n, snap);
    pc_trim(s->pc);
    cache_gauges(s);
}

static void add_point(run_seq *r, int p)
{
    int i = 0;
    while (i < r->n_points && r->points[i] < p) i++;
    if (i < r->n_points && r->points[i] == p) return;
    if (r->n_points == MAX_POINTS) return;
    memmove(r->points + i + 1, r->points + i, (size_t)(r->n_points - i) * sizeof *r->points);
    r->points[i] = p;
    r->n_points++;
}

static int common_prefix(const int32_t *a, const int32_t *b, int n)
{
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static run_seq *running_by_serial(sched *s, unsigned serial)
{
    for (int i = 0; i < s->n_run; i++)
        if (s->running[i]->serial == serial) return s->running[i];
    return NULL;
}

/* 1 when waiting task w should wait for a running request's snapshot: one
 * that shares more than MIN_GAIN prompt tokens beyond w's best snapshot and
 * has not computed them yet (it is asked to snapshot there). */
static int cache_hold(sched *s, run_seq *w)
{
    if (!s->pc || !w->cache) return 0;
    if (w->hold_on) { /* cheap re-check of an earlier decision */
        run_seq *r = running_by_serial(s, w->hold_on);
        if (r && !r->finish && r->n_done < w->hold_at) return 1;
        w->hold_on = 0;
    }
    const sched_task *t = w->t;
    const int n = t->n_prompt, k = echo_ntop(t);
    const int best = pc_lookup(s->pc, t->prompt, n, n - 1, k).len;
    for (int i = 0; i < s->n_run; i++) {
        run_seq *r = s->running[i];
        const sched_task *rt = r->t;
        if (!r->cache || r->finish || r->n_done >= rt->n_prompt) continue;
        if (k >= 0 && echo_ntop(rt) < k) continue; /* its rows would not serve w's echo */
        const int shared = common_prefix(t->prompt, rt->prompt, n < rt->n_prompt ? n : rt->n_prompt);
        const int p = shared - 1; /* w feeds from p: the token at p gives the first new row */
        if (p <= best + MIN_GAIN || r->n_done > p) continue;
        if (r->n_done == p) { /* it stands there right now: snapshot it, w starts from it */
            cache_take(s, r, rt->prompt, p);
            return 0;
        }
        add_point(r, p);
        w->hold_on = r->serial;
        w->hold_at = p;
        return 1;
    }
    return 0;
}

/* The tail point of an n-token prompt restored to hit: one token before the
 * last multiple of TAIL_GRID inside it, when that saves a later request at
 * least TAIL_MIN tokens over the snapshot it would hit otherwise (the hit or
 * the grid point below); 0 = none. Requests that share a long prompt up to
 * near its end (lm-eval's continuations of one context, a regenerated or
 * edited last message) then recompute fewer than TAIL_GRID + their own
 * tokens instead of everything since the last grid point. One token before,
 * so an echo request whose own tokens start at the multiple still has the
 * log-prob of its first one computed (pc_lookup). */
static int tail_point(const sched *s, int n, int hit)
{
    const int p = (n - 1) / TAIL_GRID * TAIL_GRID - 1;
    if (p <= 0) return 0;
    const int below = hit > p / s->grid * s->grid ? hit : p / s->grid * s->grid;
    return p - below >= TAIL_MIN ? p : 0;
}

/* After kda_seq_new: starts r from its longest cached prefix and plans its
 * snapshot points. Returns the tokens restored. */
static int cache_admit(sched *s, run_seq *r)
{
    if (!s->pc || !r->cache) return 0;
    sched_task *t = r->t;
    const int n = t->n_prompt, k = echo_ntop(t);
    pc_match m = pc_lookup(s->pc, t->prompt, n, n - 1, k);
    int hit = 0;
    if (m.len > 0) {
        char err[256];
        int rc = kda_seq_restore(s->e, r->seq, m.snap, t->prompt, n, err, sizeof err);
        if (rc) {
            srv_log(SRV_LOG_DEBUG, "prefix cache: restore of %d tokens failed: %s", m.len, err);
        } else {
            hit = m.len;
            if (k >= 0) pc_echo_read(s->pc, t->prompt, hit, k, t->prompt_lps, t->prompt_top_ids, t->prompt_top_lps);
        }
    }
    r->n_done = hit;
    t->n_cached = hit;
    metrics_prefix_cache_lookup(n, hit);
    /* snapshot points: the branch point and the end of a scoring prompt (the
     * grid is implicit: every multiple of s->grid inside the prompt) */
    r->n_points = 0;
    if (m.shared - 1 > hit + MIN_GAIN) add_point(r, m.shared - 1);
    const int tail = tail_point(s, n, hit);
    if (tail > 0) add_point(r, tail);
    if (t->max_tokens == 0) add_point(r, n);
    pc_insert(s->pc, t->prompt, n); /* later requests see where they branch off this one */
    return hit;
}

/* Where r's next prompt chunk ends: the next multiple of C (fixed positions,
 * whatever the cache restored), the prompt's end, the next grid position or
 * the next planned snapshot point. */
static int chunk_end(const sched *s, const run_seq *r, int from, int C)
{
    int end = (from / C + 1) * C;
    if (end > r->t->n_prompt) end = r->t->n_prompt;
    if (s->pc && r->cache) {
        const int g = (from / s->grid + 1) * s->grid;
        if (g < end) end = g;
        for (int i = 0; i < r->n_points; i++)
            if (r->points[i] > from && r->points[i] < end) end = r->points[i];
    }
    return end;
}

/* a prompt position where a snapshot is taken: a step's chunk must end there */
static int snapshot_point(const sched *s, const run_seq *r, int pos)
{
    if (!s->pc || !r->cache) return 0;
    if (pos % s->grid == 0) return 1;
    for (int i = 0; i < r->n_points; i++)
        if (r->points[i] == pos) return 1;
    return 0;
}

/* After a prompt chunk of r ran (r->n_done not yet advanced): its rows'
 * echo outputs into the index, and a snapshot where one is planned. */
static void cache_after_prompt_step(sched *s, run_seq *r, const kda_batch_item *it)
{
    if (!s->pc || !r->cache) return;
    sched_task *t = r->t;
    const int r0 = r->n_done, r1 = r0 + it->n_tokens, k = echo_ntop(t);
    if (k >= 0)
        pc_echo_write(s->pc, t->prompt, t->n_prompt, r0, r1, t->prompt_lps + r0, k,
                      k ? t->prompt_top_ids + (size_t)r0 * k : NULL, k ? t->prompt_top_lps + (size_t)r0 * k : NULL);
    int take = r1 % s->grid == 0 && r1 < t->n_prompt;
    while (r->n_points && r->points[0] <= r1) {
        take |= r->points[0] == r1;
        memmove(r->points, r->points + 1, (size_t)--r->n_points * sizeof *r->points);
    }
    if (take) cache_take(s, r, t->prompt, r1);
}

/* A generation that ended normally leaves a snapshot of everything it fed
 * (prompt and generated tokens but the last): the next turn of a chat,
 * which resends the history, starts from it. */
static void cache_finished(sched *s, run_seq *r)
{
    if (!s->pc || !r->cache || r->seq < 0 || r->n_gen < 1) return;
    if (r->finish != SCHED_FINISH_LENGTH && r->finish != SCHED_FINISH_EOS && r->finish != SCHED_FINISH_STOP) return;
    const sched_task *t = r->t;
    /* the prompt and the generated ids but the last; or all of them when a
     * stop string ended it while the next step, which fed the last, ran */
    const int n = kda_seq_len(s->e, r->seq), g = n - t->n_prompt;
    if (g < 0 || g > r->n_gen) return;
    memcpy(s->key, t->prompt, (size_t)t->n_prompt * sizeof *s->key);
    memcpy(s->key + t->n_prompt, r->gen, (size_t)g * sizeof *s->key);
    cache_take(s, r, s->key, n);
}

/* kda_seq_reserve, evicting cache entries while the memory they alone hold
 * could make room: a request never fails because the cache holds memory. */
static int reserve_evicting(sched *s, int seq, int n_tokens, char *err, size_t errlen)
{
    int rc = kda_seq_reserve(s->e, seq, n_tokens, err, errlen);
    while (rc == KDA_ENOMEM && s->pc && engine_cache_bytes(s->e) > 0 && pc_evict_one(s->pc))
        rc = kda_seq_reserve(s->e, seq, n_tokens, err, errlen);
    return rc;
}

/* ---- one step ---- */

/* The time since the last mark goes to phase k. */
static void phase(sched *s, int k)
{
    const double now = srv_now();
    s->phase_s[k] += now - s->t_mark;
    s->t_mark = now;
}

/* The phases so far (the last one ends now as k) into the metrics, once per iteration. */
static void phase_flush(sched *s, int k)
{
    phase(s, k);
    metrics_sched_phases(s->phase_s);
    memset(s->phase_s, 0, sizeof s->phase_s);
}

/* The device failed during a step: its n sequences are lost (engine.h). */
static void fail_step(sched *s, int n, int rc, const char *err)
{
    char msg[300];
    snprintf(msg, sizeof msg, "engine error: %s", err);
    srv_log(SRV_LOG_ERROR, "engine step failed (%s): %s; failing %d sequences", kda_strerror(rc), err, n);
    for (int i = 0; i < n; i++) task_finish(s, s->item_seq[i], SCHED_FINISH_ERROR, msg);
}

/* Builds the next step (one token for every decoding sequence, then prompt
 * chunks oldest first while the budget lasts) and launches it. */
static void step_launch(sched *s)
{
    int n = 0, n_tok = 0, n_decode = 0, tg_used = 0;
    const int C = s->o.prefill_chunk;
    for (int i = 0; i < s->n_run; i++) {
        const run_seq *r = s->running[i];
        n_decode += !r->finish && !r->final && r->n_done >= r->t->n_prompt;
    }
    int budget = n_decode ? s->o.step_tokens : s->o.step_tokens_idle;

    for (int i = 0; i < s->n_run; i++) {
        run_seq *r = s->running[i];
        if (r->finish || r->final || r->n_done < r->t->n_prompt) continue;
        s->items[n] = (kda_batch_item){
            .seq = r->seq, .tokens = &r->gen[r->n_gen - 1], .n_tokens = 1,
            .sampling = &r->samp, .sampled = &r->sampled, .sampled_logprob = &r->sampled_lp,
            .n_top = r->t->n_top, .top_ids = r->top_ids, .top_logprobs = r->top_lps,
        };
        s->item_seq[n++] = r;
        budget--;
        n_tok++;
    }
    for (int i = 0; i < s->n_run; i++) {
        run_seq *r = s->running[i];
        sched_task *t = r->t;
        if (r->finish || r->n_done >= t->n_prompt) continue;
        int chunk = chunk_end(s, r, r->n_done, C) - r->n_done;
        /* Oldest first; a step always makes progress on at least one prompt. */
        if (chunk > budget && n > 0) break;
        for (int k = 1; r->n_done + chunk < t->n_prompt && !snapshot_point(s, r, r->n_done + chunk) &&
                        (!s->o.chunks_per_step || k < s->o.chunks_per_step); k++) { /* more whole chunks */
            const int next = chunk_end(s, r, r->n_done + chunk, C) - r->n_done;
            if (next > budget) break;
            chunk = next;
        }
        kda_batch_item *it = &s->items[n];
        *it = (kda_batch_item){.seq = r->seq, .tokens = t->prompt + r->n_done, .n_tokens = chunk};
        if (t->prompt_logprobs) {
            if (tg_used + chunk > s->n_targets) break; /* cannot happen: n_targets covers the largest budget */
            int32_t *tg = s->targets + tg_used;
            tg_used += chunk;
            for (int j = 0; j < chunk; j++) {
                int k = r->n_done + j + 1;
                tg[j] = k < t->n_prompt ? t->prompt[k] : -1;
            }
            it->targets = tg;
            it->target_logprobs = t->prompt_lps + r->n_done;
            if (t->n_top > 0) {
                it->n_top = t->n_top;
                it->pos_top_ids = t->prompt_top_ids + (size_t)r->n_done * (size_t)t->n_top;
                it->pos_top_logprobs = t->prompt_top_lps + (size_t)r->n_done * (size_t)t->n_top;
            }
        }
        if (r->n_done + chunk == t->n_prompt && t->max_tokens > 0) {
            it->sampling = &r->samp;
            it->sampled = &r->sampled;
            it->sampled_logprob = &r->sampled_lp;
            it->n_top = t->n_top;
            it->top_ids = r->top_ids;
            it->top_logprobs = r->top_lps;
        }
        s->item_seq[n++] = r;
        budget -= chunk;
        n_tok += chunk;
    }
    if (!n) return;

    char err[256] = "";
    phase(s, METRICS_SCHED_BUILD);
    s->t_flight = s->t_mark;
    int rc = kda_engine_step_begin(s->e, s->items, n, err, sizeof err);
    phase(s, METRICS_SCHED_ENGINE);
    if (rc) {
        metrics_step(s->t_mark - s->t_flight, n_tok, n);
        const int bad = kda_engine_step_bad_item(s->e);
        if (bad >= 0 && rc != KDA_EDEVICE) {
            /* one request the engine refuses: nothing advanced, so only it
             * ends and the others run in the next step */
            char msg[300];
            snprintf(msg, sizeof msg, "engine error: %s", err);
            srv_log(SRV_LOG_WARN, "engine refused a request (%s): %s", kda_strerror(rc), err);
            task_finish(s, s->item_seq[bad], SCHED_FINISH_ERROR, msg);
            return;
        }
        fail_step(s, n, rc, err);
        return;
    }
    s->n_flight = n;
    s->n_flight_tok = n_tok;
}

/* Waits for the step in flight and commits what it made: prompt progress
 * (and the snapshots planned there), the sampled ids. */
static void step_finish(sched *s)
{
    const int n = s->n_flight;
    if (!n) return;
    s->n_flight = 0;
    phase(s, METRICS_SCHED_WAKE);
    char err[256] = "";
    int rc = kda_engine_step_end(s->e, err, sizeof err);
    phase(s, METRICS_SCHED_WAIT);
    metrics_step(s->t_mark - s->t_flight, s->n_flight_tok, n);
    if (rc) {
        fail_step(s, n, rc, err);
        return;
    }
    if (srv_log_level >= SRV_LOG_DEBUG) { /* the step trace: where a request's time goes between steps */
        int rows = 0;
        for (int i = 0; i < n; i++) rows += s->item_seq[i]->n_done < s->item_seq[i]->t->n_prompt; /* not advanced yet */
        srv_log(SRV_LOG_DEBUG, "step: %d sequences (%d prompt chunks), %d tokens; %.3f ms launch to end, %.3f ms "
                "from the previous step's end to this launch", n, rows, s->n_flight_tok, (s->t_mark - s->t_flight) * 1e3,
                s->t_prev_end > 0 ? (s->t_flight - s->t_prev_end) * 1e3 : 0.0);
    }
    s->t_prev_end = s->t_mark;
    for (int i = 0; i < n; i++) {
        run_seq *r = s->item_seq[i];
        sched_task *t = r->t;
        kda_batch_item *it = &s->items[i];
        if (r->finish) continue; /* ended while the step ran (a stop string, a disconnect): its output is dropped */
        if (r->n_done < t->n_prompt) {
            cache_after_prompt_step(s, r, it);
            r->n_done += it->n_tokens;
            if (r->n_done < t->n_prompt) continue;
            if (t->max_tokens == 0) { task_finish(s, r, SCHED_FINISH_LENGTH, NULL); continue; }
        }
        commit_token(s, r, r->sampled, r->sampled_lp);
    }
    phase(s, METRICS_SCHED_OUTPUTS);
}

/* ---- the loop ---- */

static void reap(sched *s)
{
    int k = 0;
    for (int i = 0; i < s->n_run; i++) {
        run_seq *r = s->running[i];
        if (r->finish && !r->emit_pending) run_seq_release(s, r);
        else s->running[k++] = r;
    }
    s->n_run = k;
}

/* Sequences of clients that went away, or all of them. */
static void drop_cancelled(sched *s, int all)
{
    for (int i = 0; i < s->n_run; i++) {
        run_seq *r = s->running[i];
        pthread_mutex_lock(&r->c->mu);
        int gone = r->c->cancelled;
        pthread_mutex_unlock(&r->c->mu);
        if (gone || all) task_finish(s, r, SCHED_FINISH_ABORT, all ? "server is shutting down" : NULL);
    }
    reap(s);
    int dropped = 0;
    run_seq **pp = &s->wait_head;
    s->wait_tail = NULL;
    while (*pp) {
        run_seq *r = *pp;
        pthread_mutex_lock(&r->c->mu);
        int gone = r->c->cancelled;
        pthread_mutex_unlock(&r->c->mu);
        if (gone || all) {
            *pp = r->next;
            task_finish(s, r, SCHED_FINISH_ABORT, all ? "server is shutting down" : NULL);
            run_seq_release(s, r);
            dropped++;
        } else {
            s->wait_tail = r;
            pp = &r->next;
        }
    }
    if (dropped) {
        pthread_mutex_lock(&s->mu);
        s->n_queued -= dropped;
        pthread_mutex_unlock(&s->mu);
    }
}

static void admit(sched *s)
{
    int admitted = 0;
    run_seq **pp = &s->wait_head, *prev = NULL;
    while (*pp && s->n_run < s->o.max_batch && kda_seqs_free_slots(s->e) > 0) {
        run_seq *r = *pp;
        if (cache_hold(s, r)) { /* waits for a running sibling's snapshot; the next may go */
            prev = r;
            pp = &r->next;
            continue;
        }
        char err[256] = "";
        int rc = kda_seq_new(s->e, &r->seq, err, sizeof err);
        if (!rc) cache_admit(s, r);
        /* Reserve the whole request (prompt + max_tokens) now, so no later
         * step can fail for memory and take its batch neighbours down. */
        if (!rc && (rc = reserve_evicting(s, r->seq, r->t->n_prompt + r->t->max_tokens, err, sizeof err))) {
            kda_seq_free(s->e, r->seq);
            r->seq = -1;
            r->n_done = 0;
            r->t->n_cached = 0;
        }
        if (rc == KDA_ENOMEM && s->n_run > 0) break;   /* room comes back as others finish */
        *pp = r->next;
        if (s->wait_tail == r) s->wait_tail = prev;
        admitted++;
        if (rc) {
            r->seq = -1;
            char msg[300];
            snprintf(msg, sizeof msg, "could not start a sequence: %s", err);
            task_finish(s, r, SCHED_FINISH_ERROR, msg);
            run_seq_release(s, r);
            continue;
        }
        r->serial = ++s->next_serial;
        pthread_mutex_lock(&r->c->mu);
        r->t->t_admit = srv_now();
        pthread_mutex_unlock(&r->c->mu);
        s->running[s->n_run++] = r;
        metrics_prompt_tokens(r->t->n_prompt);
    }
    pthread_mutex_lock(&s->mu);
    s->n_queued -= admitted;
    s->n_running = s->n_run;
    int waiting = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    metrics_queue(waiting, s->n_run);
    kda_usage u;
    kda_engine_usage(s->e, &u);
    metrics_pool(u.seqs_used, u.seqs_total, (double)(u.kv_bytes_used + u.state_bytes_used));
    cache_gauges(s);
}

static void sched_free_arrays(sched *s)
{
    free(s->running); free(s->items); free(s->item_seq); free(s->itl); free(s->targets); free(s->emit_list);
}

/* One iteration: the step in flight ends and its results are committed;
 * cancellations, releases and admissions (everything that changes the
 * engine's sequences happens while no step runs); the next step is launched;
 * then, with overlap, the ids committed before the launch become text and
 * their connections are woken while the device computes. Without overlap
 * that delivery comes before anything else, as soon as the step ends. */
static void *sched_main(void *arg)
{
    sched *s = arg;
    s->t_mark = srv_now();
    for (;;) {
        pthread_mutex_lock(&s->mu);
#define SCHED_NOTHING (!s->stop && !s->cancel_all && !s->in_head && s->n_run == 0 && !s->wait_head && !s->n_flight)
        if (SCHED_NOTHING) phase_flush(s, METRICS_SCHED_WAKE);
        while (SCHED_NOTHING) pthread_cond_wait(&s->cv, &s->mu);
#undef SCHED_NOTHING
        phase(s, METRICS_SCHED_IDLE);
        if (s->in_head) {
            if (s->wait_tail) s->wait_tail->next = s->in_head;
            else s->wait_head = s->in_head;
            s->wait_tail = s->in_tail;
            s->in_head = s->in_tail = NULL;
        }
        int stop = s->stop, all = s->cancel_all;
        s->cancel_all = 0;
        pthread_mutex_unlock(&s->mu);

        step_finish(s);
        if (!s->o.overlap) {
            emit_pending(s);
            phase(s, METRICS_SCHED_OUTPUTS);
            wake_flush(s);
            phase(s, METRICS_SCHED_WAKE);
        }
        drop_cancelled(s, all || stop);
        if (stop) {
            emit_pending(s); /* every sequence has ended: this only clears the list */
            reap(s);
            wake_flush(s);
            break;
        }
        admit(s);
        if (s->n_run == 0 && s->wait_head) {
            /* Nothing runs yet nothing could be admitted: the engine has no slot
             * to give. Fail the head rather than spin. */
            run_seq *r = s->wait_head;
            s->wait_head = r->next;
            if (!s->wait_head) s->wait_tail = NULL;
            task_finish(s, r, SCHED_FINISH_ERROR, "no free engine sequence slot");
            run_seq_release(s, r);
            pthread_mutex_lock(&s->mu);
            s->n_queued--;
            pthread_mutex_unlock(&s->mu);
        }
        phase(s, METRICS_SCHED_ADMIT);
        step_launch(s);
        if (s->o.overlap) {
            emit_pending(s);
            phase(s, METRICS_SCHED_OUTPUTS);
            wake_flush(s);
        }
        if (s->n_run == 0) {
            pthread_mutex_lock(&s->mu);
            s->n_running = 0;
            pthread_mutex_unlock(&s->mu);
            admit(s);   /* refresh the pool gauges */
        }
        phase_flush(s, METRICS_SCHED_WAKE);
    }
    return NULL;
}

/* ---- public ---- */

int sched_start(sched **out, kda_engine *e, const tok_tokenizer *tok, const sched_opts *o,
                char *err, size_t errlen)
{
    sched *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return -1; }
    s->e = e;
    s->tok = tok;
    s->info = kda_engine_info(e);
    s->o = *o;
    s->running = calloc((size_t)o->max_batch, sizeof *s->running);
    s->items = calloc((size_t)o->max_batch, sizeof *s->items);
    s->item_seq = calloc((size_t)o->max_batch, sizeof *s->item_seq);
    s->itl = calloc((size_t)o->max_batch, sizeof *s->itl);
    s->emit_list = calloc((size_t)o->max_batch, sizeof *s->emit_list);
    /* a step's prompt tokens: at most the larger budget, or one chunk beyond it */
    s->n_targets = (o->step_tokens > o->step_tokens_idle ? o->step_tokens : o->step_tokens_idle) + o->prefill_chunk;
    s->targets = calloc((size_t)s->n_targets, sizeof *s->targets);
    if (!s->running || !s->items || !s->item_seq || !s->itl || !s->targets || !s->emit_list) {
        snprintf(err, errlen, "out of memory for a batch of %d", o->max_batch);
        sched_free_arrays(s); free(s);
        return -1;
    }
    if (o->prefix_cache_bytes && s->info->max_snapshots > 0) {
        pc_opts po = {.budget = o->prefix_cache_bytes, .arg = e, .drop = engine_drop, .engine_bytes = engine_cache_bytes};
        s->pc = pc_new(&po);
        s->key = malloc((size_t)s->info->max_seq_len * sizeof *s->key);
        if (!s->pc || !s->key) {
            snprintf(err, errlen, "out of memory for the prefix cache");
            pc_free(s->pc); free(s->key);
            sched_free_arrays(s); free(s);
            return -1;
        }
        s->grid = sched_prefix_grid(s->info, o);
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        snprintf(err, errlen, "could not start the scheduler thread");
        pc_free(s->pc); free(s->key);
        sched_free_arrays(s); free(s);
        return -1;
    }
    *out = s;
    return 0;
}

int sched_submit(sched *s, sched_client *c)
{
    run_seq *head = NULL, *tail = NULL;
    for (int i = 0; i < c->n_tasks; i++) {
        run_seq *r = run_seq_new(s->tok, c, &c->tasks[i]);
        if (!r) {
            while (head) { run_seq *nx = head->next; run_seq_free(head); head = nx; }
            return SCHED_ENOMEM;
        }
        if (tail) tail->next = r; else head = r;
        tail = r;
    }
    pthread_mutex_lock(&s->mu);
    int rc = s->closed ? SCHED_ECLOSED
           : s->n_queued + c->n_tasks > s->o.max_queue ? SCHED_EFULL : SCHED_OK;
    if (rc == SCHED_OK) {
        if (s->in_tail) s->in_tail->next = head; else s->in_head = head;
        s->in_tail = tail;
        s->n_queued += c->n_tasks;
        pthread_mutex_lock(&c->mu);
        c->refs += c->n_tasks;
        pthread_mutex_unlock(&c->mu);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc != SCHED_OK)
        while (head) { run_seq *nx = head->next; run_seq_free(head); head = nx; }
    return rc;
}

void sched_close_admission(sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    pthread_mutex_unlock(&s->mu);
}

int sched_pending(sched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_queued + s->n_running;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void sched_cancel_all(sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->cancel_all = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sched_stop(sched *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    s->closed = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    /* Anything submitted after the thread's last look. */
    for (run_seq *r = s->in_head; r;) {
        run_seq *nx = r->next;
        task_finish(s, r, SCHED_FINISH_ABORT, "server is shutting down");
        run_seq_release(s, r);
        r = nx;
    }
    wake_flush(s);
    if (s->pc) {
        pc_stats st;
        pc_get_stats(s->pc, &st);
        pc_free(s->pc); /* every snapshot back to the engine */
        kda_usage u;
        kda_engine_usage(s->e, &u);
        srv_log(SRV_LOG_INFO, "prefix cache: dropped %d snapshots (%lu evicted while running); engine now holds "
                "%d sequences, %zu KV bytes, %d snapshots, %zu cache bytes",
                st.snaps, st.evictions, u.seqs_used, u.kv_bytes_used, u.snaps_used, u.cache_bytes);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    sched_free_arrays(s);
    free(s->wake); free(s->emit); free(s->key);
    free(s);
}

int sched_prefix_grid(const kda_model_info *in, const sched_opts *o)
{
    const int C = o->prefill_chunk > 0 ? o->prefill_chunk : 1;
    if (o->prefix_grid > 0) return o->prefix_grid;
    /* the tokens whose KV is as large as one snapshot, a multiple of C (at least C) */
    const size_t state = in->snapshot_bytes_each ? in->snapshot_bytes_each : in->state_bytes_per_seq;
    const size_t per_token = in->kv_bytes_per_token ? in->kv_bytes_per_token : 1;
    const size_t g = state / per_token / (size_t)C * (size_t)C;
    return g < (size_t)C ? C : g > (1u << 20) ? 1 << 20 : (int)g;
}

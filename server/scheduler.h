/*
 * scheduler.h - the scheduler thread: owns the engine and every live sequence.
 *
 * HTTP threads build a sched_client (one sched_task per sequence: one per
 * prompt and per choice of n), submit it, and read results back from it.
 * The scheduler thread admits tasks into the running batch at step
 * boundaries (continuous batching), feeds prompts in fixed-size chunks under
 * a per-step token budget (each starting after the longest prefix the prefix
 * cache holds, see scheduler.c), samples through the engine, detokenizes and
 * applies stop strings, and appends new text to each task's output buffer.
 *
 * Ownership and locking:
 *  - task request fields are written by the HTTP thread before submit and
 *    are read-only afterwards;
 *  - task result fields (out, finish, counts, timings) are written by the
 *    scheduler under client->mu; once finish != 0 the scheduler never
 *    touches the task again, so a reader that saw finish under mu may read
 *    the rest without the lock;
 *  - client->cancelled is set by the HTTP side (disconnect); the scheduler
 *    frees the sequence at its next step boundary.
 * The scheduler never blocks on a client: output accumulates in memory
 * bounded by max_pending, past which the task is aborted.
 */
#ifndef SRV_SCHED_H
#define SRV_SCHED_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "tokenizer.h"

enum {
    SCHED_FINISH_NONE = 0,
    SCHED_FINISH_LENGTH,   /* max_tokens reached */
    SCHED_FINISH_EOS,      /* the model produced EOS */
    SCHED_FINISH_STOP,     /* a stop string completed */
    SCHED_FINISH_ABORT,    /* cancelled: disconnect, shutdown or too slow a reader */
    SCHED_FINISH_ERROR,    /* engine failure; task->error says why */
};

/* Output produced since the HTTP side last drained it. */
typedef struct {
    char *text; size_t len, text_cap; /* new UTF-8 text, not NUL-terminated */
    int32_t *ids;                  /* [cap] new token ids */
    float *lps;                    /* [cap] raw log-prob of each id (if task->logprobs) */
    int32_t *top_ids;              /* [cap * n_top] best alternatives per id */
    float *top_lps;                /* [cap * n_top] */
    int n, cap;
} sched_out;

typedef struct {
    /* request: written before submit, read-only afterwards */
    int32_t *prompt; int n_prompt; /* [n_prompt], owned by the task */
    int max_tokens;                /* 0: prompt only (scoring) */
    float temperature, top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int top_k;
    uint64_t seed;
    char **stops; int n_stops;     /* owned */
    int logprobs;                  /* record each generated id's log-prob */
    int n_top;                     /* ... and this many alternatives (0..20) */
    int prompt_logprobs;           /* fill prompt_lps (score, echo) */
    int eos_id;                    /* -1: none */
    int ignore_eos;
    kda_logit_bias *logit_bias; int n_logit_bias;  /* owned; added to the logits (OpenAI logit_bias) */
    int min_tokens;                /* until this many ids: EOS banned, stop strings not searched */
    int no_cache;                  /* bypass the prefix cache: no lookup, no snapshots */
    double t_submit;               /* srv_now() at arrival */

    /* results: written by the scheduler under client->mu */
    sched_out out;
    float *prompt_lps;             /* [n_prompt] log p(prompt[i+1] | prompt[0..i]); last is 0 */
    int32_t *prompt_top_ids;       /* [n_prompt * n_top] alternatives at each prompt_lps entry */
    float *prompt_top_lps;         /* [n_prompt * n_top] */
    int finish;                    /* SCHED_FINISH_*, set once */
    int n_gen;                     /* generated ids so far */
    int n_cached;                  /* prompt tokens served from the prefix cache (not computed) */
    double t_admit, t_first, t_end;/* srv_now(); t_first 0 until the first id */
    char error[320];
} sched_task;

typedef struct sched_client sched_client;
struct sched_client {
    pthread_mutex_t mu;
    int refs;                      /* HTTP side + one per task held by the scheduler */
    int n_tasks;
    sched_task *tasks;             /* [n_tasks] */
    int n_finished;                /* under mu */
    int dirty;                     /* under mu: new output since the HTTP side last looked */
    int heartbeat;                 /* under mu: a keep-alive comment is due (set by the HTTP side) */
    int cancelled;                 /* under mu: the client is gone */
    int stream;
    /* Called by the scheduler, without mu held, after it set dirty. */
    void (*wake)(sched_client *c);
    void *wake_arg;
    int wake_queued;               /* scheduler thread only: on its wake list (one entry per client) */
};

sched_client *sched_client_new(int n_tasks);
void sched_client_ref(sched_client *c);
void sched_client_unref(sched_client *c);
/* Marks the client gone; its sequences are freed at the next step. */
void sched_client_cancel(sched_client *c);
/* Appends n bytes to an output buffer (HTTP-side helpers use it too). */
int sched_out_text(sched_out *o, const char *s, size_t n);
void sched_out_free(sched_out *o);

typedef struct {
    int max_batch;        /* running sequences at once */
    int max_queue;        /* tasks waiting for a batch slot; more is 503 */
    int step_tokens;      /* token budget of a step while sequences decode (bounds their inter-token latency) */
    int step_tokens_idle; /* ... and of a step when none decodes (prompts only: as much as the engine takes) */
    int prefill_chunk;    /* prompts are cut at multiples of this; a step takes whole chunks */
    int chunks_per_step;  /* at most this many chunks of one prompt per step (0 = as the budget allows) */
    size_t max_pending;   /* unread bytes per task before a slow reader is cut off */
    /* prefix cache (server/prefix_cache.h): off when prefix_cache_bytes is 0;
     * the engine must have been opened with snapshot room */
    size_t prefix_cache_bytes;  /* budget: engine snapshot memory + the index */
    int prefix_grid;            /* snapshot every this many prompt tokens (0 = from memory, see scheduler.c) */
    /* 1: the next step is launched before the last one's tokens are turned
     * into text and delivered, which then happens while the device runs it
     * (scheduler.c, "overlap"); 0: every step's tokens are delivered before
     * the next step starts */
    int overlap;
} sched_opts;

typedef struct sched sched;

enum { SCHED_OK = 0, SCHED_EFULL = -1, SCHED_ECLOSED = -2, SCHED_ENOMEM = -3 };

/* Takes over e and tok's streaming use; e is only touched by the scheduler
 * thread from here on (kda_engine_info excepted). */
int sched_start(sched **out, kda_engine *e, const tok_tokenizer *tok, const sched_opts *o,
                char *err, size_t errlen);
/* Queues every task of c. SCHED_EFULL: queue full; SCHED_ECLOSED: draining;
 * SCHED_ENOMEM: no memory for the sequences' buffers. */
int sched_submit(sched *s, sched_client *c);
void sched_close_admission(sched *s);   /* further submits get SCHED_ECLOSED */
int sched_pending(sched *s);            /* tasks queued or running */
void sched_cancel_all(sched *s);        /* abort everything now (end of grace period) */
void sched_stop(sched *s);              /* joins the thread, drops the prefix cache; the engine is free again */
/* The prefix cache's snapshot grid for this model and these options (the
 * startup log reports it). */
int sched_prefix_grid(const kda_model_info *in, const sched_opts *o);

#endif

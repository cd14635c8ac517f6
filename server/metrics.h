/*
 * metrics.h - process-wide counters, gauges and histograms, rendered as
 * Prometheus text by GET /metrics. Any thread may update them; one mutex
 * guards everything (updates are a few per request or per step).
 *
 * Two families: our own kda_* series, and the same counters again under
 * vLLM's names (vllm:*, each with a model_name label) so that dashboards
 * written for vLLM work unchanged; README.md ("Metrics") has the mapping.
 * process_* series follow the Prometheus client conventions.
 */
#ifndef SRV_METRICS_H
#define SRV_METRICS_H

#include <stddef.h>

/* Route names are indexed by the caller's route ids; the array must outlive
 * the process. Statuses outside a fixed list are counted as "other". */
void metrics_init(const char *const *route_names, int n_routes);
/* The model_name label of the vllm:* series (copied) and the bytes the KV
 * cache and state pools hold in all (the denominator of the cache usage
 * fraction). Call once the model is loaded. */
void metrics_set_model(const char *model_name, double cache_bytes_total);
void metrics_request(int route, int status);
void metrics_prompt_tokens(long n);
void metrics_generated_tokens(long n);
void metrics_cancelled(void);
void metrics_ttft(double seconds);
void metrics_itl_many(const double *seconds, int n); /* n gaps under one lock (a step's) */
void metrics_step(double seconds, int n_tokens, int n_seqs);
/* The scheduler thread's wall time by what it did (seconds since the last
 * call, added to kda_scheduler_seconds_total{phase}): where a step's time
 * goes besides the engine, so the share the GPU waits on the host is read
 * off /metrics. */
enum {
    METRICS_SCHED_IDLE,     /* nothing to run: waiting for a request */
    METRICS_SCHED_ADMIT,    /* taking submissions, dropping cancelled ones, admitting (prefix cache included) */
    METRICS_SCHED_BUILD,    /* building the step's items */
    METRICS_SCHED_ENGINE,   /* inside the engine: the whole step, or its launch with an overlapped step */
    METRICS_SCHED_WAIT,     /* waiting for an overlapped step's results */
    METRICS_SCHED_OUTPUTS,  /* the step's results: snapshots, detokenizing, stop strings, output buffers */
    METRICS_SCHED_WAKE,     /* waking HTTP connections, releasing finished sequences */
    METRICS_SCHED_N
};
void metrics_sched_phases(const double *seconds);
void metrics_queue(int waiting, int running);
void metrics_pool(int used_seqs, int total_seqs, double used_bytes);
/* a request looked its prompt up in the prefix cache and got hit_tokens of it */
void metrics_prefix_cache_lookup(long prompt_tokens, long hit_tokens);
void metrics_prefix_cache_size(int snapshots, double bytes, unsigned long evictions);

/* Requests and connections refused by the HTTP layer's limits (README,
 * "Limits"), by reason. */
enum {
    METRICS_REJECT_CLIENT_CONNECTIONS,  /* --max-connections-per-client */
    METRICS_REJECT_REQUEST_TIMEOUT,     /* --request-timeout: closed before the request was complete */
    METRICS_REJECT_BODY_SIZE,           /* --max-body-bytes (413) */
    METRICS_REJECT_BODY_BUDGET,         /* --max-body-bytes-in-flight (503) */
    METRICS_REJECT_CLIENT_BODY_BUDGET,  /* --max-body-bytes-in-flight-per-client (503) */
    METRICS_REJECT_JSON_MEMORY,         /* --max-json-bytes (413) */
    METRICS_REJECT_CONTENT_TYPE,        /* 415 */
    METRICS_REJECT_FRAMING,             /* conflicting Content-Length / Transfer-Encoding (400) */
    METRICS_REJECT_UNAUTHORIZED,        /* 401 */
    METRICS_N_REJECT
};
void metrics_rejected(int reason);
/* Open connections and request-body bytes reserved, now (gauges). */
void metrics_http(long open_connections, long body_bytes);

/* One finished sequence (a task), as vLLM reports a finished request. */
typedef struct {
    const char *reason;     /* "stop", "length", "abort" or "error" */
    double queue_s;         /* arrival -> admitted to the batch */
    double prefill_s;       /* admitted -> first generated token */
    double decode_s;        /* first generated token -> finished */
    double e2e_s;           /* arrival -> finished */
    long n_prompt, n_gen, max_tokens;
} metrics_finished;
void metrics_request_finished(const metrics_finished *f);

/* malloc'd text, *len its length. */
char *metrics_render(size_t *len);

#endif

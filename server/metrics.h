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
void metrics_itl(double seconds);
void metrics_step(double seconds, int n_tokens, int n_seqs);
void metrics_queue(int waiting, int running);
void metrics_pool(int used_seqs, int total_seqs, double used_bytes);
/* a request looked its prompt up in the prefix cache and got hit_tokens of it */
void metrics_prefix_cache_lookup(long prompt_tokens, long hit_tokens);
void metrics_prefix_cache_size(int snapshots, double bytes, unsigned long evictions);

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

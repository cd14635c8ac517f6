/*
 * metrics.h - process-wide counters, gauges and histograms, rendered as
 * Prometheus text by GET /metrics. Any thread may update them; one mutex
 * guards everything (updates are a few per request or per step).
 */
#ifndef SRV_METRICS_H
#define SRV_METRICS_H

#include <stddef.h>

/* Route names are indexed by the caller's route ids; the array must outlive
 * the process. Statuses outside a fixed list are counted as "other". */
void metrics_init(const char *const *route_names, int n_routes);
void metrics_request(int route, int status);
void metrics_prompt_tokens(long n);
void metrics_generated_tokens(long n);
void metrics_cancelled(void);
void metrics_ttft(double seconds);
void metrics_itl(double seconds);
void metrics_step(double seconds, int n_tokens, int n_seqs);
void metrics_queue(int waiting, int running);
void metrics_pool(int used_seqs, int total_seqs, double used_bytes);

/* malloc'd text, *len its length. */
char *metrics_render(size_t *len);

#endif

/* metrics.c - see metrics.h. Histogram buckets suit per-token latencies from
 * a tiny CPU model (sub-millisecond) up to a big model's prompt (seconds). */
#include "metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROUTES 16
#define N_BUCKETS 16

static const double buckets[N_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                          0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const int statuses[] = {200, 400, 401, 404, 405, 413, 500, 503};
#define N_STATUS ((int)(sizeof statuses / sizeof statuses[0]) + 1)   /* + "other" */

typedef struct {
    unsigned long count[N_BUCKETS];   /* not cumulative; summed on render */
    unsigned long n;
    double sum;
} histogram;

static struct {
    pthread_mutex_t mu;
    const char *const *routes;
    int n_routes;
    unsigned long requests[MAX_ROUTES][N_STATUS];
    unsigned long prompt_tokens, generated_tokens, cancelled, steps, step_tokens;
    int waiting, running, pool_used, pool_total;
    double pool_bytes;
    histogram ttft, itl, step;
} m = {.mu = PTHREAD_MUTEX_INITIALIZER};

void metrics_init(const char *const *route_names, int n_routes)
{
    m.routes = route_names;
    m.n_routes = n_routes < MAX_ROUTES ? n_routes : MAX_ROUTES;
}

void metrics_request(int route, int status)
{
    if (route < 0 || route >= m.n_routes) return;
    int k = N_STATUS - 1;
    for (int i = 0; i < N_STATUS - 1; i++)
        if (statuses[i] == status) k = i;
    pthread_mutex_lock(&m.mu);
    m.requests[route][k]++;
    pthread_mutex_unlock(&m.mu);
}

#define COUNTER_ADD(field, v) do { pthread_mutex_lock(&m.mu); m.field += (v); pthread_mutex_unlock(&m.mu); } while (0)

void metrics_prompt_tokens(long n) { COUNTER_ADD(prompt_tokens, (unsigned long)n); }
void metrics_generated_tokens(long n) { COUNTER_ADD(generated_tokens, (unsigned long)n); }
void metrics_cancelled(void) { COUNTER_ADD(cancelled, 1); }

static void observe(histogram *h, double v)
{
    int b = 0;
    while (b < N_BUCKETS && v > buckets[b]) b++;
    if (b < N_BUCKETS) h->count[b]++;
    h->n++;
    h->sum += v;
}

void metrics_ttft(double s) { pthread_mutex_lock(&m.mu); observe(&m.ttft, s); pthread_mutex_unlock(&m.mu); }
void metrics_itl(double s) { pthread_mutex_lock(&m.mu); observe(&m.itl, s); pthread_mutex_unlock(&m.mu); }

void metrics_step(double s, int n_tokens, int n_seqs)
{
    (void)n_seqs;
    pthread_mutex_lock(&m.mu);
    observe(&m.step, s);
    m.steps++;
    m.step_tokens += (unsigned long)n_tokens;
    pthread_mutex_unlock(&m.mu);
}

void metrics_queue(int waiting, int running)
{
    pthread_mutex_lock(&m.mu);
    m.waiting = waiting;
    m.running = running;
    pthread_mutex_unlock(&m.mu);
}

void metrics_pool(int used, int total, double bytes)
{
    pthread_mutex_lock(&m.mu);
    m.pool_used = used;
    m.pool_total = total;
    m.pool_bytes = bytes;
    pthread_mutex_unlock(&m.mu);
}

typedef struct { char *p; size_t len, cap; int oom; } text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) { t->oom = 1; return; }
        if ((size_t)n < t->cap - t->len) { t->len += (size_t)n; return; }
        size_t cap = t->cap * 2 + (size_t)n;
        char *p = realloc(t->p, cap);
        if (!p) { t->oom = 1; return; }
        t->p = p;
        t->cap = cap;
    }
}

static void put_histogram(text *t, const char *name, const char *help, const histogram *h)
{
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long cum = 0;
    for (int b = 0; b < N_BUCKETS; b++) {
        cum += h->count[b];
        put(t, "%s_bucket{le=\"%g\"} %lu\n", name, buckets[b], cum);
    }
    put(t, "%s_bucket{le=\"+Inf\"} %lu\n%s_sum %.9g\n%s_count %lu\n", name, h->n, name, h->sum, name, h->n);
}

char *metrics_render(size_t *len)
{
    text t = {.cap = 8192};
    t.p = malloc(t.cap);
    if (!t.p) return NULL;
    pthread_mutex_lock(&m.mu);
    put(&t, "# HELP kda_requests_total HTTP requests by route and status.\n# TYPE kda_requests_total counter\n");
    for (int r = 0; r < m.n_routes; r++)
        for (int k = 0; k < N_STATUS; k++) {
            if (!m.requests[r][k]) continue;
            if (k < N_STATUS - 1)
                put(&t, "kda_requests_total{route=\"%s\",status=\"%d\"} %lu\n", m.routes[r], statuses[k], m.requests[r][k]);
            else
                put(&t, "kda_requests_total{route=\"%s\",status=\"other\"} %lu\n", m.routes[r], m.requests[r][k]);
        }
    put(&t, "# HELP kda_prompt_tokens_total Prompt tokens processed.\n# TYPE kda_prompt_tokens_total counter\n"
            "kda_prompt_tokens_total %lu\n", m.prompt_tokens);
    put(&t, "# HELP kda_generated_tokens_total Tokens generated.\n# TYPE kda_generated_tokens_total counter\n"
            "kda_generated_tokens_total %lu\n", m.generated_tokens);
    put(&t, "# HELP kda_requests_cancelled_total Sequences cancelled by a client disconnect or shutdown.\n"
            "# TYPE kda_requests_cancelled_total counter\nkda_requests_cancelled_total %lu\n", m.cancelled);
    put(&t, "# HELP kda_engine_steps_total Engine steps run.\n# TYPE kda_engine_steps_total counter\n"
            "kda_engine_steps_total %lu\n", m.steps);
    put(&t, "# HELP kda_engine_step_tokens_total Tokens fed through engine steps.\n"
            "# TYPE kda_engine_step_tokens_total counter\nkda_engine_step_tokens_total %lu\n", m.step_tokens);
    put(&t, "# HELP kda_queue_depth Sequences waiting for a batch slot.\n# TYPE kda_queue_depth gauge\n"
            "kda_queue_depth %d\n", m.waiting);
    put(&t, "# HELP kda_running_sequences Sequences in the running batch.\n# TYPE kda_running_sequences gauge\n"
            "kda_running_sequences %d\n", m.running);
    put(&t, "# HELP kda_state_pool_used_sequences Engine sequence slots in use.\n"
            "# TYPE kda_state_pool_used_sequences gauge\nkda_state_pool_used_sequences %d\n", m.pool_used);
    put(&t, "# HELP kda_state_pool_total_sequences Engine sequence slots.\n"
            "# TYPE kda_state_pool_total_sequences gauge\nkda_state_pool_total_sequences %d\n", m.pool_total);
    put(&t, "# HELP kda_state_pool_used_bytes Recurrent state plus KV cache held by live sequences.\n"
            "# TYPE kda_state_pool_used_bytes gauge\nkda_state_pool_used_bytes %.0f\n", m.pool_bytes);
    put_histogram(&t, "kda_time_to_first_token_seconds", "Arrival to first generated token.", &m.ttft);
    put_histogram(&t, "kda_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.", &m.itl);
    put_histogram(&t, "kda_engine_step_seconds", "Duration of one kda_engine_step call.", &m.step);
    pthread_mutex_unlock(&m.mu);
    if (t.oom) { free(t.p); return NULL; }
    *len = t.len;
    return t.p;
}

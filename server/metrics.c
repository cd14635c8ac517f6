/* metrics.c - see metrics.h. The kda_* histogram buckets suit per-token
 * latencies from a tiny CPU model (sub-millisecond) up to a big model's
 * prompt (seconds); the vllm:* request histograms reach an hour, and token
 * counts use vLLM's 1-2-5 series. */
#include "metrics.h"

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_ROUTES 24
#define MAX_BUCKETS 24

static const double step_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double request_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                    1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
static const double tokens_le[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
                                   10000, 20000, 50000, 100000, 200000, 500000, 1000000};
#define N_OF(a) ((int)(sizeof a / sizeof a[0]))
static const int statuses[] = {200, 204, 400, 401, 404, 405, 413, 415, 500, 503};
#define N_STATUS (N_OF(statuses) + 1)   /* + "other" */
static const char *const reasons[] = {"stop", "length", "abort", "error"};
#define N_REASONS N_OF(reasons)
static const char *const reject_names[METRICS_N_REJECT] = {
    [METRICS_REJECT_CLIENT_CONNECTIONS] = "client_connections", [METRICS_REJECT_REQUEST_TIMEOUT] = "request_timeout",
    [METRICS_REJECT_BODY_SIZE] = "body_size", [METRICS_REJECT_BODY_BUDGET] = "body_budget",
    [METRICS_REJECT_CLIENT_BODY_BUDGET] = "client_body_budget",    [METRICS_REJECT_JSON_MEMORY] = "json_memory", [METRICS_REJECT_CONTENT_TYPE] = "content_type",
    [METRICS_REJECT_FRAMING] = "framing", [METRICS_REJECT_UNAUTHORIZED] = "unauthorized",
};

static const char *const sched_phase_names[METRICS_SCHED_N] = {
    [METRICS_SCHED_IDLE] = "idle", [METRICS_SCHED_ADMIT] = "admit", [METRICS_SCHED_BUILD] = "build",
    [METRICS_SCHED_ENGINE] = "engine", [METRICS_SCHED_WAIT] = "wait", [METRICS_SCHED_OUTPUTS] = "outputs",
    [METRICS_SCHED_WAKE] = "wake",
};

typedef struct {
    const double *le;
    int n_le;
    unsigned long count[MAX_BUCKETS];   /* not cumulative; summed on render */
    unsigned long n;
    double sum;
} histogram;

#define HIST(edges) {.le = edges, .n_le = N_OF(edges)}

static struct {
    pthread_mutex_t mu;
    const char *const *routes;
    int n_routes;
    char model[256];                     /* label value, escaped */
    double cache_total, start_time;
    unsigned long requests[MAX_ROUTES][N_STATUS];
    unsigned long prompt_tokens, generated_tokens, cancelled, steps, step_tokens;
    unsigned long finished[N_REASONS];
    int waiting, running, pool_used, pool_total;
    double pool_bytes;
    unsigned long pc_hits, pc_hit_tokens, pc_evictions, pc_queried_tokens;
    int pc_snapshots;
    double pc_bytes;
    unsigned long rejected[METRICS_N_REJECT];
    double sched_s[METRICS_SCHED_N];
    long http_open, http_body_bytes;
    histogram ttft, itl, step;
    histogram e2e, queue, prefill, decode, inference, req_prompt, req_gen, req_max_tokens, req_params_max, iter_tokens;
} m = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .ttft = HIST(step_le), .itl = HIST(step_le), .step = HIST(step_le),
    .e2e = HIST(request_le), .queue = HIST(request_le), .prefill = HIST(request_le),
    .decode = HIST(request_le), .inference = HIST(request_le),
    .req_prompt = HIST(tokens_le), .req_gen = HIST(tokens_le), .req_max_tokens = HIST(tokens_le), .req_params_max = HIST(tokens_le),
    .iter_tokens = HIST(tokens_le),
};

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

void metrics_init(const char *const *route_names, int n_routes)
{
    m.routes = route_names;
    m.n_routes = n_routes < MAX_ROUTES ? n_routes : MAX_ROUTES;
    m.start_time = wall_now();
}

/* Prometheus label values escape backslash, double quote and newline. */
void metrics_set_model(const char *name, double cache_bytes_total)
{
    pthread_mutex_lock(&m.mu);
    size_t k = 0;
    for (const char *p = name; *p && k + 3 < sizeof m.model; p++) {
        if (*p == '\\' || *p == '"') m.model[k++] = '\\', m.model[k++] = *p;
        else if (*p == '\n') m.model[k++] = '\\', m.model[k++] = 'n';
        else m.model[k++] = *p;
    }
    m.model[k] = '\0';
    m.cache_total = cache_bytes_total;
    pthread_mutex_unlock(&m.mu);
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

void metrics_rejected(int reason)
{
    if (reason >= 0 && reason < METRICS_N_REJECT) COUNTER_ADD(rejected[reason], 1);
}

void metrics_http(long open_connections, long body_bytes)
{
    pthread_mutex_lock(&m.mu);
    m.http_open = open_connections;
    m.http_body_bytes = body_bytes;
    pthread_mutex_unlock(&m.mu);
}

static void observe(histogram *h, double v)
{
    int b = 0;
    while (b < h->n_le && v > h->le[b]) b++;
    if (b < h->n_le) h->count[b]++;
    h->n++;
    h->sum += v;
}

void metrics_ttft(double s) { pthread_mutex_lock(&m.mu); observe(&m.ttft, s); pthread_mutex_unlock(&m.mu); }
void metrics_itl_many(const double *s, int n)
{
    if (n <= 0) return;
    pthread_mutex_lock(&m.mu);
    for (int i = 0; i < n; i++) observe(&m.itl, s[i]);
    pthread_mutex_unlock(&m.mu);
}

void metrics_step(double s, int n_tokens, int n_seqs)
{
    (void)n_seqs;
    pthread_mutex_lock(&m.mu);
    observe(&m.step, s);
    observe(&m.iter_tokens, n_tokens);
    m.steps++;
    m.step_tokens += (unsigned long)n_tokens;
    pthread_mutex_unlock(&m.mu);
}

void metrics_sched_phases(const double *s)
{
    pthread_mutex_lock(&m.mu);
    for (int i = 0; i < METRICS_SCHED_N; i++) m.sched_s[i] += s[i];
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

void metrics_request_finished(const metrics_finished *f)
{
    int r = N_REASONS - 1;
    for (int i = 0; i < N_REASONS; i++)
        if (!strcmp(reasons[i], f->reason)) r = i;
    pthread_mutex_lock(&m.mu);
    m.finished[r]++;
    observe(&m.e2e, f->e2e_s);
    observe(&m.queue, f->queue_s);
    observe(&m.prefill, f->prefill_s);
    observe(&m.decode, f->decode_s);
    observe(&m.inference, f->prefill_s + f->decode_s);
    observe(&m.req_prompt, (double)f->n_prompt);
    observe(&m.req_gen, (double)f->n_gen);
    observe(&m.req_max_tokens, (double)f->n_gen);
    observe(&m.req_params_max, (double)f->max_tokens);
    pthread_mutex_unlock(&m.mu);
}

void metrics_prefix_cache_lookup(long prompt_tokens, long hit_tokens)
{
    pthread_mutex_lock(&m.mu);
    m.pc_queried_tokens += (unsigned long)prompt_tokens;
    m.pc_hits += hit_tokens > 0;
    m.pc_hit_tokens += (unsigned long)hit_tokens;
    pthread_mutex_unlock(&m.mu);
}

void metrics_prefix_cache_size(int snapshots, double bytes, unsigned long evictions)
{
    pthread_mutex_lock(&m.mu);
    m.pc_snapshots = snapshots;
    m.pc_bytes = bytes;
    m.pc_evictions = evictions;
    pthread_mutex_unlock(&m.mu);
}

/* ---- rendering ---- */

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

/* labels: "" or `model_name="x",` style prefix (trailing comma) */
static void put_histogram(text *t, const char *name, const char *help, const char *labels, const histogram *h)
{
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long cum = 0;
    for (int b = 0; b < h->n_le; b++) {
        cum += h->count[b];
        put(t, "%s_bucket{%sle=\"%g\"} %lu\n", name, labels, h->le[b], cum);
    }
    size_t ln = strlen(labels);
    put(t, "%s_bucket{%sle=\"+Inf\"} %lu\n", name, labels, h->n);
    /* the label set without its trailing comma, in braces, or nothing */
    if (ln) put(t, "%s_sum{%.*s} %.9g\n%s_count{%.*s} %lu\n", name, (int)ln - 1, labels, h->sum, name, (int)ln - 1,
                labels, h->n);
    else put(t, "%s_sum %.9g\n%s_count %lu\n", name, h->sum, name, h->n);
}

static void put_one(text *t, const char *name, const char *type, const char *help, const char *model, double v)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%s\"} %.17g\n", name, help, name, type, name, model, v);
}

static void render_vllm(text *t)
{
    char lab[300];
    snprintf(lab, sizeof lab, "model_name=\"%s\",", m.model);
    const char *mn = m.model;
    put_one(t, "vllm:num_requests_running", "gauge", "Sequences in the running batch (kda_running_sequences).", mn,
            m.running);
    put_one(t, "vllm:num_requests_waiting", "gauge", "Sequences waiting for a batch slot (kda_queue_depth).", mn,
            m.waiting);
    put_one(t, "vllm:num_requests_swapped", "gauge", "Always 0: sequences are never swapped out.", mn, 0);
    double frac = m.cache_total > 0 ? m.pool_bytes / m.cache_total : 0;
    if (frac > 1) frac = 1;
    put_one(t, "vllm:kv_cache_usage_perc", "gauge",
            "Fraction (0-1) of the KV cache and KDA state pools held by live sequences.", mn, frac);
    put_one(t, "vllm:gpu_cache_usage_perc", "gauge", "Same as vllm:kv_cache_usage_perc (vLLM's older name).", mn, frac);
    put_one(t, "vllm:cpu_cache_usage_perc", "gauge", "Always 0: there is no CPU swap space.", mn, 0);
    put_one(t, "vllm:prompt_tokens_total", "counter", "Prompt tokens processed (kda_prompt_tokens_total).", mn,
            (double)m.prompt_tokens);
    put_one(t, "vllm:generation_tokens_total", "counter", "Tokens generated (kda_generated_tokens_total).", mn,
            (double)m.generated_tokens);
    put_one(t, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", mn,
            (double)m.pc_queried_tokens);
    put_one(t, "vllm:prefix_cache_hits_total", "counter",
            "Prompt tokens served from the prefix cache (kda_prefix_cache_hit_tokens_total).", mn,
            (double)m.pc_hit_tokens);
    put_one(t, "vllm:num_preemptions_total", "counter", "Always 0: admitted sequences are never preempted.", mn, 0);
    put(t, "# HELP vllm:request_success_total Finished sequences by finish reason.\n"
           "# TYPE vllm:request_success_total counter\n");
    for (int r = 0; r < N_REASONS; r++)
        put(t, "vllm:request_success_total{%sfinished_reason=\"%s\"} %lu\n", lab, reasons[r], m.finished[r]);
    put_histogram(t, "vllm:time_to_first_token_seconds", "Arrival to first generated token (kda_time_to_first_token_seconds).",
                  lab, &m.ttft);
    put_histogram(t, "vllm:time_per_output_token_seconds",
                  "Time between consecutive generated tokens (kda_inter_token_latency_seconds).", lab, &m.itl);
    put_histogram(t, "vllm:inter_token_latency_seconds", "Same samples as vllm:time_per_output_token_seconds.", lab,
                  &m.itl);
    put_histogram(t, "vllm:e2e_request_latency_seconds", "Arrival to finish, per sequence.", lab, &m.e2e);
    put_histogram(t, "vllm:request_queue_time_seconds", "Arrival to admission into the batch, per sequence.", lab,
                  &m.queue);
    put_histogram(t, "vllm:request_prefill_time_seconds", "Admission to first generated token, per sequence.", lab,
                  &m.prefill);
    put_histogram(t, "vllm:request_decode_time_seconds", "First generated token to finish, per sequence.", lab,
                  &m.decode);
    put_histogram(t, "vllm:request_inference_time_seconds", "Prefill plus decode time, per sequence.", lab,
                  &m.inference);
    put_histogram(t, "vllm:request_prompt_tokens", "Prompt tokens, per sequence.", lab, &m.req_prompt);
    put_histogram(t, "vllm:request_generation_tokens", "Generated tokens, per sequence.", lab, &m.req_gen);
    put_histogram(t, "vllm:request_max_num_generation_tokens",
                  "Generated tokens of the sequence (each choice of n is its own sequence here).", lab,
                  &m.req_max_tokens);
    put_histogram(t, "vllm:request_params_max_tokens", "The max_tokens asked for, per sequence.", lab, &m.req_params_max);
    put_histogram(t, "vllm:iteration_tokens_total", "Tokens fed through one engine step.", lab, &m.iter_tokens);
}

/* process_* as the Prometheus client libraries export them (Linux /proc). */
static void render_process(text *t, double start_time)
{
    struct rusage ru;
    double cpu = 0;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
              ru.ru_stime.tv_usec * 1e-6;
    unsigned long vm_pages = 0, rss_pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lu %lu", &vm_pages, &rss_pages) != 2) vm_pages = rss_pages = 0;
        fclose(f);
    }
    double page = (double)sysconf(_SC_PAGESIZE);
    long fds = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        for (struct dirent *e; (e = readdir(d));) fds += e->d_name[0] != '.';
        closedir(d);
        fds--;   /* the directory stream's own descriptor */
    }
    struct rlimit rl;
    double max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (double)rl.rlim_cur : -1;
    put(t, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
           "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.6f\n", cpu);
    put(t, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
           "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %.0f\n", rss_pages * page);
    put(t, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
           "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %.0f\n", vm_pages * page);
    put(t, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
           "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.3f\n", start_time);
    put(t, "# HELP process_open_fds Number of open file descriptors.\n"
           "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n", fds);
    if (max_fds >= 0)
        put(t, "# HELP process_max_fds Maximum number of open file descriptors.\n"
               "# TYPE process_max_fds gauge\nprocess_max_fds %.0f\n", max_fds);
}

char *metrics_render(size_t *len)
{
    text t = {.cap = 32768};
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
    put(&t, "# HELP kda_scheduler_seconds_total The scheduler thread's wall time by phase.\n"
            "# TYPE kda_scheduler_seconds_total counter\n");
    for (int i = 0; i < METRICS_SCHED_N; i++)
        put(&t, "kda_scheduler_seconds_total{phase=\"%s\"} %.6f\n", sched_phase_names[i], m.sched_s[i]);
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
    put(&t, "# HELP kda_prefix_cache_hits_total Requests that started from a cached prefix.\n"
            "# TYPE kda_prefix_cache_hits_total counter\nkda_prefix_cache_hits_total %lu\n", m.pc_hits);
    put(&t, "# HELP kda_prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache (not computed).\n"
            "# TYPE kda_prefix_cache_hit_tokens_total counter\nkda_prefix_cache_hit_tokens_total %lu\n",
        m.pc_hit_tokens);
    put(&t, "# HELP kda_prefix_cache_bytes Memory held by the prefix cache: snapshot states, KV no sequence holds, "
            "the index.\n# TYPE kda_prefix_cache_bytes gauge\nkda_prefix_cache_bytes %.0f\n", m.pc_bytes);
    put(&t, "# HELP kda_prefix_cache_snapshots Prefix snapshots held.\n"
            "# TYPE kda_prefix_cache_snapshots gauge\nkda_prefix_cache_snapshots %d\n", m.pc_snapshots);
    put(&t, "# HELP kda_prefix_cache_evictions_total Cache entries evicted (budget, or room for a request).\n"
            "# TYPE kda_prefix_cache_evictions_total counter\nkda_prefix_cache_evictions_total %lu\n", m.pc_evictions);
    put(&t, "# HELP kda_http_rejected_total Connections and requests refused by the HTTP limits, by reason.\n"
            "# TYPE kda_http_rejected_total counter\n");
    for (int r = 0; r < METRICS_N_REJECT; r++)
        put(&t, "kda_http_rejected_total{reason=\"%s\"} %lu\n", reject_names[r], m.rejected[r]);
    put(&t, "# HELP kda_http_connections Open HTTP connections.\n# TYPE kda_http_connections gauge\n"
            "kda_http_connections %ld\n", m.http_open);
    put(&t, "# HELP kda_http_body_bytes_in_flight Request-body bytes reserved by requests being received.\n"
            "# TYPE kda_http_body_bytes_in_flight gauge\nkda_http_body_bytes_in_flight %ld\n", m.http_body_bytes);
    put_histogram(&t, "kda_time_to_first_token_seconds", "Arrival to first generated token.", "", &m.ttft);
    put_histogram(&t, "kda_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.", "",
                  &m.itl);
    put_histogram(&t, "kda_engine_step_seconds", "Duration of one kda_engine_step call.", "", &m.step);
    render_vllm(&t);
    double start = m.start_time;
    pthread_mutex_unlock(&m.mu);
    render_process(&t, start);
    if (t.oom) { free(t.p); return NULL; }
    *len = t.len;
    return t.p;
}

/*
 * http.c - see http.h.
 *
 * Threads: --http-threads event loops, each a libmicrohttpd daemon in external-epoll mode driven
 * by its own thread (loop_main), all accepting from one listening socket. The loop, not MHD,
 * does the waiting: it blocks in its own epoll on MHD's epoll fd and a kick eventfd, then calls
 * MHD_run, which never blocks. MHD's internal polling thread is not used because its epoll drain
 * (`while (epoll_wait(fd, ev, 128, timeout) == 128)`, libmicrohttpd 0.9.75 to 1.0.1) blocks again
 * with `timeout` when one wait returns exactly 128 events: those 128 connections stay unprocessed
 * until another event or the next connection timeout, when the timeout sweep closes them as idle
 * before any request callback ran (issue 13's silent losses; tests/server/test_burst.py).
 *
 * A request's life: the first handler call sees only headers (route, method,
 * API key and Content-Length are checked there, so a bad request is refused
 * before its body is read); later calls accumulate the body; the call with
 * no more data dispatches. Scheduled requests then wait without a thread:
 *  - non-streaming: the handler suspends the connection; the scheduler's
 *    wake resumes it when every task has finished, and the handler, called
 *    again, renders the response;
 *  - streaming: a chunked response whose reader renders SSE events and,
 *    when there is nothing to send, suspends the connection until woken.
 * "suspended" is read and written under the client's mutex, and the reader
 * suspends while holding it, so a wake can never slip in between "nothing
 * to send" and "suspended" (the lost-wake-up race). Whoever clears it resumes
 * the connection and kicks its loop under the same mutex, so a resumed
 * connection is never resumed twice and never freed before its loop runs.
 *
 * Keep-alive comments on idle streams and the hang-up probe of waiting
 * non-streaming requests are timed here, by each loop (loop_tick), so they
 * go out on schedule whatever the engine is doing.
 *
 * Hostile clients (README, "Limits"). Every TCP connection has an http_sock
 * (MHD's socket context, created and freed by on_connection):
 *  - connections per client address are counted in one table shared by the
 *    loops; the accept policy refuses a client at its cap, so one address
 *    cannot fill the global connection limit (slowloris);
 *  - a connection that is receiving a request sits in its loop's deadline
 *    queue from the moment it opens (or its previous response ends) until the
 *    request is complete; the loop shuts down the socket of any connection
 *    still there at its deadline, however steadily it trickles bytes. The
 *    timeout is the same for all, so appending keeps the queue sorted and the
 *    loop only looks at its head;
 *  - a request body reserves its Content-Length (or, chunked, what it has
 *    grown to) from a global budget, and from its client's share of it, before
 *    any of it is stored; a request either cannot hold gets 503 at once. The
 *    client's share is kept in the same table as its connections, so one
 *    address with many stalled uploads cannot take the whole budget.
 * Shutdown: http_stop first detaches every job from its connection under the
 * client's mutex, so the scheduler's wake() never reaches MHD again.
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "json_budget.h"
#include "log.h"
#include "metrics.h"
#include "webui.h"

/* server/openapi.json, embedded at build time (server/meson.build) */
extern const unsigned char openapi_json[];
extern const size_t openapi_json_len;

enum { ROUTE_GENERATE, ROUTE_SCORE, ROUTE_COMPLETIONS, ROUTE_CHAT, ROUTE_MODELS, ROUTE_MODEL, ROUTE_TOKENIZE,
       ROUTE_DETOKENIZE, ROUTE_V1_TOKENIZE, ROUTE_V1_DETOKENIZE, ROUTE_TOKENIZER_INFO, ROUTE_OPENAPI, ROUTE_HEALTH,
       ROUTE_METRICS, ROUTE_WEBUI, ROUTE_PROPS, ROUTE_OTHER, N_ROUTES };

/* Every route is described in server/openapi.json (tests/server/test_openapi.py
 * checks this table against it). A path longer than "/" ending in '/' matches as
 * a prefix. */
static const struct { const char *path, *method; int public; } routes[N_ROUTES] = {
    [ROUTE_GENERATE] = {"/generate", "POST", 0},
    [ROUTE_SCORE] = {"/score", "POST", 0},
    [ROUTE_COMPLETIONS] = {"/v1/completions", "POST", 0},
    [ROUTE_CHAT] = {"/v1/chat/completions", "POST", 0},
    [ROUTE_MODELS] = {"/v1/models", "GET", 0},
    [ROUTE_MODEL] = {"/v1/models/", "GET", 0},
    [ROUTE_TOKENIZE] = {"/tokenize", "POST", 0},
    [ROUTE_DETOKENIZE] = {"/detokenize", "POST", 0},
    [ROUTE_V1_TOKENIZE] = {"/v1/tokenize", "POST", 0},
    [ROUTE_V1_DETOKENIZE] = {"/v1/detokenize", "POST", 0},
    [ROUTE_TOKENIZER_INFO] = {"/tokenizer_info", "GET", 0},
    [ROUTE_OPENAPI] = {"/openapi.json", "GET", 1},
    [ROUTE_HEALTH] = {"/health", "GET", 1},
    [ROUTE_METRICS] = {"/metrics", "GET", 1},
    [ROUTE_WEBUI] = {"/", "GET", 1},          /* the page asks for the key itself */
    [ROUTE_PROPS] = {"/props", "GET", 0},
    [ROUTE_OTHER] = {"other", "", 1},
};
static const char *route_names[N_ROUTES];

enum { STATE_LOADING, STATE_READY, STATE_DRAINING };

#define TICK_S 0.05         /* how often a loop looks at its waiting requests */
#define PROBE_S 0.5         /* how often a waiting non-streaming client's socket is checked */
#define CONN_TIMEOUT_S 120  /* MHD closes a connection idle (not suspended) this long */
#define MAX_CONNECTIONS 4096
#define TRIM_BYTES (1u << 20)   /* after a request this large, give freed heap back to the system */
#define SMALL_BODY (64u << 10)   /* bodies this small may use the budget's reserve */

typedef struct http_conn http_conn;
typedef struct http_loop http_loop;
typedef struct http_sock http_sock;

/* A client address: IPv4 as IPv4-mapped IPv6, so one key type serves both. */
typedef struct { unsigned char a[16]; } client_key;

/* Open connections and body bytes per client address: open addressing with
 * linear probing, at least twice as many slots as connections can be open, so
 * it never fills (a client holds body bytes only through an open connection). */
typedef struct {
    client_key key;
    int count;              /* open connections */
    size_t body_bytes;      /* reserved by its requests being received; count == 0 && body_bytes == 0: free slot */
} client_slot;

/* One TCP connection (MHD's socket context; loop thread only). */
struct http_sock {
    http_loop *loop;
    int fd;
    client_key key;
    double deadline;        /* the whole request must be in by then; 0: not receiving */
    http_sock *prev, *next; /* loop's deadline queue, earliest first */
};

/* One event loop: a daemon and the thread that drives it. */
struct http_loop {
    http_server *h;
    struct MHD_Daemon *d;
    pthread_t thread;
    int thread_started;
    int ep;                 /* epoll over MHD's epoll fd and kick_fd */
    int kick_fd;            /* eventfd: a connection was resumed from another thread */
    _Atomic int kicked;     /* kick_fd was written and the loop has not run since */
    http_conn *live;        /* requests with a scheduler job (loop thread only) */
    http_sock *recv_head, *recv_tail;   /* connections receiving a request, by deadline (loop thread only) */
    double next_tick;
    int quiesced;           /* loop thread only */
};

struct http_server {
    http_opts o;
    const api_ctx *ctx;     /* valid once state is READY */
    sched *s;
    _Atomic int state;
    _Atomic int jobs;
    _Atomic int drain;      /* loops stop accepting */
    _Atomic int n_quiesced;
    _Atomic int stop;       /* loops exit */
    _Atomic int stopping;   /* http_stop runs: nothing suspends any more */
    int n_loops;
    http_loop *loops;
    pthread_mutex_t clients_mu;
    client_slot *clients;   /* [n_slots], n_slots a power of two */
    size_t n_slots;
    _Atomic long n_open;    /* connections, all loops */
    _Atomic size_t body_bytes;   /* reserved by request bodies being received (changed under clients_mu, read
                                  * without it for the gauge and messages) */
};

struct http_conn {
    http_server *h;
    http_loop *loop;
    struct MHD_Connection *conn;
    http_conn *prev, *next; /* loop->live, while job is set */
    int route;
    char method[8];
    char url[512];
    char *body; size_t len, cap;
    size_t reserved;        /* bytes of h->body_bytes (and of its client's share) this request holds */
    client_key key;         /* its client, whose share holds `reserved` */
    int too_large;
    int over_budget;        /* chunked body outgrew a budget (BUDGET_*): discarded, 503 at the end */
    int big;                /* used TRIM_BYTES or more: trim the heap when done */
    int responded;          /* a response is queued */
    int status;
    api_job *job;
    int suspended;          /* under job->client->mu */
    int peer_gone;          /* non-streaming client closed while we waited (under the mutex) */
    api_buf sse;            /* rendered, not yet handed to MHD */
    size_t sse_off;
    double t0;
    double last_sent;       /* stream: last bytes handed to MHD (loop thread) */
    double next_probe;      /* non-streaming: next hang-up check (loop thread) */
};

/* ---- responses ---- */

/* CORS: with --allowed-origins, a request whose Origin is listed (or any,
 * for "*") gets Access-Control-Allow-Origin on every response. */
static const char *cors_origin(const http_conn *hc)
{
    const char *list = hc->h->o.allowed_origins;
    if (!list) return NULL;
    const char *origin = MHD_lookup_connection_value(hc->conn, MHD_HEADER_KIND, "Origin");
    if (!origin) return NULL;
    if (!strcmp(list, "*")) return "*";
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && *p == ' ') { p++; len--; }
        while (len && p[len - 1] == ' ') len--;
        if (len == n && !strncmp(p, origin, n)) return origin;
        if (!end) break;
        p = end + 1;
    }
    return NULL;
}

static void add_cors(const http_conn *hc, struct MHD_Response *r)
{
    const char *origin = cors_origin(hc);
    if (!origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    if (strcmp(origin, "*")) MHD_add_response_header(r, "Vary", "Origin");
}

/* A response is queued: the request is counted in /metrics now, not when the
 * connection's completion callback runs. That callback runs after the last bytes
 * went out, so a client that reads its answer and then asks /metrics (on another
 * connection, served by another loop) could see the count before it moved. */
static void queued(http_conn *hc, int status)
{
    hc->status = status;
    hc->responded = 1;
    metrics_request(hc->route, status);
}

static enum MHD_Result reply(http_conn *hc, int status, const char *ctype, char *body, size_t len, int retry_after)
{
    static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":500}}";
    struct MHD_Response *r;
    if (body) {
        r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    } else {
        status = 500;
        ctype = "application/json";
        r = MHD_create_response_from_buffer(sizeof fallback - 1, (void *)fallback, MHD_RESPMEM_PERSISTENT);
    }
    if (!r) { free(body); return MHD_NO; }
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    add_cors(hc, r);
    if (retry_after) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 405) MHD_add_response_header(r, "Allow", routes[hc->route].method);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(hc->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    queued(hc, status);
    return ok;
}

static enum MHD_Result reply_json(http_conn *hc, int status, char *body, size_t len)
{
    return reply(hc, status, "application/json", body, len, status == 503);
}

static enum MHD_Result reply_api_error(http_conn *hc, const api_error *e)
{
    size_t len = 0;
    char *body = api_error_json_param(e->status, e->message, e->param, &len);
    return reply_json(hc, e->status, body, len);
}

/* CORS preflight: answered without an API key (browsers send none). */
static enum MHD_Result reply_preflight(http_conn *hc)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
    if (cors_origin(hc)) {
        const char *want = MHD_lookup_connection_value(hc->conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        add_cors(hc, r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", want ? want : "Authorization, Content-Type, X-API-Key");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ok = MHD_queue_response(hc->conn, 204, r);
    MHD_destroy_response(r);
    queued(hc, 204);
    return ok;
}

static enum MHD_Result reply_error(http_conn *hc, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static enum MHD_Result reply_error(http_conn *hc, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = 0;
    char *body = api_error_json(status, msg, &len);
    return reply_json(hc, status, body, len);
}

static enum MHD_Result reply_page(http_conn *hc)
{
    struct MHD_Response *r = webui_page_response();
    if (!r) return MHD_NO;
    enum MHD_Result ok = MHD_queue_response(hc->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    queued(hc, 200);
    return ok;
}

/* ---- wake-ups ---- */

static void loop_kick(http_loop *l)
{
    if (atomic_exchange(&l->kicked, 1)) return;   /* already pending */
    uint64_t one = 1;
    ssize_t n = write(l->kick_fd, &one, sizeof one);
    (void)n;   /* EAGAIN: the counter is saturated, so the loop wakes anyway */
}

/* Caller holds the client's mutex and saw hc->suspended. */
static void resume_locked(http_conn *hc)
{
    hc->suspended = 0;
    MHD_resume_connection(hc->conn);
    loop_kick(hc->loop);
}

/* A suspended connection is not watched by MHD, so a non-streaming client
 * that hangs up would go unnoticed until its answer is ready. The loop's
 * probe looks at the socket without consuming anything: EOF or a reset
 * means the client is gone. */
static int peer_closed(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Called by the scheduler thread after it set dirty. */
static void wake(sched_client *c)
{
    pthread_mutex_lock(&c->mu);
    http_conn *hc = c->wake_arg;
    /* Non-streaming requests only care about the end. */
    if (hc && hc->suspended && (c->stream || c->n_finished == c->n_tasks)) resume_locked(hc);
    pthread_mutex_unlock(&c->mu);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_conn *hc = cls;
    for (;;) {
        if (hc->sse_off < hc->sse.len) {
            size_t n = hc->sse.len - hc->sse_off;
            if (n > max) n = max;
            memcpy(buf, hc->sse.p + hc->sse_off, n);
            hc->sse_off += n;
            hc->last_sent = srv_now();
            return (ssize_t)n;
        }
        hc->sse.len = hc->sse_off = 0;
        if (hc->job->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        api_render_stream(hc->job, &hc->sse);
        if (hc->sse.len) continue;
        if (atomic_load(&hc->h->stopping)) return MHD_CONTENT_READER_END_WITH_ERROR;
        sched_client *c = hc->job->client;
        pthread_mutex_lock(&c->mu);
        int dirty = c->dirty;
        if (!dirty) {
            hc->suspended = 1;
            MHD_suspend_connection(hc->conn);
        }
        pthread_mutex_unlock(&c->mu);
        if (!dirty) return 0;
    }
}

/* Non-streaming: render if every task finished, else (re)suspend. */
static enum MHD_Result finish_or_wait(http_conn *hc)
{
    sched_client *c = hc->job->client;
    pthread_mutex_lock(&c->mu);
    int done = c->n_finished == c->n_tasks, gone = hc->peer_gone;
    if (gone || (!done && atomic_load(&hc->h->stopping))) {
        pthread_mutex_unlock(&c->mu);
        return MHD_NO;   /* close: on_completed cancels the unfinished tasks */
    }
    if (!done) {
        hc->suspended = 1;
        MHD_suspend_connection(hc->conn);
    }
    pthread_mutex_unlock(&c->mu);
    if (!done) return MHD_YES;
    int status = 200;
    size_t len = 0;
    char *body = api_render(hc->job, &status, &len);
    return reply_json(hc, status, body, len);
}

/* ---- per-loop timers: keep-alive comments and hang-up probes ---- */

static void live_add(http_conn *hc)
{
    http_loop *l = hc->loop;
    hc->prev = NULL;
    hc->next = l->live;
    if (l->live) l->live->prev = hc;
    l->live = hc;
}

static void live_remove(http_conn *hc)
{
    if (hc->prev) hc->prev->next = hc->next;
    else hc->loop->live = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    hc->prev = hc->next = NULL;
}

/* A stream quiet for heartbeat_s gets a comment (which is also how a client
 * that left while queued is found: the write fails); a waiting non-streaming
 * request has its socket checked every PROBE_S. */
static void tick_one(http_conn *hc, double now, double heartbeat_s)
{
    sched_client *c = hc->job->client;
    if (hc->job->stream) {
        if (heartbeat_s <= 0 || now - hc->last_sent < heartbeat_s) return;
        hc->last_sent = now;
        pthread_mutex_lock(&c->mu);
        c->heartbeat = 1;
        c->dirty = 1;
        if (hc->suspended) resume_locked(hc);
        pthread_mutex_unlock(&c->mu);
    } else if (now >= hc->next_probe) {
        hc->next_probe = now + PROBE_S;
        pthread_mutex_lock(&c->mu);
        if (hc->suspended && c->n_finished < c->n_tasks && peer_closed(hc->conn)) {
            hc->peer_gone = 1;
            resume_locked(hc);
        }
        pthread_mutex_unlock(&c->mu);
    }
}

static void loop_tick(http_loop *l, double now)
{
    if (now < l->next_tick) return;
    l->next_tick = now + TICK_S;
    for (http_conn *hc = l->live; hc; hc = hc->next) tick_one(hc, now, l->h->o.heartbeat_s);
}

/* ---- connections: per-client counts and the whole-request deadline ---- */

static void key_of(const struct sockaddr *addr, client_key *k)
{
    memset(k, 0, sizeof *k);
    if (addr && addr->sa_family == AF_INET6) {
        memcpy(k->a, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
    } else if (addr && addr->sa_family == AF_INET) {
        k->a[10] = k->a[11] = 0xff;
        memcpy(k->a + 12, &((const struct sockaddr_in *)addr)->sin_addr, 4);
    }
}

static size_t key_hash(const client_key *k)
{
    uint64_t x = 1469598103934665603ull;   /* FNV-1a */
    for (int i = 0; i < 16; i++) x = (x ^ k->a[i]) * 1099511628211ull;
    return (size_t)x;
}

static int slot_used(const client_slot *c) { return c->count > 0 || c->body_bytes > 0; }

/* The slot holding k, or the free slot where it would go. Caller holds clients_mu. */
static size_t client_find(const http_server *h, const client_key *k)
{
    size_t mask = h->n_slots - 1, i = key_hash(k) & mask;
    while (slot_used(&h->clients[i]) && memcmp(&h->clients[i].key, k, sizeof *k)) i = (i + 1) & mask;
    return i;
}

/* Frees slot i if its client holds nothing any more. Backward-shift deletion:
 * move up every later entry of the probe run whose home slot does not lie
 * between the hole and itself. Caller holds clients_mu. */
static void client_release(http_server *h, size_t i)
{
    if (slot_used(&h->clients[i])) return;
    size_t mask = h->n_slots - 1;
    h->clients[i] = (client_slot){0};
    for (size_t j = (i + 1) & mask; slot_used(&h->clients[j]); j = (j + 1) & mask) {
        size_t home = key_hash(&h->clients[j].key) & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            h->clients[i] = h->clients[j];
            h->clients[j] = (client_slot){0};
            i = j;
        }
    }
}

static int client_count(http_server *h, const client_key *k)
{
    pthread_mutex_lock(&h->clients_mu);
    int n = h->clients[client_find(h, k)].count;
    pthread_mutex_unlock(&h->clients_mu);
    return n;
}

static void client_add(http_server *h, const client_key *k, int delta)
{
    pthread_mutex_lock(&h->clients_mu);
    size_t i = client_find(h, k);
    h->clients[i].key = *k;
    h->clients[i].count += delta;
    if (h->clients[i].count < 0) h->clients[i].count = 0;
    client_release(h, i);
    pthread_mutex_unlock(&h->clients_mu);
}

/* Counts are taken on NOTIFY_STARTED, so several loops accepting at once may
 * overshoot a client's cap by at most one connection each. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    http_server *h = ((http_loop *)cls)->h;
    if (h->o.max_per_client <= 0) return MHD_YES;
    client_key k;
    key_of(addr, &k);
    if (client_count(h, &k) < h->o.max_per_client) return MHD_YES;
    metrics_rejected(METRICS_REJECT_CLIENT_CONNECTIONS);
    srv_log(SRV_LOG_DEBUG, "refused a connection: its client holds %d (--max-connections-per-client)",
            h->o.max_per_client);
    return MHD_NO;
}

static void publish_http_gauges(http_server *h)
{
    metrics_http(atomic_load(&h->n_open), (long)atomic_load(&h->body_bytes));
}

static void deadline_unlink(http_sock *s)
{
    if (!s->deadline) return;
    http_loop *l = s->loop;
    if (s->prev) s->prev->next = s->next;
    else l->recv_head = s->next;
    if (s->next) s->next->prev = s->prev;
    else l->recv_tail = s->prev;
    s->prev = s->next = NULL;
    s->deadline = 0;
}

/* The connection starts waiting for a whole request. */
static void deadline_arm(http_sock *s, double now)
{
    http_loop *l = s->loop;
    if (l->h->o.request_timeout_s <= 0) return;
    deadline_unlink(s);
    s->deadline = now + l->h->o.request_timeout_s;
    s->prev = l->recv_tail;
    if (l->recv_tail) l->recv_tail->next = s;
    else l->recv_head = s;
    l->recv_tail = s;
}

static http_sock *sock_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* A connection too slow to deliver its request is shut down (not closed:
 * the descriptor stays MHD's, which sees the hang-up and cleans up as for a
 * client that went away). */
static void deadline_sweep(http_loop *l, double now)
{
    while (l->recv_head && l->recv_head->deadline <= now) {
        http_sock *s = l->recv_head;
        deadline_unlink(s);
        shutdown(s->fd, SHUT_RDWR);
        metrics_rejected(METRICS_REJECT_REQUEST_TIMEOUT);
        srv_log(SRV_LOG_DEBUG, "closed a connection that did not deliver a whole request in %.0fs (--request-timeout)",
                l->h->o.request_timeout_s);
    }
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    http_loop *l = cls;
    http_server *h = l->h;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_sock *s = calloc(1, sizeof *s);
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ca = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (!s || !fd) {   /* out of memory: refuse the connection rather than leave it unbounded */
            free(s);
            if (fd) shutdown(fd->connect_fd, SHUT_RDWR);
            return;
        }
        s->loop = l;
        s->fd = fd->connect_fd;
        key_of(ca ? ca->client_addr : NULL, &s->key);
        client_add(h, &s->key, 1);
        deadline_arm(s, srv_now());
        *socket_context = s;
        atomic_fetch_add(&h->n_open, 1);
    } else {
        http_sock *s = *socket_context;
        if (!s) return;
        *socket_context = NULL;
        deadline_unlink(s);
        client_add(h, &s->key, -1);
        free(s);
        atomic_fetch_sub(&h->n_open, 1);
    }
    publish_http_gauges(h);
}

/* ---- the body budget ---- */

enum { BUDGET_OK, BUDGET_GLOBAL, BUDGET_CLIENT };   /* which budget refused */

/* What a body of n bytes may find reserved before it: the last eighth of a
 * budget is kept for bodies of SMALL_BODY or less, so large uploads that stall
 * cannot starve ordinary requests (where the rest still holds a whole body). */
static size_t budget_limit(const http_server *h, size_t budget, size_t n)
{
    if (n > SMALL_BODY && budget - budget / 8 >= h->o.max_body) budget -= budget / 8;
    return budget;
}

/* Reserves n more bytes for hc's body from the global budget and its client's
 * share; both or neither. Both are checked and taken under clients_mu, so
 * loops reserving at once cannot overshoot either together. */
static int budget_take(http_server *h, http_conn *hc, size_t n)
{
    size_t share = h->o.body_budget_per_client;
    pthread_mutex_lock(&h->clients_mu);
    size_t i = client_find(h, &hc->key);
    if (share && h->clients[i].body_bytes + n > budget_limit(h, share, n)) {
        pthread_mutex_unlock(&h->clients_mu);
        return BUDGET_CLIENT;
    }
    if (h->o.body_budget && atomic_load(&h->body_bytes) + n > budget_limit(h, h->o.body_budget, n)) {
        pthread_mutex_unlock(&h->clients_mu);
        return BUDGET_GLOBAL;
    }
    atomic_fetch_add(&h->body_bytes, n);
    h->clients[i].key = hc->key;
    h->clients[i].body_bytes += n;
    hc->reserved += n;
    pthread_mutex_unlock(&h->clients_mu);
    return BUDGET_OK;
}

/* Gives back everything hc reserved; called once, when the request ends
 * however it ends (on_completed: answered, refused, aborted, timed out). */
static void budget_give(http_server *h, http_conn *hc)
{
    size_t n = hc->reserved;
    if (!n) return;
    hc->reserved = 0;
    pthread_mutex_lock(&h->clients_mu);
    size_t i = client_find(h, &hc->key);
    h->clients[i].body_bytes = h->clients[i].body_bytes >= n ? h->clients[i].body_bytes - n : 0;
    client_release(h, i);
    atomic_fetch_sub(&h->body_bytes, n);
    pthread_mutex_unlock(&h->clients_mu);
}

static size_t client_body_bytes(http_server *h, const client_key *k)
{
    pthread_mutex_lock(&h->clients_mu);
    size_t n = h->clients[client_find(h, k)].body_bytes;
    pthread_mutex_unlock(&h->clients_mu);
    return n;
}

/* The 503 of a body a budget cannot hold. */
static enum MHD_Result reply_over_budget(http_conn *hc, int which)
{
    http_server *h = hc->h;
    if (which == BUDGET_CLIENT) {
        metrics_rejected(METRICS_REJECT_CLIENT_BODY_BUDGET);
        return reply_error(hc, 503, "this client is sending too many request bodies at once (%zu bytes in flight "
                                    "from its address, share %zu, --max-body-bytes-in-flight-per-client); retry later",
                           client_body_bytes(h, &hc->key), h->o.body_budget_per_client);
    }
    metrics_rejected(METRICS_REJECT_BODY_BUDGET);
    return reply_error(hc, 503, "the server is receiving too many request bodies at once (%zu bytes in flight, "
                                "--max-body-bytes-in-flight); retry later", atomic_load(&h->body_bytes));
}

/* ---- dispatch ---- */

/* Around one request's JSON work on this thread (json_budget.h). */
static void json_begin(http_conn *hc) { json_budget_arm(hc->h->o.max_json); }

/* Returns 1 (and replies 413) when the request needed more JSON memory than allowed. */
static int json_end(http_conn *hc, char **body)
{
    size_t peak = json_budget_disarm();
    if (peak >= TRIM_BYTES) hc->big = 1;
    if (!json_budget_exceeded()) return 0;
    if (body) { free(*body); *body = NULL; }
    metrics_rejected(METRICS_REJECT_JSON_MEMORY);
    reply_error(hc, 413, "this request needs more than %zu bytes of memory to parse or answer (--max-json-bytes): "
                         "send fewer or shorter items", hc->h->o.max_json);
    return 1;
}

static enum MHD_Result submit(http_conn *hc, int kind)
{
    http_server *h = hc->h;
    api_error e = {0};
    api_job *job = NULL;
    json_begin(hc);
    int bad = api_parse(h->ctx, kind, hc->body ? hc->body : "", hc->len, &job, &e);
    if (json_end(hc, NULL)) {
        if (!bad) api_job_free(job);
        return hc->responded ? MHD_YES : MHD_NO;
    }
    if (bad) return reply_api_error(hc, &e);
    job->client->wake = wake;
    job->client->wake_arg = hc;
    int rc = sched_submit(h->s, job->client);
    if (rc != SCHED_OK) {
        api_job_free(job);
        if (rc == SCHED_EFULL) return reply_error(hc, 503, "the request queue is full; retry later");
        if (rc == SCHED_ECLOSED) return reply_error(hc, 503, "the server is shutting down");
        return reply_error(hc, 500, "out of memory");
    }
    hc->job = job;
    hc->last_sent = srv_now();
    hc->next_probe = hc->last_sent + PROBE_S;
    live_add(hc);
    atomic_fetch_add(&h->jobs, 1);
    if (!job->stream) return finish_or_wait(hc);

    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, hc, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_cors(hc, r);
    enum MHD_Result ok = MHD_queue_response(hc->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    queued(hc, 200);
    return ok;
}

static enum MHD_Result dispatch(http_conn *hc)
{
    http_server *h = hc->h;
    int state = atomic_load(&h->state);
    size_t len = 0;
    if (hc->route == ROUTE_HEALTH) {
        if (state == STATE_READY) return reply_json(hc, 200, strdup("{\"status\":\"ok\"}"), 15);
        return reply_error(hc, 503, state == STATE_LOADING ? "the model is loading" : "the server is shutting down");
    }
    if (hc->route == ROUTE_METRICS) {
        char *body = metrics_render(&len);
        return reply(hc, 200, "text/plain; version=0.0.4", body, len, 0);
    }
    if (hc->route == ROUTE_WEBUI) return reply_page(hc);   /* static: served while loading too */
    if (hc->route == ROUTE_OPENAPI) {
        char *body = strndup((const char *)openapi_json, openapi_json_len);
        return reply(hc, 200, "application/json", body, openapi_json_len, 0);
    }
    if (state == STATE_LOADING) return reply_error(hc, 503, "the model is loading");
    if (state == STATE_DRAINING && hc->route != ROUTE_MODELS && hc->route != ROUTE_MODEL)
        return reply_error(hc, 503, "the server is shutting down");
    api_error e = {0};
    char *body = NULL;
    switch (hc->route) {
    case ROUTE_GENERATE: return submit(hc, API_GENERATE);
    case ROUTE_SCORE: return submit(hc, API_SCORE);
    case ROUTE_COMPLETIONS: return submit(hc, API_COMPLETIONS);
    case ROUTE_CHAT: return submit(hc, API_CHAT);
    case ROUTE_MODELS: body = api_models(h->ctx, &len); break;
    case ROUTE_PROPS: body = webui_props(h->ctx, &len); break;
    case ROUTE_MODEL: body = api_model(h->ctx, hc->url + strlen(routes[ROUTE_MODEL].path), &e, &len); break;
    case ROUTE_TOKENIZE: case ROUTE_V1_TOKENIZE:
        json_begin(hc);
        body = api_tokenize(h->ctx, hc->body ? hc->body : "", hc->len, &e, &len);
        if (json_end(hc, &body)) return hc->responded ? MHD_YES : MHD_NO;
        break;
    case ROUTE_DETOKENIZE: case ROUTE_V1_DETOKENIZE:
        json_begin(hc);
        body = api_detokenize(h->ctx, hc->body ? hc->body : "", hc->len, &e, &len);
        if (json_end(hc, &body)) return hc->responded ? MHD_YES : MHD_NO;
        break;
    case ROUTE_TOKENIZER_INFO: body = api_tokenizer_info(h->ctx, &len); break;
    default: return reply_error(hc, 404, "no route for %s %s", hc->method, hc->url);
    }
    if (!body) {
        if (!e.status) return reply_error(hc, 500, "out of memory");
        return reply_api_error(hc, &e);
    }
    return reply_json(hc, 200, body, len);
}

/* Constant-time, so response timing does not leak the key. */
static int key_equal(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++) diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

/* An empty credential never matches (main refuses an empty key too). */
static int authorized(http_server *h, struct MHD_Connection *conn)
{
    if (!h->o.api_key) return 1;
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) return auth[7] && key_equal(auth + 7, h->o.api_key);
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-API-Key");
    return x && x[0] && key_equal(x, h->o.api_key);
}

/* JSON routes take application/json (any parameters; a charset must be
 * UTF-8), a +json type, or no Content-Type at all (non-browser clients that
 * send none). The types a browser may send cross-origin without a preflight
 * (text/plain, application/x-www-form-urlencoded, multipart/form-data) and
 * everything else get 415, so a web page cannot drive a key-less server. */
static int json_content_type(const char *ct)
{
    if (!ct) return 1;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, "; \t");
    int ok = (n == 16 && !strncasecmp(ct, "application/json", 16)) ||
             (n > 17 && !strncasecmp(ct, "application/", 12) && !strncasecmp(ct + n - 5, "+json", 5));
    if (!ok) return 0;
    for (const char *p = ct + n; (p = strchr(p, ';'));) {
        p++;
        while (*p == ' ' || *p == '\t') p++;
        if (strncasecmp(p, "charset=", 8)) continue;
        const char *v = p + 8;
        if (*v == '"') v++;
        if (strncasecmp(v, "utf-8", 5) && strncasecmp(v, "utf8", 4)) return 0;
    }
    return 1;
}

typedef struct { int n_length, conflict, chunked; const char *length; } framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, "Content-Length")) {
        if (f->n_length++ && strcmp(f->length, value ? value : "")) f->conflict = 1;
        f->length = value ? value : "";
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->chunked = 1;
    }
    return MHD_YES;
}

static int is_json_route(int route)
{
    return !strcmp(routes[route].method, "POST");
}

/* First call: only the headers are known. Order: framing, then the key
 * (before routing, so routes and methods cannot be probed without one), then
 * route and method, then the body's type, size and budget. */
static enum MHD_Result on_headers(http_conn *hc, const char *url, const char *method)
{
    http_server *h = hc->h;
    snprintf(hc->method, sizeof hc->method, "%s", method);
    snprintf(hc->url, sizeof hc->url, "%s", url);
    hc->route = ROUTE_OTHER;
    int path_known = 0;
    for (int r = 0; r < ROUTE_OTHER; r++) {
        size_t n = strlen(routes[r].path);
        int prefix = n > 1 && routes[r].path[n - 1] == '/';
        if (prefix ? strncmp(url, routes[r].path, n) != 0 || !url[n] : strcmp(url, routes[r].path) != 0) continue;
        if (r == ROUTE_WEBUI && !h->o.webui) continue;
        path_known = 1;
        hc->route = r;
        if (strcmp(method, routes[r].method) == 0) break;
    }
    framing f = {0};
    MHD_get_connection_values(hc->conn, MHD_HEADER_KIND, count_framing, &f);
    if (f.conflict || (f.n_length && f.chunked)) {
        metrics_rejected(METRICS_REJECT_FRAMING);
        return reply_error(hc, 400, f.conflict ? "conflicting Content-Length headers"
                                               : "Content-Length and Transfer-Encoding together");
    }
    if (!strcmp(method, "OPTIONS") && path_known) return reply_preflight(hc);
    if ((!path_known || !routes[hc->route].public) && !authorized(h, hc->conn)) {
        metrics_rejected(METRICS_REJECT_UNAUTHORIZED);
        return reply_error(hc, 401, "missing or wrong API key (send \"Authorization: Bearer KEY\")");
    }
    if (!path_known) return reply_error(hc, 404, "no route for %s %s", method, url);
    if (strcmp(method, routes[hc->route].method) != 0)
        return reply_error(hc, 405, "%s %s is not allowed; use %s", method, url, routes[hc->route].method);
    if (!is_json_route(hc->route)) return MHD_YES;
    const char *ct = MHD_lookup_connection_value(hc->conn, MHD_HEADER_KIND, "Content-Type");
    if (!json_content_type(ct)) {
        metrics_rejected(METRICS_REJECT_CONTENT_TYPE);
        return reply_error(hc, 415, "Content-Type %.100s is not accepted: send the body as JSON with "
                                    "\"Content-Type: application/json\" (curl: --json, or -H 'Content-Type: "
                                    "application/json' with -d)", ct);
    }
    if (f.length) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(f.length, &end, 10);
        if (errno || *end || end == f.length || f.length[0] == '-' || n > h->o.max_body) {
            metrics_rejected(METRICS_REJECT_BODY_SIZE);
            return reply_error(hc, 413, "request body of %.40s bytes exceeds the limit of %zu bytes (--max-body-bytes)",
                               f.length, h->o.max_body);
        }
        /* reserved now, so a request the budget cannot hold is refused before
         * a byte of it is stored; allocated at its exact size on arrival */
        int refused = n ? budget_take(h, hc, (size_t)n + 1) : BUDGET_OK;
        if (refused) return reply_over_budget(hc, refused);
        publish_http_gauges(h);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
    (void)version;
    http_loop *l = cls;
    http_server *h = l->h;
    http_conn *hc = *con_cls;
    if (!hc) {
        hc = calloc(1, sizeof *hc);
        if (!hc) return MHD_NO;
        hc->h = h;
        hc->loop = l;
        hc->conn = conn;
        hc->t0 = srv_now();
        http_sock *sk = sock_of(conn);
        if (sk) hc->key = sk->key;
        *con_cls = hc;
        return on_headers(hc, url, method);
    }
    if (hc->responded) {   /* refused early: discard the body */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (hc->too_large || hc->over_budget) return MHD_YES;
        if (hc->len + n > h->o.max_body) {   /* chunked uploads have no Content-Length */
            hc->too_large = 1;
            return MHD_YES;
        }
        if (hc->len + n + 1 > hc->cap) {
            /* a declared length was reserved whole; a chunked body reserves as it grows */
            size_t cap = hc->reserved > hc->len + n ? hc->reserved : hc->cap ? hc->cap : 4096;
            while (cap < hc->len + n + 1) cap *= 2;
            if (cap > hc->reserved) {
                int refused = budget_take(h, hc, cap - hc->reserved);
                if (refused) {
                    hc->over_budget = refused;
                    free(hc->body);
                    hc->body = NULL;
                    hc->len = hc->cap = 0;
                    return MHD_YES;
                }
            }
            char *b = realloc(hc->body, cap);
            if (!b) return MHD_NO;
            hc->body = b;
            hc->cap = cap;
            if (cap >= TRIM_BYTES) hc->big = 1;
        }
        memcpy(hc->body + hc->len, upload_data, n);
        hc->len += n;
        hc->body[hc->len] = '\0';
        return MHD_YES;
    }
    if (hc->job) return finish_or_wait(hc);   /* resumed by the scheduler */
    http_sock *sk = sock_of(conn);   /* the whole request is in: no deadline until its response is done */
    if (sk) deadline_unlink(sk);
    if (hc->too_large) {
        metrics_rejected(METRICS_REJECT_BODY_SIZE);
        return reply_error(hc, 413, "request body exceeds the limit of %zu bytes (--max-body-bytes)", h->o.max_body);
    }
    if (hc->over_budget) return reply_over_budget(hc, hc->over_budget);
    return dispatch(hc);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    http_server *h = ((http_loop *)cls)->h;
    http_conn *hc = *con_cls;
    if (!hc) return;
    *con_cls = NULL;
    if (hc->job) {
        live_remove(hc);
        sched_client *c = hc->job->client;
        pthread_mutex_lock(&c->mu);
        int unfinished = c->n_finished < c->n_tasks;
        c->wake_arg = NULL;
        c->cancelled = unfinished;
        pthread_mutex_unlock(&c->mu);
        if (unfinished)
            srv_log(SRV_LOG_INFO, "%s %s: client went away (code %d); cancelling its sequences",
                    hc->method, hc->url, (int)toe);
        api_job_free(hc->job);
        atomic_fetch_sub(&h->jobs, 1);
    }
    if (!hc->responded) metrics_request(hc->route, hc->status);   /* no response was queued */
    srv_log(hc->route == ROUTE_HEALTH || hc->route == ROUTE_METRICS ? SRV_LOG_DEBUG : SRV_LOG_INFO,
            "%s %s %d %.1fms", hc->method, hc->url, hc->status, (srv_now() - hc->t0) * 1e3);
    /* keep-alive: the next request has the same deadline from now (a
     * closing connection is unlinked by on_connection right after) */
    http_sock *sk = sock_of(conn);
    if (sk && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) deadline_arm(sk, srv_now());
    int big = hc->big;
    free(hc->body);
    budget_give(h, hc);
    publish_http_gauges(h);
    api_buf_free(&hc->sse);
    free(hc);
    /* glibc keeps freed memory of large requests in its heaps (the mmap
     * threshold grows after large frees), so RSS stayed high after them */
    if (big) malloc_trim(0);
}

/* MHD's own messages: the ones about limits and resources say why a
 * connection was refused or dropped before any request callback ran, so they
 * are warnings; the rest (mostly clients that reset) are debug. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    int important = strstr(msg, "limit") || strstr(msg, "accept") || strstr(msg, "memory") ||
                    strstr(msg, "resource") || strstr(msg, "epoll");
    srv_log(important ? SRV_LOG_WARN : SRV_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

/* ---- event loops ---- */

/* How long the loop may sleep: until MHD's next connection timeout, or
 * (with requests waiting) the next tick; 0 when MHD has work pending. */
static int loop_timeout_ms(http_loop *l, double now)
{
    MHD_UNSIGNED_LONG_LONG t = 0;
    long long ms = MHD_get_timeout(l->d, &t) == MHD_YES ? (long long)t : -1;
    if (l->recv_head) {
        long long due = (long long)((l->recv_head->deadline - now) * 1e3) + 1;
        if (due < 0) due = 0;
        if (ms < 0 || due < ms) ms = due;
    }
    if (l->live) {
        long long tick = (long long)((l->next_tick - now) * 1e3) + 1;
        if (tick < 0) tick = 0;
        if (ms < 0 || tick < ms) ms = tick;
    }
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void *loop_main(void *arg)
{
    http_loop *l = arg;
    http_server *h = l->h;
    while (!atomic_load(&h->stop)) {
        if (atomic_load(&h->drain) && !l->quiesced) {
            int fd = MHD_quiesce_daemon(l->d);
            if (fd >= 0) close(fd);
            l->quiesced = 1;
            atomic_fetch_add(&h->n_quiesced, 1);
        }
        struct epoll_event ev[2];
        epoll_wait(l->ep, ev, 2, loop_timeout_ms(l, srv_now()));
        /* Drain, then clear, then let MHD look at the resumed connections: a
         * resume whose kick found the flag set is seen by this MHD_run (the
         * exchange orders it after that resume), and one after the clear
         * writes the eventfd again, so the next wait returns at once. */
        uint64_t v;
        while (read(l->kick_fd, &v, sizeof v) == sizeof v) {}
        atomic_exchange(&l->kicked, 0);
        MHD_run(l->d);
        double now = srv_now();
        deadline_sweep(l, now);
        loop_tick(l, now);
    }
    return NULL;
}

static int listen_socket(const http_opts *o, char *err, size_t errlen)
{
    struct sockaddr_in6 a6 = {0};
    struct sockaddr_in a4 = {0};
    struct sockaddr *addr;
    socklen_t alen;
    int v6 = strchr(o->host, ':') != NULL;
    if (v6) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET6, o->host, &a6.sin6_addr) != 1) {
            snprintf(err, errlen, "--host %s is not an IPv6 address", o->host);
            return -1;
        }
        addr = (struct sockaddr *)&a6;
        alen = sizeof a6;
    } else {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET, o->host, &a4.sin_addr) != 1) {
            snprintf(err, errlen, "--host %s is not an IPv4 address (names are not resolved)", o->host);
            return -1;
        }
        addr = (struct sockaddr *)&a4;
        alen = sizeof a4;
    }
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    /* SO_REUSEADDR lets a restart bind while old connections linger in
     * TIME_WAIT; no SO_REUSEPORT, so a port another server listens on fails. */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, addr, alen) != 0 || listen(fd, SOMAXCONN) != 0) {
        snprintf(err, errlen, "could not listen on %s:%d: %s", o->host, o->port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int loop_start(http_server *h, http_loop *l, int listen_fd, unsigned conn_limit, char *err, size_t errlen)
{
    l->h = h;
    l->ep = l->kick_fd = -1;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (strchr(h->o.host, ':')) flags |= MHD_USE_IPv6;
    l->d = MHD_start_daemon(flags, 0, on_accept, l, on_request, l,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_LISTEN_SOCKET, listen_fd,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, l,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONN_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_LIMIT, conn_limit,
                            MHD_OPTION_END);
    if (!l->d) {
        close(listen_fd);
        snprintf(err, errlen, "libmicrohttpd could not start on %s:%d", h->o.host, h->o.port);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(l->d, MHD_DAEMON_INFO_EPOLL_FD);
    l->ep = epoll_create1(EPOLL_CLOEXEC);
    l->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event mev = {.events = EPOLLIN, .data.u32 = 0}, kev = {.events = EPOLLIN, .data.u32 = 1};
    if (!di || l->ep < 0 || l->kick_fd < 0 || epoll_ctl(l->ep, EPOLL_CTL_ADD, di->epoll_fd, &mev) != 0 ||
        epoll_ctl(l->ep, EPOLL_CTL_ADD, l->kick_fd, &kev) != 0) {
        snprintf(err, errlen, "event loop setup failed: %s", strerror(errno));
        return -1;
    }
    if (pthread_create(&l->thread, NULL, loop_main, l) != 0) {
        snprintf(err, errlen, "could not start an HTTP thread");
        return -1;
    }
    l->thread_started = 1;
    return 0;
}

static void loops_free(http_server *h)
{
    for (int i = 0; i < h->n_loops; i++) {
        http_loop *l = &h->loops[i];
        if (l->d) MHD_stop_daemon(l->d);
        if (l->ep >= 0) close(l->ep);
        if (l->kick_fd >= 0) close(l->kick_fd);
    }
    free(h->loops);
    free(h->clients);
    pthread_mutex_destroy(&h->clients_mu);
    free(h);
}

static void loops_join(http_server *h)
{
    atomic_store(&h->stop, 1);
    for (int i = 0; i < h->n_loops; i++)
        if (h->loops[i].thread_started) {
            loop_kick(&h->loops[i]);
            pthread_join(h->loops[i].thread, NULL);
            h->loops[i].thread_started = 0;
        }
}

int http_start(http_server **out, const http_opts *o, int *port, char *err, size_t errlen)
{
    for (int r = 0; r < N_ROUTES; r++) route_names[r] = routes[r].path;
    metrics_init(route_names, N_ROUTES);
    http_server *h = calloc(1, sizeof *h);
    int n = o->threads > 0 ? o->threads : 1;
    if (h) h->loops = calloc((size_t)n, sizeof *h->loops);
    if (!h || !h->loops) { free(h); snprintf(err, errlen, "out of memory"); return -1; }
    h->o = *o;
    atomic_store(&h->state, STATE_LOADING);
    pthread_mutex_init(&h->clients_mu, NULL);
    unsigned limit = o->max_connections > 0 ? (unsigned)o->max_connections : MAX_CONNECTIONS;
    for (h->n_slots = 64; h->n_slots < 2 * (size_t)limit + (size_t)n * 2; h->n_slots *= 2) {}
    h->clients = calloc(h->n_slots, sizeof *h->clients);
    if (!h->clients) { free(h->loops); free(h); snprintf(err, errlen, "out of memory"); return -1; }
    json_budget_install();
    int fd = listen_socket(o, err, errlen);
    if (fd < 0) { free(h->loops); free(h->clients); free(h); return -1; }
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    getsockname(fd, (struct sockaddr *)&bound, &blen);
    *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
    /* Every loop accepts from the same socket (a dup each: each daemon closes its own). */
    for (int i = 0; i < n; i++) {
        int lfd = i == n - 1 ? fd : fcntl(fd, F_DUPFD_CLOEXEC, 0);
        h->loops[i].ep = h->loops[i].kick_fd = -1;
        h->n_loops = i + 1;
        unsigned share = limit / (unsigned)n + ((unsigned)i < limit % (unsigned)n);
        if (lfd < 0 || loop_start(h, &h->loops[i], lfd, share ? share : 1, err, errlen)) {
            if (lfd < 0) snprintf(err, errlen, "dup of the listening socket failed: %s", strerror(errno));
            if (i < n - 1) close(fd);
            loops_join(h);
            loops_free(h);
            return -1;
        }
    }
    *out = h;
    return 0;
}

void http_set_ready(http_server *h, const api_ctx *ctx, sched *s)
{
    h->ctx = ctx;
    h->s = s;
    atomic_store(&h->state, STATE_READY);
}

void http_drain(http_server *h)
{
    atomic_store(&h->state, STATE_DRAINING);
    atomic_store(&h->drain, 1);
    for (int i = 0; i < h->n_loops; i++) loop_kick(&h->loops[i]);
    /* Each loop closes its copy of the listening socket; once all have,
     * new connections are refused. */
    double deadline = srv_now() + 5;
    while (atomic_load(&h->n_quiesced) < h->n_loops && srv_now() < deadline) usleep(1000);
}

int http_jobs(http_server *h) { return atomic_load(&h->jobs); }

/* MHD_stop_daemon must not find a suspended connection: the loops are
 * stopped, then every waiting request is resumed and run to its end (a
 * reader with nothing left to send ends the stream; a waiting non-streaming
 * request is closed), then the daemons stop. */
void http_stop(http_server *h)
{
    if (!h) return;
    loops_join(h);
    atomic_store(&h->stopping, 1);
    /* The scheduler thread may still be stepping and calling wake(), which
     * resumes connections under the client's mutex. Detaching each job under
     * that mutex means no wake() is in flight past this point and none will
     * reach MHD again, while the daemons below run, stop and free connections. */
    for (int i = 0; i < h->n_loops; i++)
        for (http_conn *hc = h->loops[i].live; hc; hc = hc->next) {
            sched_client *c = hc->job->client;
            pthread_mutex_lock(&c->mu);
            c->wake_arg = NULL;
            if (hc->suspended) resume_locked(hc);
            pthread_mutex_unlock(&c->mu);
        }
    for (int i = 0; i < h->n_loops; i++)
        for (int k = 0; k < 4; k++) MHD_run(h->loops[i].d);
    loops_free(h);
}

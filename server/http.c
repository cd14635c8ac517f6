/*
 * http.c - see http.h.
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
 * to send" and "suspended" (the lost-wake-up race).
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <strings.h>
#include <unistd.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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

struct http_server {
    struct MHD_Daemon *d;
    http_opts o;
    const api_ctx *ctx;     /* valid once state is READY */
    sched *s;
    _Atomic int state;
    _Atomic int jobs;
};

typedef struct {
    http_server *h;
    struct MHD_Connection *conn;
    int route;
    char method[8];
    char url[512];
    char *body; size_t len, cap;
    int too_large;
    int responded;          /* a response is queued */
    int status;
    api_job *job;
    int suspended;          /* under job->client->mu */
    int peer_gone;          /* non-streaming client closed while we waited (under the mutex) */
    api_buf sse;            /* rendered, not yet handed to MHD */
    size_t sse_off;
    double t0;
} http_conn;

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
    hc->status = status;
    hc->responded = 1;
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
    hc->status = 204;
    hc->responded = 1;
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
    hc->status = 200;
    hc->responded = 1;
    return ok;
}

/* ---- scheduler wake-ups ---- */

/* A suspended connection is not watched by MHD, so a non-streaming client
 * that hangs up would go unnoticed until its answer is ready. The scheduler
 * wakes such clients now and then (its probe); this looks at the socket
 * without consuming anything: EOF or a reset means the client is gone. */
static int peer_closed(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void wake(sched_client *c)
{
    struct MHD_Connection *conn = NULL;
    pthread_mutex_lock(&c->mu);
    http_conn *hc = c->wake_arg;
    /* Non-streaming requests only care about the end, or about their client leaving. */
    if (hc && hc->suspended && !c->stream && c->n_finished < c->n_tasks && peer_closed(hc->conn))
        hc->peer_gone = 1;
    if (hc && hc->suspended && (c->stream || c->n_finished == c->n_tasks || hc->peer_gone)) {
        hc->suspended = 0;
        conn = hc->conn;
    }
    pthread_mutex_unlock(&c->mu);
    /* Still suspended until this call, so MHD cannot have freed it. */
    if (conn) MHD_resume_connection(conn);
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
            return (ssize_t)n;
        }
        hc->sse.len = hc->sse_off = 0;
        if (hc->job->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        api_render_stream(hc->job, &hc->sse);
        if (hc->sse.len) continue;
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
    if (gone) {
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

/* ---- dispatch ---- */

static enum MHD_Result submit(http_conn *hc, int kind)
{
    http_server *h = hc->h;
    api_error e = {0};
    api_job *job = NULL;
    if (api_parse(h->ctx, kind, hc->body ? hc->body : "", hc->len, &job, &e)) return reply_api_error(hc, &e);
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
    hc->status = 200;
    hc->responded = 1;
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
        body = api_tokenize(h->ctx, hc->body ? hc->body : "", hc->len, &e, &len);
        break;
    case ROUTE_DETOKENIZE: case ROUTE_V1_DETOKENIZE:
        body = api_detokenize(h->ctx, hc->body ? hc->body : "", hc->len, &e, &len);
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

static int authorized(http_server *h, struct MHD_Connection *conn)
{
    if (!h->o.api_key) return 1;
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) return key_equal(auth + 7, h->o.api_key);
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-API-Key");
    return x && key_equal(x, h->o.api_key);
}

/* First call: only the headers are known. */
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
    if (!path_known) return reply_error(hc, 404, "no route for %s %s", method, url);
    if (!strcmp(method, "OPTIONS")) return reply_preflight(hc);
    if (strcmp(method, routes[hc->route].method) != 0)
        return reply_error(hc, 405, "%s %s is not allowed; use %s", method, url, routes[hc->route].method);
    if (!routes[hc->route].public && !authorized(h, hc->conn))
        return reply_error(hc, 401, "missing or wrong API key (send \"Authorization: Bearer KEY\")");
    const char *cl = MHD_lookup_connection_value(hc->conn, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > h->o.max_body)
        return reply_error(hc, 413, "request body of %s bytes exceeds the limit of %zu bytes", cl, h->o.max_body);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls)
{
    (void)version;
    http_server *h = cls;
    http_conn *hc = *con_cls;
    if (!hc) {
        hc = calloc(1, sizeof *hc);
        if (!hc) return MHD_NO;
        hc->h = h;
        hc->conn = conn;
        hc->t0 = srv_now();
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
        if (hc->too_large || hc->len + n > h->o.max_body) {   /* chunked uploads have no Content-Length */
            hc->too_large = 1;
            return MHD_YES;
        }
        if (hc->len + n + 1 > hc->cap) {
            size_t cap = hc->cap ? hc->cap : 4096;
            while (cap < hc->len + n + 1) cap *= 2;
            char *b = realloc(hc->body, cap);
            if (!b) return MHD_NO;
            hc->body = b;
            hc->cap = cap;
        }
        memcpy(hc->body + hc->len, upload_data, n);
        hc->len += n;
        hc->body[hc->len] = '\0';
        return MHD_YES;
    }
    if (hc->job) return finish_or_wait(hc);   /* resumed by the scheduler */
    if (hc->too_large) return reply_error(hc, 413, "request body exceeds the limit of %zu bytes", h->o.max_body);
    return dispatch(hc);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    http_server *h = cls;
    http_conn *hc = *con_cls;
    if (!hc) return;
    *con_cls = NULL;
    if (hc->job) {
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
    metrics_request(hc->route, hc->status);
    srv_log(hc->route == ROUTE_HEALTH || hc->route == ROUTE_METRICS ? SRV_LOG_DEBUG : SRV_LOG_INFO,
            "%s %s %d %.1fms", hc->method, hc->url, hc->status, (srv_now() - hc->t0) * 1e3);
    free(hc->body);
    api_buf_free(&hc->sse);
    free(hc);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    srv_log(SRV_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

int http_start(http_server **out, const http_opts *o, int *port, char *err, size_t errlen)
{
    for (int r = 0; r < N_ROUTES; r++) route_names[r] = routes[r].path;
    metrics_init(route_names, N_ROUTES);
    http_server *h = calloc(1, sizeof *h);
    if (!h) { snprintf(err, errlen, "out of memory"); return -1; }
    h->o = *o;
    atomic_store(&h->state, STATE_LOADING);

    struct sockaddr_in6 a6 = {0};
    struct sockaddr_in a4 = {0};
    struct sockaddr *addr;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (strchr(o->host, ':')) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET6, o->host, &a6.sin6_addr) != 1) {
            snprintf(err, errlen, "--host %s is not an IPv6 address", o->host);
            free(h);
            return -1;
        }
        addr = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)o->port);
        if (inet_pton(AF_INET, o->host, &a4.sin_addr) != 1) {
            snprintf(err, errlen, "--host %s is not an IPv4 address (names are not resolved)", o->host);
            free(h);
            return -1;
        }
        addr = (struct sockaddr *)&a4;
    }
    h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)o->threads,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                            MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errlen, "could not listen on %s:%d (port in use, or address not local?)", o->host, o->port);
        free(h);
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : o->port;
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
    int fd = MHD_quiesce_daemon(h->d);
    if (fd >= 0) close(fd);
}

int http_jobs(http_server *h) { return atomic_load(&h->jobs); }

void http_stop(http_server *h)
{
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}

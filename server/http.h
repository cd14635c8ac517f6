/*
 * http.h - libmicrohttpd glue: listening, routing, API keys, body limits,
 * the suspend/resume dance that lets a request wait for the scheduler
 * without holding an HTTP thread, the keep-alive comments of idle streams,
 * and the limits that keep hostile clients from starving the others
 * (connections per client, the whole-request deadline, the body budget and
 * each client's share of it).
 */
#ifndef SRV_HTTP_H
#define SRV_HTTP_H

#include <stddef.h>

#include "api.h"
#include "scheduler.h"

typedef struct {
    const char *host;
    int port;               /* 0: any free port (the log says which) */
    int threads;            /* event loops, one thread each */
    const char *api_key;    /* NULL: no auth */
    size_t max_body;        /* bytes; larger bodies get 413 */
    double heartbeat_s;     /* idle streams get a comment this often (0: never) */
    int max_connections;    /* open connections at once, all loops together (0: 4096) */
    int max_per_client;     /* open connections from one client address (0: no cap) */
    double request_timeout_s;   /* a connection must deliver a whole request (headers and body) this
                                 * long after opening or after its previous response (0: no deadline) */
    size_t body_budget;     /* request-body bytes all requests being received may reserve (0: no cap) */
    size_t body_budget_per_client;   /* ... and those of one client address (0: no cap) */
    size_t max_json;        /* memory cJSON may hold for one request's body (0: no cap; json_budget.h) */
    int webui;              /* serve the playground page at GET / */
    const char *allowed_origins;  /* CORS: comma-separated origins or "*"; NULL: no CORS headers */
} http_opts;

typedef struct http_server http_server;

/* Starts listening; every route but /health and /metrics answers 503 until
 * http_set_ready. *port receives the bound port. */
int http_start(http_server **out, const http_opts *o, int *port, char *err, size_t errlen);
/* ctx and s must outlive the server. */
void http_set_ready(http_server *h, const api_ctx *ctx, sched *s);
/* Stops accepting connections (returns once the listening socket is
 * closed); requests on open ones get 503. */
void http_drain(http_server *h);
int http_jobs(http_server *h);     /* requests waiting on the scheduler */
void http_stop(http_server *h);

#endif

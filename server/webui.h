/*
 * webui.h - the built-in playground: the page served at GET / (embedded in
 * the binary at build time from server/webui/index.html by embed.py) and
 * GET /props, the facts about the loaded model that the page shows.
 */
#ifndef SRV_WEBUI_H
#define SRV_WEBUI_H

#include <stddef.h>

#include "api.h"

struct MHD_Response;

/* A response over the page's static bytes with headers that keep it to its
 * own origin (a Content-Security-Policy allowing no other host); the caller
 * queues and destroys it. NULL when out of memory. */
struct MHD_Response *webui_page_response(void);

/* /props: {"model", "family", "device", "max_seq_len", "vocab_size",
 * "n_layers", "n_params", "max_seqs"}; NULL when out of memory. */
char *webui_props(const api_ctx *ctx, size_t *len);

#endif

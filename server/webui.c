/* webui.c - see webui.h. */
#include "webui.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <string.h>

/* Defined in the generated webui_page.c. */
extern const unsigned char webui_index_html[];
extern const size_t webui_index_html_len;

/* The page is one file with inline script and style: nothing may load from
 * anywhere, and it may talk only to the server that served it (no CORS). */
static const char page_csp[] =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct MHD_Response *webui_page_response(void)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(webui_index_html_len, (void *)webui_index_html,
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r) return NULL;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Content-Security-Policy", page_csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    /* A rebuilt server may serve a new page at the same address. */
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return r;
}

char *webui_props(const api_ctx *ctx, size_t *len)
{
    const kda_model_info *in = ctx->info;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "model", ctx->model_name);
    cJSON_AddStringToObject(o, "family", in->family_name);
    cJSON_AddStringToObject(o, "device", in->device_name);
    cJSON_AddNumberToObject(o, "max_seq_len", ctx->max_seq_len);
    cJSON_AddNumberToObject(o, "vocab_size", ctx->vocab_size);
    cJSON_AddNumberToObject(o, "n_layers", in->n_layers);
    cJSON_AddNumberToObject(o, "n_params", (double)in->n_params);
    cJSON_AddNumberToObject(o, "max_seqs", in->max_seqs);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) *len = strlen(s);
    return s;
}

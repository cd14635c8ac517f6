/*
 * main.c - kda-server: flags, startup, signals, shutdown.
 *
 * Startup order: listen first (a busy port fails in milliseconds, and
 * /health can say "loading" while the weights load), then the tokenizer and
 * the engine, then the scheduler thread, then ready.
 * Shutdown (SIGTERM/SIGINT): stop accepting, let running requests finish
 * for --grace-seconds, abort what is left, exit 0. A second signal skips the
 * rest of the grace period.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "engine.h"
#include "http.h"
#include "kda_version.h"
#include "log.h"
#include "metrics.h"
#include "scheduler.h"
#include "tokenizer.h"

#ifndef KDA_DEFAULT_MODEL
#define KDA_DEFAULT_MODEL "models/demo"
#endif

typedef struct {
    const char *model, *model_name, *host, *device, *api_key, *api_key_file, *name_map, *config_map;
    const char *chat_template, *allowed_origins;
    int no_webui;
    int port, max_batch, max_queue, max_seq_len, threads, http_threads, render_threads, step_tokens, step_tokens_idle, prefill_chunk;
    int prefix_cache, prefix_grid;
    int step_overlap;    /* -1 auto (on where the engine's steps are asynchronous), 0 off, 1 on */
    long prefix_cache_bytes;
    double grace_s, heartbeat_s, gpu_mem_fraction;
    long max_body;
    /* hostile-client limits (README, "Limits"); -1: the default worked out at startup */
    long max_connections, max_per_client, body_budget, body_budget_per_client, max_json, max_tokenize_tokens;
    long max_response;
    double request_timeout_s;
    kda_tuning tuning;   /* $KDA_TUNING, then --tuning on top, then --kda-state-dtype */
    const char *state_dtype;
} flags;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kda-server [options]\n"
        "\n"
        "  --model DIR            checkpoint directory (default: $KDA_MODEL, else %s)\n"
        "  --model-name NAME      name served by /v1/models (default: the directory's name)\n"
        "  --name-map FILE        tensor names of another layout (configs/README.md)\n"
        "  --config-map PATH      config.json keys of another layout: a map file, or a folder of\n"
        "                         *.configmap.json chosen by model_type (configs/README.md)\n"
        "  --host ADDR            address to listen on (default 127.0.0.1)\n"
        "  --port N               port, 0 = any free one (default 8080)\n"
        "  --device cpu|cuda|auto engine device (default cpu)\n"
        "  --max-batch N          sequences decoded together (default 32)\n"
        "  --max-queue N          sequences waiting for a slot before 503 (default 256)\n"
        "  --max-seq-len N        per-sequence context, prompt + generated (default: the model's)\n"
        "  --threads N            engine CPU threads, 0 = all cores (default 0; idle ones wait\n"
        "                         passively, OMP_WAIT_POLICY=PASSIVE, unless set)\n"
        "  --gpu-memory-fraction F  CUDA: share of the free device memory the pool takes at\n"
        "                         startup (weights, KV cache, state, activations; default 0.9)\n"
        "  --http-threads N       HTTP event loops, one thread each (default 4)\n"
        "  --render-threads N     threads that render one large response of several choices or\n"
        "                         /score results, and the most all responses use at once\n"
        "                         (default: the cores, at most 8; 1 = the HTTP thread alone)\n"
        "  --step-tokens N        token budget of a step while sequences decode (default: cpu 512,\n"
        "                         cuda 1024)\n"
        "  --step-tokens-idle N   ... and when none decodes (default: cpu 512, cuda the engine's\n"
        "                         prefill pass, 8192)\n"
        "  --prefill-chunk N      prompts are cut at multiples of N tokens (default: cpu 128, cuda 256)\n"
        "  --step-overlap auto|on|off  launch each engine step before the previous step's tokens are\n"
        "                         turned into text and sent, which then overlaps the device's work\n"
        "                         (default auto: on for cuda, off for cpu, whose steps run on the\n"
        "                         calling thread and would deliver each token a step late)\n"
        "  --prefix-cache on|off  reuse KDA state snapshots and KV of shared prompt prefixes across\n"
        "                         requests, exactly (default on; a request bypasses it with\n"
        "                         \"cache_prompt\": false)\n"
        "  --prefix-cache-bytes N memory the prefix cache may hold: snapshot states, KV no running\n"
        "                         sequence holds, its index (default 2147483648; CUDA carves N bytes of\n"
        "                         snapshot slots in the device pool at startup)\n"
        "  --prefix-cache-grid N  snapshot every N prompt tokens (default 0: the tokens whose KV is as\n"
        "                         large as one snapshot, a multiple of --prefill-chunk)\n"
        "  --max-body-bytes N     request bodies above this get 413 (default 8388608)\n"
        "  --max-body-bytes-in-flight N  request-body bytes all requests being received may hold;\n"
        "                         a request that does not fit gets 503 before its body is read\n"
        "                         (default 201326592 = 192 MiB; 0 = no cap, else at least --max-body-bytes)\n"
        "  --max-body-bytes-in-flight-per-client N  ... of which one client address may hold; beyond it\n"
        "                         503 the same way (default: a quarter of --max-body-bytes-in-flight, at\n"
        "                         least --max-body-bytes; 0 = no cap, else at least --max-body-bytes)\n"
        "  --max-json-bytes N     memory parsing one request body may take (a JSON array costs ~64\n"
        "                         bytes per element); above it 413 (default 33554432 = 32 MiB)\n"
        "  --max-tokenize-tokens N  /tokenize results longer than this get 400 (default 262144)\n"
        "  --max-response-bytes N a request whose response could take more than N bytes gets 400 before\n"
        "                         it runs: the bound counts every choice x (max_tokens + the echoed prompt)\n"
        "                         x the most bytes one token and its log-probs / alternatives can take,\n"
        "                         streamed or not; /score, /tokenize and /detokenize are bounded the same\n"
        "                         way (default 67108864 = 64 MiB, 0 = no cap)\n"
        "  --max-connections N    open connections at once (default 4096, lowered to fit the\n"
        "                         descriptor limit)\n"
        "  --max-connections-per-client N  open connections from one client address; more are\n"
        "                         refused at accept (default: half of --max-connections; 0 = no cap)\n"
        "  --request-timeout S    a connection must deliver a whole request, headers and body, within S\n"
        "                         seconds of opening or of its previous response, else it is closed\n"
        "                         (default 60, 0 = off)\n"
        "  --heartbeat-seconds S  keep-alive comment on idle streams (default 15, 0 = off)\n"
        "  --grace-seconds S      on SIGTERM/SIGINT, time given to running requests (default 30)\n"
        "  --api-key KEY          require \"Authorization: Bearer KEY\" or \"X-API-Key: KEY\" on every route\n"
        "                         but /, /health, /metrics, /openapi.json (must not be empty)\n"
        "  --api-key-file PATH    same, key read from the file's first line\n"
        "  --kda-state-dtype fp32|bf16  CUDA: how the KDA recurrent state is stored (default fp32; bf16\n"
        "                         halves its memory and traffic at a measured fidelity cost: README)\n"
        "  --tuning k=v,...       kernel variants and switches, also from $KDA_TUNING (--tuning wins):\n"
        "                         gemv_max_t graphs pdl gemm_lt gemm_verbose gemm_tune_flush gemm_splitk\n"
        "                         gemm_skinny gemm_pad gemv_persist gu_bf16 attn_split kda_stream\n"
        "                         fast_prefill mixed_pass mixed_reserve short_prompt prefill_rows\n"
        "                         attn_prefill_variant attn_prefill_split\n"
        "                         kda_chunk_gemm kda_chunk_bv kda_chunk_split prof cpu_bf16_act\n"
        "                         kda_state_bf16 (defaults: the measured best; engine/engine.h,\n"
        "                         kda_tuning, says what each does)\n"
        "  --no-webui             do not serve the playground page at GET /\n"
        "  --chat-template T      chat format for /v1/chat/completions: llama-2, chatml, plain, or a\n"
        "                         Jinja file (default: the model directory's own template, if any)\n"
        "  --allowed-origins L    CORS: comma-separated origins allowed to call from a browser, or *\n"
        "                         (default: none, no CORS headers)\n"
        "  --log-level L          error|warn|info|debug (default info)\n"
        "  --version              print the version and exit\n"
        "  --help                 this text\n", KDA_DEFAULT_MODEL);
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *v)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || *end || end == s || x < lo || x > hi) {
        fprintf(stderr, "kda-server: %s must be an integer in [%ld, %ld], got \"%s\"\n", flag, lo, hi, s);
        return -1;
    }
    *v = x;
    return 0;
}

static int parse_double(const char *flag, const char *s, double lo, double hi, double *v)
{
    char *end;
    double x = strtod(s, &end);
    if (*end || end == s || !(x >= lo && x <= hi)) {
        fprintf(stderr, "kda-server: %s must be a number in [%g, %g], got \"%s\"\n", flag, lo, hi, s);
        return -1;
    }
    *v = x;
    return 0;
}

/* Returns 0 to run, 1 to exit 0 (--help, --version), -1 to exit 2. */
static int parse_flags(int argc, char **argv, flags *f)
{
    *f = (flags){.host = "127.0.0.1", .device = "cpu", .port = 8080, .max_batch = 32, .max_queue = 256,
                 .http_threads = 4, .grace_s = 30,
                 .prefix_cache = 1, .step_overlap = -1, .prefix_cache_bytes = 2147483648L,
                 .heartbeat_s = 15, .max_body = 8 << 20,
                 .max_connections = -1, .max_per_client = -1, .body_budget = 192L << 20, .body_budget_per_client = -1,
                 .max_json = 32L << 20, .max_response = 64L << 20,
                 .max_tokenize_tokens = 262144, .request_timeout_s = 60};
    kda_tuning_defaults(&f->tuning);
    {
        char err[256];
        if (kda_tuning_from_env(&f->tuning, err, sizeof err)) {
            fprintf(stderr, "kda-server: KDA_TUNING: %s\n", err);
            return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 1; }
        if (!strcmp(a, "--no-webui")) { f->no_webui = 1; continue; }
        if (!strcmp(a, "--version")) { printf("kda-server %s (git %s)\n", KDA_PROJECT_VERSION, KDA_GIT_DESCRIBE); return 1; }
        if (i + 1 >= argc) {
            fprintf(stderr, "kda-server: unknown flag or missing value: %s (see --help)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        long x = 0;
        int rc = 0;
        if (!strcmp(a, "--model")) f->model = v;
        else if (!strcmp(a, "--model-name")) f->model_name = v;
        else if (!strcmp(a, "--name-map")) f->name_map = v;
        else if (!strcmp(a, "--config-map")) f->config_map = v;
        else if (!strcmp(a, "--host")) f->host = v;
        else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
                fprintf(stderr, "kda-server: --device must be cpu, cuda or auto, got \"%s\"\n", v);
                return -1;
            }
            f->device = v;
        }
        else if (!strcmp(a, "--api-key")) {
            if (!v[0]) {
                fprintf(stderr, "kda-server: --api-key is empty: give a key, or leave the flag out to serve "
                                "without authentication\n");
                return -1;
            }
            f->api_key = v;
        }
        else if (!strcmp(a, "--step-overlap")) {
            if (strcmp(v, "auto") && strcmp(v, "on") && strcmp(v, "off")) {
                fprintf(stderr, "kda-server: --step-overlap must be auto, on or off, got \"%s\"\n", v);
                return -1;
            }
            f->step_overlap = !strcmp(v, "auto") ? -1 : !strcmp(v, "on");
        }
        else if (!strcmp(a, "--prefix-cache")) {
            if (strcmp(v, "on") && strcmp(v, "off")) {
                fprintf(stderr, "kda-server: --prefix-cache must be on or off, got \"%s\"\n", v);
                return -1;
            }
            f->prefix_cache = !strcmp(v, "on");
        }
        else if (!strcmp(a, "--prefix-cache-bytes")) { rc = parse_long(a, v, 0, 1L << 50, &x); f->prefix_cache_bytes = x; }
        else if (!strcmp(a, "--prefix-cache-grid")) { rc = parse_long(a, v, 0, 1 << 20, &x); f->prefix_grid = (int)x; }
        else if (!strcmp(a, "--tuning")) {
            char err[256];
            if (kda_tuning_parse(&f->tuning, v, err, sizeof err)) {
                fprintf(stderr, "kda-server: --tuning: %s\n", err);
                return -1;
            }
        }
        else if (!strcmp(a, "--kda-state-dtype")) f->state_dtype = v; /* applied after --tuning */
        else if (!strcmp(a, "--api-key-file")) f->api_key_file = v;
        else if (!strcmp(a, "--chat-template")) f->chat_template = v;
        else if (!strcmp(a, "--allowed-origins")) f->allowed_origins = v;
        else if (!strcmp(a, "--log-level")) {
            int l = srv_log_parse_level(v);
            if (l < 0) { fprintf(stderr, "kda-server: --log-level must be error, warn, info or debug\n"); return -1; }
            srv_log_level = l;
        }
        else if (!strcmp(a, "--port")) { rc = parse_long(a, v, 0, 65535, &x); f->port = (int)x; }
        else if (!strcmp(a, "--max-batch")) { rc = parse_long(a, v, 1, 4096, &x); f->max_batch = (int)x; }
        else if (!strcmp(a, "--max-queue")) { rc = parse_long(a, v, 1, 1 << 20, &x); f->max_queue = (int)x; }
        else if (!strcmp(a, "--max-seq-len")) { rc = parse_long(a, v, 0, INT_MAX, &x); f->max_seq_len = (int)x; }
        else if (!strcmp(a, "--threads")) { rc = parse_long(a, v, 0, 1024, &x); f->threads = (int)x; }
        else if (!strcmp(a, "--http-threads")) { rc = parse_long(a, v, 1, 256, &x); f->http_threads = (int)x; }
        else if (!strcmp(a, "--render-threads")) { rc = parse_long(a, v, 1, 64, &x); f->render_threads = (int)x; }
        else if (!strcmp(a, "--step-tokens")) { rc = parse_long(a, v, 1, 1 << 20, &x); f->step_tokens = (int)x; }
        else if (!strcmp(a, "--step-tokens-idle")) { rc = parse_long(a, v, 1, 1 << 20, &x); f->step_tokens_idle = (int)x; }
        else if (!strcmp(a, "--prefill-chunk")) { rc = parse_long(a, v, 1, 1 << 16, &x); f->prefill_chunk = (int)x; }
        else if (!strcmp(a, "--max-body-bytes")) { rc = parse_long(a, v, 1024, 1L << 32, &x); f->max_body = x; }
        else if (!strcmp(a, "--max-body-bytes-in-flight")) { rc = parse_long(a, v, 0, 1L << 40, &x); f->body_budget = x; }
        else if (!strcmp(a, "--max-body-bytes-in-flight-per-client")) {
            rc = parse_long(a, v, 0, 1L << 40, &x);
            f->body_budget_per_client = x;
        }
        else if (!strcmp(a, "--max-response-bytes")) { rc = parse_long(a, v, 0, 1L << 40, &x); f->max_response = x; }
        else if (!strcmp(a, "--max-json-bytes")) { rc = parse_long(a, v, 0, 1L << 40, &x); f->max_json = x; }
        else if (!strcmp(a, "--max-tokenize-tokens")) { rc = parse_long(a, v, 1, INT_MAX, &x); f->max_tokenize_tokens = x; }
        else if (!strcmp(a, "--max-connections")) { rc = parse_long(a, v, 1, 1 << 20, &x); f->max_connections = x; }
        else if (!strcmp(a, "--max-connections-per-client")) { rc = parse_long(a, v, 0, 1 << 20, &x); f->max_per_client = x; }
        else if (!strcmp(a, "--request-timeout")) rc = parse_double(a, v, 0, 86400, &f->request_timeout_s);
        else if (!strcmp(a, "--grace-seconds")) rc = parse_double(a, v, 0, 86400, &f->grace_s);
        else if (!strcmp(a, "--heartbeat-seconds")) rc = parse_double(a, v, 0, 3600, &f->heartbeat_s);
        else if (!strcmp(a, "--gpu-memory-fraction")) rc = parse_double(a, v, 0.01, 1.0, &f->gpu_mem_fraction);
        else {
            fprintf(stderr, "kda-server: unknown flag %s (see --help)\n", a);
            return -1;
        }
        if (rc) return -1;
    }
    {
        char err[256];
        if (kda_state_dtype_parse(&f->tuning, f->state_dtype, err, sizeof err)) {
            fprintf(stderr, "kda-server: %s\n", err);
            return -1;
        }
    }
    if (f->body_budget && f->body_budget < f->max_body) {
        fprintf(stderr, "kda-server: --max-body-bytes-in-flight (%ld) must be 0 or at least --max-body-bytes (%ld)\n",
                f->body_budget, f->max_body);
        return -1;
    }
    if (f->body_budget_per_client > 0 && f->body_budget_per_client < f->max_body) {
        fprintf(stderr, "kda-server: --max-body-bytes-in-flight-per-client (%ld) must be 0 or at least --max-body-bytes "
                        "(%ld)\n", f->body_budget_per_client, f->max_body);
        return -1;
    }
    if (f->body_budget_per_client < 0) {   /* the default: a quarter of the budget, holding one whole body */
        long share = f->body_budget / 4;
        f->body_budget_per_client = !f->body_budget ? 0 : share > f->max_body ? share : f->max_body;
    }
    return 0;
}

static char *read_key_file(const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "kda-server: --api-key-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char line[1024];
    char *key = NULL;
    if (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0]) key = strdup(line);
    }
    fclose(fp);
    if (!key) fprintf(stderr, "kda-server: --api-key-file %s: the first line is empty\n", path);
    return key;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Last path component, trailing slashes ignored. */
static void base_name(const char *path, char *out, size_t cap)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && path[s - 1] != '/') s--;
    snprintf(out, cap, "%.*s", (int)(n - s), path + s);
}

static void log_model(const char *dir, const kda_model_info *in, int max_batch)
{
    int n_kda = 0;
    for (int l = 0; l < in->n_layers && l < KDA_MAX_LAYERS; l++) n_kda += in->layer_kind[l] == KDA_LAYER_KDA;
    srv_log(SRV_LOG_INFO, "loaded %s: family %s, %d layers (%d KDA + %d GQA), d_model %d, vocab %d, %.2fM params",
            dir, in->family_name, in->n_layers, n_kda, in->n_layers - n_kda, in->d_model, in->vocab_size,
            (double)in->n_params / 1e6);
    char total[96];
    if (in->pool_bytes)
        snprintf(total, sizeof total, "; device pool %.1f MiB in total", (double)in->pool_bytes / 1048576.0);
    else
        snprintf(total, sizeof total, " (host memory, taken per sequence on first use)");
    srv_log(SRV_LOG_INFO, "memory on %s: weights %.1f MiB, KV cache pool %.1f MiB (%.1f KiB/token), KDA state pool "
            "%.1f MiB (%.1f KiB/sequence)%s",
            in->device_name, (double)in->weight_bytes / 1048576.0, (double)in->kv_pool_bytes / 1048576.0,
            (double)in->kv_bytes_per_token / 1024.0, (double)in->state_pool_bytes / 1048576.0,
            (double)in->state_bytes_per_seq / 1024.0, total);
    srv_log(SRV_LOG_INFO, "capacity: max concurrent sequences at full context (%d tokens): %d; %d sequence slots "
            "(max batch %d)",
            in->max_seq_len, in->max_full_context_seqs, in->max_seqs, max_batch);
}

/* Each connection is a descriptor: raise the soft limit to the hard one (a
 * default soft limit of 1024 would make accept() fail with EMFILE under a
 * burst, and MHD stop listening), and keep the connection limit under it with
 * room for the model files, the engine and the logs. */
#define MAX_CONNECTIONS 4096
static int connection_capacity(long wanted)
{
    struct rlimit rl;
    long cap = wanted > 0 ? wanted : MAX_CONNECTIONS;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return (int)cap;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 65536 ? 65536 : rl.rlim_max;
        if (want > rl.rlim_cur) {
            struct rlimit up = {want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl.rlim_cur = want;
        }
    }
    long room = (long)rl.rlim_cur - 256;
    if (room < 64) room = 64;
    if (room < cap)
        srv_log(SRV_LOG_WARN, "up to %ld connections, not %ld: the descriptor limit is %ld (ulimit -n)", room, cap,
                (long)rl.rlim_cur);
    return room < cap ? (int)room : (int)cap;
}

static void log_prefix_cache(const kda_model_info *in, const sched_opts *so)
{
    if (!so->prefix_cache_bytes || in->max_snapshots == 0) {
        srv_log(SRV_LOG_INFO, "prefix cache: off%s", so->prefix_cache_bytes ? " (budget below one snapshot)" : "");
        return;
    }
    srv_log(SRV_LOG_INFO, "prefix cache: on, budget %.1f MiB, %d snapshot slots of %.2f MiB (KDA state), KV shared "
            "by reference, a snapshot every %d prompt tokens plus branch points and ends of requests",
            (double)so->prefix_cache_bytes / 1048576.0, in->max_snapshots, (double)in->snapshot_bytes_each / 1048576.0,
            sched_prefix_grid(in, so));
}

/* Waits up to seconds for SIGINT/SIGTERM; returns the signal or 0. */
static int wait_signal(const sigset_t *set, double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

int main(int argc, char **argv)
{
    flags f;
    int pr = parse_flags(argc, argv, &f);
    if (pr) return pr > 0 ? 0 : 2;

    const char *model = f.model ? f.model : getenv("KDA_MODEL") && *getenv("KDA_MODEL") ? getenv("KDA_MODEL")
                                                                                       : KDA_DEFAULT_MODEL;
    if (!is_dir(model)) {
        if (f.model) fprintf(stderr, "kda-server: --model %s is not a directory\n", model);
        else fprintf(stderr, "kda-server: no model at %s (the default); pass --model DIR or set KDA_MODEL\n", model);
        return 1;
    }
    char *key = NULL;
    if (f.api_key_file) {
        key = read_key_file(f.api_key_file);
        if (!key) return 2;
    } else if (f.api_key) {
        key = strdup(f.api_key);
    }
    char name[256];
    if (f.model_name) snprintf(name, sizeof name, "%s", f.model_name);
    else base_name(model, name, sizeof name);

    /* Every thread created from here on inherits the blocked set, so the
     * signals are only ever taken by sigtimedwait below. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    char err[512] = "";
    int port = 0, rc = 1;
    http_server *h = NULL;
    tok_tokenizer *tok = NULL;
    kda_engine *e = NULL;
    sched *s = NULL;
    api_ctx ctx = {0};
    http_opts ho = {.host = f.host, .port = f.port, .threads = f.http_threads, .api_key = key,
                    .max_body = (size_t)f.max_body, .webui = !f.no_webui, .allowed_origins = f.allowed_origins,
                    .heartbeat_s = f.heartbeat_s, .max_connections = connection_capacity(f.max_connections),
                    .request_timeout_s = f.request_timeout_s, .body_budget = (size_t)f.body_budget,
                    .body_budget_per_client = (size_t)f.body_budget_per_client,
                    .max_json = (size_t)f.max_json};
    ho.max_per_client = f.max_per_client >= 0 ? (int)f.max_per_client : ho.max_connections / 2;
    if (http_start(&h, &ho, &port, err, sizeof err)) {
        srv_log(SRV_LOG_ERROR, "%s", err);
        goto out;
    }
    srv_log(SRV_LOG_INFO, "listening on http://%s%s%s:%d (loading %s)", strchr(f.host, ':') ? "[" : "", f.host,
            strchr(f.host, ':') ? "]" : "", port, model);

    double t0 = srv_now();
    if (tok_open_dir(&tok, model, err, sizeof err)) {
        srv_log(SRV_LOG_ERROR, "tokenizer: %s", err);
        goto out;
    }
    kda_engine_opts eo = {.model_dir = model, .device = f.device, .threads = f.threads, .max_seqs = f.max_batch,
                          .max_seq_len = f.max_seq_len, .gpu_mem_fraction = f.gpu_mem_fraction,
                          .name_map = f.name_map, .config_map = f.config_map,
                          .tuning = &f.tuning, .verbose = srv_log_level >= SRV_LOG_DEBUG,
                          .snapshot_bytes = f.prefix_cache ? (size_t)f.prefix_cache_bytes : 0};
    int erc = kda_engine_open(&e, &eo, err, sizeof err);
    if (erc) {
        srv_log(SRV_LOG_ERROR, "engine: %s (%s)", err, kda_strerror(erc));
        goto out;
    }
    const kda_model_info *info = kda_engine_info(e);
    if (tok_vocab_size(tok) != info->vocab_size) {
        srv_log(SRV_LOG_ERROR, "the tokenizer has %d ids but the model's vocab_size is %d (%s)",
                tok_vocab_size(tok), info->vocab_size, model);
        goto out;
    }
    log_model(model, info, f.max_batch);
    srv_log(SRV_LOG_INFO, "loaded in %.2fs", srv_now() - t0);

    /* BOS comes from the tokenizer (a byte tokenizer has none, whatever
     * config.json says), EOS from the model config: the same choice as
     * kda-cli, so greedy output matches it. */
    int bos = tok_bos_id(tok);
    int eos = info->eos_id >= 0 && info->eos_id < info->vocab_size ? info->eos_id : tok_eos_id(tok);
    ctx = (api_ctx){.tok = tok, .vocab_size = info->vocab_size, .bos_id = bos, .eos_id = eos,
                    .max_seq_len = info->max_seq_len, .model_name = name, .max_tasks = f.max_queue,
                    .max_tokenize_tokens = (int)f.max_tokenize_tokens, .max_response_bytes = (size_t)f.max_response,
                    .info = info, .render_threads = f.render_threads, .render_min_work = 4096};
    if (!ctx.render_threads) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        ctx.render_threads = nc < 1 ? 1 : nc > 8 ? 8 : (int)nc;
    }
    if (api_ctx_init(&ctx, model, f.chat_template, err, sizeof err)) {
        srv_log(SRV_LOG_ERROR, "%s", err);
        goto out;
    }
    if (ctx.max_response_bytes)
        srv_log(SRV_LOG_INFO, "responses: up to %.0f MiB each, bounded before a request runs (--max-response-bytes); "
                "one token's text takes at most %d bytes escaped", (double)ctx.max_response_bytes / 1048576.0,
                ctx.max_token_json);
    srv_log(SRV_LOG_INFO, "chat template: %s", ctx.chat ? chat_template_name(ctx.chat)
                                                       : "none (chat requests get 400; see --chat-template)");
    metrics_set_model(name, (double)info->kv_pool_bytes + (double)info->state_pool_bytes);
    int max_batch = f.max_batch < info->max_seqs ? f.max_batch : info->max_seqs;
    /* step budgets by device (0 = not given): the CPU keeps its small steps;
     * on the GPU prompts go in large passes when nothing decodes, and in
     * bounded pieces while something does */
    const int on_gpu = strcmp(info->device_name, "cpu") != 0;
    if (!f.step_tokens) f.step_tokens = on_gpu ? 1024 : 512;
    if (!f.step_tokens_idle) f.step_tokens_idle = on_gpu && info->pass_rows > f.step_tokens ? info->pass_rows : f.step_tokens;
    if (!f.prefill_chunk) f.prefill_chunk = on_gpu ? 256 : 128;
    sched_opts so = {.max_batch = max_batch, .max_queue = f.max_queue, .step_tokens = f.step_tokens,
                     .step_tokens_idle = f.step_tokens_idle, .prefill_chunk = f.prefill_chunk,
                     .chunks_per_step = on_gpu ? 0 : 1, .max_pending = 4u << 20,
                     .prefix_cache_bytes = f.prefix_cache ? (size_t)f.prefix_cache_bytes : 0,
                     .prefix_grid = f.prefix_grid,
                     .overlap = f.step_overlap >= 0 ? f.step_overlap : info->async_step};
    log_prefix_cache(info, &so);
    if (sched_start(&s, e, tok, &so, err, sizeof err)) {
        srv_log(SRV_LOG_ERROR, "scheduler: %s", err);
        goto out;
    }
    http_set_ready(h, &ctx, s);
    srv_log(SRV_LOG_INFO,
            "ready: model \"%s\", max batch %d, queue %d, step budget %d tokens (%d with nothing decoding, "
            "chunks of %d), steps %s, API key %s, %d HTTP threads, up to %d connections (%d per client), request timeout "
            "%.0fs, request bodies in flight up to %.0f MiB (%.0f MiB per client), responses up to %.0f MiB",
            name, max_batch, f.max_queue, f.step_tokens, f.step_tokens_idle, f.prefill_chunk,
            so.overlap ? "overlapped" : "in turn", key ? "required" : "off",
            f.http_threads, ho.max_connections, ho.max_per_client, ho.request_timeout_s,
            (double)ho.body_budget / 1048576.0, (double)ho.body_budget_per_client / 1048576.0,
            (double)f.max_response / 1048576.0);

    int sig;
    while (!(sig = wait_signal(&sigs, 3600))) {}
    srv_log(SRV_LOG_INFO, "%s: draining (grace %.0fs, %d sequences pending)", sig == SIGINT ? "SIGINT" : "SIGTERM",
            f.grace_s, sched_pending(s));
    sched_close_admission(s);
    http_drain(h);
    double deadline = srv_now() + f.grace_s;
    while (sched_pending(s) > 0 && srv_now() < deadline) {
        if (wait_signal(&sigs, 0.05)) {
            srv_log(SRV_LOG_WARN, "second signal: not waiting for the grace period");
            break;
        }
    }
    if (sched_pending(s) > 0) {
        srv_log(SRV_LOG_WARN, "aborting %d sequences still pending", sched_pending(s));
        sched_cancel_all(s);
    }
    /* Let aborted and finished responses reach their clients before the
     * daemon goes; a client that does not read is cut off after 2 s. */
    deadline = srv_now() + 2;
    while (http_jobs(h) > 0 && srv_now() < deadline) wait_signal(&sigs, 0.01);
    rc = 0;
out:
    http_stop(h);        /* first: no HTTP thread may touch the scheduler after this */
    sched_stop(s);
    api_ctx_free(&ctx);
    if (e) kda_engine_close(e);
    if (tok) tok_close(tok);
    free(key);
    if (rc == 0) srv_log(SRV_LOG_INFO, "bye");
    return rc;
}

/*
 * prefix_cache.h - kda-server's prefix cache index: which token prefixes
 * have an engine snapshot (engine.h, "prefix snapshots"), found by longest
 * match, kept under a byte budget by evicting least-recently-used leaves.
 *
 * A radix tree over token ids: each node is an edge of tokens ending at
 * depth tokens from the root, and may hold the snapshot of exactly those
 * depth tokens. Along every path the tree also keeps what an echo request
 * returns for each prompt position (the log-prob of the token, and the best
 * alternatives at the position before it), so a cached prefix can serve
 * echo/logprobs requests without recomputing them. On the CPU these numbers
 * are bitwise those the position gets from scratch (step boundaries never
 * change them), so it does not matter which request recorded them.
 *
 * Everything is addressed by tokens, never by node: any node may be evicted
 * between two calls, and a later call simply finds less (or re-creates the
 * path). Policy (which prefixes to snapshot, when to trim) is the scheduler's.
 * Scheduler thread only; nothing is locked.
 */
#ifndef SRV_PREFIX_CACHE_H
#define SRV_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define PC_MAX_TOP 20 /* alternatives kept per position (the API's logprobs limit) */

typedef struct {
    size_t budget;                      /* bytes: engine snapshot memory + this index */
    void *arg;
    void (*drop)(void *arg, int snap);  /* gives an engine snapshot back (kda_snapshot_drop) */
    size_t (*engine_bytes)(void *arg);  /* what the snapshots hold in the engine (kda_usage.cache_bytes) */
} pc_opts;

typedef struct pc_cache pc_cache;

pc_cache *pc_new(const pc_opts *o);
void pc_free(pc_cache *c); /* drops every snapshot */

typedef struct {
    int len;     /* tokens of the snapshot found, 0 = none */
    int snap;    /* its engine id, -1 = none */
    int shared;  /* longest prefix of the tokens that any stored path has */
    int echo_ok; /* rows 0..echo_ok-1 have known outputs (lookups with n_top >= 0) */
} pc_match;

/* The longest snapshot that is a prefix of tokens[0..n) and at most max_len
 * tokens long. n_top >= 0: the caller echoes every prompt row with n_top
 * alternatives, so only snapshots whose rows all have known outputs count
 * (len <= echo_ok). Touches the matched path (LRU). */
pc_match pc_lookup(pc_cache *c, const int32_t *tokens, int n, int max_len, int n_top);
/* The known outputs of rows 0..m-1 (m <= echo_ok of a lookup just made with
 * n_top): lps[q] = log p(tokens[q + 1] | tokens[0..q]), alternatives of row
 * q at top_ids/top_lps[q * n_top] (NULL when n_top is 0). */
void pc_echo_read(pc_cache *c, const int32_t *tokens, int m, int n_top, float *lps, int32_t *top_ids,
                  float *top_lps);
/* Records the path tokens[0..n) (touching it); -1: out of memory. */
int pc_insert(pc_cache *c, const int32_t *tokens, int n);
/* Puts snapshot snap of tokens[0..n) into the tree. If that prefix has one
 * already, snap is dropped instead. -1: out of memory (snap dropped). */
int pc_store(pc_cache *c, const int32_t *tokens, int n, int snap);
/* Records rows [r0, r1) of the prompt tokens[0..n): row q's log-prob of
 * tokens[q + 1] at lps[q - r0] and its n_top alternatives at
 * top_ids/top_lps[(q - r0) * n_top]; rows with q + 1 >= n are skipped, and
 * so are rows recorded before with more alternatives. n_top <= PC_MAX_TOP.
 * -1: out of memory. */
int pc_echo_write(pc_cache *c, const int32_t *tokens, int n, int r0, int r1, const float *lps, int n_top,
                  const int32_t *top_ids, const float *top_lps);
/* Evicts the least recently used leaf (dropping its snapshot); 0 when the
 * tree is empty. */
int pc_evict_one(pc_cache *c);
/* Evicts while the engine's snapshot memory plus the index exceed the budget. */
void pc_trim(pc_cache *c);

typedef struct {
    int snaps, nodes;
    size_t index_bytes;       /* tokens and echo outputs kept by the tree */
    unsigned long evictions;  /* leaves evicted */
} pc_stats;
void pc_get_stats(const pc_cache *c, pc_stats *s);

#endif

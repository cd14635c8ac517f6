/*
 * prefix_cache.c - the prefix cache index (see prefix_cache.h).
 *
 * Layout: a node owns an edge of len tokens at absolute positions
 * [depth - len, depth) and, per token, the outputs of the row before it:
 * at position q, lp[q] = log p(token q | tokens before it) and the best
 * alternatives of row q - 1 (ntop[q] of them; -1 = not recorded). These are
 * a function of the path up to and including token q, so they sit on it.
 * All nodes are also on one list, which eviction scans for the least
 * recently used leaf (nodes number in the thousands; evictions happen at
 * admission rate). Ancestors are touched whenever a descendant is, so
 * evicting leaves first is LRU over the whole tree.
 */
#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>

typedef struct pc_node pc_node;
struct pc_node {
    pc_node *parent, *child, *sibling; /* first child, next sibling */
    pc_node *prev, *next;              /* the list of all nodes */
    int32_t *tok;                      /* [len] */
    float *lp;                         /* [len] */
    int8_t *ntop;                      /* [len], -1 = no outputs recorded for this position */
    int32_t *top_id;                   /* [len * PC_MAX_TOP] or NULL until alternatives are recorded */
    float *top_lp;                     /* [len * PC_MAX_TOP] */
    int len, depth;
    int snap;                          /* engine snapshot of the first depth tokens, -1 = none */
    uint64_t used;                     /* LRU stamp */
};

struct pc_cache {
    pc_opts o;
    pc_node root;                      /* depth 0, no tokens, never evicted */
    pc_node *all;                      /* list head (root excluded) */
    uint64_t clock;
    int n_nodes, n_snaps;
    size_t bytes;
    unsigned long evictions;
};

static size_t node_bytes(const pc_node *n)
{
    size_t b = sizeof *n + (size_t)n->len * (sizeof *n->tok + sizeof *n->lp + sizeof *n->ntop);
    if (n->top_id) b += (size_t)n->len * PC_MAX_TOP * (sizeof *n->top_id + sizeof *n->top_lp);
    return b;
}

static void list_add(pc_cache *c, pc_node *n)
{
    n->prev = NULL;
    n->next = c->all;
    if (c->all) c->all->prev = n;
    c->all = n;
    c->n_nodes++;
}

static void list_del(pc_cache *c, pc_node *n)
{
    if (n->prev) n->prev->next = n->next;
    else c->all = n->next;
    if (n->next) n->next->prev = n->prev;
    c->n_nodes--;
}

static void node_free_arrays(pc_node *n)
{
    free(n->tok), free(n->lp), free(n->ntop), free(n->top_id), free(n->top_lp);
}

/* A node for tokens [0, len) with no outputs recorded; NULL when out of memory. */
static pc_node *node_new(const int32_t *tokens, int len)
{
    pc_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->tok = malloc((size_t)len * sizeof *n->tok);
    n->lp = malloc((size_t)len * sizeof *n->lp);
    n->ntop = malloc((size_t)len * sizeof *n->ntop);
    if (!n->tok || !n->lp || !n->ntop) {
        node_free_arrays(n);
        free(n);
        return NULL;
    }
    memcpy(n->tok, tokens, (size_t)len * sizeof *n->tok);
    memset(n->ntop, -1, (size_t)len);
    n->len = len;
    n->snap = -1;
    return n;
}

/* the per-position alternatives arrays, allocated when first needed */
static int alloc_tops(pc_node *n)
{
    if (n->top_id) return 0;
    n->top_id = malloc((size_t)n->len * PC_MAX_TOP * sizeof *n->top_id);
    n->top_lp = malloc((size_t)n->len * PC_MAX_TOP * sizeof *n->top_lp);
    if (!n->top_id || !n->top_lp) {
        free(n->top_id), free(n->top_lp);
        n->top_id = NULL, n->top_lp = NULL;
        return -1;
    }
    return 0;
}

static void child_add(pc_node *parent, pc_node *n)
{
    n->parent = parent;
    n->sibling = parent->child;
    parent->child = n;
}

static void child_del(pc_node *parent, pc_node *n)
{
    pc_node **pp = &parent->child;
    while (*pp != n) pp = &(*pp)->sibling;
    *pp = n->sibling;
}

static pc_node *child_with(const pc_node *n, int32_t first)
{
    for (pc_node *k = n->child; k; k = k->sibling)
        if (k->tok[0] == first) return k;
    return NULL;
}

/* Splits n after its first k tokens (0 < k < len): a new node takes them
 * (and their outputs) and becomes n's parent. Returns it, NULL when out of memory. */
static pc_node *split(pc_cache *c, pc_node *n, int k)
{
    pc_node *head = node_new(n->tok, k);
    pc_node *tail = node_new(n->tok + k, n->len - k);
    if (!head || !tail || (n->top_id && (alloc_tops(head) || alloc_tops(tail)))) {
        if (head) node_free_arrays(head), free(head);
        if (tail) node_free_arrays(tail), free(tail);
        return NULL;
    }
    const size_t before = node_bytes(n);
    memcpy(head->lp, n->lp, (size_t)k * sizeof *n->lp);
    memcpy(tail->lp, n->lp + k, (size_t)(n->len - k) * sizeof *n->lp);
    memcpy(head->ntop, n->ntop, (size_t)k);
    memcpy(tail->ntop, n->ntop + k, (size_t)(n->len - k));
    if (n->top_id) {
        const size_t per = PC_MAX_TOP;
        memcpy(head->top_id, n->top_id, (size_t)k * per * sizeof *n->top_id);
        memcpy(head->top_lp, n->top_lp, (size_t)k * per * sizeof *n->top_lp);
        memcpy(tail->top_id, n->top_id + k * per, (size_t)(n->len - k) * per * sizeof *n->top_id);
        memcpy(tail->top_lp, n->top_lp + k * per, (size_t)(n->len - k) * per * sizeof *n->top_lp);
    }
    /* n keeps its identity (children, snapshot, place in the lists) with the tail's arrays */
    node_free_arrays(n);
    n->tok = tail->tok, n->lp = tail->lp, n->ntop = tail->ntop, n->top_id = tail->top_id, n->top_lp = tail->top_lp;
    n->len = tail->len;
    free(tail);
    pc_node *parent = n->parent;
    child_del(parent, n);
    head->depth = n->depth - n->len;
    head->used = n->used;
    child_add(parent, head);
    child_add(head, n);
    list_add(c, head);
    c->bytes += node_bytes(head) + node_bytes(n) - before;
    return head;
}

/* Follows tokens[0..n) from the root. create: the path is completed (edges
 * split or added) so that a node ends exactly at n; -1 when out of memory.
 * Every node passed is touched. Returns the node ending at `matched` when
 * one does (always with create), else NULL. */
static pc_node *walk(pc_cache *c, const int32_t *tokens, int n, int create, int *matched, int *rc)
{
    const uint64_t now = ++c->clock;
    pc_node *at = &c->root;
    int pos = 0;
    *rc = 0;
    while (pos < n) {
        pc_node *k = child_with(at, tokens[pos]);
        if (!k) {
            if (!create) break;
            pc_node *leaf = node_new(tokens + pos, n - pos);
            if (!leaf) { *rc = -1; break; }
            leaf->depth = n;
            leaf->used = now;
            child_add(at, leaf);
            list_add(c, leaf);
            c->bytes += node_bytes(leaf);
            at = leaf;
            pos = n;
            break;
        }
        int m = 0;
        while (m < k->len && pos + m < n && k->tok[m] == tokens[pos + m]) m++;
        if (m < k->len) {
            if (!create) { pos += m; at = NULL; break; }
            pc_node *head = split(c, k, m);
            if (!head) { *rc = -1; break; }
            k = head;
        }
        k->used = now;
        at = k;
        pos += k->len;
    }
    *matched = pos;
    return at;
}

pc_cache *pc_new(const pc_opts *o)
{
    pc_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->o = *o;
    c->root.snap = -1;
    return c;
}

static void drop_snap(pc_cache *c, pc_node *n)
{
    if (n->snap < 0) return;
    if (c->o.drop) c->o.drop(c->o.arg, n->snap);
    n->snap = -1;
    c->n_snaps--;
}

void pc_free(pc_cache *c)
{
    if (!c) return;
    for (pc_node *n = c->all, *nx; n; n = nx) {
        nx = n->next;
        drop_snap(c, n);
        node_free_arrays(n);
        free(n);
    }
    free(c);
}

/* output of position q (>= 1) of a matched path, known with at least n_top alternatives */
static int known(const pc_node *n, int i, int n_top) { return n->ntop[i] >= 0 && n->ntop[i] >= n_top; }

pc_match pc_lookup(pc_cache *c, const int32_t *tokens, int n, int max_len, int n_top)
{
    pc_match m = {.len = 0, .snap = -1, .shared = 0, .echo_ok = 0};
    const uint64_t now = ++c->clock;
    /* first pass: how far the path matches and how many rows have known outputs */
    pc_node *at = &c->root;
    int pos = 0, echo_run = n_top >= 0;
    while (pos < n) {
        pc_node *k = child_with(at, tokens[pos]);
        if (!k) break;
        int i = 0;
        for (; i < k->len && pos + i < n && k->tok[i] == tokens[pos + i]; i++) {
            const int q = pos + i;
            if (q == 0 || !echo_run) continue;
            if (known(k, i, n_top)) m.echo_ok = q; /* rows 0..q-1 known */
            else echo_run = 0;
        }
        k->used = now;
        pos += i;
        if (i < k->len) break;
        at = k;
    }
    m.shared = pos;
    /* second pass: the deepest snapshot within the limits (a snapshot of d
     * tokens needs rows 0..d-1, the last of which sits on the next edge) */
    const int limit = n_top >= 0 && m.echo_ok < max_len ? m.echo_ok : max_len;
    at = &c->root;
    pos = 0;
    while (pos < m.shared) {
        pc_node *k = child_with(at, tokens[pos]);
        if (!k || pos + k->len > m.shared || k->depth > limit) break;
        if (k->snap >= 0) m.len = k->depth, m.snap = k->snap;
        pos += k->len;
        at = k;
    }
    return m;
}

void pc_echo_read(pc_cache *c, const int32_t *tokens, int m, int n_top, float *lps, int32_t *top_ids,
                  float *top_lps)
{
    pc_node *at = &c->root;
    int pos = 0;
    while (pos <= m) { /* rows 0..m-1 are at positions 1..m */
        pc_node *k = child_with(at, tokens[pos]);
        if (!k) return;
        for (int i = 0; i < k->len && pos + i <= m && k->tok[i] == tokens[pos + i]; i++) {
            const int q = pos + i;
            if (q == 0) continue;
            lps[q - 1] = k->lp[i];
            if (n_top > 0 && k->top_id) {
                memcpy(top_ids + (size_t)(q - 1) * n_top, k->top_id + (size_t)i * PC_MAX_TOP, (size_t)n_top * sizeof *top_ids);
                memcpy(top_lps + (size_t)(q - 1) * n_top, k->top_lp + (size_t)i * PC_MAX_TOP, (size_t)n_top * sizeof *top_lps);
            }
        }
        pos += k->len;
        at = k;
    }
}

int pc_insert(pc_cache *c, const int32_t *tokens, int n)
{
    int matched, rc;
    walk(c, tokens, n, 1, &matched, &rc);
    return rc;
}

int pc_store(pc_cache *c, const int32_t *tokens, int n, int snap)
{
    int matched, rc;
    pc_node *at = walk(c, tokens, n, 1, &matched, &rc);
    if (rc || !at || at == &c->root || at->depth != n) {
        if (c->o.drop) c->o.drop(c->o.arg, snap);
        return -1;
    }
    if (at->snap >= 0) { /* the same prefix is cached already */
        if (c->o.drop) c->o.drop(c->o.arg, snap);
        return 0;
    }
    at->snap = snap;
    c->n_snaps++;
    return 0;
}

int pc_echo_write(pc_cache *c, const int32_t *tokens, int n, int r0, int r1, const float *lps, int n_top,
                  const int32_t *top_ids, const float *top_lps)
{
    if (r1 > n - 1) r1 = n - 1;
    if (r0 >= r1) return 0;
    int matched, rc;
    walk(c, tokens, r1 + 1, 1, &matched, &rc); /* the path through position r1 */
    if (rc) return -1;
    pc_node *at = &c->root;
    int pos = 0;
    while (pos <= r1) {
        pc_node *k = child_with(at, tokens[pos]);
        if (!k) return -1;
        for (int i = 0; i < k->len && pos + i <= r1; i++) {
            const int q = pos + i, row = q - 1;
            if (row < r0 || k->ntop[i] > n_top) continue; /* keep a record with more alternatives */
            if (n_top > 0 && !k->top_id) {
                const size_t before = node_bytes(k);
                if (alloc_tops(k)) return -1;
                c->bytes += node_bytes(k) - before;
            }
            k->lp[i] = lps[row - r0];
            k->ntop[i] = (int8_t)n_top;
            if (n_top > 0) {
                memcpy(k->top_id + (size_t)i * PC_MAX_TOP, top_ids + (size_t)(row - r0) * n_top, (size_t)n_top * sizeof *top_ids);
                memcpy(k->top_lp + (size_t)i * PC_MAX_TOP, top_lps + (size_t)(row - r0) * n_top, (size_t)n_top * sizeof *top_lps);
            }
        }
        pos += k->len;
        at = k;
    }
    return 0;
}

int pc_evict_one(pc_cache *c)
{
    pc_node *lru = NULL;
    for (pc_node *n = c->all; n; n = n->next)
        if (!n->child && (!lru || n->used < lru->used)) lru = n;
    if (!lru) return 0;
    drop_snap(c, lru);
    child_del(lru->parent, lru);
    list_del(c, lru);
    c->bytes -= node_bytes(lru);
    node_free_arrays(lru);
    free(lru);
    c->evictions++;
    return 1;
}

void pc_trim(pc_cache *c)
{
    while (c->all && (c->o.engine_bytes ? c->o.engine_bytes(c->o.arg) : 0) + c->bytes > c->o.budget)
        if (!pc_evict_one(c)) break;
}

void pc_get_stats(const pc_cache *c, pc_stats *s)
{
    *s = (pc_stats){.snaps = c->n_snaps, .nodes = c->n_nodes, .index_bytes = c->bytes, .evictions = c->evictions};
}

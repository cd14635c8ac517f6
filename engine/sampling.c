/*
 * sampling.c - the CPU sampler; semantics in engine.h (kda_sampling).
 *
 * No allocation and no sort of the vocabulary per token: the caller's
 * workspace (sampling_work_bytes, zeroed once) holds the working logits and
 * the candidate list, and the top-k, top-p and the draw are selections in key
 * order (value descending, id ascending on ties) done by partitioning, O(vocab)
 * on average. The kept sets and the drawn token are those of a full sort; only
 * the order in which probabilities are summed differs from one, which moves
 * sums by rounding alone (the GPU sampler sums in yet another order and the
 * test that compares them draws identical tokens).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"

typedef struct {
    float v;       /* logit / temperature */
    float p;       /* probability once computed */
    int32_t id;
} cand;

/* key order: larger value first, lower id first on ties (all keys distinct) */
static inline int key_gt(const cand *a, const cand *b) { return a->v > b->v || (a->v == b->v && a->id < b->id); }

/* workspace: logits copy, candidates, per-id counts, per-id marks. The counts
 * and marks are zero on entry and are put back to zero before returning. */
typedef struct {
    float *l;
    cand *c;
    int32_t *count;
    unsigned char *seen;
} work_view;

static work_view work_carve(void *w, int vocab)
{
    work_view v;
    char *p = w;
    v.l = (float *)p, p += (size_t)vocab * sizeof(float);
    v.c = (cand *)p, p += (size_t)vocab * sizeof(cand);
    v.count = (int32_t *)p, p += (size_t)vocab * sizeof(int32_t);
    v.seen = (unsigned char *)p;
    return v;
}

size_t sampling_work_bytes(int vocab)
{
    return (size_t)vocab * (sizeof(float) + sizeof(cand) + sizeof(int32_t) + 1) + 8;
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i; /* strict: lowest id wins ties */
    return best;
}

static void apply_penalties(float *l, int vocab, const kda_sampling *s, const int32_t *hist, int n_hist,
                            work_view *w)
{
    const int n_prompt = s->n_prompt < n_hist ? s->n_prompt : n_hist;
    if (s->repetition_penalty != 1.0f && s->repetition_penalty > 0.0f) {
        for (int i = 0; i < n_hist; i++) { /* once per distinct id of prompt + generated */
            const int32_t t = hist[i];
            if (t < 0 || t >= vocab || w->seen[t]) continue;
            w->seen[t] = 1;
            l[t] = l[t] > 0 ? l[t] / s->repetition_penalty : l[t] * s->repetition_penalty;
        }
        for (int i = 0; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < vocab) w->seen[hist[i]] = 0;
    }
    if (s->presence_penalty != 0.0f || s->frequency_penalty != 0.0f) {
        for (int i = n_prompt; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < vocab) w->count[hist[i]]++;
        for (int i = n_prompt; i < n_hist; i++) {
            const int32_t t = hist[i];
            if (t < 0 || t >= vocab || !w->count[t]) continue;
            l[t] -= s->presence_penalty + s->frequency_penalty * (float)w->count[t];
            w->count[t] = 0; /* applied once per id; also restores the zeroed workspace */
        }
    }
}

static void swap_cand(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Partitions c[lo, hi) around a pivot: on return c[lo, g) hold the keys
 * greater than the pivot, c[g] the pivot, c[g+1, hi) the rest. Returns g and
 * the probability mass of c[lo, g) in *mass (when mass != NULL). */
static int partition(cand *c, int lo, int hi, double *mass)
{
    const int mid = lo + (hi - lo) / 2;
    /* median of three as the pivot, moved to hi - 1 */
    int a = lo, b = mid, d = hi - 1;
    if (key_gt(&c[b], &c[a])) { int t = a; a = b; b = t; }
    if (key_gt(&c[d], &c[a])) { int t = a; a = d; d = t; }
    if (key_gt(&c[d], &c[b])) { int t = b; b = d; d = t; }
    swap_cand(&c[b], &c[hi - 1]);
    const cand pv = c[hi - 1];
    int g = lo;
    double m = 0.0;
    for (int i = lo; i < hi - 1; i++)
        if (key_gt(&c[i], &pv)) {
            if (mass) m += c[i].p;
            swap_cand(&c[i], &c[g++]);
        }
    swap_cand(&c[g], &c[hi - 1]);
    if (mass) *mass = m;
    return g;
}

/* Rearranges c[0, n) so that c[0, k) are the k greatest keys (any order). */
static void select_top_k(cand *c, int n, int k)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        const int g = partition(c, lo, hi, NULL);
        if (g == k || g + 1 == k) return;
        if (g > k) hi = g;
        else lo = g + 1;
    }
}

/* The smallest m such that the m greatest keys of c[0, n) carry mass >= target
 * (strict: > target). Rearranges c so that c[0, m) are those keys and c[m-1]
 * the smallest of them. Returns 0 when the whole set does not reach target. */
static int weighted_prefix(cand *c, int n, double target, int strict)
{
    int lo = 0, hi = n;
    double acc = 0.0; /* mass of c[0, lo): keys above everything in [lo, hi) */
    while (lo < hi) {
        double mg = 0.0;
        const int g = partition(c, lo, hi, &mg);
        const double with_g = acc + mg, with_pivot = with_g + c[g].p;
        if (strict ? with_g > target : with_g >= target) {
            hi = g;
        } else if (strict ? with_pivot > target : with_pivot >= target) {
            return g + 1;
        } else {
            acc = with_pivot;
            lo = g + 1;
        }
    }
    return 0;
}

int32_t sampling_draw(const float *logits, int vocab, const kda_sampling *s, const int32_t *hist, int n_hist,
                      void *work)
{
    work_view w = work_carve(work, vocab);
    float *l = w.l;
    memcpy(l, logits, (size_t)vocab * sizeof(float));
    for (int i = 0; i < s->n_logit_bias; i++) {
        const int32_t id = s->logit_bias[i].id;
        if (id >= 0 && id < vocab) l[id] += s->logit_bias[i].bias;
    }
    apply_penalties(l, vocab, s, hist, n_hist, &w);
    if (!(s->temperature > 0.0f)) return argmax(l, vocab);

    cand *c = w.c;
    for (int i = 0; i < vocab; i++) c[i] = (cand){.v = l[i] / s->temperature, .p = 0.0f, .id = i};
    int n = vocab;
    if (s->top_k > 0 && s->top_k < n) {
        select_top_k(c, n, s->top_k);
        n = s->top_k;
    }
    /* softmax over the kept candidates, relative to the best one */
    int top = 0;
    for (int i = 1; i < n; i++)
        if (key_gt(&c[i], &c[top])) top = i;
    const float v0 = c[top].v;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        c[i].p = (float)exp((double)(c[i].v - v0));
        sum += c[i].p;
    }
    for (int i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        const int m = weighted_prefix(c, n, (double)s->top_p, 0);
        if (m > 0) n = m; /* rounding left the total below top_p: keep everything */
    }
    if (s->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < n; i++) pmax = c[i].p > pmax ? c[i].p : pmax;
        const float thr = s->min_p * pmax;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (c[i].p >= thr) c[k++] = c[i];
        n = k;
    }
    double tot = 0.0;
    for (int i = 0; i < n; i++) tot += c[i].p;
    const uint64_t counter = (uint64_t)(n_hist > s->n_prompt ? n_hist - s->n_prompt : 0);
    const double u = kda_rng_uniform(s->seed, counter) * tot;
    const int m = weighted_prefix(c, n, u, 1);
    if (m > 0) return c[m - 1].id;
    /* rounding: u reached the total; the last kept element in key order */
    int last = 0;
    for (int i = 1; i < n; i++)
        if (key_gt(&c[last], &c[i])) last = i;
    return c[last].id;
}

void sampling_top_n(const float *logits, int vocab, float lse, int n, int32_t *ids, float *lps)
{
    if (n <= 0) return;
    if (n > vocab) n = vocab;
    /* one pass keeping the n best in order (n <= KDA_MAX_TOP is small) */
    int k = 0;
    for (int v = 0; v < vocab; v++) {
        const float x = logits[v];
        if (k == n && !(x > logits[ids[n - 1]])) continue; /* ties keep the lower id */
        int j = k < n ? k++ : n - 1;
        while (j > 0 && logits[ids[j - 1]] < x) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
    for (int i = 0; i < n; i++) lps[i] = logits[ids[i]] - lse;
}

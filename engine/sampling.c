/*
 * sampling.c - the CPU sampler; semantics in engine.h (kda_sampling).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i; /* strict: lowest id wins ties */
    return best;
}

typedef struct {
    float v;
    int32_t id;
} cand;

static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void apply_penalties(float *l, int vocab, const kda_sampling *s)
{
    if (s->repetition_penalty != 1.0f && s->repetition_penalty > 0.0f) {
        /* once per distinct token in prompt + generated: mark by sign trick on a copy is
         * overkill; penalise idempotently by tracking which ids were seen */
        unsigned char *seen = calloc((size_t)vocab, 1);
        const int32_t *lists[2] = {s->prompt_tokens, s->gen_tokens};
        int lens[2] = {s->n_prompt, s->n_gen};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < lens[k]; i++) {
                int32_t t = lists[k][i];
                if (t < 0 || t >= vocab || (seen && seen[t])) continue;
                if (seen) seen[t] = 1;
                l[t] = l[t] > 0 ? l[t] / s->repetition_penalty : l[t] * s->repetition_penalty;
            }
        free(seen);
    }
    if (s->presence_penalty != 0.0f || s->frequency_penalty != 0.0f) {
        int *count = calloc((size_t)vocab, sizeof(int));
        if (count) {
            for (int i = 0; i < s->n_gen; i++)
                if (s->gen_tokens[i] >= 0 && s->gen_tokens[i] < vocab) count[s->gen_tokens[i]]++;
            for (int t = 0; t < vocab; t++)
                if (count[t]) l[t] -= s->presence_penalty + s->frequency_penalty * (float)count[t];
            free(count);
        }
    }
}

int32_t sampling_draw(const float *logits, int vocab, const kda_sampling *s, float *work)
{
    float *l = work;
    memcpy(l, logits, (size_t)vocab * sizeof(float));
    apply_penalties(l, vocab, s);
    if (!(s->temperature > 0.0f)) return argmax(l, vocab);

    cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c) return argmax(l, vocab);
    for (int i = 0; i < vocab; i++) {
        c[i].v = l[i] / s->temperature;
        c[i].id = i;
    }
    qsort(c, (size_t)vocab, sizeof *c, cand_desc);
    int n = vocab;
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    /* softmax over the kept candidates */
    double sum = 0.0;
    float *p = work + vocab;
    for (int i = 0; i < n; i++) {
        p[i] = (float)exp((double)(c[i].v - c[0].v));
        sum += p[i];
    }
    for (int i = 0; i < n; i++) p[i] = (float)(p[i] / sum);
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
        double cum = 0.0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += p[i];
            if (cum >= s->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->min_p > 0.0f) {
        float thr = s->min_p * p[0];
        int keep = 1;
        while (keep < n && p[keep] >= thr) keep++;
        n = keep;
    }
    double tot = 0.0;
    for (int i = 0; i < n; i++) tot += p[i];
    double u = kda_rng_uniform(s->seed, (uint64_t)s->n_gen) * tot, acc = 0.0;
    int32_t tok = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += p[i];
        if (u < acc) {
            tok = c[i].id;
            break;
        }
    }
    free(c);
    return tok;
}

void sampling_top_n(const float *logits, int vocab, float lse, int n, int32_t *ids, float *lps)
{
    if (n <= 0) return;
    if (n > vocab) n = vocab;
    /* partial selection: n is small (<= 20) */
    for (int k = 0; k < n; k++) {
        int32_t best = -1;
        for (int i = 0; i < vocab; i++) {
            int taken = 0;
            for (int j = 0; j < k; j++)
                if (ids[j] == i) {
                    taken = 1;
                    break;
                }
            if (taken) continue;
            if (best < 0 || logits[i] > logits[best]) best = i;
        }
        ids[k] = best;
        lps[k] = logits[best] - lse;
    }
}

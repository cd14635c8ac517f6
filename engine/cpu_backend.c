/*
 * cpu_backend.c - the CPU reference backend: fp32 math straight from the
 * mmapped weights, with the exact per-token KDA recurrence for every token.
 *
 * Invariant: a sequence's numbers do not depend on how its tokens are split
 * into steps. Every per-token operation (projections, norms, conv, the KDA
 * step, attention over positions 0..p, the lm-head) computes each element by
 * the same code whatever the step's length, so feeding 1000 tokens at once, in
 * chunks, or after restoring a prefix snapshot gives bit-identical logits.
 * The prefix cache's exactness rests on this. (The chunked WY form,
 * kda_chunked_f32, stays in cpu_ops.c as the oracle of a chunked GPU kernel:
 * its rounding depends on where chunks start, and it is 2.5-4x slower here:
 * 58 vs 15 us per token and head at K = V = 64, 133 vs 53 at 128.)
 *
 * One step = one forward pass over the tokens of every item, concatenated
 * into N rows: the projections run as one matmul over all N rows (each weight
 * row converted once), the per-sequence parts (conv tails, recurrent state,
 * KV cache, attention) run per item. Every output element is computed by the
 * same code whatever else is in the batch, so a batched step is bit-identical
 * to running each sequence alone.
 *
 * Memory: a slot's state is allocated the first time the slot is used and
 * kept for reuse (KDA state H*K*V floats per KDA layer, conv tails, KV cache
 * for max_seq_len positions per GQA layer). Step scratch grows to the largest
 * step seen and is reused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_ops.h"
#include "model.h"
#include "sampling.h"

#define LOGIT_ROWS 32       /* logits computed this many rows at a time */
/* Below this many multiply-adds a loop runs on one thread: waking the team
 * costs more than the work (tiny models, single decode tokens). */
#define PAR_MIN_WORK (1 << 16)

typedef struct {
    float *S;      /* [n_kda][HV][K][V] recurrent state */
    float *tail;   /* [n_kda][P][HK + HK + HV*V] conv history, oldest first (P = 0 without conv) */
    float *kc, *vc;/* [n_gqa][cap][Hkv*hd] keys after norm+RoPE, values */
    int ready;
    /* the snapshot whose rows this slot's first rows are (restored from it or
     * taken from it), valid while that snapshot's gen is base_gen; -1 none */
    int base_snap;
    unsigned base_gen;
} cpu_slot;

/* KV rows [base, end) of a snapshotted prefix; the rows below base are the
 * parent's, so snapshots along one conversation share their common rows. */
typedef struct kv_seg kv_seg;
struct kv_seg {
    kv_seg *parent;
    int refs;      /* snapshots using it as their last segment + child segments */
    int base, end;
    float *kv;     /* [n_gqa][2][end - base][Hkv*hd]: keys then values per GQA layer */
};

typedef struct {
    float *state;  /* S then tails, as in cpu_slot (allocated on first use) */
    kv_seg *seg;   /* its rows end here */
    unsigned gen;  /* bumped at every take and drop */
    int live;
} cpu_snap;

/* Small per-layer vectors, converted to fp32 once (NULL when the config has no such tensor). */
typedef struct {
    float *attn_norm, *mlp_norm;       /* [D] */
    float *q_conv, *k_conv, *v_conv;   /* [C][taps] */
    float *q_conv_b, *k_conv_b, *v_conv_b; /* [C] */
    float *A_log, *dt_bias;            /* [HV], [HV*K] */
    float *g1_bias, *o_norm;           /* [HV*V], [V] */
    float *q_norm, *k_norm;            /* [hd] */
    float *q_bias, *k_bias, *v_bias, *o_bias; /* [Hq*hd], [Hkv*hd], [Hkv*hd], [D] */
    float *gate_bias, *up_bias, *down_bias;   /* [F], [F], [D] */
    float *ar_attn_q, *ar_attn_w, *ar_mlp_q, *ar_mlp_w; /* attnres [D] each */
} layer_vecs;

typedef struct {
    backend base;
    const model_config *c;
    const model_weights *w;
    int max_seqs, cap, threads;
    int n_kda, n_gqa;
    int kda_idx[KDA_MAX_LAYERS], gqa_idx[KDA_MAX_LAYERS];
    layer_vecs *vec;
    float *final_norm;
    float *ar_final_q, *ar_final_w;    /* attnres before the final norm, [D] */
    int ar_sources;                    /* attnres: most residual sources a row holds */
    cpu_slot *slots;
    /* step scratch: grows to the largest step seen (a step's rows are not
     * bounded by anything the backend knows) and is reused; offsets and the
     * sampler's workspace are sized at create */
    float *scratch;
    size_t scratch_floats;
    int *off;               /* [max_seqs + 1] row offset of each item */
    cpu_snap *snaps;        /* [n_snaps] prefix snapshots */
    int n_snaps;
    size_t cache_bytes;     /* snapshot states and segments allocated */
    void *sample_work;      /* sampling_work_bytes(vocab), zeroed once */
    /* tuning cpu_bf16_act=1: round activations to bf16 where the CUDA backend
     * stores them in bf16 (GEMM inputs after RMSNorm, KDA/GQA mixer outputs, the
     * MLP gate|up outputs when the model has no MLP biases,
     * the SwiGLU product, K/V cache entries). Tests use it to tell how much
     * of a CUDA-vs-CPU difference bf16 storage alone causes. */
    int bf16_act;
} cpu_backend;

/* x[i] = bf16(x[i]) when the backend emulates bf16 activation storage */
static void act_round(const cpu_backend *b, float *x, size_t n)
{
    if (!b->bf16_act) return;
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

static float *vec_dup(const tensor_view *t)
{
    if (!t->data) return NULL;
    size_t n = (size_t)(t->rows * t->cols);
    float *v = malloc(n * sizeof(float));
    if (!v) return NULL;
    for (int64_t r = 0; r < t->rows; r++) tv_row_f32(t, r, v + (size_t)r * t->cols);
    return v;
}

static size_t slot_state_floats(const cpu_backend *b) { return (size_t)b->n_kda * model_kda_layer_state_floats(b->c); }
static size_t slot_tail_floats(const cpu_backend *b) { return (size_t)b->n_kda * model_kda_layer_tail_floats(b->c); }
static size_t slot_kv_floats(const cpu_backend *b)
{
    const model_config *c = b->c;
    return (size_t)b->n_gqa * b->cap * c->gqa_kvh * c->gqa_hd;
}

static int cpu_seq_reset(backend *bb, int slot, char *err, size_t errlen)
{
    cpu_backend *b = (cpu_backend *)bb;
    cpu_slot *s = &b->slots[slot];
    if (!s->ready) {
        s->S = malloc(slot_state_floats(b) * sizeof(float) + 1);
        s->tail = malloc(slot_tail_floats(b) * sizeof(float) + 1);
        s->kc = malloc(slot_kv_floats(b) * sizeof(float) + 1);
        s->vc = malloc(slot_kv_floats(b) * sizeof(float) + 1);
        if (!s->S || !s->tail || !s->kc || !s->vc) {
            free(s->S), free(s->tail), free(s->kc), free(s->vc);
            memset(s, 0, sizeof *s);
            snprintf(err, errlen, "out of host memory for a sequence's state (%zu MiB)",
                     (slot_state_floats(b) + slot_tail_floats(b) + 2 * slot_kv_floats(b)) * 4 >> 20);
            return KDA_ENOMEM;
        }
        s->ready = 1;
    }
    memset(s->S, 0, slot_state_floats(b) * sizeof(float));
    memset(s->tail, 0, slot_tail_floats(b) * sizeof(float));
    s->base_snap = -1;
    return 0;
}

/* ---- prefix snapshots (engine.h) ---- */

static size_t kv_row_floats(const cpu_backend *b) { return (size_t)b->c->gqa_kvh * b->c->gqa_hd; }

static size_t seg_bytes(const cpu_backend *b, const kv_seg *g)
{
    return sizeof *g + (size_t)b->n_gqa * 2 * (size_t)(g->end - g->base) * kv_row_floats(b) * sizeof(float);
}

static void seg_unref(cpu_backend *b, kv_seg *g)
{
    while (g && --g->refs == 0) {
        kv_seg *parent = g->parent;
        b->cache_bytes -= seg_bytes(b, g);
        free(g->kv);
        free(g);
        g = parent;
    }
}

/* rows [base, end) of every GQA layer between a slot's cache and a segment */
static void seg_rows(const cpu_backend *b, const kv_seg *g, cpu_slot *s, int to_slot)
{
    const size_t KD = kv_row_floats(b), n = (size_t)(g->end - g->base) * KD;
    for (int l = 0; l < b->n_gqa; l++) {
        float *kc = s->kc + ((size_t)l * b->cap + g->base) * KD, *vc = s->vc + ((size_t)l * b->cap + g->base) * KD;
        float *gk = g->kv + (size_t)l * 2 * n, *gv = gk + n;
        if (to_slot) {
            memcpy(kc, gk, n * sizeof(float));
            memcpy(vc, gv, n * sizeof(float));
        } else {
            memcpy(gk, kc, n * sizeof(float));
            memcpy(gv, vc, n * sizeof(float));
        }
    }
}

static int cpu_snap_take(backend *bb, int slot, int n_tokens, int snap, char *err, size_t errlen)
{
    cpu_backend *b = (cpu_backend *)bb;
    cpu_slot *s = &b->slots[slot];
    cpu_snap *sn = &b->snaps[snap];
    const size_t sf = slot_state_floats(b), tf = slot_tail_floats(b);
    if (!sn->state && !(sn->state = malloc((sf + tf) * sizeof(float) + 1))) goto oom;
    /* the rows this slot shares with the snapshot it continues need no copy */
    kv_seg *parent = s->base_snap >= 0 && b->snaps[s->base_snap].live && b->snaps[s->base_snap].gen == s->base_gen
                         ? b->snaps[s->base_snap].seg : NULL;
    kv_seg *g = parent;
    if (!parent || parent->end < n_tokens) {
        if (!(g = calloc(1, sizeof *g))) goto oom;
        g->base = parent ? parent->end : 0;
        g->end = n_tokens;
        const size_t floats = (size_t)b->n_gqa * 2 * (size_t)(g->end - g->base) * kv_row_floats(b);
        if (!(g->kv = malloc(floats * sizeof(float) + 1))) {
            free(g);
            goto oom;
        }
        seg_rows(b, g, s, 0);
        g->parent = parent;
        if (parent) parent->refs++;
        b->cache_bytes += seg_bytes(b, g);
    }
    g->refs++;
    memcpy(sn->state, s->S, sf * sizeof(float));
    memcpy(sn->state + sf, s->tail, tf * sizeof(float));
    sn->seg = g;
    sn->live = 1;
    sn->gen++;
    b->cache_bytes += (sf + tf) * sizeof(float);
    s->base_snap = snap;
    s->base_gen = sn->gen;
    return 0;
oom:
    snprintf(err, errlen, "out of host memory for a snapshot of %d tokens", n_tokens);
    return KDA_ENOMEM;
}

static int cpu_snap_restore(backend *bb, int snap, int slot, int n_tokens, const int32_t *hist, char *err,
                            size_t errlen)
{
    (void)n_tokens, (void)hist, (void)err, (void)errlen;
    cpu_backend *b = (cpu_backend *)bb;
    cpu_slot *s = &b->slots[slot];
    cpu_snap *sn = &b->snaps[snap];
    const size_t sf = slot_state_floats(b), tf = slot_tail_floats(b);
    memcpy(s->S, sn->state, sf * sizeof(float));
    memcpy(s->tail, sn->state + sf, tf * sizeof(float));
    for (const kv_seg *g = sn->seg; g; g = g->parent) seg_rows(b, g, s, 1);
    s->base_snap = snap;
    s->base_gen = sn->gen;
    return 0;
}

static void cpu_snap_drop(backend *bb, int snap)
{
    cpu_backend *b = (cpu_backend *)bb;
    cpu_snap *sn = &b->snaps[snap];
    seg_unref(b, sn->seg);
    sn->seg = NULL;
    sn->live = 0;
    sn->gen++;
    b->cache_bytes -= (slot_state_floats(b) + slot_tail_floats(b)) * sizeof(float);
}

static size_t cpu_cache_bytes(const backend *bb) { return ((const cpu_backend *)bb)->cache_bytes; }

static float *scratch_get(cpu_backend *b, size_t floats)
{
    if (floats > b->scratch_floats) {
        free(b->scratch);
        b->scratch = malloc(floats * sizeof(float));
        b->scratch_floats = b->scratch ? floats : 0;
    }
    return b->scratch;
}

/* y[t][r] += bias[r] for N rows of width R (bias may be NULL) */
static void add_bias(float *y, const float *bias, int N, int R)
{
    if (!bias) return;
    for (int t = 0; t < N; t++)
        for (int r = 0; r < R; r++) y[(size_t)t * R + r] += bias[r];
}

/* ---- one KDA layer over all N rows ----
 * H q/k heads, HV value heads: value head j reads q/k head j / (HV / H)
 * (fla GVA); its gate, beta, state and output are its own. */
static void kda_layer_forward(cpu_backend *b, int li, const step_item *items, int n, const int *off,
                              int N, const float *a, float *x, float *buf)
{
    const model_config *c = b->c;
    const kda_layer *L = &b->w->layers[li].kda;
    const layer_vecs *lv = &b->vec[li];
    const int D = c->d, H = c->kda_h, HV = c->kda_hv, K = c->kda_k, V = c->kda_v;
    const int HK = H * K, HVK = HV * K, HVV = HV * V, group = HV / H;
    const int P = model_conv_history(c), kl = b->kda_idx[li];
    float *qr = buf, *kr = qr + (size_t)N * HK, *vr = kr + (size_t)N * HK;
    float *q = vr + (size_t)N * HVV, *k = q + (size_t)N * HK, *v = k + (size_t)N * HK;
    float *low = v + (size_t)N * HVV;       /* [N, V] bottleneck */
    float *gk = low + (size_t)N * V;        /* [N, HV*K] */
    float *bt = gk + (size_t)N * HVK;       /* [N, HV] */
    float *G = bt + (size_t)N * HV;         /* [N, HV*V] */
    float *o = G + (size_t)N * HVV;         /* [N, HV*V] */
    float *out = o + (size_t)N * HVV;       /* [N, D] */

    matmul_tv(qr, a, &L->q, N);
    matmul_tv(kr, a, &L->k, N);
    matmul_tv(vr, a, &L->v, N);
    matmul_tv(low, a, &L->f0, N);
    matmul_tv(gk, low, &L->f1, N);          /* graw, gated in place below */
    matmul_tv(bt, a, &L->b, N);
    matmul_tv(low, a, &L->g0, N);
    matmul_tv(G, low, &L->g1, N);

    const int par = (long)N * HVK * 16 >= PAR_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int t = 0; t < N; t++) {
        float *g = gk + (size_t)t * HVK;
        if (c->gate == KDA_GATE_LOWER_BOUND)
            kda_gate_lb_f32(g, g, lv->A_log, lv->dt_bias, HV, K, c->gate_lower_bound);
        else
            kda_gate_f32(g, g, lv->A_log, lv->dt_bias, HV, K);
        for (int h = 0; h < HV; h++) bt[(size_t)t * HV + h] = c->beta_scale * sigmoid_f32(bt[(size_t)t * HV + h]);
        for (int j = 0; j < HVV; j++) G[(size_t)t * HVV + j] += lv->g1_bias[j];
    }

    if (c->short_conv) {
        /* short conv per sequence (its tail continues from the previous step) */
        for (int i = 0; i < n; i++) {
            cpu_slot *s = &b->slots[items[i].slot];
            float *tail = s->tail + (size_t)kl * P * (2 * HK + HVV);
            const int T = items[i].it->n_tokens;
            const size_t r0 = (size_t)off[i];
            short_conv_bias_f32(q + r0 * HK, qr + r0 * HK, T, HK, lv->q_conv, lv->q_conv_b, c->conv_size, tail);
            short_conv_bias_f32(k + r0 * HK, kr + r0 * HK, T, HK, lv->k_conv, lv->k_conv_b, c->conv_size,
                                tail + (size_t)P * HK);
            short_conv_bias_f32(v + r0 * HVV, vr + r0 * HVV, T, HVV, lv->v_conv, lv->v_conv_b, c->conv_size,
                                tail + (size_t)2 * P * HK);
        }
    } else { /* fla use_short_conv false: q, k, v = silu(projection) */
        for (size_t i = 0; i < (size_t)N * HK; i++) q[i] = silu_f32(qr[i]), k[i] = silu_f32(kr[i]);
        for (size_t i = 0; i < (size_t)N * HVV; i++) v[i] = silu_f32(vr[i]);
    }

    const float qscale = 1.0f / sqrtf((float)K);
#pragma omp parallel for schedule(static) if (par)
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            float *qh = q + (size_t)t * HK + (size_t)h * K;
            l2norm_f32(qh, K);
            for (int d = 0; d < K; d++) qh[d] *= qscale;
            l2norm_f32(k + (size_t)t * HK + (size_t)h * K, K);
        }

    /* recurrence: independent per (sequence, value head) */
#pragma omp parallel for schedule(dynamic) if ((long)N * HV * K * V * 4 >= PAR_MIN_WORK)
    for (int ih = 0; ih < n * HV; ih++) {
        const int i = ih / HV, h = ih % HV, hq = h / group;
        const int T = items[i].it->n_tokens;
        const size_t r0 = (size_t)off[i];
        float *S = b->slots[items[i].slot].S + ((size_t)kl * HV + h) * K * V;
        const float *qh = q + r0 * HK + (size_t)hq * K, *kh = k + r0 * HK + (size_t)hq * K;
        const float *gh = gk + r0 * HVK + (size_t)h * K, *vh = v + r0 * HVV + (size_t)h * V;
        float *oh = o + r0 * HVV + (size_t)h * V;
        kda_recurrent_strided_f32(S, qh, kh, vh, gh, bt + r0 * HV + h, oh, T, K, V, HK, HVK, HVV, HV, HVV);
    }

    /* gated output norm: RMSNorm(o_h) * sigmoid(G_h) */
#pragma omp parallel for schedule(static) if (par)
    for (int t = 0; t < N; t++)
        for (int h = 0; h < HV; h++) {
            float *oh = o + (size_t)t * HVV + (size_t)h * V;
            const float *gh = G + (size_t)t * HVV + (size_t)h * V;
            rmsnorm_f32(oh, oh, lv->o_norm, V, c->norm_eps);
            for (int j = 0; j < V; j++) oh[j] *= sigmoid_f32(gh[j]);
        }
    act_round(b, o, (size_t)N * HVV);
    matmul_tv(out, o, &L->o, N);
    for (size_t i = 0; i < (size_t)N * D; i++) x[i] += out[i];
}

/* ---- one GQA layer over all N rows ---- */
static void gqa_layer_forward(cpu_backend *b, int li, const step_item *items, int n, const int *off,
                              int N, const float *a, float *x, float *buf)
{
    const model_config *c = b->c;
    const gqa_layer *L = &b->w->layers[li].gqa;
    const layer_vecs *lv = &b->vec[li];
    const int D = c->d, Hq = c->gqa_h, Hkv = c->gqa_kvh, hd = c->gqa_hd;
    const int QD = Hq * hd, KD = Hkv * hd, gl = b->gqa_idx[li];
    float *q = buf, *k = q + (size_t)N * QD, *v = k + (size_t)N * KD, *g = v + (size_t)N * KD;
    float *o = g + (size_t)N * QD, *out = o + (size_t)N * QD;

    matmul_tv(q, a, &L->q, N);
    matmul_tv(k, a, &L->k, N);
    matmul_tv(v, a, &L->v, N);
    add_bias(q, lv->q_bias, N, QD);
    add_bias(k, lv->k_bias, N, KD);
    add_bias(v, lv->v_bias, N, KD);
    if (c->output_gate) matmul_tv(g, a, &L->gate, N);

    for (int i = 0; i < n; i++) {
        cpu_slot *s = &b->slots[items[i].slot];
        float *kc = s->kc + (size_t)gl * b->cap * KD, *vc = s->vc + (size_t)gl * b->cap * KD;
        const int T = items[i].it->n_tokens, pos0 = items[i].pos;
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)off[i] + t;
            float *qt = q + r * QD, *kt = k + r * KD;
            if (c->qk_norm) {
                for (int h = 0; h < Hq; h++) rmsnorm_f32(qt + h * hd, qt + h * hd, lv->q_norm, hd, c->qk_norm_eps);
                for (int h = 0; h < Hkv; h++) rmsnorm_f32(kt + h * hd, kt + h * hd, lv->k_norm, hd, c->qk_norm_eps);
            }
            rope_freq(qt, Hq, hd, c->rope_dim, pos0 + t, c->rope_inv_freq);
            rope_freq(kt, Hkv, hd, c->rope_dim, pos0 + t, c->rope_inv_freq);
            act_round(b, kt, (size_t)KD);
            act_round(b, v + r * KD, (size_t)KD);
            memcpy(kc + (size_t)(pos0 + t) * KD, kt, (size_t)KD * sizeof(float));
            memcpy(vc + (size_t)(pos0 + t) * KD, v + r * KD, (size_t)KD * sizeof(float));
        }
    }
#pragma omp parallel for schedule(dynamic) if (n > 1 && (long)N * (items[0].pos + N) * Hq * hd >= PAR_MIN_WORK)
    for (int i = 0; i < n; i++) {
        cpu_slot *s = &b->slots[items[i].slot];
        const size_t r0 = (size_t)off[i];
        gqa_attention_window_f32(o + r0 * QD, q + r0 * QD, s->kc + (size_t)gl * b->cap * KD,
                                 s->vc + (size_t)gl * b->cap * KD, items[i].it->n_tokens, items[i].pos, Hq, Hkv, hd,
                                 c->window);
    }
    if (c->output_gate)
        for (size_t i = 0; i < (size_t)N * QD; i++) o[i] *= sigmoid_f32(g[i]);
    act_round(b, o, (size_t)N * QD);
    matmul_tv(out, o, &L->o, N);
    add_bias(out, lv->o_bias, N, D);
    for (size_t i = 0; i < (size_t)N * D; i++) x[i] += out[i];
}

/* x += MLP(m). normed: the MLP's input m [N, D] when the caller computed it
 * (attnres), else NULL: m = RMSNorm(x; mlp_norm). */
static void mlp_forward(cpu_backend *b, int li, int N, const float *normed, float *x, float *buf)
{
    const model_config *c = b->c;
    const mlp *M = &b->w->layers[li].mlp;
    const layer_vecs *lv = &b->vec[li];
    const int D = c->d, F = c->ffn;
    float *m = buf, *gt = m + (size_t)N * D, *up = gt + (size_t)N * F, *out = up + (size_t)N * F;
    if (normed) {
        memcpy(m, normed, (size_t)N * D * sizeof(float));
    } else {
        for (int t = 0; t < N; t++)
            rmsnorm_f32(m + (size_t)t * D, x + (size_t)t * D, lv->mlp_norm, D, c->norm_eps);
    }
    act_round(b, m, (size_t)N * D);
    matmul_tv(gt, m, &M->gate, N);
    matmul_tv(up, m, &M->up, N);
    add_bias(gt, lv->gate_bias, N, F);
    add_bias(up, lv->up_bias, N, F);
    if (!lv->gate_bias && !lv->up_bias) { /* the CUDA backend's bf16 gate|up (tuning gu_bf16) */
        act_round(b, gt, (size_t)N * F);
        act_round(b, up, (size_t)N * F);
    }
    for (size_t i = 0; i < (size_t)N * F; i++) gt[i] = silu_f32(gt[i]) * up[i];
    act_round(b, gt, (size_t)N * F);
    matmul_tv(out, gt, &M->down, N);
    add_bias(out, lv->down_bias, N, D);
    for (size_t i = 0; i < (size_t)N * D; i++) x[i] += out[i];
}

/* Floats of scratch one layer needs for N rows (max over layer kinds). */
static size_t layer_scratch(const model_config *c, int N)
{
    size_t HK = (size_t)c->kda_h * c->kda_k, HVK = (size_t)c->kda_hv * c->kda_k, HVV = (size_t)c->kda_hv * c->kda_v;
    size_t kda = (size_t)N * (4 * HK + 4 * HVV + c->kda_v + HVK + c->kda_hv + c->d);
    size_t QD = (size_t)c->gqa_h * c->gqa_hd, KD = (size_t)c->gqa_kvh * c->gqa_hd;
    size_t gqa = (size_t)N * (3 * QD + 2 * KD + c->d);
    size_t mlp = (size_t)N * (2 * (size_t)c->d + 2 * (size_t)c->ffn);
    size_t m = kda > gqa ? kda : gqa;
    return m > mlp ? m : mlp;
}

/* ---- fla attention residuals (KDAModel with attnres_block_size) ----
 * Each sub-layer's input is RMSNorm(attnres(residual sources); its norm
 * weight) instead of RMSNorm(h): the sources are the completed block sums
 * (the embedding first) and the running partial sum, which x holds. Sub-layer
 * s (2i attention, 2i+1 MLP) that starts a new block (s % block == 0) moves
 * the partial sum into the sources first, and the partial sum restarts from
 * zero. Layer 0's attention sees the embedding alone, where the softmax over
 * one source is 1: plain RMSNorm, as fla special-cases it. The final norm
 * reads attnres over the sources and the last partial sum. Per row, no state
 * across tokens. */

/* a[t] = RMSNorm(attnres(states[0..ns) ++ [x]); out_w) for all N rows */
static void attnres_input(const cpu_backend *b, int N, const float *x, const float *states, int ns,
                          const float *query, const float *key_w, const float *out_w, float *a)
{
    const int D = b->c->d;
    const float *src[KDA_ATTNRES_MAX_SOURCES];
    for (int t = 0; t < N; t++) {
        for (int l = 0; l < ns; l++) src[l] = states + ((size_t)l * N + t) * D;
        src[ns] = x + (size_t)t * D;
        float *at = a + (size_t)t * D;
        attnres_mix_f32(at, src, ns + 1, query, key_w, D, b->c->norm_eps);
        rmsnorm_f32(at, at, out_w, D, b->c->norm_eps);
    }
}

/* Sub-layer s starts a new block: the partial sum x becomes a source, x restarts at 0. */
static void attnres_boundary(const cpu_backend *b, int s, int N, float *x, float *states, int *ns)
{
    if (s % b->c->attnres_block) return;
    const size_t rows = (size_t)N * b->c->d;
    memcpy(states + (size_t)(*ns)++ * rows, x, rows * sizeof(float));
    memset(x, 0, rows * sizeof(float));
}

static void attnres_layers(cpu_backend *b, const step_item *items, int n, const int *off, int N, float *x, float *a,
                           float *states, float *buf)
{
    const model_config *c = b->c;
    int ns = 0;
    for (int li = 0; li < c->n_layers; li++) {
        const layer_vecs *lv = &b->vec[li];
        /* the sources include x as it is before a boundary moves it: compute first */
        attnres_input(b, N, x, states, ns, lv->ar_attn_q, lv->ar_attn_w, lv->attn_norm, a);
        attnres_boundary(b, 2 * li, N, x, states, &ns);
        if (c->kind[li] == KDA_LAYER_KDA)
            kda_layer_forward(b, li, items, n, off, N, a, x, buf);
        else
            gqa_layer_forward(b, li, items, n, off, N, a, x, buf);
        attnres_input(b, N, x, states, ns, lv->ar_mlp_q, lv->ar_mlp_w, lv->mlp_norm, a);
        attnres_boundary(b, 2 * li + 1, N, x, states, &ns);
        mlp_forward(b, li, N, a, x, buf);
    }
    /* the final mix replaces x; the output rows then apply the final norm */
    const float *src[KDA_ATTNRES_MAX_SOURCES];
    for (int t = 0; t < N; t++) {
        for (int l = 0; l < ns; l++) src[l] = states + ((size_t)l * N + t) * c->d;
        src[ns] = x + (size_t)t * c->d;
        attnres_mix_f32(a + (size_t)t * c->d, src, ns + 1, b->ar_final_q, b->ar_final_w, c->d, c->norm_eps);
    }
    memcpy(x, a, (size_t)N * c->d * sizeof(float));
}

/* Writes the requested outputs of one row's logits. */
static void emit_row(cpu_backend *b, const step_item *si, int t, const float *logits)
{
    const kda_batch_item *it = si->it;
    const int vocab = b->c->vocab, last = t == it->n_tokens - 1;
    float lse = logsumexp_f32(logits, vocab);
    if (it->logits && (it->want_all_logits || last))
        memcpy(it->logits + (it->want_all_logits ? (size_t)t * vocab : 0), logits, (size_t)vocab * sizeof(float));
    if (it->targets && it->target_logprobs) {
        int32_t tg = it->targets[t];
        it->target_logprobs[t] = tg >= 0 ? logits[tg] - lse : 0.0f;
    }
    if (it->n_top > 0 && it->pos_top_ids && it->pos_top_logprobs)
        sampling_top_n(logits, vocab, lse, it->n_top, it->pos_top_ids + (size_t)t * it->n_top,
                       it->pos_top_logprobs + (size_t)t * it->n_top);
    if (last && it->sampling) {
        int32_t tok = sampling_draw(logits, vocab, it->sampling, si->hist, si->pos + it->n_tokens, b->sample_work);
        if (it->sampled) *it->sampled = tok;
        if (it->sampled_logprob) *it->sampled_logprob = logits[tok] - lse;
        if (it->n_top > 0 && it->top_ids && it->top_logprobs)
            sampling_top_n(logits, vocab, lse, it->n_top, it->top_ids, it->top_logprobs);
    }
}

/* Rows of an item whose logits are needed: all of them for per-position
 * outputs, else the last one when it samples or returns logits. */
static int first_out_row(const kda_batch_item *it)
{
    const int all = it->want_all_logits || (it->targets && it->target_logprobs) ||
                    (it->n_top > 0 && it->pos_top_ids && it->pos_top_logprobs);
    if (all) return 0;
    return it->logits || it->sampling ? it->n_tokens - 1 : it->n_tokens;
}

static int cpu_step(backend *bb, const step_item *items, int n, char *err, size_t errlen)
{
    cpu_backend *b = (cpu_backend *)bb;
    const model_config *c = b->c;
    const int D = c->d, vocab = c->vocab;
#ifdef _OPENMP
    /* per calling thread: the server steps from its scheduler thread, not the opener */
    omp_set_num_threads(b->threads);
#endif
    int *off = b->off;
    int N = 0;
    for (int i = 0; i < n; i++) {
        off[i] = N;
        N += items[i].it->n_tokens;
    }
    off[n] = N;
    const size_t ar_floats = (size_t)b->ar_sources * N * D; /* attnres block sums */
    size_t need = (size_t)2 * N * D + ar_floats + layer_scratch(c, N) + (size_t)LOGIT_ROWS * (D + vocab);
    float *x = scratch_get(b, need);
    if (!x) goto oom;
    float *a = x + (size_t)N * D, *states = a + (size_t)N * D, *buf = states + ar_floats;

    for (int i = 0; i < n; i++)
        for (int t = 0; t < items[i].it->n_tokens; t++)
            tv_row_f32(&b->w->embed, items[i].it->tokens[t], x + (size_t)(off[i] + t) * D);

    if (c->attnres_block) {
        attnres_layers(b, items, n, off, N, x, a, states, buf);
    } else {
        for (int li = 0; li < c->n_layers; li++) {
            const float *wn = b->vec[li].attn_norm;
            for (int t = 0; t < N; t++) rmsnorm_f32(a + (size_t)t * D, x + (size_t)t * D, wn, D, c->norm_eps);
            act_round(b, a, (size_t)N * D);
            if (c->kind[li] == KDA_LAYER_KDA)
                kda_layer_forward(b, li, items, n, off, N, a, x, buf);
            else
                gqa_layer_forward(b, li, items, n, off, N, a, x, buf);
            mlp_forward(b, li, N, NULL, x, buf);
        }
    }

    /* Output rows: all rows of items that want per-position outputs, else the last. */
    float *hn = buf, *lg = hn + (size_t)LOGIT_ROWS * D;
    for (int i = 0; i < n; i++) {
        const kda_batch_item *it = items[i].it;
        for (int t = first_out_row(it); t < it->n_tokens; t += LOGIT_ROWS) {
            int rows = it->n_tokens - t < LOGIT_ROWS ? it->n_tokens - t : LOGIT_ROWS;
            for (int r = 0; r < rows; r++)
                rmsnorm_f32(hn + (size_t)r * D, x + (size_t)(off[i] + t + r) * D, b->final_norm, D, c->norm_eps);
            act_round(b, hn, (size_t)rows * D);
            matmul_tv(lg, hn, &b->w->lm_head, rows);
            for (int r = 0; r < rows; r++) emit_row(b, &items[i], t + r, lg + (size_t)r * vocab);
        }
    }
    return 0;
oom:
    snprintf(err, errlen, "out of host memory for a step of %d rows", N);
    return KDA_ENOMEM;
}

static void cpu_destroy(backend *bb)
{
    cpu_backend *b = (cpu_backend *)bb;
    if (!b) return;
    for (int i = 0; b->slots && i < b->max_seqs; i++) {
        free(b->slots[i].S), free(b->slots[i].tail), free(b->slots[i].kc), free(b->slots[i].vc);
    }
    if (b->vec)
        for (int l = 0; l < b->c->n_layers; l++) {
            layer_vecs *v = &b->vec[l];
            free(v->attn_norm), free(v->mlp_norm), free(v->q_conv), free(v->k_conv), free(v->v_conv);
            free(v->q_conv_b), free(v->k_conv_b), free(v->v_conv_b);
            free(v->A_log), free(v->dt_bias), free(v->g1_bias), free(v->o_norm), free(v->q_norm), free(v->k_norm);
            free(v->q_bias), free(v->k_bias), free(v->v_bias), free(v->o_bias);
            free(v->gate_bias), free(v->up_bias), free(v->down_bias);
            free(v->ar_attn_q), free(v->ar_attn_w), free(v->ar_mlp_q), free(v->ar_mlp_w);
        }
    for (int i = 0; b->snaps && i < b->n_snaps; i++) {
        if (b->snaps[i].live) seg_unref(b, b->snaps[i].seg);
        free(b->snaps[i].state);
    }
    free(b->snaps);
    free(b->vec);
    free(b->final_norm);
    free(b->ar_final_q), free(b->ar_final_w);
    free(b->slots);
    free(b->scratch);
    free(b->off);
    free(b->sample_work);
    free(b);
}

int cpu_backend_create(backend **out, const backend_params *p, char *err, size_t errlen)
{
    if (p->tuning.kda_state_bf16) { /* the reference keeps what it computes */
        snprintf(err, errlen, "the CPU backend keeps the KDA state in fp32 (--kda-state-dtype bf16 is a CUDA option)");
        return KDA_EUNSUP;
    }
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) goto oom;
    b->base.device_name = "cpu";
    b->base.seq_reset = cpu_seq_reset;
    b->base.step = cpu_step;
    b->base.destroy = cpu_destroy;
    b->c = p->cfg;
    b->w = p->w;
    b->max_seqs = p->max_seqs;
    b->cap = p->max_seq_len;
    b->bf16_act = p->tuning.cpu_bf16_act;
#ifdef _OPENMP
    b->threads = p->threads > 0 ? p->threads : omp_get_num_procs();
#endif
    const model_config *c = p->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        b->kda_idx[l] = c->kind[l] == KDA_LAYER_KDA ? b->n_kda++ : -1;
        b->gqa_idx[l] = c->kind[l] == KDA_LAYER_GQA ? b->n_gqa++ : -1;
    }
    /* slots are allocated on first use; these are the totals at max_seqs */
    b->base.kv_pool_bytes = (size_t)b->max_seqs * 2 * slot_kv_floats(b) * sizeof(float);
    b->base.state_pool_bytes = (size_t)b->max_seqs * (slot_state_floats(b) + slot_tail_floats(b)) * sizeof(float);
    b->base.max_full_context_seqs = b->max_seqs;
    if (p->max_snaps > 0) {
        b->snaps = calloc((size_t)p->max_snaps, sizeof *b->snaps);
        if (!b->snaps) goto oom;
        b->n_snaps = p->max_snaps;
        b->base.n_snaps = p->max_snaps;
        b->base.snap_state_bytes = (slot_state_floats(b) + slot_tail_floats(b)) * sizeof(float);
        b->base.snap_take = cpu_snap_take;
        b->base.snap_restore = cpu_snap_restore;
        b->base.snap_drop = cpu_snap_drop;
        b->base.cache_bytes = cpu_cache_bytes;
    }
    b->slots = calloc((size_t)b->max_seqs, sizeof *b->slots);
    b->vec = calloc((size_t)c->n_layers, sizeof *b->vec);
    b->final_norm = vec_dup(&p->w->final_norm);
    b->off = malloc((size_t)(b->max_seqs + 1) * sizeof *b->off);
    b->sample_work = calloc(1, sampling_work_bytes(c->vocab));
    if (!b->slots || !b->vec || !b->final_norm || !b->off || !b->sample_work) goto oom;
    /* every tensor the binding found, as fp32; a bound tensor that is not
     * copied is out of memory (DUP fails only then: absent stays NULL) */
#define DUP(dst, t) do { if ((t).data && !((dst) = vec_dup(&(t)))) goto oom; } while (0)
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *L = &p->w->layers[l];
        layer_vecs *v = &b->vec[l];
        DUP(v->attn_norm, L->attn_norm);
        DUP(v->mlp_norm, L->mlp_norm);
        DUP(v->gate_bias, L->mlp.gate_bias);
        DUP(v->up_bias, L->mlp.up_bias);
        DUP(v->down_bias, L->mlp.down_bias);
        DUP(v->ar_attn_q, L->attn_res.query);
        DUP(v->ar_attn_w, L->attn_res.norm);
        DUP(v->ar_mlp_q, L->mlp_res.query);
        DUP(v->ar_mlp_w, L->mlp_res.norm);
        if (L->kind == KDA_LAYER_KDA) {
            const kda_layer *k = &L->kda;
            DUP(v->q_conv, k->q_conv);
            DUP(v->k_conv, k->k_conv);
            DUP(v->v_conv, k->v_conv);
            DUP(v->q_conv_b, k->q_conv_bias);
            DUP(v->k_conv_b, k->k_conv_bias);
            DUP(v->v_conv_b, k->v_conv_bias);
            DUP(v->A_log, k->A_log);
            DUP(v->dt_bias, k->dt_bias);
            DUP(v->g1_bias, k->g1_bias);
            DUP(v->o_norm, k->o_norm);
        } else {
            const gqa_layer *g = &L->gqa;
            DUP(v->q_norm, g->q_norm);
            DUP(v->k_norm, g->k_norm);
            DUP(v->q_bias, g->q_bias);
            DUP(v->k_bias, g->k_bias);
            DUP(v->v_bias, g->v_bias);
            DUP(v->o_bias, g->o_bias);
        }
    }
    DUP(b->ar_final_q, p->w->res.query);
    DUP(b->ar_final_w, p->w->res.norm);
#undef DUP
    if (c->attnres_block) b->ar_sources = (2 * c->n_layers - 1) / c->attnres_block + 1;
    *out = &b->base;
    return 0;
oom:
    cpu_destroy(b ? &b->base : NULL);
    snprintf(err, errlen, "out of host memory creating the CPU backend");
    return KDA_ENOMEM;
}

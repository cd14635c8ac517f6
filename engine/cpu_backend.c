/*
 * cpu_backend.c - the CPU reference backend: fp32 math straight from the
 * mmapped weights, exact per-token KDA recurrence for short inputs and the
 * chunked form for long ones (the same function; tests/engine shows it).
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

#define KDA_CHUNK 64        /* chunked form above this many tokens per call (as fla does) */
#define LOGIT_ROWS 32       /* logits computed this many rows at a time */
/* Below this many multiply-adds a loop runs on one thread: waking the team
 * costs more than the work (tiny models, single decode tokens). */
#define PAR_MIN_WORK (1 << 16)

typedef struct {
    float *S;      /* [n_kda][H][K][V] recurrent state */
    float *tail;   /* [n_kda][P][HK + HK + HV] conv history, oldest first */
    float *kc, *vc;/* [n_gqa][cap][Hkv*hd] keys after norm+RoPE, values */
    int ready;
} cpu_slot;

/* Small per-layer vectors, converted to fp32 once. */
typedef struct {
    float *attn_norm, *mlp_norm;       /* [D] */
    float *q_conv, *k_conv, *v_conv;   /* [C][taps] */
    float *A_log, *dt_bias;            /* [H], [HK] */
    float *g1_bias, *o_norm;           /* [HV], [V] */
    float *q_norm, *k_norm;            /* [hd] */
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
    cpu_slot *slots;
    /* step scratch: grows to the largest step seen (a step's rows are not
     * bounded by anything the backend knows) and is reused; offsets and the
     * sampler's workspace are sized at create */
    float *scratch;
    size_t scratch_floats;
    int *off;               /* [max_seqs + 1] row offset of each item */
    void *sample_work;      /* sampling_work_bytes(vocab), zeroed once */
    /* tuning cpu_bf16_act=1: round activations to bf16 where the CUDA backend
     * stores them in bf16 (GEMM inputs after RMSNorm, KDA/GQA mixer outputs,
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
    return 0;
}

static float *scratch_get(cpu_backend *b, size_t floats)
{
    if (floats > b->scratch_floats) {
        free(b->scratch);
        b->scratch = malloc(floats * sizeof(float));
        b->scratch_floats = b->scratch ? floats : 0;
    }
    return b->scratch;
}

/* ---- one KDA layer over all N rows ---- */
static void kda_layer_forward(cpu_backend *b, int li, const step_item *items, int n, const int *off,
                              int N, const float *a, float *x, float *buf)
{
    const model_config *c = b->c;
    const kda_layer *L = &b->w->layers[li].kda;
    const layer_vecs *lv = &b->vec[li];
    const int D = c->d, H = c->kda_h, K = c->kda_k, V = c->kda_v, HK = H * K, HV = H * V;
    const int P = c->conv_size - 1, kl = b->kda_idx[li];
    float *qr = buf, *kr = qr + (size_t)N * HK, *vr = kr + (size_t)N * HK;
    float *q = vr + (size_t)N * HV, *k = q + (size_t)N * HK, *v = k + (size_t)N * HK;
    float *low = v + (size_t)N * HV;        /* [N, V] bottleneck */
    float *gk = low + (size_t)N * V;        /* [N, HK] */
    float *bt = gk + (size_t)N * HK;        /* [N, H] */
    float *G = bt + (size_t)N * H;          /* [N, HV] */
    float *o = G + (size_t)N * HV;          /* [N, HV] */
    float *out = o + (size_t)N * HV;        /* [N, D] */

    matmul_tv(qr, a, &L->q, N);
    matmul_tv(kr, a, &L->k, N);
    matmul_tv(vr, a, &L->v, N);
    matmul_tv(low, a, &L->f0, N);
    matmul_tv(gk, low, &L->f1, N);          /* graw, gated in place below */
    matmul_tv(bt, a, &L->b, N);
    matmul_tv(low, a, &L->g0, N);
    matmul_tv(G, low, &L->g1, N);

    const int par = (long)N * HK * 16 >= PAR_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int t = 0; t < N; t++) {
        kda_gate_f32(gk + (size_t)t * HK, gk + (size_t)t * HK, lv->A_log, lv->dt_bias, H, K);
        for (int h = 0; h < H; h++) bt[(size_t)t * H + h] = sigmoid_f32(bt[(size_t)t * H + h]);
        for (int j = 0; j < HV; j++) G[(size_t)t * HV + j] += lv->g1_bias[j];
    }

    /* short conv per sequence (its tail continues from the previous step) */
    for (int i = 0; i < n; i++) {
        cpu_slot *s = &b->slots[items[i].slot];
        float *tail = s->tail + (size_t)kl * P * (2 * HK + HV);
        const int T = items[i].it->n_tokens;
        const size_t r0 = (size_t)off[i];
        short_conv_f32(q + r0 * HK, qr + r0 * HK, T, HK, lv->q_conv, c->conv_size, tail);
        short_conv_f32(k + r0 * HK, kr + r0 * HK, T, HK, lv->k_conv, c->conv_size, tail + (size_t)P * HK);
        short_conv_f32(v + r0 * HV, vr + r0 * HV, T, HV, lv->v_conv, c->conv_size, tail + (size_t)2 * P * HK);
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

    /* recurrence: independent per (sequence, head) */
#pragma omp parallel for schedule(dynamic) if ((long)N * H * K * V * 4 >= PAR_MIN_WORK)
    for (int ih = 0; ih < n * H; ih++) {
        const int i = ih / H, h = ih % H;
        const int T = items[i].it->n_tokens;
        const size_t r0 = (size_t)off[i];
        float *S = b->slots[items[i].slot].S + ((size_t)kl * H + h) * K * V;
        const float *qh = q + r0 * HK + (size_t)h * K, *kh = k + r0 * HK + (size_t)h * K;
        const float *gh = gk + r0 * HK + (size_t)h * K, *vh = v + r0 * HV + (size_t)h * V;
        float *oh = o + r0 * HV + (size_t)h * V;
        if (T > KDA_CHUNK)
            kda_chunked_f32(S, qh, kh, vh, gh, bt + r0 * H + h, oh, T, K, V, HK, HV, H, HV, KDA_CHUNK);
        else
            kda_recurrent_f32(S, qh, kh, vh, gh, bt + r0 * H + h, oh, T, K, V, HK, HV, H, HV);
    }

    /* gated output norm: RMSNorm(o_h) * sigmoid(G_h) */
#pragma omp parallel for schedule(static) if (par)
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            float *oh = o + (size_t)t * HV + (size_t)h * V;
            const float *gh = G + (size_t)t * HV + (size_t)h * V;
            rmsnorm_f32(oh, oh, lv->o_norm, V, c->norm_eps);
            for (int j = 0; j < V; j++) oh[j] *= sigmoid_f32(gh[j]);
        }
    act_round(b, o, (size_t)N * HV);
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
    if (c->output_gate) matmul_tv(g, a, &L->gate, N);

    for (int i = 0; i < n; i++) {
        cpu_slot *s = &b->slots[items[i].slot];
        float *kc = s->kc + (size_t)gl * b->cap * KD, *vc = s->vc + (size_t)gl * b->cap * KD;
        const int T = items[i].it->n_tokens, pos0 = items[i].pos;
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)off[i] + t;
            float *qt = q + r * QD, *kt = k + r * KD;
            if (c->qk_norm) {
                for (int h = 0; h < Hq; h++) rmsnorm_f32(qt + h * hd, qt + h * hd, lv->q_norm, hd, c->norm_eps);
                for (int h = 0; h < Hkv; h++) rmsnorm_f32(kt + h * hd, kt + h * hd, lv->k_norm, hd, c->norm_eps);
            }
            rope_partial(qt, Hq, hd, c->rope_dim, pos0 + t, c->rope_theta);
            rope_partial(kt, Hkv, hd, c->rope_dim, pos0 + t, c->rope_theta);
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
        gqa_attention_f32(o + r0 * QD, q + r0 * QD, s->kc + (size_t)gl * b->cap * KD, s->vc + (size_t)gl * b->cap * KD,
                          items[i].it->n_tokens, items[i].pos, Hq, Hkv, hd);
    }
    if (c->output_gate)
        for (size_t i = 0; i < (size_t)N * QD; i++) o[i] *= sigmoid_f32(g[i]);
    act_round(b, o, (size_t)N * QD);
    matmul_tv(out, o, &L->o, N);
    for (size_t i = 0; i < (size_t)N * D; i++) x[i] += out[i];
}

static void mlp_forward(cpu_backend *b, int li, int N, float *x, float *buf)
{
    const model_config *c = b->c;
    const mlp *M = &b->w->layers[li].mlp;
    const int D = c->d, F = c->ffn;
    float *m = buf, *gt = m + (size_t)N * D, *up = gt + (size_t)N * F, *out = up + (size_t)N * F;
    for (int t = 0; t < N; t++)
        rmsnorm_f32(m + (size_t)t * D, x + (size_t)t * D, b->vec[li].mlp_norm, D, c->norm_eps);
    act_round(b, m, (size_t)N * D);
    matmul_tv(gt, m, &M->gate, N);
    matmul_tv(up, m, &M->up, N);
    for (size_t i = 0; i < (size_t)N * F; i++) gt[i] = silu_f32(gt[i]) * up[i];
    act_round(b, gt, (size_t)N * F);
    matmul_tv(out, gt, &M->down, N);
    for (size_t i = 0; i < (size_t)N * D; i++) x[i] += out[i];
}

/* Floats of scratch one layer needs for N rows (max over layer kinds). */
static size_t layer_scratch(const model_config *c, int N)
{
    size_t HK = (size_t)c->kda_h * c->kda_k, HV = (size_t)c->kda_h * c->kda_v;
    size_t kda = (size_t)N * (4 * HK + 4 * HV + c->kda_v + HK + c->kda_h + c->d + HV);
    size_t QD = (size_t)c->gqa_h * c->gqa_hd, KD = (size_t)c->gqa_kvh * c->gqa_hd;
    size_t gqa = (size_t)N * (3 * QD + 2 * KD + c->d);
    size_t mlp = (size_t)N * (2 * (size_t)c->d + 2 * (size_t)c->ffn);
    size_t m = kda > gqa ? kda : gqa;
    return m > mlp ? m : mlp;
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
    size_t need = (size_t)2 * N * D + layer_scratch(c, N) + (size_t)LOGIT_ROWS * (D + vocab);
    float *x = scratch_get(b, need);
    if (!x) goto oom;
    float *a = x + (size_t)N * D, *buf = a + (size_t)N * D;

    for (int i = 0; i < n; i++)
        for (int t = 0; t < items[i].it->n_tokens; t++)
            tv_row_f32(&b->w->embed, items[i].it->tokens[t], x + (size_t)(off[i] + t) * D);

    for (int li = 0; li < c->n_layers; li++) {
        const float *wn = b->vec[li].attn_norm;
        for (int t = 0; t < N; t++) rmsnorm_f32(a + (size_t)t * D, x + (size_t)t * D, wn, D, c->norm_eps);
        act_round(b, a, (size_t)N * D);
        if (c->kind[li] == KDA_LAYER_KDA)
            kda_layer_forward(b, li, items, n, off, N, a, x, buf);
        else
            gqa_layer_forward(b, li, items, n, off, N, a, x, buf);
        mlp_forward(b, li, N, x, buf);
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
            free(v->A_log), free(v->dt_bias), free(v->g1_bias), free(v->o_norm), free(v->q_norm), free(v->k_norm);
        }
    free(b->vec);
    free(b->final_norm);
    free(b->slots);
    free(b->scratch);
    free(b->off);
    free(b->sample_work);
    free(b);
}

int cpu_backend_create(backend **out, const backend_params *p, char *err, size_t errlen)
{
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
    b->slots = calloc((size_t)b->max_seqs, sizeof *b->slots);
    b->vec = calloc((size_t)c->n_layers, sizeof *b->vec);
    b->final_norm = vec_dup(&p->w->final_norm);
    b->off = malloc((size_t)(b->max_seqs + 1) * sizeof *b->off);
    b->sample_work = calloc(1, sampling_work_bytes(c->vocab));
    if (!b->slots || !b->vec || !b->final_norm || !b->off || !b->sample_work) goto oom;
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *L = &p->w->layers[l];
        layer_vecs *v = &b->vec[l];
        v->attn_norm = vec_dup(&L->attn_norm);
        v->mlp_norm = vec_dup(&L->mlp_norm);
        if (!v->attn_norm || !v->mlp_norm) goto oom;
        if (L->kind == KDA_LAYER_KDA) {
            v->q_conv = vec_dup(&L->kda.q_conv);
            v->k_conv = vec_dup(&L->kda.k_conv);
            v->v_conv = vec_dup(&L->kda.v_conv);
            v->A_log = vec_dup(&L->kda.A_log);
            v->dt_bias = vec_dup(&L->kda.dt_bias);
            v->g1_bias = vec_dup(&L->kda.g1_bias);
            v->o_norm = vec_dup(&L->kda.o_norm);
            if (!v->q_conv || !v->k_conv || !v->v_conv || !v->A_log || !v->dt_bias || !v->g1_bias || !v->o_norm)
                goto oom;
        } else if (c->qk_norm) {
            v->q_norm = vec_dup(&L->gqa.q_norm);
            v->k_norm = vec_dup(&L->gqa.k_norm);
            if (!v->q_norm || !v->k_norm) goto oom;
        }
    }
    *out = &b->base;
    return 0;
oom:
    cpu_destroy(b ? &b->base : NULL);
    snprintf(err, errlen, "out of host memory creating the CPU backend");
    return KDA_ENOMEM;
}

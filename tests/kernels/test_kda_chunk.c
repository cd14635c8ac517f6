/*
 * test_kda_chunk.c - the chunked KDA forward (kernels/kda_chunk.h) against
 * the fp32 CPU reference (engine/cpu_ops.h composed as in cpu_backend.c's
 * kda_layer_forward: short_conv_f32, l2norm_f32, kda_gate_f32,
 * kda_recurrent_f32, rmsnorm_f32) and against kc_kda_step, the per-token
 * GPU kernel, on the same inputs.
 *
 * Every case: random inputs (per channel a decay rate log-uniform between
 * exp(-1e-3) and exp(-5) per token, jittered per token, so some channels keep
 * the state for thousands of tokens; exp(-5)..exp(-30) for the strong-decay
 * cases), non-zero initial state and conv tail, output and workspace poisoned
 * with NaN, then
 *   y (bf16) rel L2 per item            <= 5e-3 (all variants; bf16 rounding alone
 *                                          gives ~1.7e-3)
 *   final state S rel L2 per slot       <= 2e-3 (tf32), 1e-4 (3xTF32, SIMT)
 *   conv tail                           bitwise equal to the reference
 *   rows of padding items, other slots  bitwise untouched
 * A case that fails (and the cases marked diag) is re-run stage by stage
 * (debug_stop_after 1..4): each stage's workspace output is compared with a
 * float64 computation from the GPU's own output of the previous stage, so a
 * wrong stage shows by name, with its worst item, row and head. Failed cases
 * do not stop the run; the exit status is 1 if any failed, 77 without a GPU.
 *
 *   test_kda_chunk            all cases
 *   test_kda_chunk --bench    timings at H=16, K=V=128 (see bench/NOTES.md;
 *                             KDA_CHUNK_BENCH_SMALL=1: tiny shapes, a dry run)
 * KDA_CHUNK_TEST_QUICK=1 drops the largest cases, =2 keeps only small ones
 * (for compute-sanitizer); KDA_CHUNK_TEST_ONLY=text runs the cases whose name
 * contains text. KDA_PDL=0 turns programmatic dependent launch off.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_ops.h"
#include "kda_chunk.h"
#include "kt_util.h"

#define MAXI 64
/* the kernels' switches (kc_kda_chunk_args.gemm, bv, seq_split, recur_buffers, out_split, intra_split) */
typedef struct {
    int gemm, bv, split, nbuf, osplit, isplit, ksplit;
} variant;
#define Y_TOL 5e-3 /* bf16 output against the fp32 reference */
enum { GATE_NORMAL = 0, GATE_STRONG = 1, GATE_FACTORED = 2 };

static int g_failed_checks;
static int g_quick;

/* ---- a problem: the inputs of one layer call, on the host ---- */
typedef struct {
    int H, K, V, taps, R, T, C, HK, HV, ldp, off_f0, off_g0, off_beta, n_slots;
    size_t layer_floats, slot_stride;
    float eps;
    float *proj;    /* [T, ldp]: q|k|v raw, f0 [R], g0 [R], beta logits [H], padding */
    float *lowrank; /* [T, HK + HV]: graw | G (before g_bias) */
    float *convw, *gb, *A_log, *dtb, *onorm;
    float *state;   /* [n_slots, slot_stride] (initial) */
    float *f1, *g1; /* [HK, R], [HV, R] bf16-rounded (GATE_FACTORED) */
} prob;

static float softplus_inv(float y) { return y > 20.0f ? y : logf(expm1f(y)); }

static void prob_init(prob *p, int H, int K, int V, int taps, int T, int n_slots, int gate)
{
    memset(p, 0, sizeof *p);
    p->H = H, p->K = K, p->V = V, p->taps = taps, p->T = T, p->n_slots = n_slots, p->R = 32;
    p->HK = H * K, p->HV = H * V, p->C = 2 * p->HK + p->HV;
    p->off_f0 = p->C, p->off_g0 = p->C + p->R, p->off_beta = p->C + 2 * p->R;
    p->ldp = p->off_beta + H + 3; /* odd stride */
    p->eps = 1e-6f;
    p->layer_floats = (size_t)H * K * V + (size_t)(taps - 1) * p->C;
    p->slot_stride = p->layer_floats + 7; /* guard floats between slots: must stay untouched */
    const size_t Tn = T > 0 ? (size_t)T : 1;
    p->proj = malloc(Tn * p->ldp * 4);
    p->lowrank = malloc(Tn * (p->HK + p->HV) * 4);
    kt_fill(p->proj, Tn * p->ldp, 1.0f);
    p->convw = malloc((size_t)p->C * taps * 4);
    kt_fill(p->convw, (size_t)p->C * taps, 0.5f);
    p->gb = malloc((size_t)p->HV * 4);
    kt_fill(p->gb, p->HV, 0.5f);
    p->A_log = malloc((size_t)H * 4);
    p->dtb = malloc((size_t)p->HK * 4);
    kt_fill(p->dtb, p->HK, 0.5f);
    p->onorm = malloc((size_t)V * 4);
    for (int i = 0; i < V; i++) p->onorm[i] = 1.0f + 0.1f * kt_randn();
    p->state = malloc(p->slot_stride * n_slots * 4);
    kt_fill(p->state, p->slot_stride * n_slots, 0.3f);
    const int LR = p->HK + p->HV;
    if (gate == GATE_FACTORED) {
        /* graw = F1 f0, G = G1 g0 from bf16 weights, as kc_kda_step computes them */
        for (int h = 0; h < H; h++) p->A_log[h] = logf(0.05f + 0.5f * (float)kt_u01());
        p->f1 = malloc((size_t)p->HK * p->R * 4);
        p->g1 = malloc((size_t)p->HV * p->R * 4);
        kt_fill(p->f1, (size_t)p->HK * p->R, 1.0f / sqrtf((float)p->R));
        kt_fill(p->g1, (size_t)p->HV * p->R, 1.0f / sqrtf((float)p->R));
        kt_bf16_round(p->f1, (size_t)p->HK * p->R);
        kt_bf16_round(p->g1, (size_t)p->HV * p->R);
        for (int t = 0; t < T; t++) {
            const float *pr = p->proj + (size_t)t * p->ldp;
            float *lr = p->lowrank + (size_t)t * LR;
            for (int c = 0; c < p->HK; c++) {
                double s = 0;
                for (int r = 0; r < p->R; r++) s += (double)p->f1[(size_t)c * p->R + r] * pr[p->off_f0 + r];
                lr[c] = (float)s;
            }
            for (int c = 0; c < p->HV; c++) {
                double s = 0;
                for (int r = 0; r < p->R; r++) s += (double)p->g1[(size_t)c * p->R + r] * pr[p->off_g0 + r];
                lr[p->HK + c] = (float)s;
            }
        }
    } else {
        /* per channel a decay rate m_c = -gk log-uniform in [lo, hi] (some
         * channels remember thousands of tokens, others a few), per token
         * m_c exp(0.3 N(0,1)); graw inverts the gate: softplus(graw + dt_bias)
         * = m / exp(A_log) */
        const double lo = gate == GATE_STRONG ? 5.0 : 1e-3, hi = gate == GATE_STRONG ? 30.0 : 5.0;
        for (int h = 0; h < H; h++) p->A_log[h] = -1.0f + 2.0f * (float)kt_u01();
        double *mc = malloc((size_t)p->HK * sizeof *mc);
        for (int c = 0; c < p->HK; c++) mc[c] = exp(log(lo) + (log(hi) - log(lo)) * kt_u01());
        for (int t = 0; t < T; t++) {
            float *lr = p->lowrank + (size_t)t * LR;
            for (int c = 0; c < p->HK; c++) {
                const double m = mc[c] * exp(0.3 * kt_randn());
                lr[c] = softplus_inv((float)(m / exp(p->A_log[c / K]))) - p->dtb[c];
            }
            for (int c = 0; c < p->HV; c++) lr[p->HK + c] = kt_randn();
        }
        free(mc);
    }
}

static void prob_free(prob *p)
{
    free(p->proj), free(p->lowrank), free(p->convw), free(p->gb), free(p->A_log), free(p->dtb), free(p->onorm);
    free(p->state), free(p->f1), free(p->g1);
}

/* ---- the CPU reference (and its prep outputs, for the stage checks) ---- */
typedef struct {
    float *q, *k, *v, *gk, *beta; /* global rows: [T][HK], [T][HK], [T][HV], [T][HK], [T][H] */
} prep_rec;

/* Runs items in order over st (slots, updated in place); y rows of live items. */
static void reference(const prob *p, const int *row0, const int *ntok, const int *slot, int n_items, float *st,
                      float *y, prep_rec *rec)
{
    const int H = p->H, K = p->K, V = p->V, HK = p->HK, HV = p->HV, C = p->C, P = p->taps - 1, LR = HK + HV;
    const float qscale = 1.0f / sqrtf((float)K);
    for (int i = 0; i < n_items; i++) {
        const int nt = ntok[i];
        if (slot[i] < 0 || nt <= 0) continue;
        float *S = st + (size_t)slot[i] * p->slot_stride, *tail = S + (size_t)H * K * V;
        float *x = malloc((size_t)nt * C * 4), *cv = malloc((size_t)nt * C * 4);
        float *q = malloc((size_t)nt * HK * 4), *k = malloc((size_t)nt * HK * 4), *gk = malloc((size_t)nt * HK * 4);
        float *v = malloc((size_t)nt * HV * 4), *bt = malloc((size_t)nt * H * 4), *o = malloc((size_t)nt * HV * 4);
        for (int t = 0; t < nt; t++) memcpy(x + (size_t)t * C, p->proj + (size_t)(row0[i] + t) * p->ldp, (size_t)C * 4);
        short_conv_f32(cv, x, nt, C, p->convw, p->taps, tail); /* per channel: same math as q|k|v separately */
        for (int t = 0; t < nt; t++) {
            const size_t row = (size_t)row0[i] + t;
            memcpy(q + (size_t)t * HK, cv + (size_t)t * C, (size_t)HK * 4);
            memcpy(k + (size_t)t * HK, cv + (size_t)t * C + HK, (size_t)HK * 4);
            memcpy(v + (size_t)t * HV, cv + (size_t)t * C + 2 * HK, (size_t)HV * 4);
            for (int h = 0; h < H; h++) {
                l2norm_f32(q + (size_t)t * HK + h * K, K);
                for (int d = 0; d < K; d++) q[(size_t)t * HK + h * K + d] *= qscale;
                l2norm_f32(k + (size_t)t * HK + h * K, K);
                bt[(size_t)t * H + h] = sigmoid_f32(p->proj[row * p->ldp + p->off_beta + h]);
            }
            kda_gate_f32(gk + (size_t)t * HK, p->lowrank + row * LR, p->A_log, p->dtb, H, K);
        }
        if (rec) {
            memcpy(rec->q + (size_t)row0[i] * HK, q, (size_t)nt * HK * 4);
            memcpy(rec->k + (size_t)row0[i] * HK, k, (size_t)nt * HK * 4);
            memcpy(rec->v + (size_t)row0[i] * HV, v, (size_t)nt * HV * 4);
            memcpy(rec->gk + (size_t)row0[i] * HK, gk, (size_t)nt * HK * 4);
            memcpy(rec->beta + (size_t)row0[i] * H, bt, (size_t)nt * H * 4);
        }
        for (int h = 0; h < H; h++)
            kda_recurrent_f32(S + (size_t)h * K * V, q + h * K, k + h * K, v + h * V, gk + h * K, bt + h, o + h * V,
                              nt, K, V, HK, HV, H, HV);
        for (int t = 0; t < nt; t++) {
            const size_t row = (size_t)row0[i] + t;
            for (int h = 0; h < H; h++) {
                float *oh = o + (size_t)t * HV + h * V;
                rmsnorm_f32(oh, oh, p->onorm, V, p->eps);
                for (int j = 0; j < V; j++)
                    y[row * HV + h * V + j] = oh[j] * sigmoid_f32(p->lowrank[row * LR + HK + h * V + j] + p->gb[h * V + j]);
            }
        }
        free(x), free(cv), free(q), free(k), free(gk), free(v), free(bt), free(o);
        (void)P;
    }
}

/* ---- device side ---- */
typedef struct {
    float *proj, *lowrank, *convw, *gb, *A_log, *dtb, *onorm, *state;
    int32_t *meta; /* row0 | ntok | slot, [3][MAXI] */
    uint16_t *y;
    void *work;
    size_t work_bytes;
} dev_prob;

static void dev_init(dev_prob *d, const prob *p, int n_items_max, int split)
{
    const size_t Tn = p->T > 0 ? (size_t)p->T : 1;
    d->proj = kt_dev(p->proj, Tn * p->ldp * 4);
    d->lowrank = kt_dev(p->lowrank, Tn * (p->HK + p->HV) * 4);
    d->convw = kt_dev(p->convw, (size_t)p->C * p->taps * 4);
    d->gb = kt_dev(p->gb, (size_t)p->HV * 4);
    d->A_log = kt_dev(p->A_log, (size_t)p->H * 4);
    d->dtb = kt_dev(p->dtb, (size_t)p->HK * 4);
    d->onorm = kt_dev(p->onorm, (size_t)p->V * 4);
    d->state = kt_dev(p->state, p->slot_stride * p->n_slots * 4);
    d->meta = kt_dev(NULL, 3 * MAXI * 4);
    d->y = kt_dev_poison(Tn * p->HV * 2);
    d->work_bytes = split > 1 ? kc_kda_chunk_workspace_split(p->T, n_items_max, p->H, p->K, p->V, split)
                              : kc_kda_chunk_workspace(p->T, n_items_max, p->H, p->K, p->V);
    d->work = kt_dev_poison(d->work_bytes);
}

static void dev_free(dev_prob *d)
{
    cudaFree(d->proj), cudaFree(d->lowrank), cudaFree(d->convw), cudaFree(d->gb), cudaFree(d->A_log);
    cudaFree(d->dtb), cudaFree(d->onorm), cudaFree(d->state), cudaFree(d->meta), cudaFree(d->y), cudaFree(d->work);
}

static void fill_args(kc_kda_chunk_args *a, const prob *p, const dev_prob *d, int n_items, variant vr, int stop)
{
    memset(a, 0, sizeof *a);
    a->proj = d->proj, a->ldp = p->ldp, a->off_beta = p->off_beta, a->lowrank = d->lowrank;
    a->item_row0 = d->meta, a->item_ntok = d->meta + MAXI, a->item_slot = d->meta + 2 * MAXI;
    a->n_items = n_items, a->T = p->T;
    a->state = d->state, a->slot_stride = p->slot_stride;
    a->convw = d->convw, a->g_bias = d->gb, a->A_log = d->A_log, a->dt_bias = d->dtb, a->onorm = d->onorm;
    a->eps = p->eps, a->H = p->H, a->K = p->K, a->V = p->V, a->taps = p->taps;
    a->y = d->y, a->ldy = p->HV;
    a->work = d->work, a->work_bytes = d->work_bytes;
    a->gemm = vr.gemm, a->bv = vr.bv, a->seq_split = vr.split, a->recur_buffers = vr.nbuf, a->out_split = vr.osplit, a->intra_split = vr.isplit, a->recur_ksplit = vr.ksplit,
    a->debug_stop_after = stop;
}

static void set_items(dev_prob *d, const int *row0, const int *ntok, const int *slot, int n)
{
    int32_t m[3 * MAXI];
    memset(m, 0, sizeof m);
    for (int i = 0; i < n; i++) m[i] = row0[i], m[MAXI + i] = ntok[i], m[2 * MAXI + i] = slot[i];
    KT_CK(cudaMemcpy(d->meta, m, sizeof m, cudaMemcpyHostToDevice));
}

/* ---- error reports ---- */
typedef struct {
    double num, den;  /* sum (got - ref)^2, sum ref^2 */
    double worst;     /* largest |got - ref| */
    long worst_at;    /* caller's index of it (-1: none) */
    long nonfinite;   /* count; the first one's index in first_bad */
    long first_bad;
} err_acc;

static void err_init(err_acc *e) { memset(e, 0, sizeof *e), e->worst_at = -1, e->first_bad = -1; }
static void err_add(err_acc *e, double got, double ref, long at)
{
    if (!isfinite(got)) {
        if (!e->nonfinite++) e->first_bad = at;
        return;
    }
    const double d = got - ref;
    e->num += d * d, e->den += ref * ref;
    if (fabs(d) > e->worst) e->worst = fabs(d), e->worst_at = at;
}
static double err_rel(const err_acc *e) { return e->nonfinite ? INFINITY : sqrt(e->num / (e->den > 0 ? e->den : 1e-300)); }

/* prints one check; at encodes (row, head, col) as row * H * W + head * W + col */
static int report(const char *cs, const char *what, const err_acc *e, double tol, int H, int W)
{
    const double rel = err_rel(e);
    const int ok = rel <= tol;
    printf("  %-34s %-26s rel %.3e (tol %.0e) %s", cs, what, rel, tol, ok ? "ok" : "FAIL");
    if (e->nonfinite) {
        const long at = e->first_bad;
        printf("  %ld non-finite, first at row %ld head %ld col %ld", e->nonfinite, at / ((long)H * W),
               (at / W) % H, at % W);
    } else if (e->worst_at >= 0) {
        const long at = e->worst_at;
        printf("  worst |d| %.2e at row %ld head %ld col %ld", e->worst, at / ((long)H * W), (at / W) % H, at % W);
    }
    printf("\n");
    if (!ok) g_failed_checks++;
    return !ok;
}

/* ---- stage-by-stage diagnosis ----
 * Host copy of the chunk table (the rule the plan kernel implements). */
typedef struct {
    int n;
    int item[4096], local[4096];
    int chunk0[MAXI], nch[MAXI], nseg[MAXI];
} host_plan;

/* segments: min(split, chunks / 4), 1 below 2 (kda_chunk.h) */
static void make_plan(host_plan *hp, const prob *p, const int *row0, const int *ntok, const int *slot, int n_items,
                      int split)
{
    hp->n = 0;
    for (int i = 0; i < n_items; i++) {
        const int live = slot[i] >= 0 && ntok[i] > 0 && row0[i] >= 0 && row0[i] + ntok[i] <= p->T;
        hp->chunk0[i] = hp->n;
        hp->nch[i] = live ? (ntok[i] + 63) / 64 : 0;
        hp->nseg[i] = split > 1 && hp->nch[i] / 4 >= 2 ? (hp->nch[i] / 4 < split ? hp->nch[i] / 4 : split) : 1;
        for (int c = 0; c < hp->nch[i]; c++) hp->item[hp->n] = i, hp->local[hp->n] = c, hp->n++;
    }
}

static void *ws_get(const dev_prob *d)
{
    void *h = malloc(d->work_bytes);
    kt_get(h, d->work, d->work_bytes);
    return h;
}

static int run_stage(const prob *p, dev_prob *d, int n_items, variant vr, int stop)
{
    KT_CK(cudaMemset(d->work, 0xFF, d->work_bytes));
    KT_CK(cudaMemset(d->y, 0xFF, (size_t)(p->T > 0 ? p->T : 1) * p->HV * 2));
    kc_kda_chunk_args a;
    fill_args(&a, p, d, n_items, vr, stop);
    const int rc = kc_kda_chunk(&a, 0);
    KT_CK(cudaDeviceSynchronize());
    return rc;
}

#define WSF(ws, L, buf) ((const float *)((const char *)(ws) + (L).buf))

static void stage_diag(const char *cs, const prob *p, dev_prob *d, const int *row0, const int *ntok, const int *slot,
                       int n_items, variant vr, const prep_rec *rec)
{
    const int H = p->H, K = p->K, V = p->V, HK = p->HK, HV = p->HV;
    const size_t T = p->T;
    const double tol_mm = vr.gemm == KC_KDA_GEMM_TF32 ? 3e-3 : 1e-4; /* stages with matrix products */
    printf("  %s: stage-by-stage (each from the GPU's previous stage, float64 on the host)\n", cs);
    kc_kda_chunk_layout L;
    kc_kda_chunk_layout_of(p->T, n_items, H, K, V, vr.split, &L);
    host_plan *hp = malloc(sizeof *hp);
    make_plan(hp, p, row0, ntok, slot, n_items, vr.split);

    /* stage 1: plan + prep */
    if (run_stage(p, d, n_items, vr, 1)) printf("  stage 1 launch failed\n");
    void *w1 = ws_get(d);
    {
        const int *nc = (const int *)((char *)w1 + L.plan_nchunks), *st = (const int *)((char *)w1 + L.status);
        const int *ci = (const int *)((char *)w1 + L.chunk_item), *cl = (const int *)((char *)w1 + L.chunk_local);
        const int *c0 = (const int *)((char *)w1 + L.item_chunk0), *nch = (const int *)((char *)w1 + L.item_nchunks);
        const int *nsg = (const int *)((char *)w1 + L.item_nseg);
        int bad = *nc != hp->n || *st != 0, segs = 0;
        for (int c = 0; !bad && c < hp->n; c++) bad = ci[c] != hp->item[c] || cl[c] != hp->local[c];
        for (int i = 0; !bad && i < n_items; i++) {
            bad = nch[i] != hp->nch[i] || (hp->nch[i] && c0[i] != hp->chunk0[i]) || (hp->nch[i] && nsg[i] != hp->nseg[i]);
            segs += hp->nch[i] ? nsg[i] : 0;
        }
        printf("  %-34s %-26s %d chunks (expected %d), %d segments, status %d: %s\n", cs, "plan", *nc, hp->n, segs, *st,
               bad ? "FAIL" : "ok");
        if (bad) g_failed_checks++;
    }
    err_acc eq, ek, ev, eg, eb;
    err_init(&eq), err_init(&ek), err_init(&ev), err_init(&eg), err_init(&eb);
    for (int i = 0; i < n_items; i++) {
        if (!hp->nch[i]) continue;
        for (int h = 0; h < H; h++) {
            double gam[128];
            for (int t = 0; t < ntok[i]; t++) {
                const size_t row = (size_t)row0[i] + t, rh = (size_t)h * T + row;
                if (t % 64 == 0) memset(gam, 0, sizeof gam);
                for (int dd = 0; dd < K; dd++) {
                    const long at = (long)row * H * K + h * K + dd;
                    gam[dd] += rec->gk[row * HK + h * K + dd];
                    err_add(&eq, WSF(w1, L, q)[rh * K + dd], rec->q[row * HK + h * K + dd], at);
                    err_add(&ek, WSF(w1, L, k)[rh * K + dd], rec->k[row * HK + h * K + dd], at);
                    err_add(&eg, WSF(w1, L, g)[rh * K + dd], gam[dd], at);
                }
                for (int j = 0; j < V; j++)
                    err_add(&ev, WSF(w1, L, v)[rh * V + j], rec->v[row * HV + h * V + j], (long)row * H * V + h * V + j);
                err_add(&eb, WSF(w1, L, beta)[rh], rec->beta[row * H + h], (long)row * H + h);
            }
        }
    }
    report(cs, "1 prep q", &eq, 1e-5, H, K);
    report(cs, "1 prep k", &ek, 1e-5, H, K);
    report(cs, "1 prep v", &ev, 1e-5, H, V);
    report(cs, "1 prep Gam (chunk cumsum)", &eg, 1e-5, H, K);
    report(cs, "1 prep beta", &eb, 1e-6, H, 1);

    /* stage 2: intra, from stage 1's q, k, v, Gam, beta */
    if (run_stage(p, d, n_items, vr, 2)) printf("  stage 2 launch failed\n");
    void *w2 = ws_get(d);
    err_acc eW, eU, eqg, ekg, eA, eE;
    err_init(&eW), err_init(&eU), err_init(&eqg), err_init(&ekg), err_init(&eA), err_init(&eE);
    double *Lm = malloc(64 * 64 * 8), *Ai = malloc(64 * 64 * 8), *G = malloc(64 * 128 * 8);
    for (int c = 0; c < hp->n; c++) {
        const int i = hp->item[c], p0 = 64 * hp->local[c], n = ntok[i] - p0 < 64 ? ntok[i] - p0 : 64;
        const size_t r0 = (size_t)row0[i] + p0;
        for (int h = 0; h < H; h++) {
            const float *q1 = WSF(w1, L, q) + ((size_t)h * T + r0) * K, *k1 = WSF(w1, L, k) + ((size_t)h * T + r0) * K;
            const float *v1 = WSF(w1, L, v) + ((size_t)h * T + r0) * V, *g1 = WSF(w1, L, g) + ((size_t)h * T + r0) * K;
            const float *b1 = WSF(w1, L, beta) + (size_t)h * T + r0;
            for (int r = 0; r < n; r++)
                for (int dd = 0; dd < K; dd++) G[r * K + dd] = g1[r * K + dd];
            for (int r = 0; r < n; r++)
                for (int s = 0; s < n; s++) {
                    double kk = 0, qk = 0;
                    if (s <= r)
                        for (int dd = 0; dd < K; dd++) {
                            const double e = exp(G[r * K + dd] - G[s * K + dd]);
                            kk += (double)k1[r * K + dd] * k1[s * K + dd] * e;
                            qk += (double)q1[r * K + dd] * k1[s * K + dd] * e;
                        }
                    Lm[r * 64 + s] = s < r ? b1[r] * kk : 0.0;
                    const float ga = WSF(w2, L, aqk)[((size_t)h * T + r0 + r) * 64 + s];
                    err_add(&eA, ga, s <= r ? qk : 0.0, (long)(r0 + r) * H * 64 + h * 64 + s);
                }
            for (int col = 0; col < n; col++) /* (I + L)^-1 column by column */
                for (int r = 0; r < n; r++) {
                    double x = r == col ? 1.0 : 0.0;
                    for (int s = col; s < r; s++) x -= Lm[r * 64 + s] * Ai[s * 64 + col];
                    Ai[r * 64 + col] = r >= col ? x : 0.0;
                }
            const double *gl = G + (n - 1) * K;
            for (int r = 0; r < n; r++) {
                const size_t rh = (size_t)h * T + r0 + r;
                for (int dd = 0; dd < K; dd++) {
                    double wv = 0;
                    for (int s = 0; s <= r; s++) wv += Ai[r * 64 + s] * b1[s] * k1[s * K + dd] * exp(G[s * K + dd]);
                    const long at = (long)(r0 + r) * H * K + h * K + dd;
                    err_add(&eW, WSF(w2, L, g)[rh * K + dd], wv, at);
                    err_add(&eqg, WSF(w2, L, q)[rh * K + dd], q1[r * K + dd] * exp(G[r * K + dd]), at);
                    err_add(&ekg, WSF(w2, L, k)[rh * K + dd], k1[r * K + dd] * exp(gl[dd] - G[r * K + dd]), at);
                }
                for (int j = 0; j < V; j++) {
                    double u = 0;
                    for (int s = 0; s <= r; s++) u += Ai[r * 64 + s] * b1[s] * v1[s * V + j];
                    err_add(&eU, WSF(w2, L, v)[rh * V + j], u, (long)(r0 + r) * H * V + h * V + j);
                }
            }
            for (int dd = 0; dd < K; dd++)
                err_add(&eE, WSF(w2, L, egl)[((size_t)c * H + h) * K + dd], exp(gl[dd]), (long)c * H * K + h * K + dd);
        }
    }
    report(cs, "2 intra W", &eW, tol_mm, H, K);
    report(cs, "2 intra U", &eU, tol_mm, H, V);
    report(cs, "2 intra Aqk", &eA, tol_mm, H, 64);
    report(cs, "2 intra qg", &eqg, 1e-5, H, K);
    report(cs, "2 intra kg", &ekg, 1e-5, H, K);
    report(cs, "2 intra exp(Gam_last) [chunk]", &eE, 1e-5, H, K);

    /* stage 3: recurrence, from stage 2's W, U, kg, exp(Gam_last) and the initial state */
    if (run_stage(p, d, n_items, vr, 3)) printf("  stage 3 launch failed\n");
    void *w3 = ws_get(d);
    err_acc eS, eV;
    err_init(&eS), err_init(&eV);
    double *S = malloc((size_t)K * V * 8), *vn = malloc((size_t)64 * V * 8);
    for (int i = 0; i < n_items; i++) {
        if (!hp->nch[i]) continue;
        for (int h = 0; h < H; h++) {
            const float *S0 = p->state + (size_t)slot[i] * p->slot_stride + (size_t)h * K * V;
            for (int e = 0; e < K * V; e++) S[e] = S0[e];
            for (int cc = 0; cc < hp->nch[i]; cc++) {
                const int c = hp->chunk0[i] + cc, p0 = 64 * cc, n = ntok[i] - p0 < 64 ? ntok[i] - p0 : 64;
                const size_t r0 = (size_t)row0[i] + p0;
                const float *sc = WSF(w3, L, sc) + ((size_t)c * H + h) * K * V;
                for (int e = 0; e < K * V; e++) err_add(&eS, sc[e], S[e], (long)c * H * K * V + (long)h * K * V + e);
                const float *W = WSF(w2, L, g) + ((size_t)h * T + r0) * K, *U = WSF(w2, L, v) + ((size_t)h * T + r0) * V;
                const float *kg = WSF(w2, L, k) + ((size_t)h * T + r0) * K, *eg = WSF(w2, L, egl) + ((size_t)c * H + h) * K;
                for (int r = 0; r < n; r++)
                    for (int j = 0; j < V; j++) {
                        double x = U[r * V + j];
                        for (int dd = 0; dd < K; dd++) x -= (double)W[r * K + dd] * S[dd * V + j];
                        vn[r * V + j] = x;
                        err_add(&eV, WSF(w3, L, v)[((size_t)h * T + r0 + r) * V + j], x, (long)(r0 + r) * H * V + h * V + j);
                    }
                for (int dd = 0; dd < K; dd++)
                    for (int j = 0; j < V; j++) {
                        double x = eg[dd] * S[dd * V + j];
                        for (int r = 0; r < n; r++) x += (double)kg[r * K + dd] * vn[r * V + j];
                        S[dd * V + j] = x;
                    }
            }
        }
    }
    /* sc is indexed by chunk: the report's "row" is the chunk, "head" the head, "col" d*V+j */
    report(cs, "3 recur S at chunk start", &eS, tol_mm, H, K * V);
    report(cs, "3 recur Vnew", &eV, tol_mm, H, V);

    /* stage 4: output, from stage 3's state snapshots and Vnew, stage 2's qg and Aqk */
    if (run_stage(p, d, n_items, vr, 4)) printf("  stage 4 launch failed\n");
    float *gy = kt_get_bf16(d->y, T * HV);
    err_acc eY;
    err_init(&eY);
    double *o = malloc((size_t)V * 8);
    for (int c = 0; c < hp->n; c++) {
        const int i = hp->item[c], p0 = 64 * hp->local[c], n = ntok[i] - p0 < 64 ? ntok[i] - p0 : 64;
        const size_t r0 = (size_t)row0[i] + p0;
        for (int h = 0; h < H; h++) {
            const float *qg = WSF(w3, L, q) + ((size_t)h * T + r0) * K, *sc = WSF(w3, L, sc) + ((size_t)c * H + h) * K * V;
            const float *aq = WSF(w3, L, aqk) + ((size_t)h * T + r0) * 64, *vv = WSF(w3, L, v) + ((size_t)h * T + r0) * V;
            for (int r = 0; r < n; r++) {
                double ss = 0;
                for (int j = 0; j < V; j++) {
                    double x = 0;
                    for (int dd = 0; dd < K; dd++) x += (double)qg[r * K + dd] * sc[dd * V + j];
                    for (int s = 0; s <= r; s++) x += (double)aq[r * 64 + s] * vv[s * V + j];
                    o[j] = x, ss += x * x;
                }
                const double rn = 1.0 / sqrt(ss / V + p->eps);
                const size_t row = r0 + r;
                for (int j = 0; j < V; j++) {
                    const double gt = p->lowrank[row * (HK + HV) + HK + h * V + j] + p->gb[h * V + j];
                    err_add(&eY, gy[row * HV + h * V + j], o[j] * rn * p->onorm[j] / (1.0 + exp(-gt)),
                            (long)row * H * V + h * V + j);
                }
            }
        }
    }
    report(cs, "4 out y (bf16)", &eY, Y_TOL, H, V);
    free(Lm), free(Ai), free(G), free(S), free(vn), free(o), free(gy), free(w1), free(w2), free(w3), free(hp);
}

/* ---- one case ---- */
typedef struct {
    const char *name;
    int H, K, V, taps, gate;
    variant vr;
    int n_items;
    int ntok[MAXI], slot[MAXI]; /* slot < 0: padding item */
    int n_slots;
    int diag;     /* always run the stage-by-stage checks */
    int small;    /* runs in KDA_CHUNK_TEST_QUICK=2 whatever its length */
    int vs_step;  /* also compare with kc_kda_step on the same inputs */
    int plan_reuse; /* the chunk table from an earlier call on the same items (plan + prep only),
                     * the real call with plan_ready = 1: the layers of one pass */
    int pieces;   /* > 0: item 0 is fed in this many calls (continuation), see piece_len */
    int piece_len[8];
} kcase;

static double state_tol(int gemm) { return gemm == KC_KDA_GEMM_TF32 ? 2e-3 : 1e-4; }

#ifndef KC_EMU
/* kc_kda_step on the same inputs (GATE_FACTORED): y and state next to ours */
static void compare_with_step(const char *cs, const prob *p, const dev_prob *d, const int *row0, const int *ntok,
                              const int *slot, int n_items, const float *gy, const float *gstate)
{
    const int H = p->H, K = p->K, V = p->V, HK = p->HK, HV = p->HV, R = p->R;
    uint16_t *f1t = malloc((size_t)R * HK * 2), *g1t = malloc((size_t)R * HV * 2);
    for (int c = 0; c < HK; c++)
        for (int r = 0; r < R; r++) f1t[(size_t)r * HK + c] = f32_to_bf16(p->f1[(size_t)c * R + r]);
    for (int c = 0; c < HV; c++)
        for (int r = 0; r < R; r++) g1t[(size_t)r * HV + c] = f32_to_bf16(p->g1[(size_t)c * R + r]);
    kc_kda_args a;
    memset(&a, 0, sizeof a);
    a.proj = d->proj, a.ldp = p->ldp, a.off_f0 = p->off_f0, a.off_g0 = p->off_g0, a.off_beta = p->off_beta;
    a.item_row0 = d->meta, a.item_ntok = d->meta + MAXI, a.item_slot = d->meta + 2 * MAXI, a.n_items = n_items;
    a.state = kt_dev(p->state, p->slot_stride * p->n_slots * 4);
    a.slot_stride = p->slot_stride;
    a.convw = d->convw, a.f1t = kt_dev(f1t, (size_t)R * HK * 2), a.g1t = kt_dev(g1t, (size_t)R * HV * 2);
    a.g_bias = d->gb, a.A_log = d->A_log, a.dt_bias = d->dtb, a.onorm = d->onorm, a.eps = p->eps;
    a.H = H, a.K = K, a.V = V, a.R = R, a.taps = p->taps;
    a.y = kt_dev_poison((size_t)p->T * HV * 2), a.ldy = HV;
    a.lowrank = kt_dev_poison((size_t)p->T * (HK + HV) * 4), a.lowrank_rows = p->T;
    const int rc = kc_kda_step(&a, 0);
    KT_CK(cudaDeviceSynchronize());
    if (rc) {
        printf("  %-34s kc_kda_step returned %d: FAIL\n", cs, rc);
        g_failed_checks++;
    } else {
        float *sy = kt_get_bf16(a.y, (size_t)p->T * HV), *ss = malloc(p->slot_stride * p->n_slots * 4);
        kt_get(ss, a.state, p->slot_stride * p->n_slots * 4);
        for (int i = 0; i < n_items; i++) {
            if (slot[i] < 0 || ntok[i] <= 0) continue;
            err_acc e;
            err_init(&e);
            for (size_t x = (size_t)row0[i] * HV; x < (size_t)(row0[i] + ntok[i]) * HV; x++) err_add(&e, gy[x], sy[x], (long)x);
            char what[64];
            snprintf(what, sizeof what, "y vs kc_kda_step item %d", i);
            report(cs, what, &e, 1e-2, H, V);
            err_init(&e);
            const size_t o = (size_t)slot[i] * p->slot_stride;
            for (size_t x = 0; x < (size_t)H * K * V; x++) err_add(&e, gstate[o + x], ss[o + x], (long)x);
            snprintf(what, sizeof what, "S vs kc_kda_step slot %d", slot[i]);
            report(cs, what, &e, 2e-3, 1, 1);
        }
        free(sy), free(ss);
    }
    cudaFree(a.state), cudaFree((void *)a.f1t), cudaFree((void *)a.g1t), cudaFree(a.y), cudaFree(a.lowrank);
    free(f1t), free(g1t);
}
#endif

static int run_case(const kcase *kc)
{
    const int before = g_failed_checks;
    const int H = kc->H, K = kc->K, V = kc->V, n_items = kc->n_items;
    int row0[MAXI], T = 0;
    for (int i = 0; i < n_items; i++) row0[i] = T, T += kc->ntok[i];
    char cs[96];
    snprintf(cs, sizeof cs, "%s", kc->name);
    printf("case %s: H=%d K=%d V=%d taps=%d T=%d items=%d gemm=%d bv=%d split=%d buffers=%d out_split=%d intra_split=%d\n", cs,
           H, K, V, kc->taps, T, n_items, kc->vr.gemm, kc->vr.bv, kc->vr.split, kc->vr.nbuf, kc->vr.osplit, kc->vr.isplit);
    prob p;
    prob_init(&p, H, K, V, kc->taps, T, kc->n_slots, kc->gate);
    const int HV = p.HV;
    float *ref_state = malloc(p.slot_stride * p.n_slots * 4), *ref_y = malloc((size_t)(T > 0 ? T : 1) * HV * 4);
    memcpy(ref_state, p.state, p.slot_stride * p.n_slots * 4);
    prep_rec rec;
    rec.q = malloc((size_t)(T + 1) * p.HK * 4), rec.k = malloc((size_t)(T + 1) * p.HK * 4);
    rec.v = malloc((size_t)(T + 1) * HV * 4), rec.gk = malloc((size_t)(T + 1) * p.HK * 4);
    rec.beta = malloc((size_t)(T + 1) * H * 4);
    reference(&p, row0, kc->ntok, kc->slot, n_items, ref_state, ref_y, &rec);

    dev_prob d;
    dev_init(&d, &p, n_items, kc->vr.split);
    int rc = 0;
    if (kc->pieces) {
        /* item 0 fed in several calls: each continues from the state and tail the previous left */
        int off = 0;
        for (int c = 0; c < kc->pieces && !rc; c++) {
            const int r0 = off, nt = kc->piece_len[c], sl = kc->slot[0];
            set_items(&d, &r0, &nt, &sl, 1);
            kc_kda_chunk_args a;
            fill_args(&a, &p, &d, 1, kc->vr, 0);
            rc = kc_kda_chunk(&a, 0);
            off += nt;
        }
    } else {
        set_items(&d, row0, kc->ntok, kc->slot, n_items);
        kc_kda_chunk_args a;
        if (kc->plan_reuse) { /* plans, leaves state, tail and y alone */
            fill_args(&a, &p, &d, n_items, kc->vr, 1);
            rc = kc_kda_chunk(&a, 0);
        }
        fill_args(&a, &p, &d, n_items, kc->vr, 0);
        a.plan_ready = kc->plan_reuse;
        if (!rc) rc = kc_kda_chunk(&a, 0);
    }
    KT_CK(cudaDeviceSynchronize());
    if (rc) {
        printf("  %-34s kc_kda_chunk returned %d: FAIL\n", cs, rc);
        g_failed_checks++;
    }
    float *gy = kt_get_bf16(d.y, (size_t)(T > 0 ? T : 1) * HV), *gs = malloc(p.slot_stride * p.n_slots * 4);
    kt_get(gs, d.state, p.slot_stride * p.n_slots * 4);

    /* y per item (padding items: their rows stay poisoned, bitwise) */
    for (int i = 0; i < n_items; i++) {
        char what[64];
        if (kc->slot[i] < 0) {
            long touched = 0;
            for (size_t x = (size_t)row0[i] * HV; x < (size_t)(row0[i] + kc->ntok[i]) * HV; x++) touched += !isnan(gy[x]);
            printf("  %-34s padding item %-14d %ld of its y values written: %s\n", cs, i, touched, touched ? "FAIL" : "ok");
            if (touched) g_failed_checks++;
            continue;
        }
        if (kc->ntok[i] == 0) continue;
        err_acc e, eh[64];
        err_init(&e);
        for (int h = 0; h < H && h < 64; h++) err_init(&eh[h]);
        for (int t = 0; t < kc->ntok[i]; t++)
            for (int x = 0; x < HV; x++) {
                const size_t at = (size_t)(row0[i] + t) * HV + x;
                err_add(&e, gy[at], ref_y[at], (long)at);
                if (x / V < 64) err_add(&eh[x / V], gy[at], ref_y[at], (long)at);
            }
        int wh = 0;
        for (int h = 1; h < H && h < 64; h++)
            if (err_rel(&eh[h]) > err_rel(&eh[wh])) wh = h;
        snprintf(what, sizeof what, "y item %d (%d tok)", i, kc->ntok[i]);
        report(cs, what, &e, Y_TOL, H, V);
        if (H > 1) printf("  %-34s   worst head %d: rel %.3e\n", "", wh, err_rel(&eh[wh]));
    }
    /* state and tail per slot; untouched slots and the guard floats bitwise */
    for (int s = 0; s < p.n_slots; s++) {
        const size_t o = (size_t)s * p.slot_stride;
        int used = 0;
        for (int i = 0; i < n_items; i++) used |= kc->slot[i] == s && kc->ntok[i] > 0;
        if (!used) {
            const int same = !memcmp(gs + o, p.state + o, p.slot_stride * 4);
            printf("  %-34s slot %d (not live)              untouched: %s\n", cs, s, same ? "ok" : "FAIL");
            if (!same) g_failed_checks++;
            continue;
        }
        err_acc e;
        err_init(&e);
        for (size_t x = 0; x < (size_t)H * K * V; x++) err_add(&e, gs[o + x], ref_state[o + x], (long)x);
        char what[64];
        snprintf(what, sizeof what, "state S slot %d", s);
        report(cs, what, &e, state_tol(kc->vr.gemm), H, K * V);
        const size_t tl = (size_t)(p.taps - 1) * p.C;
        const int tail_ok = !memcmp(gs + o + (size_t)H * K * V, ref_state + o + (size_t)H * K * V, tl * 4);
        const int guard_ok = !memcmp(gs + o + p.layer_floats, p.state + o + p.layer_floats, (p.slot_stride - p.layer_floats) * 4);
        printf("  %-34s slot %d conv tail bitwise: %s, guard untouched: %s\n", cs, s, tail_ok ? "ok" : "FAIL", guard_ok ? "ok" : "FAIL");
        if (!tail_ok || !guard_ok) g_failed_checks++;
        if (!tail_ok)
            for (size_t x = 0; x < tl; x++)
                if (gs[o + H * K * V + x] != ref_state[o + H * K * V + x]) {
                    printf("    first tail difference: row %zu channel %zu: %g vs %g\n", x / p.C, x % p.C,
                           gs[o + H * K * V + x], ref_state[o + H * K * V + x]);
                    break;
                }
    }
#ifndef KC_EMU
    if (kc->vs_step) compare_with_step(cs, &p, &d, row0, kc->ntok, kc->slot, n_items, gy, gs);
#else
    if (kc->vs_step) printf("  %-34s (kc_kda_step comparison: GPU only)\n", cs);
#endif
    const int failed = g_failed_checks > before;
    if ((kc->diag || failed) && !kc->pieces) {
        KT_CK(cudaMemcpy(d.state, p.state, p.slot_stride * p.n_slots * 4, cudaMemcpyHostToDevice));
        stage_diag(cs, &p, &d, row0, kc->ntok, kc->slot, n_items, kc->vr, &rec);
    }
    printf("case %s: %s\n\n", cs, g_failed_checks > before ? "FAILED" : "passed");
    free(ref_state), free(ref_y), free(gy), free(gs);
    free(rec.q), free(rec.k), free(rec.v), free(rec.gk), free(rec.beta);
    dev_free(&d);
    prob_free(&p);
    return g_failed_checks > before;
}

/* bad arguments: an error code and nothing launched; an item outside 0..T-1 skipped and counted */
static int run_bad_args(void)
{
    const int before = g_failed_checks;
    printf("case bad-args\n");
    prob p;
    prob_init(&p, 2, 16, 16, 4, 80, 3, GATE_NORMAL);
    dev_prob d;
    dev_init(&d, &p, 2, 0);
    const int r0[2] = {0, 40}, nt[2] = {40, 50}, sl[2] = {0, 1}; /* item 1 runs past T = 80 */
    set_items(&d, r0, nt, sl, 2);
    kc_kda_chunk_args a;
    struct {
        const char *what;
        int expect;
    } t[10] = {{"K = 48 unsupported", -5}, {"workspace too small", -1}, {"misaligned workspace", -1},
              {"ldy too small", -1}, {"V = 2K at K = 128", -5}, {"seq_split = 17", -1},
              {"split, no split workspace", -1}, {"out_split = 3", -1}, {"intra_split = 3", -1},
              {"intra_split = 2 at K = 16", -1}};
    for (int i = 0; i < 10; i++) {
        fill_args(&a, &p, &d, 2, (variant){0, 0, 0, 0, 0, 0, 0}, 0);
        if (i == 0) a.K = 48;
        if (i == 1) a.work_bytes -= 256;
        if (i == 2) a.work = (char *)a.work + 16, a.work_bytes -= 16;
        if (i == 3) a.ldy = p.HV - 1;
        if (i == 4) a.K = 128, a.V = 256;
        if (i == 5) a.seq_split = 17;
        if (i == 6) a.seq_split = 4; /* dev_init sized the workspace without the split's buffers */
        if (i == 7) a.out_split = 3;
        if (i == 8) a.intra_split = 3;
        if (i == 9) a.intra_split = 2; /* the problem has K = 16: one slice */
        const int rc = kc_kda_chunk(&a, 0);
        printf("  %-34s %-26s returned %d (expected %d): %s\n", "bad-args", t[i].what, rc, t[i].expect,
               rc == t[i].expect ? "ok" : "FAIL");
        if (rc != t[i].expect) g_failed_checks++;
    }
    KT_CK(cudaDeviceSynchronize());
    float *gy = kt_get_bf16(d.y, (size_t)p.T * p.HV);
    long touched = 0;
    for (size_t x = 0; x < (size_t)p.T * p.HV; x++) touched += !isnan(gy[x]);
    printf("  %-34s %-26s %ld y values written: %s\n", "bad-args", "after the refused calls", touched, touched ? "FAIL" : "ok");
    if (touched) g_failed_checks++;
    /* the valid call: item 1 is out of range */
    fill_args(&a, &p, &d, 2, (variant){0, 0, 0, 0, 0, 0, 0}, 0);
    int rc = kc_kda_chunk(&a, 0);
    KT_CK(cudaDeviceSynchronize());
    kc_kda_chunk_layout L;
    kc_kda_chunk_layout_of(p.T, 2, p.H, p.K, p.V, 0, &L);
    int status = -1;
    KT_CK(cudaMemcpy(&status, (char *)d.work + L.status, 4, cudaMemcpyDeviceToHost));
    float *gs = malloc(p.slot_stride * p.n_slots * 4);
    kt_get(gs, d.state, p.slot_stride * p.n_slots * 4);
    const int slot1_same = !memcmp(gs + p.slot_stride, p.state + p.slot_stride, p.slot_stride * 4);
    const int ok = rc == 0 && status == 1 && slot1_same;
    printf("  %-34s %-26s rc %d, status %d (expected 1), its slot untouched %d: %s\n", "bad-args", "item past T", rc,
           status, slot1_same, ok ? "ok" : "FAIL");
    if (!ok) g_failed_checks++;
    free(gy), free(gs);
    dev_free(&d);
    prob_free(&p);
    printf("case bad-args: %s\n\n", g_failed_checks > before ? "FAILED" : "passed");
    return g_failed_checks > before;
}

/* ---- benchmark: H=16, K=V=128, CUDA events, median of repeats ---- */
static double counted_flop(int T, int n_items, int H, int K, int V)
{
    /* per full 64-token chunk and head: diagonal sub-blocks 4 x 136 pairs x
     * 4K, off-diagonal L and Aqk 2 x 96 x 16 x 2K, W and U 64 x 64 x 2(K+V),
     * W S and kg^T Vnew 2 x 64 x 2KV, qg S 64 x 2KV, Aqk Vnew 64 x 64 x 2V */
    const double per_chunk = 4.0 * 136 * 4 * K + 2.0 * 96 * 16 * 2 * K + 64.0 * 64 * 2 * (K + V) +
                             3.0 * 64 * 2 * (double)K * V + 64.0 * 64 * 2 * V;
    const double chunks = (double)T / 64; /* items here are multiples of 64 */
    (void)n_items;
    return per_chunk * chunks * H;
}
static double floor_bytes(int T, int n_items, int H, int K, int V)
{
    /* must move: proj q|k|v|beta and lowrank read (fp32), y written (bf16),
     * each item's state read and written (fp32) */
    const double HK = (double)H * K, HV = (double)H * V;
    return (double)T * ((2 * HK + HV + H) * 4 + (HK + HV) * 4 + HV * 2) + (double)n_items * 2 * HK * V * 4;
}

/* the bytes each stage moves through its fp32 workspace buffers (first touches
 * only; re-reads that hit L2 are not counted), per bench/NOTES.md */
static void stage_bytes(double *b, int T, int n_items, int H, int K, int V)
{
    const double HK = (double)H * K, HV = (double)H * V, t = T, sc = (double)H * K * V * 4 / 64;
    b[0] = t * ((2 * HK + HV + H) * 4 + HK * 4 + (3 * HK + HV + H) * 4);       /* prep */
    b[1] = t * ((3 * HK + HV + H) * 4 + (3 * HK + HV) * 4 + H * 64 * 4);       /* intra */
    b[2] = t * ((2 * HK + HV) * 4 + HV * 4 + sc) + (double)n_items * 2 * HK * V * 4; /* recur */
    b[3] = t * (HK * 4 + sc + H * 64 * 4 + HV * 4 + HV * 4 + HV * 2);           /* out */
}

static int cmp_float(const void *x, const void *y)
{
    const float a = *(const float *)x, b = *(const float *)y;
    return a < b ? -1 : a > b;
}

static float time_chunk(kc_kda_chunk_args *a, int reps)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    float ms[64];
    for (int i = 0; i < (reps > 1 ? 2 : 0); i++) kc_kda_chunk(a, 0);
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, 0);
        kc_kda_chunk(a, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[r], e0, e1);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(ms, reps, sizeof ms[0], cmp_float);
    return ms[reps / 2];
}

/* 1 if name contains one of the '|'-separated parts of list */
static int name_in_list(const char *name, const char *list)
{
    char part[64];
    for (const char *p = list; *p;) {
        const char *e = strchr(p, '|');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 0 && len < sizeof part) {
            memcpy(part, p, len), part[len] = 0;
            if (strstr(name, part)) return 1;
        }
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static int run_bench(void)
{
    /* KDA_CHUNK_BENCH_SMALL=1: tiny shapes, to dry-run this code (e.g. in the emulator) */
    const int small = getenv("KDA_CHUNK_BENCH_SMALL") != NULL;
    const int H = small ? 2 : 16, K = 128, V = 128, taps = 4, reps = small ? 1 : 15;
    int shapes[8][2] = {{1, small ? 256 : 2048}, {small ? 2 : 8, small ? 64 : 2048}, {1, small ? 320 : 8192},
                        {small ? 2 : 4, small ? 128 : 8192}};
    int n_shapes = 4;
    /* KDA_CHUNK_BENCH_BT="B:L,...": these shapes instead (up to 8; e.g. the short prompts of a
     * serving mix, whose cost is the stages' fixed latency) */
    const char *bt = getenv("KDA_CHUNK_BENCH_BT");
    if (bt && *bt) {
        n_shapes = 0;
        for (const char *q = bt; *q && n_shapes < 8;) {
            int b = 0, l = 0, used = 0;
            if (sscanf(q, "%d:%d%n", &b, &l, &used) != 2 || b < 1 || l < 1) break;
            shapes[n_shapes][0] = b, shapes[n_shapes][1] = l, n_shapes++;
            q += used;
            if (*q == ',') q++;
        }
    }
    int dev = 0;
    struct cudaDeviceProp prop;
    KT_CK(cudaGetDevice(&dev));
    KT_CK(cudaGetDeviceProperties(&prop, dev));
    /* copy bandwidth in this process: the memory roof the GB/s column is read against */
    double copy_gbs = 0;
    {
        const size_t n = (size_t)1 << 30;
        void *x = kt_dev(NULL, n), *y = kt_dev(NULL, n);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        float best = 1e9f;
        for (int r = 0; r < 5; r++) {
            cudaEventRecord(e0, 0);
            cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice, 0);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (ms < best) best = ms;
        }
        copy_gbs = 2.0 * n / (best * 1e-3) / 1e9;
        cudaFree(x), cudaFree(y);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    printf("bench kc_kda_chunk: %s, %d SMs, H=%d K=%d V=%d taps=%d; device copy %.0f GB/s (read+write)\n", prop.name,
           prop.multiProcessorCount, H, K, V, taps, copy_gbs);
    printf("%-10s %-20s %9s %12s %9s %9s %9s   stages ms: prep intra recur out+tail\n", "case", "variant", "ms",
           "tokens/s", "TFLOP/s", "GB/s", "%copy");
    /* KDA_CHUNK_BENCH_SHAPES="01..." runs only those shape indices, KDA_CHUNK_BENCH_VARIANT="a|b"
     * only the variants whose name contains a or b, KDA_CHUNK_BENCH_NOSTAGES=1 no per-stage times
     * (for a profiler: one call per variant after the warm-up) */
    const char *only_shapes = getenv("KDA_CHUNK_BENCH_SHAPES"), *only_var = getenv("KDA_CHUNK_BENCH_VARIANT");
    const int no_stages = getenv("KDA_CHUNK_BENCH_NOSTAGES") != NULL;
    for (int s = 0; s < n_shapes; s++) {
        if (only_shapes && !strchr(only_shapes, '0' + s)) continue;
        const int B = shapes[s][0], L = shapes[s][1], T = B * L;
        prob p;
        prob_init(&p, H, K, V, taps, T, B, GATE_NORMAL);
        dev_prob d;
        dev_init(&d, &p, B, 2); /* with the split's buffers */
        int r0[MAXI], nt[MAXI], sl[MAXI];
        for (int i = 0; i < B; i++) r0[i] = i * L, nt[i] = L, sl[i] = i;
        set_items(&d, r0, nt, sl, B);
        const struct {
            const char *name;
            variant vr;
        } var[] = {{"tf32 (defaults)", {0, 0, 0, 0, 0, 0, 0}}, {"tf32 bv=16", {0, 16, 0, 0, 0, 0, 0}}, {"tf32 bv=32", {0, 32, 0, 0, 0, 0, 0}},
                   {"tf32 bv=64", {0, 64, 0, 0, 0, 0, 0}},   {"tf32 buffers=1", {0, 0, 0, 1, 0, 0, 0}}, {"tf32 buf=1 bv=32", {0, 32, 0, 1, 0, 0, 0}},
                   {"tf32 split=2", {0, 0, 2, 0, 0, 0, 0}},  {"tf32 split=4", {0, 0, 4, 0, 0, 0, 0}}, {"tf32 split=8", {0, 0, 8, 0, 0, 0, 0}},
                   {"tf32 split=4 buf=1", {0, 0, 4, 1, 0, 0, 0}}, {"tf32 out_split=1", {0, 0, 0, 0, 1, 0, 0}},
                   {"tf32 out_split=2", {0, 0, 0, 0, 2, 0, 0}}, {"tf32 out_split=4", {0, 0, 0, 0, 4, 0, 0}},
                   {"tf32 intra_split=1", {0, 0, 0, 0, 0, 1, 0}},
                   {"tf32 intra_split=2", {0, 0, 0, 0, 0, 2, 0}}, {"tf32 ksplit=off", {0, 0, 0, 0, 0, 0, 1}},
                   {"tf32 ksplit=on", {0, 0, 0, 0, 0, 0, 2}}, {"3xtf32", {1, 0, 0, 0, 0, 0, 0}}, {"simt", {2, 0, 0, 0, 0, 0, 0}}};
        for (int v = 0; v < (int)(sizeof var / sizeof var[0]); v++) {
            if (var[v].vr.gemm == 2 && s > 0) continue; /* the reference path: one point is enough */
            if (only_var && !name_in_list(var[v].name, only_var)) continue;
            kc_kda_chunk_args a;
            fill_args(&a, &p, &d, B, var[v].vr, 0);
            if (kc_kda_chunk(&a, 0)) {
                printf("%dx%-8d %-20s launch refused\n", B, L, var[v].name);
                continue;
            }
            const float ms = time_chunk(&a, reps);
            float st[5] = {0, 0, 0, 0, ms};
            for (int k = 1; k <= (no_stages ? 0 : 4); k++) {
                a.debug_stop_after = k;
                st[k - 1] = time_chunk(&a, reps);
            }
            a.debug_stop_after = 0;
            const cudaError_t e = cudaDeviceSynchronize();
            const double fl = counted_flop(T, B, H, K, V), by = floor_bytes(T, B, H, K, V);
            printf("%dx%-8d %-20s %9.3f %12.0f %9.1f %9.0f %8.1f%%   %.3f %.3f %.3f %.3f%s%s\n", B, L, var[v].name, ms,
                   T / (ms * 1e-3), fl / (ms * 1e-3) / 1e12, by / (ms * 1e-3) / 1e9, 100.0 * by / (ms * 1e-3) / 1e9 / copy_gbs,
                   st[0], st[1] - st[0], st[2] - st[1], st[4] - st[2], e ? " CUDA ERROR: " : "",
                   e ? cudaGetErrorString(e) : "");
            double sb[4];
            stage_bytes(sb, T, B, H, K, V);
            const float sms[4] = {st[0], st[1] - st[0], st[2] - st[1], st[4] - st[2]};
            printf("%-31s stage GB/s (workspace traffic / stage ms): prep %.0f intra %.0f recur %.0f out %.0f\n", "",
                   sb[0] / (sms[0] * 1e6), sb[1] / (sms[1] * 1e6), sb[2] / (sms[2] * 1e6), sb[3] / (sms[3] * 1e6));
        }
        printf("%dx%-8d counted work: %.2f GFLOP, floor bytes %.1f MB, workspace %.1f MB\n", B, L,
               counted_flop(T, B, H, K, V) / 1e9, floor_bytes(T, B, H, K, V) / 1e6, d.work_bytes / 1e6);
        dev_free(&d);
        prob_free(&p);
    }
#ifndef KC_EMU
    /* the per-token kernel on the same shape, for scale (its time includes its low-rank kernel) */
    {
        const int B = 1, L = shapes[0][1], T = B * L;
        prob p;
        prob_init(&p, H, K, V, taps, T, B, GATE_FACTORED);
        dev_prob d;
        dev_init(&d, &p, B, 0);
        const int r0 = 0, nt = L, sl = 0;
        set_items(&d, &r0, &nt, &sl, 1);
        uint16_t *w = kt_dev(NULL, (size_t)p.R * (p.HK + p.HV) * 2);
        KT_CK(cudaMemset(w, 0, (size_t)p.R * (p.HK + p.HV) * 2));
        kc_kda_args a;
        memset(&a, 0, sizeof a);
        a.proj = d.proj, a.ldp = p.ldp, a.off_f0 = p.off_f0, a.off_g0 = p.off_g0, a.off_beta = p.off_beta;
        a.item_row0 = d.meta, a.item_ntok = d.meta + MAXI, a.item_slot = d.meta + 2 * MAXI, a.n_items = 1;
        a.state = d.state, a.slot_stride = p.slot_stride, a.convw = d.convw, a.f1t = w, a.g1t = w + (size_t)p.R * p.HK;
        a.g_bias = d.gb, a.A_log = d.A_log, a.dt_bias = d.dtb, a.onorm = d.onorm, a.eps = p.eps;
        a.H = H, a.K = K, a.V = V, a.R = p.R, a.taps = taps, a.y = d.y, a.ldy = p.HV;
        a.lowrank = d.lowrank, a.lowrank_rows = T;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        kc_kda_step(&a, 0);
        cudaEventRecord(e0, 0);
        kc_kda_step(&a, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("%dx%-8d %-20s %9.3f %12.0f   (kc_kda_step, per token)\n", B, L, "per-token", ms, T / (ms * 1e-3));
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cudaFree(w);
        dev_free(&d);
        prob_free(&p);
    }
#endif
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("bench: CUDA error %s\n", cudaGetErrorString(e));
        return 1;
    }
    return 0;
}

/* ---- the cases ---- */
static void add_single(kcase *c, const char *name, int H, int K, int taps, int T, int gate, int gemm)
{
    memset(c, 0, sizeof *c);
    c->name = name, c->H = H, c->K = K, c->V = K, c->taps = taps, c->gate = gate, c->vr.gemm = gemm;
    c->n_items = 1, c->ntok[0] = T, c->slot[0] = 1, c->n_slots = 3;
}

/* bf16 state storage (state_bf16): the same fp32 arithmetic between one
 * read and one rounded write, so from a bf16-representable initial state the
 * outputs and conv tails equal the fp32-state run's bit for bit and the
 * stored S is exactly that run's S rounded to bf16 (the fp32 run itself is
 * checked against the reference above). Items over several chunks, a
 * padding item, an empty one. */
static int run_bf16_state(int H, int K, int V, int taps)
{
    const int ntok[] = {300, 1, 65, 0, 17, 0}, slot[] = {2, 0, -1, 3, 1}, n_items = 5, n_slots = 4;
    int row0[5], T = 0;
    for (int i = 0; i < n_items; i++) row0[i] = T, T += ntok[i];
    prob p;
    prob_init(&p, H, K, V, taps, T, n_slots, GATE_NORMAL);
    const size_t SKV = (size_t)H * K * V, tail = (size_t)(taps - 1) * p.C;
    for (int sl = 0; sl < n_slots; sl++) kt_bf16_round(p.state + sl * p.slot_stride, SKV);
    dev_prob d;
    dev_init(&d, &p, n_items, 0);
    set_items(&d, row0, ntok, slot, n_items);
    kc_kda_chunk_args a;
    const variant vr = {0};
    fill_args(&a, &p, &d, n_items, vr, 0);
    int fail = kc_kda_chunk(&a, 0) != 0;
    KT_CK(cudaDeviceSynchronize());
    float *yf = kt_get_bf16(d.y, (size_t)T * p.HV), *sf = malloc(p.slot_stride * n_slots * 4);
    kt_get(sf, d.state, p.slot_stride * n_slots * 4);
    /* the bf16 layout: S as bf16 (SKV / 2 floats), the fp32 tail, 5 guard floats */
    const size_t lay = SKV / 2 + tail, stride = lay + 5;
    float *hb = malloc(stride * n_slots * 4);
    kt_fill(hb, stride * n_slots, 0.3f);
    for (int sl = 0; sl < n_slots; sl++) {
        uint16_t *sb = (uint16_t *)(hb + sl * stride);
        for (size_t e = 0; e < SKV; e++) sb[e] = f32_to_bf16(p.state[sl * p.slot_stride + e]);
        memcpy(hb + sl * stride + SKV / 2, p.state + sl * p.slot_stride + SKV, tail * 4);
    }
    float *db = kt_dev(hb, stride * n_slots * 4);
    KT_CK(cudaMemset(d.y, 0xff, (size_t)T * p.HV * 2)); /* poisoned again */
    a.state = db, a.slot_stride = stride, a.state_bf16 = 1;
    fail |= kc_kda_chunk(&a, 0) != 0;
    a.seq_split = 2;
    fail |= kc_kda_chunk(&a, 0) != -5; /* the split keeps fp32 state: refused */
    KT_CK(cudaDeviceSynchronize());
    float *yb = kt_get_bf16(d.y, (size_t)T * p.HV), *gb = malloc(stride * n_slots * 4);
    kt_get(gb, db, stride * n_slots * 4);
    long y_diff = 0, s_diff = 0, t_diff = 0, g_diff = 0;
    for (size_t e = 0; e < (size_t)T * p.HV; e++) y_diff += memcmp(&yf[e], &yb[e], 4) != 0;
    for (int sl = 0; sl < n_slots; sl++) {
        const uint16_t *sb = (const uint16_t *)(gb + sl * stride);
        for (size_t e = 0; e < SKV; e++) s_diff += sb[e] != f32_to_bf16(sf[sl * p.slot_stride + e]);
        t_diff += memcmp(gb + sl * stride + SKV / 2, sf + sl * p.slot_stride + SKV, tail * 4) != 0;
        g_diff += memcmp(gb + sl * stride + lay, hb + sl * stride + lay, 5 * 4) != 0;
    }
    printf("bf16 state H=%d K=%d V=%d taps=%d: outputs differing %ld, stored S not the rounded fp32 S %ld, "
           "tails differing %ld, guards touched %ld\n", H, K, V, taps, y_diff, s_diff, t_diff, g_diff);
    fail |= y_diff || s_diff || t_diff || g_diff;
    if (fail) g_failed_checks++;
    free(yf), free(sf), free(hb), free(yb), free(gb);
    cudaFree(db);
    dev_free(&d);
    prob_free(&p);
    return fail;
}

int main(int argc, char **argv)
{
    kt_skip_without_gpu();
    const char *pdl = getenv("KDA_PDL");
    kc_set_pdl(!(pdl && !strcmp(pdl, "0")));
    const char *qk = getenv("KDA_CHUNK_TEST_QUICK");
    g_quick = qk ? atoi(qk) : 0;
    if (argc > 1 && !strcmp(argv[1], "--bench")) return run_bench();

    static kcase cs[96];
    static char names[96][48];
    int n = 0;
    /* single items over the chunk boundaries, K = 16 / 64 / 128 */
    {
        const int Ts[] = {1, 15, 16, 17, 63, 64, 65, 1000, 8192};
        for (int i = 0; i < 9; i++) {
            snprintf(names[n], sizeof names[n], "single K=16 T=%d", Ts[i]);
            add_single(&cs[n], names[n], 3, 16, 4, Ts[i], GATE_NORMAL, 0), n++;
        }
        const int T64[] = {1, 17, 64, 65, 1000, 0};
        for (int i = 0; i < 5; i++) {
            snprintf(names[n], sizeof names[n], "single K=64 T=%d", T64[i]);
            add_single(&cs[n], names[n], 2, 64, 4, T64[i], GATE_NORMAL, 0), n++;
        }
        const int T128[] = {1, 63, 65, 1000, 8192, 0};
        for (int i = 0; i < 5; i++) {
            snprintf(names[n], sizeof names[n], "single K=128 T=%d", T128[i]);
            add_single(&cs[n], names[n], 2, 128, 4, T128[i], GATE_NORMAL, 0), n++;
        }
    }
    add_single(&cs[n], "strong decay K=64 T=1000", 2, 64, 4, 1000, GATE_STRONG, 0), n++;
    add_single(&cs[n], "strong decay K=128 T=300", 2, 128, 4, 300, GATE_STRONG, 0), n++;
    add_single(&cs[n], "taps=1 K=32 T=130", 2, 32, 1, 130, GATE_NORMAL, 0), n++;
    add_single(&cs[n], "taps=2 K=16 T=70", 2, 16, 2, 70, GATE_NORMAL, 0), n++;
    add_single(&cs[n], "taps=3 K=64 T=129", 2, 64, 3, 129, GATE_NORMAL, 0), n++;
    add_single(&cs[n], "V=2K K=32 T=200", 2, 32, 4, 200, GATE_NORMAL, 0), cs[n].V = 64, n++;
    add_single(&cs[n], "V=2K K=64 T=150 diag", 2, 64, 4, 150, GATE_NORMAL, 0), cs[n].V = 128, cs[n].diag = 1, n++;
    /* varlen batches with padding items, an empty item and unused slots */
    const int varlen64 = n;
    {
        kcase *c = &cs[n++];
        memset(c, 0, sizeof *c);
        c->name = "varlen K=64 diag", c->H = 2, c->K = 64, c->V = 64, c->taps = 4, c->n_slots = 8, c->diag = 1;
        const int nt[] = {1, 2000, 17, 64, 3, 130, 0, 500, 65, 9};
        const int sl[] = {0, 2, -1, 3, 4, -1, 5, 6, -1, 7};
        c->n_items = 10;
        memcpy(c->ntok, nt, sizeof nt), memcpy(c->slot, sl, sizeof sl);
    }
    {
        kcase *c = &cs[n++];
        memset(c, 0, sizeof *c);
        c->name = "varlen K=128 H=4", c->H = 4, c->K = 128, c->V = 128, c->taps = 4, c->n_slots = 6;
        const int nt[] = {700, 1, 65, 1200, 40, 2};
        const int sl[] = {5, 0, -1, 2, 3, -1};
        c->n_items = 6;
        memcpy(c->ntok, nt, sizeof nt), memcpy(c->slot, sl, sizeof sl);
    }
    {
        kcase *c = &cs[n++];
        memset(c, 0, sizeof *c);
        c->name = "varlen K=16 30 items", c->H = 2, c->K = 16, c->V = 16, c->taps = 4, c->n_slots = 32;
        c->n_items = 30;
        kt_rng = 777;
        for (int i = 0; i < 30; i++) c->ntok[i] = 1 + (int)(kt_u01() * 300), c->slot[i] = i % 7 == 3 ? -1 : i;
    }
    /* continuation: one sequence in several calls vs one reference pass */
    {
        kcase *c = &cs[n];
        add_single(c, "continue K=128 100+900", 2, 128, 4, 1000, GATE_NORMAL, 0);
        c->pieces = 2, c->piece_len[0] = 100, c->piece_len[1] = 900, n++;
        c = &cs[n];
        add_single(c, "continue K=128 bv=64 100+900", 2, 128, 4, 1000, GATE_NORMAL, 0), c->vr.bv = 64;
        c->pieces = 2, c->piece_len[0] = 100, c->piece_len[1] = 900, n++;
        c = &cs[n];
        add_single(c, "continue K=16 1+2+5+64+100+1", 2, 16, 4, 173, GATE_NORMAL, 0);
        c->pieces = 6;
        const int pl[] = {1, 2, 5, 64, 100, 1};
        memcpy(c->piece_len, pl, sizeof pl), n++;
    }
    /* against the per-token GPU kernel on the same inputs */
    {
        kcase *c = &cs[n++];
        memset(c, 0, sizeof *c);
        c->name = "vs kc_kda_step K=64", c->H = 2, c->K = 64, c->V = 64, c->taps = 4, c->gate = GATE_FACTORED;
        c->n_slots = 4, c->vs_step = 1, c->n_items = 3;
        c->ntok[0] = 300, c->ntok[1] = 1, c->ntok[2] = 70, c->slot[0] = 1, c->slot[1] = 3, c->slot[2] = 0;
        c = &cs[n++];
        add_single(c, "vs kc_kda_step K=128 T=1000", 2, 128, 4, 1000, GATE_FACTORED, 0);
        c->vs_step = 1;
    }
    /* the other matrix paths and value blocks */
    {
        kcase *c = &cs[n];
        cs[n] = cs[varlen64];
        c->name = "varlen K=64 3xtf32", c->vr.gemm = KC_KDA_GEMM_3XTF32, c->diag = 0, n++;
        c = &cs[n];
        cs[n] = cs[varlen64];
        c->name = "varlen K=64 simt diag", c->vr.gemm = KC_KDA_GEMM_SIMT, c->diag = 1, n++;
        c = &cs[n];
        add_single(c, "single K=128 T=1000 3xtf32", 2, 128, 4, 1000, GATE_NORMAL, KC_KDA_GEMM_3XTF32), n++;
        c = &cs[n];
        add_single(c, "single K=128 T=1000 simt", 2, 128, 4, 1000, GATE_NORMAL, KC_KDA_GEMM_SIMT), n++;
        for (int bv = 16; bv <= 64; bv *= 2) {
            c = &cs[n];
            snprintf(names[n], sizeof names[n], "single K=128 T=700 bv=%d", bv);
            add_single(c, names[n], 2, 128, 4, 700, GATE_NORMAL, 0), c->vr.bv = bv, n++;
        }
        /* bv = 64 walks on mma.sync (the others through wmma): packed items, continuation,
         * V = 2K, one buffer, K = 64 (two warps per state row tile) */
        c = &cs[n];
        cs[n] = cs[varlen64];
        c->name = "varlen K=64 bv=64", c->vr.bv = 64, c->diag = 0, n++;
        c = &cs[n];
        add_single(c, "V=2K K=64 T=300 bv=64", 2, 64, 4, 300, GATE_NORMAL, 0), c->V = 128, c->vr.bv = 64, n++;
        c = &cs[n];
        add_single(c, "buffers=1 K=128 T=700 bv=64", 2, 128, 4, 700, GATE_NORMAL, 0), c->vr.nbuf = 1, c->vr.bv = 64, n++;
        c = &cs[n];
        add_single(c, "single K=64 T=333 3xtf32 bv=16", 2, 64, 4, 333, GATE_NORMAL, KC_KDA_GEMM_3XTF32), c->vr.bv = 16, n++;
        c = &cs[n];
        add_single(c, "buffers=1 K=128 T=1000", 2, 128, 4, 1000, GATE_NORMAL, 0), c->vr.nbuf = 1, n++;
        c = &cs[n];
        add_single(c, "buffers=1 K=16 T=150", 2, 16, 4, 150, GATE_NORMAL, 0), c->vr.nbuf = 1, n++;
        /* BV = 16's product split over two warps: auto takes it on these small grids, so force it off too */
        c = &cs[n];
        add_single(c, "bv=16 ksplit=off K=128 T=700", 2, 128, 4, 700, GATE_NORMAL, 0), c->vr.bv = 16, c->vr.ksplit = 1, n++;
        c = &cs[n];
        cs[n] = cs[varlen64];
        c->name = "varlen K=64 bv=16 ksplit=off", c->vr.bv = 16, c->vr.ksplit = 1, c->diag = 0, n++;
        c = &cs[n];
        cs[n] = cs[varlen64];
        c->name = "varlen K=64 bv=16 ksplit=on", c->vr.bv = 16, c->vr.ksplit = 2, c->diag = 0, n++;
        /* the output stage's row split: auto picks 4 on these small grids, so force 1 and 2 */
        c = &cs[n];
        add_single(c, "out_split=1 K=128 T=150", 2, 128, 4, 150, GATE_NORMAL, 0), c->vr.osplit = 1, c->small = 1, n++;
        c = &cs[n];
        add_single(c, "out_split=2 K=64 T=100", 2, 64, 4, 100, GATE_NORMAL, 0), c->vr.osplit = 2, c->small = 1, n++;
        c = &cs[n];
        cs[n] = cs[varlen64];
        c->name = "varlen K=64 out_split=2", c->vr.osplit = 2, c->diag = 0, n++;
        /* the intra stage in two launches: auto picks it on these small grids (K >= 64), so force it off too */
        c = &cs[n];
        add_single(c, "intra_split=1 K=128 T=150", 2, 128, 4, 150, GATE_NORMAL, 0), c->vr.isplit = 1, c->small = 1, n++;
        c = &cs[n];
        add_single(c, "intra_split=2 V=2K K=64 T=130", 2, 64, 4, 130, GATE_NORMAL, 0), c->V = 128, c->vr.isplit = 2;
        c->small = 1, n++;
        c = &cs[n];
        add_single(c, "intra_split=2 simt K=64 T=90", 2, 64, 4, 90, GATE_NORMAL, KC_KDA_GEMM_SIMT), c->vr.isplit = 2;
        c->small = 1, n++;
        /* short items of every live-block count (1..4 16-row blocks, the lm-eval continuation
         * shape), split and fused intra */
        for (int isp = 1; isp <= 2; isp++) {
            c = &cs[n];
            memset(c, 0, sizeof *c);
            c->name = isp == 1 ? "short items K=128 intra_split=1" : "short items K=128 intra_split=2";
            c->H = 2, c->K = 128, c->V = 128, c->taps = 4, c->n_slots = 8, c->small = 1, c->vr.isplit = isp;
            const int nt[] = {17, 9, 33, 1, 48, 49, 16, 64};
            const int sl[] = {0, 1, 2, 3, 4, 5, 6, 7};
            c->n_items = 8;
            memcpy(c->ntok, nt, sizeof nt), memcpy(c->slot, sl, sizeof sl);
            n++;
        }
    }
    /* the chunk table planned by an earlier call (the backend plans once per pass) */
    {
        kcase *c = &cs[n++];
        memset(c, 0, sizeof *c);
        c->name = "plan reused varlen K=64", c->H = 2, c->K = 64, c->V = 64, c->taps = 4, c->n_slots = 6;
        const int nt[] = {1, 70, 17, 64, 0, 30};
        const int sl[] = {0, 2, -1, 3, 4, 5};
        c->n_items = 6, c->plan_reuse = 1, c->small = 1;
        memcpy(c->ntok, nt, sizeof nt), memcpy(c->slot, sl, sizeof sl);
        c = &cs[n];
        add_single(c, "plan reused K=128 T=130", 2, 128, 4, 130, GATE_NORMAL, 0), c->plan_reuse = 1, c->small = 1, n++;
    }
    /* the sequence split: segments of >= 4 chunks, mixed with unsplit items */
    {
        kcase *c = &cs[n];
        add_single(c, "split=2 K=16 T=520", 2, 16, 4, 520, GATE_NORMAL, 0), c->vr.split = 2, c->small = 1, n++;
        c = &cs[n];
        add_single(c, "split=4 K=128 T=2000 diag", 2, 128, 4, 2000, GATE_NORMAL, 0), c->vr.split = 4, c->diag = 1, n++;
        c = &cs[n];
        add_single(c, "split=4 K=128 T=2000 bv=64", 2, 128, 4, 2000, GATE_NORMAL, 0), c->vr.split = 4, c->vr.bv = 64, n++;
        c = &cs[n];
        cs[n] = cs[varlen64];
        c->name = "split=3 varlen K=64", c->vr.split = 3, c->diag = 0, n++;
        c = &cs[n];
        add_single(c, "split=8 K=16 T=8192", 3, 16, 4, 8192, GATE_NORMAL, 0), c->vr.split = 8, n++;
        c = &cs[n];
        add_single(c, "split=4 3xtf32 K=64 T=1500", 2, 64, 4, 1500, GATE_NORMAL, KC_KDA_GEMM_3XTF32), c->vr.split = 4, n++;
        c = &cs[n];
        add_single(c, "split=16 strong decay K=128 T=4100", 2, 128, 4, 4100, GATE_STRONG, 0), c->vr.split = 16, n++;
        c = &cs[n];
        add_single(c, "split=4 bv=64 K=128 T=1000", 2, 128, 4, 1000, GATE_NORMAL, 0), c->vr.split = 4, c->vr.bv = 64, n++;
        c = &cs[n];
        add_single(c, "split=2 V=2K K=32 T=600", 2, 32, 4, 600, GATE_NORMAL, 0), c->V = 64, c->vr.split = 2, n++;
        c = &cs[n];
        add_single(c, "split=4 buffers=1 K=64 T=1100", 2, 64, 4, 1100, GATE_NORMAL, 0), c->vr.split = 4, c->vr.nbuf = 1, n++;
        c = &cs[n];
        add_single(c, "split=4 continue K=64 700+600+5", 2, 64, 4, 1305, GATE_NORMAL, 0), c->vr.split = 4;
        c->pieces = 3, c->piece_len[0] = 700, c->piece_len[1] = 600, c->piece_len[2] = 5, n++;
    }

    const char *only = getenv("KDA_CHUNK_TEST_ONLY");
    int failed = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        int T = 0;
        for (int j = 0; j < cs[i].n_items; j++) T += cs[i].ntok[j];
        if ((g_quick == 1 && T > 2100) || (g_quick >= 2 && T > 200 && !cs[i].small)) continue;
        if (only && !strstr(cs[i].name, only)) continue;
        kt_rng = 0x12345678abcdefull + 7919ull * (uint64_t)i;
        failed += run_case(&cs[i]);
        ran++;
    }
    failed += run_bad_args();
    ran++;
    if (!only || strstr("bf16 state", only)) {
        failed += run_bf16_state(2, 128, 128, 4) + run_bf16_state(3, 64, 64, 3) + run_bf16_state(2, 16, 32, 4);
        ran += 3;
    }
    printf("test_kda_chunk: %d cases, %d failed (%d failed checks)\n", ran, failed, g_failed_checks);
    printf(failed ? "[  FAILED  ] test_kda_chunk\n" : "[  PASSED  ] test_kda_chunk\n");
    return failed ? 1 : 0;
}

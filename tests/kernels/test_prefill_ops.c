/*
 * test_prefill_ops.c - the prompt-chunk kernels of prefill_ops.h against the
 * fp32 reference:
 *   kc_attn_prefill  vs gqa_attention_f32 (engine/cpu_ops.c), on a paged cache
 *                    whose blocks are scattered through the pool and whose
 *                    every unused byte (other layer, rows past a context,
 *                    spare blocks, unused table entries) is NaN, so any read
 *                    outside the context shows in the output;
 *   kc_logprob_rows  vs logsumexp_f32 and sampling_top_n (engine/sampling.c).
 * Inputs random, outputs poisoned (NaN) before each run. Every case prints
 * its error and its worst (item, row, head); a failing case is counted and
 * the run goes on; each test asserts no failures at the end.
 *
 * Tolerances. Attention: rel L2 per item <= 5e-3 and per (row, head) <= 2e-2
 * (q, P and the output rounded to bf16 against an fp32 reference that keeps
 * q and p in fp32; K/V are bf16 in both). Log-probs: ids exact, lse, target
 * and top log-probs within 1e-6 * max(1, |lse|) (the sum is double on both
 * sides; what is left is fp32 exp and log rounding).
 *
 * `test_prefill_ops TEST_NAME` runs the tests matching the name (cmocka filter).
 * `test_prefill_ops --bench`: the benchmarks
 * instead, CUDA events, median of the repetitions, one "BENCH {json}" line
 * per point (scripts/gpu-prefill-ops.sh collects them).
 * Skips (77) without a GPU.
 *
 * Built with -DKC_EMU (meson: prefill_ops_emu) the same tests run on the CPU
 * emulator of emu/ (kernels/ops_attn_prefill.cu and ops_logprob.cu compiled as
 * C++) at smaller sizes, without the q/k/v pipeline test (ops_gqa.cu) and the
 * benchmarks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cuda_ops.h"
#include "kt_util.h"
#include "prefill_ops.h"
#include "sampling.h"

#define ATTN_TOL_ITEM 5e-3
#define ATTN_TOL_HEAD 2e-2
#define LP_TOL 1e-6

static int n_fail; /* failed cases of the current test */

static void case_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_fail++;
}

static int all_bytes(const void *p, size_t n, unsigned char b)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != b) return 0;
    return 1;
}

/* ---- attention fixture: a pool, a block table, q, gate, items ---- */
typedef struct {
    int ntok, pos0, slot;
} item_spec;

typedef struct {
    int Hq, Hkv, hd, blk, n_gqa, layer, T, n_items, n_slots, max_blocks, n_blocks, ldp, off_gate, ldo, max_ctx;
    size_t layer_elems, block_elems;
    int32_t row0[64], ntok[64], pos0[64], slot[64];
    int32_t *table; /* [n_slots, max_blocks] */
    uint16_t *kv;   /* the pool, host copy */
    float *q;       /* [T, Hq, hd] */
    float *proj;    /* [T, ldp], the gate at off_gate (or NULL) */
    kc_gqa_args a;
    int32_t *d_row0, *d_ntok, *d_pos0, *d_slot;
    uint16_t *d_out; /* [T, ldo] */
} attn_fix;

/* Rows: the items in order, then extra_rows rows of no item. Blocks of each
 * slot are drawn from a shuffled pool; NaN everywhere but the context. */
static void fix_init(attn_fix *f, int Hq, int Hkv, int hd, int gate, const item_spec *items, int n_items,
                     int extra_rows, float qscale, int n_gqa)
{
    memset(f, 0, sizeof *f);
    f->Hq = Hq, f->Hkv = Hkv, f->hd = hd, f->blk = 16, f->n_gqa = n_gqa, f->layer = n_gqa - 1;
    f->n_items = n_items;
    int ctx[64] = {0}, need = 0;
    for (int i = 0; i < n_items; i++) {
        f->row0[i] = f->T;
        f->ntok[i] = items[i].ntok, f->pos0[i] = items[i].pos0, f->slot[i] = items[i].slot;
        f->T += items[i].ntok;
        if (items[i].slot >= 0) {
            ctx[items[i].slot] = items[i].pos0 + items[i].ntok;
            if (items[i].slot + 1 > f->n_slots) f->n_slots = items[i].slot + 1;
            if (ctx[items[i].slot] > f->max_ctx) f->max_ctx = ctx[items[i].slot];
        }
    }
    f->T += extra_rows;
    if (f->n_slots == 0) f->n_slots = 1;
    for (int s = 0; s < f->n_slots; s++) {
        const int nb = (ctx[s] + f->blk - 1) / f->blk;
        need += nb;
        if (nb + 1 > f->max_blocks) f->max_blocks = nb + 1;
    }
    f->n_blocks = need + 3; /* spare blocks stay NaN */
    f->layer_elems = (size_t)2 * Hkv * f->blk * hd;
    f->block_elems = f->layer_elems * n_gqa;
    int *perm = malloc((size_t)f->n_blocks * sizeof *perm);
    for (int i = 0; i < f->n_blocks; i++) perm[i] = i;
    for (int i = f->n_blocks - 1; i > 0; i--) {
        const int j = (int)(kt_u01() * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const int poison_block = perm[f->n_blocks - 1];
    f->table = malloc((size_t)f->n_slots * f->max_blocks * 4);
    for (int i = 0; i < f->n_slots * f->max_blocks; i++) f->table[i] = poison_block;
    f->kv = malloc(f->block_elems * f->n_blocks * 2);
    memset(f->kv, 0xFF, f->block_elems * f->n_blocks * 2);
    int next = 0;
    for (int s = 0; s < f->n_slots; s++)
        for (int b = 0; b * f->blk < ctx[s]; b++) f->table[s * f->max_blocks + b] = perm[next++];
    for (int s = 0; s < f->n_slots; s++)
        for (int p = 0; p < ctx[s]; p++) {
            const size_t base = (size_t)f->table[s * f->max_blocks + p / f->blk] * f->block_elems + f->layer * f->layer_elems;
            for (int h = 0; h < 2 * Hkv; h++) /* K heads then V heads */
                for (int d = 0; d < hd; d++) f->kv[base + ((size_t)h * f->blk + p % f->blk) * hd + d] = f32_to_bf16(kt_randn());
        }
    free(perm);
    f->q = malloc((size_t)f->T * Hq * hd * 4);
    kt_fill(f->q, (size_t)f->T * Hq * hd, qscale);
    f->ldp = Hq * hd + 5; /* odd: the gate is read by element */
    f->off_gate = gate ? 3 : -1;
    if (gate) {
        f->proj = malloc((size_t)f->T * f->ldp * 4);
        kt_fill(f->proj, (size_t)f->T * f->ldp, 1.5f);
    }
    f->ldo = Hq * hd + 8; /* 8 columns that must stay untouched */

    kc_gqa_args *a = &f->a;
    a->proj = f->proj ? kt_dev(f->proj, (size_t)f->T * f->ldp * 4) : NULL;
    a->ldp = f->ldp, a->off_gate = f->off_gate;
    a->T = f->T;
    a->Hq = Hq, a->Hkv = Hkv, a->hd = hd, a->rope_dim = hd;
    a->q = kt_dev(f->q, (size_t)f->T * Hq * hd * 4);
    a->kv = kt_dev(f->kv, f->block_elems * f->n_blocks * 2);
    a->block_stride = f->block_elems, a->layer_off = f->layer * f->layer_elems, a->blk = f->blk;
    a->block_table = kt_dev(f->table, (size_t)f->n_slots * f->max_blocks * 4);
    a->max_blocks = f->max_blocks;
    f->d_row0 = kt_dev(f->row0, (size_t)n_items * 4);
    f->d_ntok = kt_dev(f->ntok, (size_t)n_items * 4);
    f->d_pos0 = kt_dev(f->pos0, (size_t)n_items * 4);
    f->d_slot = kt_dev(f->slot, (size_t)n_items * 4);
    f->d_out = kt_dev_poison((size_t)f->T * f->ldo * 2);
}

static void fix_free(attn_fix *f)
{
    free(f->table), free(f->kv), free(f->q), free(f->proj);
    cudaFree((void *)f->a.proj), cudaFree(f->a.q), cudaFree(f->a.kv), cudaFree((void *)f->a.block_table);
    cudaFree(f->d_row0), cudaFree(f->d_ntok), cudaFree(f->d_pos0), cudaFree(f->d_slot), cudaFree(f->d_out);
}

/* K, V of slot s, positions 0..n-1, as [n, Hkv, hd] fp32 */
static void fix_gather(const attn_fix *f, int s, int n, float *kc, float *vc)
{
    const int KD = f->Hkv * f->hd;
    for (int p = 0; p < n; p++) {
        const size_t base = (size_t)f->table[s * f->max_blocks + p / f->blk] * f->block_elems + f->layer * f->layer_elems;
        for (int h = 0; h < f->Hkv; h++)
            for (int d = 0; d < f->hd; d++) {
                kc[(size_t)p * KD + h * f->hd + d] = bf16_to_f32(f->kv[base + ((size_t)h * f->blk + p % f->blk) * f->hd + d]);
                vc[(size_t)p * KD + h * f->hd + d] =
                    bf16_to_f32(f->kv[base + ((size_t)(f->Hkv + h) * f->blk + p % f->blk) * f->hd + d]);
            }
    }
}

/* Runs kc_attn_prefill on the fixture (out poisoned first) and compares
 * with the reference on every check_every-th row of each item (and its
 * last). split_keys > 0 forces that split length; variant > 0 picks the
 * kernel variant; max_ctx > 0 overrides the bound passed in. */
static void attn_check(attn_fix *f, const char *name, int split_keys, int variant, int max_ctx, int check_every)
{
    const int Hq = f->Hq, hd = f->hd, QD = Hq * hd, KD = f->Hkv * hd;
    /* max_ctx < 0: pass 0 (the kernel then assumes the table's capacity) */
    const int mc = max_ctx < 0 ? 0 : max_ctx > 0 ? max_ctx : f->max_ctx;
    const int mc_ws = mc > 0 ? mc : f->max_blocks * f->blk;
    const kc_attn_prefill_tuning tune = {variant, split_keys, 0};
    size_t wb = kc_attn_prefill_workspace(f->T, f->n_items, Hq, hd, mc_ws);
    if (split_keys > 0) wb = (size_t)((mc_ws + split_keys - 1) / split_keys) * f->T * Hq * (hd + 2) * 4;
    void *work = kt_dev_poison(wb ? wb : 16);
    kc_attn_prefill_plan plan;
    const int prc = kc_attn_prefill_plan_for(&f->a, f->n_items, mc, wb, &tune, &plan);
    KT_CK(cudaMemset(f->d_out, 0xFF, (size_t)f->T * f->ldo * 2));
    const int rc = kc_attn_prefill(&f->a, f->d_row0, f->d_ntok, f->d_pos0, f->d_slot, f->n_items, mc, f->d_out, f->ldo,
                                   work, wb, &tune, 0);
    const cudaError_t ce = cudaDeviceSynchronize();
    printf("attn %s: Hq=%d Hkv=%d hd=%d gate=%d window=%d T=%d items=%d | variant %d warps %d tile %d tokens, nsplit %d "
           "(split %d keys), grid %dx%dx%d\n",
           name, Hq, f->Hkv, hd, f->off_gate >= 0, f->a.window, f->T, f->n_items, plan.variant, plan.warps, plan.tile_tokens,
           plan.nsplit, plan.nsplit > 1 ? plan.split_keys : 0, plan.grid_x, plan.grid_y, plan.grid_z);
    if (prc || rc || ce != cudaSuccess) {
        case_fail("attn %s: plan rc %d, launch rc %d, device %s", name, prc, rc, cudaGetErrorString(ce));
        cudaFree(work);
        if (ce != cudaSuccess) {
            fprintf(stderr, "device error is sticky: stopping\n");
            exit(1);
        }
        return;
    }
    uint16_t *got16 = malloc((size_t)f->T * f->ldo * 2);
    kt_get(got16, f->d_out, (size_t)f->T * f->ldo * 2);
    float *got = malloc((size_t)f->T * QD * 4);
    for (int t = 0; t < f->T; t++)
        for (int c = 0; c < QD; c++) got[(size_t)t * QD + c] = bf16_to_f32(got16[(size_t)t * f->ldo + c]);

    /* rows of no live item, and the ldo padding, untouched */
    char *live = calloc((size_t)f->T, 1);
    for (int i = 0; i < f->n_items; i++)
        if (f->slot[i] >= 0) memset(live + f->row0[i], 1, (size_t)f->ntok[i]);
    int bad_pad = 0;
    for (int t = 0; t < f->T; t++) {
        if (!live[t] && !all_bytes(got16 + (size_t)t * f->ldo, (size_t)QD * 2, 0xFF)) bad_pad++;
        if (!all_bytes(got16 + (size_t)t * f->ldo + QD, (size_t)(f->ldo - QD) * 2, 0xFF)) bad_pad++;
    }
    if (bad_pad) case_fail("attn %s: %d rows written outside the live items / past Hq*hd", name, bad_pad);

    for (int i = 0; i < f->n_items; i++) {
        if (f->slot[i] < 0) continue;
        const int n = f->ntok[i], p0 = f->pos0[i], ctx = p0 + n;
        float *kc = malloc((size_t)ctx * KD * 4), *vc = malloc((size_t)ctx * KD * 4);
        fix_gather(f, f->slot[i], ctx, kc, vc);
        int nonfinite = 0;
        for (size_t e = (size_t)f->row0[i] * QD; e < (size_t)(f->row0[i] + n) * QD; e++) nonfinite += !isfinite(got[e]);
        int *rows = malloc((size_t)n * sizeof *rows), nr = 0;
        for (int t = 0; t < n; t++)
            if (t % check_every == 0 || t == n - 1) rows[nr++] = t;
        float *ref = malloc((size_t)nr * QD * 4), *gsel = malloc((size_t)nr * QD * 4);
#pragma omp parallel for schedule(dynamic, 4)
        for (int j = 0; j < nr; j++) {
            const int t = rows[j], r = f->row0[i] + t;
            float *o = ref + (size_t)j * QD;
            gqa_attention_window_f32(o, f->q + (size_t)r * QD, kc, vc, 1, p0 + t, Hq, f->Hkv, hd, f->a.window);
            if (f->off_gate >= 0)
                for (int c = 0; c < QD; c++) o[c] *= sigmoid_f32(f->proj[(size_t)r * f->ldp + f->off_gate + c]);
            memcpy(gsel + (size_t)j * QD, got + (size_t)r * QD, (size_t)QD * 4);
        }
        const double e = kt_rel(gsel, ref, (size_t)nr * QD);
        double worst = 0;
        int wr = -1, wh = -1;
        for (int j = 0; j < nr; j++)
            for (int h = 0; h < Hq; h++) {
                const double eh = kt_rel(gsel + (size_t)j * QD + h * hd, ref + (size_t)j * QD + h * hd, hd);
                if (!(eh <= worst)) worst = eh, wr = rows[j], wh = h; /* NaN / inf first */
            }
        printf("  item %d (pos0 %d, %d tokens, %d rows checked): rel %.2e, worst row %d head %d rel %.2e%s\n", i, p0, n,
               nr, e, wr, wh, worst, nonfinite ? " NON-FINITE" : "");
        if (!(e <= ATTN_TOL_ITEM) || !(worst <= ATTN_TOL_HEAD) || nonfinite)
            case_fail("attn %s item %d (pos0 %d, %d tokens): rel %.2e (tol %.0e), worst (row %d, head %d) %.2e (tol %.0e), "
                 "%d non-finite",
                 name, i, p0, n, e, ATTN_TOL_ITEM, wr, wh, worst, ATTN_TOL_HEAD, nonfinite);
        free(kc), free(vc), free(rows), free(ref), free(gsel);
    }
    if (plan.nsplit > 1) { /* the split path again: the same bytes (a cached prefix's exactness relies on it) */
        KT_CK(cudaMemset(f->d_out, 0xFF, (size_t)f->T * f->ldo * 2));
        const int rc2 = kc_attn_prefill(&f->a, f->d_row0, f->d_ntok, f->d_pos0, f->d_slot, f->n_items, mc, f->d_out,
                                        f->ldo, work, wb, &tune, 0);
        KT_CK(cudaDeviceSynchronize());
        uint16_t *got2 = malloc((size_t)f->T * f->ldo * 2);
        kt_get(got2, f->d_out, (size_t)f->T * f->ldo * 2);
        size_t ndiff = 0;
        for (size_t e = 0; e < (size_t)f->T * f->ldo; e++) ndiff += got2[e] != got16[e];
        printf("  rerun: %zu of %zu values differ\n", ndiff, (size_t)f->T * f->ldo);
        if (rc2 || ndiff) case_fail("attn %s: a second run (rc %d) differs in %zu values", name, rc2, ndiff);
        free(got2);
    }
    free(got16), free(got), free(live);
    cudaFree(work);
}

static void attn_case(const char *name, int Hq, int Hkv, int hd, int gate, const item_spec *items, int n_items,
                      int split_keys, int variant, int check_every)
{
    attn_fix f;
    fix_init(&f, Hq, Hkv, hd, gate, items, n_items, 3, 1.0f, 2);
    attn_check(&f, name, split_keys, variant, 0, check_every);
    fix_free(&f);
}

static void test_attn_prefill_chunk_lengths_at_the_1p7b_shape(void **st)
{
    (void)st;
    n_fail = 0;
    /* mixed lengths and a padding item in one call, no prefix */
#ifndef KC_EMU
    const item_spec mixed[] = {{1, 0, 0},  {15, 0, 1}, {16, 0, 2}, {17, 0, 3}, {63, 0, 4},
                               {64, 0, 5}, {7, 0, -1}, {65, 0, 6}, {1000, 0, 7}};
    attn_case("mixed lengths", 16, 4, 128, 1, mixed, 9, 0, 0, 1);
    const item_spec long1[] = {{4096, 0, 0}};
    attn_case("4096 tokens", 16, 4, 128, 1, long1, 1, 0, 0, 3);
    /* cached prefixes: not multiples of 16, chunks straddling blocks, one
     * token after a long prefix, a 128-token chunk after 4096 */
    const item_spec prefix[] = {{100, 37, 0}, {1, 4095, 1}, {17, 15, 2}, {5, 0, -1}, {64, 64, 3}, {130, 1000, 4}};
    const item_spec after[] = {{128, 4096, 0}};
#else /* the emulator: the same boundaries, shorter */
    const item_spec mixed[] = {{1, 0, 0},  {15, 0, 1}, {16, 0, 2}, {17, 0, 3}, {63, 0, 4},
                               {64, 0, 5}, {7, 0, -1}, {65, 0, 6}, {130, 0, 7}};
    attn_case("mixed lengths", 16, 4, 128, 1, mixed, 9, 0, 0, 1);
    const item_spec prefix[] = {{40, 37, 0}, {1, 700, 1}, {17, 15, 2}, {5, 0, -1}, {64, 64, 3}, {33, 300, 4}};
    /* lm-eval's cached continuation: 8 short items after 1,023 cached tokens */
    const item_spec cont[] = {{14, 1023, 0}, {22, 1023, 1}, {2, 1023, 2}, {17, 1023, 3}};
    attn_case("4 short continuations after 1023", 16, 4, 128, 1, cont, 4, 0, 0, 1);
    const item_spec after[] = {{33, 600, 0}};
#endif
    attn_case("cached prefixes", 16, 4, 128, 0, prefix, 6, 0, 0, 1);
    attn_case("a chunk after a long prefix (plan splits)", 16, 4, 128, 1, after, 1, 0, 0, 1);
    attn_case("a chunk after a long prefix, split 256", 16, 4, 128, 1, after, 1, 256, 0, 1);
    /* the other kernel variants on the same shapes */
    for (int v = 2; v <= 3; v++) {
        char nm[64];
        snprintf(nm, sizeof nm, "mixed lengths, variant %d", v);
        attn_case(nm, 16, 4, 128, 1, mixed, 9, 0, v, 1);
        snprintf(nm, sizeof nm, "cached prefixes, variant %d, split 128", v);
        attn_case(nm, 16, 4, 128, 0, prefix, 6, 128, v, 1);
    }
    assert_int_equal(n_fail, 0);
}

static void test_attn_prefill_every_head_dim_and_group(void **st)
{
    (void)st;
    n_fail = 0;
    const int hds[] = {16, 32, 64, 128}, groups[] = {1, 2, 4, 8};
    const item_spec items[] = {{33, 0, 0}, {20, 45, 1}, {1, 70, 2}, {5, 0, -1}, {70, 3, 3}, {16, 16, 4}};
    for (int hi = 0; hi < 4; hi++)
        for (int gi = 0; gi < 4; gi++) {
            const int G = groups[gi], Hkv = 2;
            char nm[64];
            snprintf(nm, sizeof nm, "hd %d group %d", hds[hi], G);
            attn_case(nm, G * Hkv, Hkv, hds[hi], (hi + gi) & 1, items, 6, 0, 0, 1);
            snprintf(nm, sizeof nm, "hd %d group %d, split 64", hds[hi], G);
            attn_case(nm, G * Hkv, Hkv, hds[hi], (hi + gi + 1) & 1, items, 6, 64, 0, 1);
        }
    assert_int_equal(n_fail, 0);
}

/* Sliding window (kc_gqa_args.window): keys before p - W + 1 masked, with
 * windows shorter than a key tile, across tiles and splits, longer than the
 * context, W = 1; chunks after long prefixes, forced and planned splits. */
static void test_attn_prefill_sliding_window_matches_reference(void **st)
{
    (void)st;
    n_fail = 0;
#ifndef KC_EMU
    const item_spec items[] = {{100, 0, 0}, {1, 700, 1}, {17, 15, 2}, {5, 0, -1}, {130, 1000, 3}, {64, 64, 4}};
#else
    const item_spec items[] = {{40, 0, 0}, {1, 300, 1}, {17, 15, 2}, {5, 0, -1}, {30, 260, 3}, {64, 64, 4}};
#endif
    const int windows[] = {24, 64, 100, 1, 5000};
    const int shapes[][3] = {{4, 2, 16}, {16, 4, 128}, {8, 8, 64}}; /* Hq, Hkv, hd */
#ifndef KC_EMU
    for (int si = 0; si < 3; si++)
#else /* the emulator: group 1 at hd 64 is in test_attn_prefill_every_head_dim_and_group */
    for (int si = 0; si < 2; si++)
#endif
        for (int wi = 0; wi < 5; wi++)
            for (int split = 0; split <= 256; split += 192) { /* planned, then 64-key splits */
                attn_fix f;
                fix_init(&f, shapes[si][0], shapes[si][1], shapes[si][2], (si + wi) & 1, items, 6, 3, 1.0f, 2);
                f.a.window = windows[wi];
                char nm[96];
                snprintf(nm, sizeof nm, "window %d, split %d", windows[wi], split ? 64 : 0);
                attn_check(&f, nm, split ? 64 : 0, 0, 0, 1);
                fix_free(&f);
            }
    assert_int_equal(n_fail, 0);
}

/* max_ctx only tunes the split: an underestimate (or 0) must still give
 * the right answer; a workspace too small for the forced split means fewer
 * splits, not a failure */
static void test_attn_prefill_split_bound_is_only_a_hint(void **st)
{
    (void)st;
    n_fail = 0;
    const item_spec items[] = {{40, 300, 0}, {3, 7, 1}, {2, 0, -1}, {9, 200, 2}};
    attn_fix f;
    fix_init(&f, 8, 2, 64, 1, items, 4, 0, 2.0f, 1);
    attn_check(&f, "max_ctx 200 < 340, split 64", 64, 0, 200, 1);
    attn_check(&f, "max_ctx 0 (table capacity)", 64, 0, -1, 1);
    fix_free(&f);
    /* split 64 over 340 keys wants 6 splits; a workspace for 2 */
    fix_init(&f, 8, 2, 64, 0, items, 4, 0, 1.0f, 1);
    const kc_attn_prefill_tuning split64 = {0, 64, 0};
    const size_t wb = (size_t)2 * f.T * 8 * (64 + 2) * 4;
    kc_attn_prefill_plan plan;
    assert_int_equal(kc_attn_prefill_plan_for(&f.a, f.n_items, f.max_ctx, wb, &split64, &plan), 0);
    printf("workspace for 2 splits: nsplit %d, split %d keys, %zu bytes used of %zu\n", plan.nsplit, plan.split_keys,
           plan.work_needed, wb);
    if (plan.nsplit > 2 || plan.work_needed > wb) case_fail("plan uses %zu bytes of a %zu-byte workspace", plan.work_needed, wb);
    fix_free(&f);
    assert_int_equal(n_fail, 0);
}

static void test_attn_prefill_refuses_unsupported_shapes(void **st)
{
    (void)st;
    const item_spec items[] = {{5, 0, 0}};
    const int shapes[][3] = {{4, 4, 96}, {6, 2, 64}, {16, 1, 64}, {4, 3, 64}}; /* hd 96, group 3, 16, 4/3 */
    for (int s = 0; s < 4; s++) {
        attn_fix f;
        const int Hq = shapes[s][0], Hkv = shapes[s][1], hd = shapes[s][2];
        fix_init(&f, Hq, Hkv, hd, 0, items, 1, 0, 1.0f, 1);
        const int rc = kc_attn_prefill(&f.a, f.d_row0, f.d_ntok, f.d_pos0, f.d_slot, 1, f.max_ctx, f.d_out, f.ldo,
                                       NULL, 0, NULL, 0);
        uint16_t *got = malloc((size_t)f.T * f.ldo * 2);
        kt_get(got, f.d_out, (size_t)f.T * f.ldo * 2);
        printf("refuse Hq=%d Hkv=%d hd=%d: rc %d\n", Hq, Hkv, hd, rc);
        assert_int_equal(rc, -5);
        assert_true(all_bytes(got, (size_t)f.T * f.ldo * 2, 0xFF));
        free(got);
        fix_free(&f);
    }
}

#ifndef KC_EMU
/* The lead's pipeline: kc_gqa_qkv (RMSNorm, partial RoPE, append to the
 * cache) then kc_attn_prefill, against the reference built from proj. */
static void test_attn_prefill_after_gqa_qkv_matches_reference(void **st)
{
    (void)st;
    n_fail = 0;
    const int Hq = 16, Hkv = 4, hd = 128, rope_dim = 64, QD = Hq * hd, KD = Hkv * hd;
    const item_spec items[] = {{40, 0, 0}, {3, 0, -1}, {25, 21, 1}, {1, 130, 2}};
    attn_fix f;
    fix_init(&f, Hq, Hkv, hd, 0, items, 4, 0, 1.0f, 2);
    /* proj [T, ldp]: q | gate | k | v */
    const int off_q = 0, off_g = QD, off_k = 2 * QD, off_v = off_k + KD, ldp = off_v + KD + 1;
    float *proj = malloc((size_t)f.T * ldp * 4), *qn = malloc(hd * 4), *kn = malloc(hd * 4);
    kt_fill(proj, (size_t)f.T * ldp, 1.0f);
    for (int i = 0; i < hd; i++) qn[i] = 1.0f + 0.2f * kt_randn(), kn[i] = 1.0f + 0.2f * kt_randn();
    int32_t *tpos = malloc((size_t)f.T * 4), *tslot = malloc((size_t)f.T * 4);
    for (int i = 0; i < f.n_items; i++)
        for (int t = 0; t < f.ntok[i]; t++) tpos[f.row0[i] + t] = f.pos0[i] + t, tslot[f.row0[i] + t] = f.slot[i];
    kc_gqa_args *a = &f.a;
    cudaFree((void *)a->proj);
    a->proj = kt_dev(proj, (size_t)f.T * ldp * 4);
    a->ldp = ldp, a->off_q = off_q, a->off_k = off_k, a->off_v = off_v, a->off_gate = off_g;
    a->tok_pos = kt_dev(tpos, (size_t)f.T * 4);
    a->tok_slot = kt_dev(tslot, (size_t)f.T * 4);
    a->q_norm = kt_dev(qn, hd * 4), a->k_norm = kt_dev(kn, hd * 4);
    a->eps = 1e-6f, a->rope_dim = rope_dim, a->theta = 10000.0;
    KT_CK(cudaMemset(a->q, 0xFF, (size_t)f.T * QD * 4));
    assert_int_equal(kc_gqa_qkv(a, 0), 0);
    const size_t wb = kc_attn_prefill_workspace(f.T, f.n_items, Hq, hd, f.max_ctx);
    void *work = kt_dev_poison(wb ? wb : 16);
    assert_int_equal(kc_attn_prefill(a, f.d_row0, f.d_ntok, f.d_pos0, f.d_slot, f.n_items, f.max_ctx, f.d_out, f.ldo,
                                     work, wb, NULL, 0),
                     0);
    uint16_t *got16 = malloc((size_t)f.T * f.ldo * 2);
    kt_get(got16, f.d_out, (size_t)f.T * f.ldo * 2);
    for (int i = 0; i < f.n_items; i++) {
        const int n = f.ntok[i], p0 = f.pos0[i], r0 = f.row0[i];
        if (f.slot[i] < 0) {
            assert_true(all_bytes(got16 + (size_t)r0 * f.ldo, (size_t)n * f.ldo * 2, 0xFF));
            continue;
        }
        float *kc = malloc((size_t)(p0 + n) * KD * 4), *vc = malloc((size_t)(p0 + n) * KD * 4);
        float *q = malloc((size_t)n * QD * 4), *o = malloc((size_t)n * QD * 4), *g = malloc((size_t)n * QD * 4);
        fix_gather(&f, f.slot[i], p0, kc, vc); /* the cached prefix */
        for (int t = 0; t < n; t++) {
            const float *pr = proj + (size_t)(r0 + t) * ldp;
            const int p = p0 + t;
            float *qt = q + (size_t)t * QD, *kt = kc + (size_t)p * KD, *vt = vc + (size_t)p * KD;
            for (int h = 0; h < Hq; h++) rmsnorm_f32(qt + h * hd, pr + off_q + h * hd, qn, hd, 1e-6f);
            for (int h = 0; h < Hkv; h++) rmsnorm_f32(kt + h * hd, pr + off_k + h * hd, kn, hd, 1e-6f);
            rope_partial(qt, Hq, hd, rope_dim, p, 10000.0);
            rope_partial(kt, Hkv, hd, rope_dim, p, 10000.0);
            memcpy(vt, pr + off_v, (size_t)KD * 4);
            kt_bf16_round(kt, KD);
            kt_bf16_round(vt, KD);
        }
        gqa_attention_f32(o, q, kc, vc, n, p0, Hq, Hkv, hd);
        for (int t = 0; t < n; t++)
            for (int c = 0; c < QD; c++) {
                o[(size_t)t * QD + c] *= sigmoid_f32(proj[(size_t)(r0 + t) * ldp + off_g + c]);
                g[(size_t)t * QD + c] = bf16_to_f32(got16[(size_t)(r0 + t) * f.ldo + c]);
            }
        const double e = kt_rel(g, o, (size_t)n * QD);
        printf("qkv + attn item %d (pos0 %d, %d tokens): rel %.2e\n", i, p0, n, e);
        if (!(e <= ATTN_TOL_ITEM)) case_fail("qkv + attn item %d: rel %.2e (tol %.0e)", i, e, ATTN_TOL_ITEM);
        free(kc), free(vc), free(q), free(o), free(g);
    }
    free(proj), free(qn), free(kn), free(tpos), free(tslot), free(got16);
    cudaFree((void *)a->tok_pos), cudaFree((void *)a->tok_slot), cudaFree((void *)a->q_norm), cudaFree((void *)a->k_norm);
    cudaFree(work);
    fix_free(&f);
    assert_int_equal(n_fail, 0);
}

#endif

/* ---- log-probs / top-n ---- */

/* Row r's pattern (r % 8): 0 random, 1 exact ties at the top (ids 3, 7,
 * vocab-1), 2 a block of equal values around the n-th largest, 3 every
 * value equal, 4 ascending (the candidate buffer refills every round),
 * 5 descending, 6 +0 / -0 ties at the top, 7 some -inf. */
static void lp_fill_row(float *x, int vocab, int r)
{
    kt_fill(x, (size_t)vocab, 3.0f);
    switch (r % 8) {
    case 1:
        x[3] = x[7] = x[vocab - 1] = 20.0f;
        break;
    case 2:
        for (int i = 0; i < vocab; i += 97) x[i] = 9.0f;
        break;
    case 3:
        for (int i = 0; i < vocab; i++) x[i] = 1.5f;
        break;
    case 4:
        for (int i = 0; i < vocab; i++) x[i] = -5.0f + 1e-3f * (float)i;
        break;
    case 5:
        for (int i = 0; i < vocab; i++) x[i] = 5.0f - 1e-3f * (float)i;
        break;
    case 6:
        for (int i = 0; i < vocab; i++) x[i] = -fabsf(x[i]) - 0.5f;
        for (int i = 1; i < vocab; i += 13) x[i] = (i / 13) & 1 ? -0.0f : 0.0f;
        break;
    case 7:
        for (int i = 0; i < vocab; i += 5) x[i] = -INFINITY;
        break;
    }
}

static void lp_case(int n, int vocab, int ldl, int n_top, int with_targets, int bf16)
{
    float *x = malloc((size_t)n * ldl * 4);
    for (int r = 0; r < n; r++) {
        lp_fill_row(x + (size_t)r * ldl, vocab, r);
        for (int i = vocab; i < ldl; i++) x[(size_t)r * ldl + i] = NAN; /* the stride padding is never read */
    }
    if (bf16) kt_bf16_round(x, (size_t)n * ldl);
    int32_t *tg = malloc((size_t)n * 4);
    for (int r = 0; r < n; r++) tg[r] = r % 9 == 4 ? -1 : r % 9 == 6 ? vocab : (int)(kt_u01() * vocab);
    /* top-n row stride: n_top for odd n_top, else 2 more (columns that must stay untouched) */
    const int ldt = n_top + (n_top % 2 ? 0 : 2), ntc = ldt;
    uint16_t *xb = bf16 ? kt_to_bf16(x, (size_t)n * ldl) : NULL;
    void *dx = bf16 ? kt_dev(xb, (size_t)n * ldl * 2) : kt_dev(x, (size_t)n * ldl * 4);
    free(xb);
    int32_t *dtg = with_targets ? kt_dev(tg, (size_t)n * 4) : NULL;
    float *dlse = kt_dev_poison((size_t)n * 4), *dtlp = kt_dev_poison((size_t)n * 4);
    int32_t *dids = kt_dev_poison((size_t)n * ntc * 4);
    float *dlps = kt_dev_poison((size_t)n * ntc * 4);
    const int rc = bf16 ? kc_logprob_rows_bf16(dx, ldl, n, vocab, dtg, dlse, dtlp, n_top, dids, dlps, ldt, 0)
                        : kc_logprob_rows(dx, ldl, n, vocab, dtg, dlse, dtlp, n_top, dids, dlps, ldt, 0);
    const cudaError_t ce = cudaDeviceSynchronize();
    if (rc || ce != cudaSuccess) {
        case_fail("logprob vocab %d: rc %d, device %s", vocab, rc, cudaGetErrorString(ce));
        if (ce != cudaSuccess) exit(1);
        return;
    }
    float *lse = malloc((size_t)n * 4), *tlp = malloc((size_t)n * 4), *lps = malloc((size_t)n * ntc * 4);
    int32_t *ids = malloc((size_t)n * ntc * 4);
    kt_get(lse, dlse, (size_t)n * 4);
    kt_get(tlp, dtlp, (size_t)n * 4);
    kt_get(ids, dids, (size_t)n * ntc * 4);
    kt_get(lps, dlps, (size_t)n * ntc * 4);
    int bad_rows = 0, first_bad = -1;
    double worst = 0;
    char why[160] = "";
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : bad_rows) reduction(max : worst)
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * ldl;
        const float L = logsumexp_f32(xr, vocab), tol = (float)LP_TOL * fmaxf(1.0f, fabsf(L));
        int32_t rid[KC_LOGPROB_MAX_TOP];
        float rlp[KC_LOGPROB_MAX_TOP];
        const int nref = n_top < vocab ? n_top : vocab;
        sampling_top_n(xr, vocab, L, nref, rid, rlp);
        char msg[160] = "";
        double w = fabs((double)lse[r] - L) / fmaxf(1.0f, fabsf(L));
        if (!(fabsf(lse[r] - L) <= tol)) snprintf(msg, sizeof msg, "lse %.9g want %.9g", lse[r], L);
        if (with_targets) {
            const int t = tg[r];
            const float want = t >= 0 && t < vocab ? xr[t] - L : 0.0f;
            /* equal infinities (a -inf logit) are equal: their difference is NaN */
            if (!(tlp[r] == want || fabsf(tlp[r] - want) <= tol))
                snprintf(msg, sizeof msg, "target %d lp %.9g want %.9g", t, tlp[r], want);
        } else if (!all_bytes(tlp + r, 4, 0xFF)) {
            snprintf(msg, sizeof msg, "tlp written without targets");
        }
        for (int k = 0; k < n_top && !msg[0]; k++) {
            const int32_t gi = ids[(size_t)r * ldt + k];
            const float gl = lps[(size_t)r * ldt + k];
            if (k >= nref) {
                if (gi != -1 || gl != -INFINITY) snprintf(msg, sizeof msg, "top[%d] past vocab: %d %g", k, gi, gl);
            } else if (gi != rid[k]) {
                snprintf(msg, sizeof msg, "top[%d] id %d want %d (%.9g vs %.9g)", k, gi, rid[k],
                         gi >= 0 && gi < vocab ? xr[gi] : NAN, xr[rid[k]]);
            } else if (!(gl == rlp[k] || fabsf(gl - rlp[k]) <= tol)) {
                snprintf(msg, sizeof msg, "top[%d] lp %.9g want %.9g", k, gl, rlp[k]);
            } else if (gl != rlp[k] && fabs((double)gl - rlp[k]) / fmaxf(1.0f, fabsf(L)) > w) {
                w = fabs((double)gl - rlp[k]) / fmaxf(1.0f, fabsf(L));
            }
        }
        if (!all_bytes(ids + (size_t)r * ldt + n_top, (size_t)(ldt - n_top) * 4, 0xFF) ||
            !all_bytes(lps + (size_t)r * ldt + n_top, (size_t)(ldt - n_top) * 4, 0xFF))
            snprintf(msg, sizeof msg, "top written past n_top %d (stride %d)", n_top, ldt);
        if (w > worst) worst = w;
        if (msg[0]) {
            bad_rows++;
#pragma omp critical
            if (first_bad < 0 || r < first_bad) first_bad = r, memcpy(why, msg, sizeof why);
        }
    }
    printf("logprob%s n=%d vocab=%d ldl=%d n_top=%d ldt=%d targets=%d: worst rel %.2e, %d bad rows\n",
           bf16 ? " bf16" : "", n, vocab, ldl, n_top, ldt, with_targets, worst, bad_rows);
    if (bad_rows)
        case_fail("logprob%s vocab %d ldl %d n_top %d: %d rows wrong, first row %d (pattern %d): %s", bf16 ? " bf16" : "", vocab,
             ldl, n_top, bad_rows, first_bad, first_bad % 8, why);
    free(x), free(tg), free(lse), free(tlp), free(lps), free(ids);
    cudaFree(dx), cudaFree(dtg), cudaFree(dlse), cudaFree(dtlp), cudaFree(dids), cudaFree(dlps);
}

static void test_logprob_rows_match_reference(void **st)
{
    (void)st;
    n_fail = 0;
    const int tops[] = {0, 1, 5, 20, 64};
    for (int ti = 0; ti < 5; ti++) {
        lp_case(48, 256, 256, tops[ti], 1, 0);
        lp_case(24, 32000, 32000, tops[ti], ti != 2, 0);
        lp_case(16, 32001, 32001, tops[ti], 1, 0); /* odd stride: element loads */
        lp_case(16, 32001, 32004, tops[ti], 1, 0); /* vector loads and a 1-element tail */
    }
    lp_case(8, 50, 52, 64, 1, 0); /* n_top > vocab: the rest is -1 / -inf */
    lp_case(1, 1, 1, 5, 1, 0);
    lp_case(24, 32000, 32000, 20, 1, 1); /* bf16 logits */
    lp_case(16, 32001, 32001, 64, 1, 1);
    lp_case(16, 256, 260, 5, 0, 1);
    assert_int_equal(n_fail, 0);
}

static void test_logprob_rows_refuse_bad_arguments(void **st)
{
    (void)st;
    float *dx = kt_dev_poison(64 * 4), *dl = kt_dev_poison(64);
    int32_t *di = kt_dev_poison(64 * 4);
    assert_int_equal(kc_logprob_rows(dx, 16, 2, 16, NULL, dl, NULL, 65, di, dl, 65, 0), -5); /* n_top > 64 */
    assert_int_equal(kc_logprob_rows(dx, 16, 2, 16, NULL, dl, NULL, 5, di, dl, 4, 0), -5);   /* ldt < n_top */
    assert_int_equal(kc_logprob_rows(dx, 8, 2, 16, NULL, dl, NULL, 0, NULL, NULL, 0, 0), -5); /* ldl < vocab */
    assert_int_equal(kc_logprob_rows(dx, 16, 2, 16, di, dl, NULL, 0, NULL, NULL, 0, 0), -5);  /* targets, no tlp */
    assert_int_equal(kc_logprob_rows(dx, 16, 2, 16, NULL, dl, NULL, 3, NULL, NULL, 3, 0), -5); /* top, no outputs */
    assert_int_equal(kc_logprob_rows(dx, 16, 0, 16, NULL, dl, NULL, 0, NULL, NULL, 0, 0), 0);  /* nothing to do */
    cudaFree(dx), cudaFree(dl), cudaFree(di);
}

/* ---- benchmarks ---- */
#ifndef KC_EMU
static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* median ms of reps runs of fn(ctx), after 2 warm-ups */
static float time_median(int (*fn)(void *), void *ctx, int reps)
{
    cudaEvent_t e0, e1;
    KT_CK(cudaEventCreate(&e0));
    KT_CK(cudaEventCreate(&e1));
    float t[64];
    for (int i = 0; i < 2; i++)
        if (fn(ctx)) return -1.0f;
    for (int i = 0; i < reps; i++) {
        KT_CK(cudaEventRecord(e0, 0));
        if (fn(ctx)) return -1.0f;
        KT_CK(cudaEventRecord(e1, 0));
        KT_CK(cudaEventSynchronize(e1));
        KT_CK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    KT_CK(cudaGetLastError());
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    qsort(t, (size_t)reps, sizeof t[0], cmp_float);
    return t[reps / 2];
}

typedef struct {
    attn_fix *f;
    void *work;
    size_t wb;
    kc_attn_prefill_tuning tune;
    /* the decode path (kc_gqa_attn) */
    float *opart, *ml;
    int nsplit, split;
} attn_bench_ctx;

static int run_prefill(void *p)
{
    attn_bench_ctx *c = p;
    attn_fix *f = c->f;
    return kc_attn_prefill(&f->a, f->d_row0, f->d_ntok, f->d_pos0, f->d_slot, f->n_items, f->max_ctx, f->d_out, f->ldo,
                           c->work, c->wb, &c->tune, 0);
}
static int run_decode_path(void *p)
{
    attn_bench_ctx *c = p;
    return kc_gqa_attn(&c->f->a, c->opart, c->ml, c->nsplit, c->split, c->f->d_out, c->f->ldo, 0);
}

#define H200_BF16_TFLOPS 989.0 /* dense, SXM */
#define H200_HBM_GBS 4800.0

static void bench_attn(void)
{
    /* decode: also time the per-row decode kernel on the shape; n@p: n tokens after p cached
     * ones (8x17@1023: lm-eval's cached continuations, split over the context) */
    struct {
        const char *name;
        int n, ntok, pos0, decode;
    } shapes[] = {{"1x2048", 1, 2048, 0, 1},      {"8x2048", 8, 2048, 0, 0},     {"1x8192", 1, 8192, 0, 0},
                  {"4x8192", 4, 8192, 0, 0},      {"128@4096", 1, 128, 4096, 1}, {"8x17@1023", 8, 17, 1023, 0},
                  {"1x33@1023", 1, 33, 1023, 0}};
    const int Hq = 16, Hkv = 4, hd = 128;
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        item_spec items[8];
        double keys = 0;
        for (int i = 0; i < shapes[si].n; i++) {
            items[i] = (item_spec){shapes[si].ntok, shapes[si].pos0, i};
            for (int t = 0; t < shapes[si].ntok; t++) keys += shapes[si].pos0 + t + 1;
        }
        attn_fix f;
        fix_init(&f, Hq, Hkv, hd, 1, items, shapes[si].n, 0, 1.0f, 1);
        const double flops = 4.0 * Hq * hd * keys;
        attn_bench_ctx c = {.f = &f};
        c.wb = kc_attn_prefill_workspace(f.T, f.n_items, Hq, hd, f.max_ctx);
        c.work = kt_dev(NULL, c.wb ? c.wb : 16);
        for (int v = 1; v <= 3; v++) {
            c.tune.variant = v;
            kc_attn_prefill_plan plan;
            kc_attn_prefill_plan_for(&f.a, f.n_items, f.max_ctx, c.wb, &c.tune, &plan);
            const float ms = time_median(run_prefill, &c, 15);
            const double tf = flops / (ms * 1e-3) / 1e12;
            printf("BENCH {\"op\":\"attn_prefill\",\"shape\":\"%s\",\"Hq\":%d,\"Hkv\":%d,\"hd\":%d,\"variant\":%d,"
                   "\"warps\":%d,\"nsplit\":%d,\"split_keys\":%d,\"ms\":%.4f,\"gflop\":%.3f,"
                   "\"tflops\":%.1f,\"frac_bf16_peak\":%.3f}\n",
                   shapes[si].name, Hq, Hkv, hd, v, plan.warps, plan.nsplit, plan.nsplit > 1 ? plan.split_keys : 0,
                   ms, flops / 1e9, tf, tf / H200_BF16_TFLOPS);
        }
        if (shapes[si].decode) { /* the per-row flash-decoding path */
            int32_t *tpos = malloc((size_t)f.T * 4), *tslot = malloc((size_t)f.T * 4);
            for (int i = 0; i < f.n_items; i++)
                for (int t = 0; t < f.ntok[i]; t++) tpos[f.row0[i] + t] = f.pos0[i] + t, tslot[f.row0[i] + t] = f.slot[i];
            f.a.tok_pos = kt_dev(tpos, (size_t)f.T * 4);
            f.a.tok_slot = kt_dev(tslot, (size_t)f.T * 4);
            c.split = 256;
            c.nsplit = (f.max_ctx + c.split - 1) / c.split;
            c.opart = kt_dev(NULL, (size_t)f.T * Hq * c.nsplit * hd * 4);
            c.ml = kt_dev(NULL, (size_t)f.T * Hq * c.nsplit * 2 * 4);
            const float ms = time_median(run_decode_path, &c, 15);
            const double tf = flops / (ms * 1e-3) / 1e12;
            printf("BENCH {\"op\":\"gqa_attn_decode_path\",\"shape\":\"%s\",\"Hq\":%d,\"Hkv\":%d,\"hd\":%d,\"split\":%d,"
                   "\"ms\":%.4f,\"gflop\":%.3f,\"tflops\":%.1f,\"frac_bf16_peak\":%.3f}\n",
                   shapes[si].name, Hq, Hkv, hd, c.split, ms, flops / 1e9, tf, tf / H200_BF16_TFLOPS);
            cudaFree((void *)f.a.tok_pos), cudaFree((void *)f.a.tok_slot), cudaFree(c.opart), cudaFree(c.ml);
            free(tpos), free(tslot);
        }
        cudaFree(c.work);
        fix_free(&f);
    }
}

typedef struct {
    const void *x;
    int n, vocab, n_top, bf16;
    int32_t *tg, *ids, *rows;
    float *lse, *tlp, *lps;
} lp_bench_ctx;

static int run_logprob(void *p)
{
    lp_bench_ctx *c = p;
    return c->bf16 ? kc_logprob_rows_bf16(c->x, c->vocab, c->n, c->vocab, c->tg, c->lse, c->tlp, c->n_top, c->ids, c->lps,
                                          64, 0)
                   : kc_logprob_rows(c->x, c->vocab, c->n, c->vocab, c->tg, c->lse, c->tlp, c->n_top, c->ids, c->lps, 64, 0);
}
static int run_old_logprob(void *p) /* kc_row_lse + kc_gather_logprob */
{
    lp_bench_ctx *c = p;
    const int rc = kc_row_lse(c->lse, c->x, c->n, c->vocab, 0);
    return rc ? rc : kc_gather_logprob(c->tlp, c->x, c->lse, c->rows, c->tg, c->n, c->vocab, 0);
}

static void bench_logprob(void)
{
    const int n = 1024, vocab = 32000;
    float *x = malloc((size_t)n * vocab * 4);
    kt_fill(x, (size_t)n * vocab, 3.0f);
    int32_t *tg = malloc((size_t)n * 4), *rows = malloc((size_t)n * 4);
    for (int r = 0; r < n; r++) tg[r] = (int)(kt_u01() * vocab), rows[r] = r;
    lp_bench_ctx c = {.n = n, .vocab = vocab};
    void *dx32 = kt_dev(x, (size_t)n * vocab * 4);
    uint16_t *xb = kt_to_bf16(x, (size_t)n * vocab);
    void *dx16 = kt_dev(xb, (size_t)n * vocab * 2);
    c.tg = kt_dev(tg, (size_t)n * 4), c.rows = kt_dev(rows, (size_t)n * 4);
    c.lse = kt_dev(NULL, (size_t)n * 4), c.tlp = kt_dev(NULL, (size_t)n * 4);
    c.ids = kt_dev(NULL, (size_t)n * 64 * 4), c.lps = kt_dev(NULL, (size_t)n * 64 * 4);
    const int tops[] = {0, 1, 5, 20, 64};
    for (int b = 0; b < 2; b++)
        for (int ti = 0; ti < 5; ti++) {
            c.bf16 = b, c.x = b ? dx16 : dx32, c.n_top = tops[ti];
            const float ms = time_median(run_logprob, &c, 21);
            const double gbs = (double)n * vocab * (b ? 2 : 4) / (ms * 1e-3) / 1e9;
            printf("BENCH {\"op\":\"logprob_rows%s\",\"rows\":%d,\"vocab\":%d,\"n_top\":%d,\"ms\":%.4f,\"gbs\":%.0f,"
                   "\"frac_hbm\":%.3f}\n",
                   b ? "_bf16" : "", n, vocab, c.n_top, ms, gbs, gbs / H200_HBM_GBS);
        }
    c.x = dx32;
    const float ms = time_median(run_old_logprob, &c, 21);
    const double gbs = (double)n * vocab * 4 / (ms * 1e-3) / 1e9;
    printf("BENCH {\"op\":\"row_lse+gather_logprob\",\"rows\":%d,\"vocab\":%d,\"n_top\":0,\"ms\":%.4f,\"gbs\":%.0f,"
           "\"frac_hbm\":%.3f}\n",
           n, vocab, ms, gbs, gbs / H200_HBM_GBS);
    free(x), free(tg), free(rows), free(xb);
    cudaFree(dx32), cudaFree(dx16), cudaFree(c.tg), cudaFree(c.rows), cudaFree(c.lse), cudaFree(c.tlp);
    cudaFree(c.ids), cudaFree(c.lps);
}

#endif

int main(int argc, char **argv)
{
    kt_skip_without_gpu();
#ifndef KC_EMU
    /* the backend's launch policy (KDA_TUNING=pdl=0: PDL off) */
    kda_tuning tn;
    char err[256];
    kda_tuning_defaults(&tn);
    if (kda_tuning_from_env(&tn, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    kc_set_pdl(tn.pdl);
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        struct cudaDeviceProp prop;
        KT_CK(cudaGetDeviceProperties(&prop, 0));
        printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
        bench_logprob(); /* first: its figures survive a fault in the attention runs */
        bench_attn();
        return 0;
    }
#endif
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* e.g. test_attn_prefill_every_head_dim_and_group */
    const struct CMUnitTest tests[] = {
        /* log-probs first: a device fault in attention (sticky) would end the run */
        cmocka_unit_test(test_logprob_rows_match_reference),
        cmocka_unit_test(test_logprob_rows_refuse_bad_arguments),
        cmocka_unit_test(test_attn_prefill_refuses_unsupported_shapes),
        cmocka_unit_test(test_attn_prefill_every_head_dim_and_group),
        cmocka_unit_test(test_attn_prefill_split_bound_is_only_a_hint),
        cmocka_unit_test(test_attn_prefill_sliding_window_matches_reference),
        cmocka_unit_test(test_attn_prefill_chunk_lengths_at_the_1p7b_shape),
#ifndef KC_EMU
        cmocka_unit_test(test_attn_prefill_after_gqa_qkv_matches_reference),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * kda_step_cases.h - the KDA decode step against the CPU reference
 * (engine/cpu_ops.h: short conv, gates, L2 norms, kda_step_f32, the gated
 * output RMSNorm) on random inputs, for one launch function: kc_kda_step in
 * test_kernels.c, a kernel-lab variant in kernels/lab/. Items of several
 * lengths with padding items (slot -1: their rows must stay poisoned), the
 * fla options, bf16 state; outputs rel L2 <= 1e-2 (bf16), state <= 1e-4
 * (fp32; bf16 state <= 2e-3 against the reference rounded as stored), and
 * the padding past each slot's layer bitwise untouched. Needs cmocka.h,
 * cuda_ops.h, kt_util.h and engine/cpu_ops.h first.
 */
#ifndef KDA_TEST_KDA_STEP_CASES_H
#define KDA_TEST_KDA_STEP_CASES_H

/* What the cases run: kc_kda_step unless a lab test points it elsewhere. */
static int (*kda_launch)(const kc_kda_args *a, cudaStream_t s) = kc_kda_step;


/* The fla options of the KDA kernels (cuda_ops.h kc_kda_args): grouped value
 * heads, the lower-bound gate, beta x 2, conv biases, no short conv. The last
 * three and GVA run kc_kda_conv first and the step with preconv, as the
 * backend does. */
typedef struct {
    int group;         /* value heads per q/k head (H = value heads); 0/1 none */
    float lower_bound; /* < 0: fla's lower-bound gate */
    int neg_eigval, conv_bias, no_conv;
    int state_bf16;    /* S stored as bf16 on the device (kc_kda_args.state_bf16) */
    int stream;        /* kc_kda_args.stream (items of one token): 1 = must take the stream path,
                          2 = asked for, must fall back (kc_kda_step_streams) */
    int stream_blocks; /* kc_kda_args.stream_blocks: fewer blocks walk more (item, head) pairs */
} kda_opts;

/* which path kc_kda_step takes, checked right before the launch */
static void kda_check_path(const kc_kda_args *a, const kda_opts *op)
{
    if (op->stream && kda_launch == kc_kda_step) assert_int_equal(kc_kda_step_streams(a), op->stream == 1);
}
static const kda_opts kda_plain;

static void run_kda_case_opt(int H, int K, int taps, const int *ntok, const int *slots, int n_items, int lowrank,
                             const kda_opts *op)
{
    const int grp = op->group > 1 ? op->group : 1, Hqk = H / grp, QK = Hqk * K;
    const int V = K, R = V, HK = H * K, HV = H * V, C = 2 * QK + HV, P = op->no_conv ? 0 : taps - 1;
    const int preconv = grp > 1 || op->conv_bias || op->no_conv;
    const float bscale = op->neg_eigval ? 2.0f : 1.0f;
    const int off_f0 = C, off_g0 = C + R, off_beta = C + 2 * R, ldp = C + 2 * R + H + 3; /* odd stride */
    int T = 0, row0[16];
    for (int i = 0; i < n_items; i++) row0[i] = T, T += ntok[i];
    const int n_slots = 4;
    /* the slot stride is a multiple of 4 floats, as in the backend (the lab's
     * tiled kernel moves the state in 16-byte units); 5+ floats of padding beyond
     * the layer check that nothing is written past it */
    const size_t layer_floats = (size_t)H * K * V + (size_t)P * C, slot_stride = (layer_floats + 5 + 3) & ~(size_t)3;
    float *proj = malloc((size_t)T * ldp * 4);
    kt_fill(proj, (size_t)T * ldp, 1.0f);
    float *convw = malloc((size_t)C * taps * 4), *f1 = malloc((size_t)HK * R * 4), *g1 = malloc((size_t)HV * R * 4);
    float *convb = malloc((size_t)C * 4);
    kt_fill(convb, C, 0.5f);
    float *gb = malloc((size_t)HV * 4), *A_log = malloc((size_t)H * 4), *dtb = malloc((size_t)HK * 4), *onorm = malloc((size_t)V * 4);
    kt_fill(convw, (size_t)C * taps, 0.5f);
    kt_fill(f1, (size_t)HK * R, 1.0f / sqrtf((float)R));
    kt_fill(g1, (size_t)HV * R, 1.0f / sqrtf((float)R));
    kt_bf16_round(f1, (size_t)HK * R);
    kt_bf16_round(g1, (size_t)HV * R);
    kt_fill(gb, HV, 0.5f);
    for (int h = 0; h < H; h++) A_log[h] = logf(1.0f + 15.0f * (float)kt_u01());
    kt_fill(dtb, HK, 0.5f);
    for (int i = 0; i < V; i++) onorm[i] = 1.0f + 0.1f * kt_randn();
    float *state = malloc(slot_stride * n_slots * 4);
    kt_fill(state, slot_stride * n_slots, 0.3f);
    const size_t SKV = (size_t)H * K * V;
    if (op->state_bf16) /* the reference starts from the values a bf16 state holds */
        for (int sl = 0; sl < n_slots; sl++) kt_bf16_round(state + sl * slot_stride, SKV);
    /* transposed bottleneck weights as the backend stores them */
    uint16_t *f1t = malloc((size_t)R * HK * 2), *g1t = malloc((size_t)R * HV * 2);
    for (int c = 0; c < HK; c++)
        for (int r = 0; r < R; r++) f1t[(size_t)r * HK + c] = f32_to_bf16(f1[(size_t)c * R + r]);
    for (int c = 0; c < HV; c++)
        for (int r = 0; r < R; r++) g1t[(size_t)r * HV + c] = f32_to_bf16(g1[(size_t)c * R + r]);

    /* reference */
    float *ref_state = malloc(slot_stride * n_slots * 4);
    memcpy(ref_state, state, slot_stride * n_slots * 4);
    float *ref_y = malloc((size_t)T * HV * 4);
    for (int i = 0; i < n_items; i++) {
        if (slots[i] < 0) continue;
        const int nt = ntok[i];
        float *S = ref_state + (size_t)slots[i] * slot_stride, *tail = S + (size_t)H * K * V;
        float *x = malloc((size_t)nt * C * 4), *y = malloc((size_t)nt * C * 4), *tl = malloc((size_t)(P + 1) * C * 4);
        for (int t = 0; t < nt; t++) memcpy(x + (size_t)t * C, proj + (size_t)(row0[i] + t) * ldp, (size_t)C * 4);
        memcpy(tl, tail, (size_t)P * C * 4);
        if (op->no_conv) /* fla use_short_conv false */
            for (size_t e = 0; e < (size_t)nt * C; e++) y[e] = silu_f32(x[e]);
        else /* all channels at once: same math per channel */
            short_conv_bias_f32(y, x, nt, C, convw, op->conv_bias ? convb : NULL, taps, tl);
        memcpy(tail, tl, (size_t)P * C * 4);
        for (int t = 0; t < nt; t++) {
            const float *pr = proj + (size_t)(row0[i] + t) * ldp;
            float *q = y + (size_t)t * C, *k = q + QK, *v = k + QK;
            float graw[4096], gk[4096], G[4096]; /* H * K, H * V <= 4096 */
            for (int c = 0; c < HK; c++) {
                double s = 0;
                for (int r = 0; r < R; r++) s += (double)f1[(size_t)c * R + r] * pr[off_f0 + r];
                graw[c] = (float)s;
            }
            if (op->lower_bound < 0)
                kda_gate_lb_f32(gk, graw, A_log, dtb, H, K, op->lower_bound);
            else
                kda_gate_f32(gk, graw, A_log, dtb, H, K);
            for (int c = 0; c < HV; c++) {
                double s = 0;
                for (int r = 0; r < R; r++) s += (double)g1[(size_t)c * R + r] * pr[off_g0 + r];
                G[c] = (float)s + gb[c];
            }
            for (int h = 0; h < Hqk; h++) {
                l2norm_f32(q + h * K, K);
                for (int d = 0; d < K; d++) q[h * K + d] *= 1.0f / sqrtf((float)K);
                l2norm_f32(k + h * K, K);
            }
            for (int h = 0; h < H; h++) {
                const int hq = h / grp; /* GVA: value head h reads q/k head h / group */
                float o[128];
                kda_step_f32(S + (size_t)h * K * V, q + hq * K, k + hq * K, v + h * V, gk + h * K,
                             bscale * sigmoid_f32(pr[off_beta + h]), o, K, V);
                rmsnorm_f32(o, o, onorm, V, 1e-6f);
                for (int j = 0; j < V; j++) ref_y[(size_t)(row0[i] + t) * HV + h * V + j] = o[j] * sigmoid_f32(G[h * V + j]);
            }
        }
        free(x), free(y), free(tl);
    }

    kc_kda_args a;
    memset(&a, 0, sizeof a);
    a.proj = kt_dev(proj, (size_t)T * ldp * 4);
    a.ldp = ldp, a.off_f0 = off_f0, a.off_g0 = off_g0, a.off_beta = off_beta;
    a.item_row0 = kt_dev(row0, (size_t)n_items * 4);
    a.item_ntok = kt_dev(ntok, (size_t)n_items * 4);
    a.item_slot = kt_dev(slots, (size_t)n_items * 4);
    a.n_items = n_items;
    /* bf16 state: the device layer is S as bf16 (SKV / 2 floats), then the fp32
     * tail (kc_tail_off), then 5+ floats of padding, packed from state */
    const size_t dev_layer = op->state_bf16 ? SKV / 2 + (size_t)P * C : layer_floats;
    const size_t dev_stride = op->state_bf16 ? (dev_layer + 5 + 3) & ~(size_t)3 : slot_stride;
    float *dstate = malloc(dev_stride * n_slots * 4);
    kt_fill(dstate, dev_stride * n_slots, 0.3f);
    if (op->state_bf16) {
        for (int sl = 0; sl < n_slots; sl++) {
            uint16_t *sb = (uint16_t *)(dstate + sl * dev_stride);
            for (size_t e = 0; e < SKV; e++) sb[e] = f32_to_bf16(state[sl * slot_stride + e]);
            memcpy(dstate + sl * dev_stride + SKV / 2, state + sl * slot_stride + SKV, (size_t)P * C * 4);
        }
    } else {
        memcpy(dstate, state, slot_stride * n_slots * 4);
    }
    a.state = kt_dev(dstate, dev_stride * n_slots * 4);
    a.slot_stride = dev_stride;
    a.state_bf16 = op->state_bf16;
    a.convw = kt_dev(convw, (size_t)C * taps * 4);
    a.f1t = kt_dev(f1t, (size_t)R * HK * 2);
    a.g1t = kt_dev(g1t, (size_t)R * HV * 2);
    a.g_bias = kt_dev(gb, (size_t)HV * 4);
    a.A_log = kt_dev(A_log, (size_t)H * 4);
    a.dt_bias = kt_dev(dtb, (size_t)HK * 4);
    a.onorm = kt_dev(onorm, (size_t)V * 4);
    a.eps = 1e-6f;
    a.H = H, a.K = K, a.V = V, a.R = R, a.taps = taps;
    a.group = grp;
    a.lower_bound = op->lower_bound;
    a.neg_eigval = op->neg_eigval;
    if (op->conv_bias) a.conv_bias = kt_dev(convb, (size_t)C * 4);
    a.y = kt_dev_poison((size_t)T * HV * 2);
    a.ldy = HV;
    if (lowrank) { /* F1/G1 by the separate kernel into a poisoned scratch */
        a.lowrank = kt_dev_poison((size_t)T * (HK + HV) * 4);
        a.lowrank_rows = T;
    }
    a.stream = op->stream != 0, a.stream_blocks = op->stream_blocks;
    if (preconv) {
        if (grp > 1) assert_int_equal(kda_launch(&a, 0), -5); /* the shared q/k tail: refused without the conv pass */
        const float *cw = a.convw;
        if (op->no_conv) a.convw = NULL;
        assert_int_equal(kc_kda_conv(&a, 0), 0);
        a.preconv = 1;
        kda_check_path(&a, op);
        assert_int_equal(kda_launch(&a, 0), 0);
        a.convw = cw;
    } else {
        kda_check_path(&a, op);
        assert_int_equal(kda_launch(&a, 0), 0);
    }
    float *gy = kt_get_bf16(a.y, (size_t)T * HV), *gs = malloc(slot_stride * n_slots * 4);
    float *gd = malloc(dev_stride * n_slots * 4);
    kt_get(gd, a.state, dev_stride * n_slots * 4);
    if (op->state_bf16) { /* unpacked into the reference's layout */
        for (int sl = 0; sl < n_slots; sl++) {
            const uint16_t *sb = (const uint16_t *)(gd + sl * dev_stride);
            for (size_t e = 0; e < SKV; e++) gs[sl * slot_stride + e] = bf16_to_f32(sb[e]);
            memcpy(gs + sl * slot_stride + SKV, gd + sl * dev_stride + SKV / 2, (size_t)P * C * 4);
        }
    } else {
        memcpy(gs, gd, slot_stride * n_slots * 4);
    }
    /* rows of padding items stay poisoned (never written); compare real rows */
    for (int i = 0; i < n_items; i++) {
        if (slots[i] < 0) {
            for (size_t e = (size_t)row0[i] * HV; e < (size_t)(row0[i] + ntok[i]) * HV; e++) assert_true(isnan(gy[e]));
            continue;
        }
        double e = kt_rel(gy + (size_t)row0[i] * HV, ref_y + (size_t)row0[i] * HV, (size_t)ntok[i] * HV);
        printf("kda H=%d K=%d lowrank=%d group=%d lb=%g neg=%d convb=%d noconv=%d item %d (%d tokens) out rel %.2e\n",
               H, K, lowrank, grp, op->lower_bound, op->neg_eigval, op->conv_bias, op->no_conv, i, ntok[i], e);
        assert_true(e < 1e-2);
    }
    for (int s = 0; s < n_slots; s++) {
        if (op->state_bf16) {
            /* S against the reference rounded as it is stored: only rare
             * one-ulp flips where the fp32 sums differ in their last bits
             * (one bf16 ulp is 2^-8 relative); the tail stays fp32 */
            float *rs = ref_state + s * slot_stride;
            kt_bf16_round(rs, SKV);
            const double es = kt_rel(gs + s * slot_stride, rs, SKV);
            const double et = P ? kt_rel(gs + s * slot_stride + SKV, rs + SKV, (size_t)P * C) : 0.0;
            printf("kda slot %d bf16 state rel %.2e, tail rel %.2e\n", s, es, et);
            assert_true(es < 2e-3);
            assert_true(et < 1e-4);
        } else {
            double e = kt_rel(gs + s * slot_stride, ref_state + s * slot_stride, layer_floats);
            printf("kda slot %d state rel %.2e\n", s, e);
            assert_true(e < 1e-4);
        }
        /* the padding beyond the layer must be untouched (bitwise) */
        assert_memory_equal(gd + s * dev_stride + dev_layer, dstate + s * dev_stride + dev_layer, 5 * 4);
    }
    free(convb);
    if (a.conv_bias) cudaFree((void *)a.conv_bias);
    free(proj), free(convw), free(f1), free(g1), free(gb), free(A_log), free(dtb), free(onorm), free(state);
    free(f1t), free(g1t), free(ref_state), free(ref_y), free(gy), free(gs), free(gd), free(dstate);
    cudaFree((void *)a.proj), cudaFree((void *)a.item_row0), cudaFree((void *)a.item_ntok), cudaFree((void *)a.item_slot);
    cudaFree(a.state), cudaFree((void *)a.convw), cudaFree((void *)a.f1t), cudaFree((void *)a.g1t);
    cudaFree((void *)a.g_bias), cudaFree((void *)a.A_log), cudaFree((void *)a.dt_bias), cudaFree((void *)a.onorm), cudaFree(a.y);
    if (a.lowrank) cudaFree(a.lowrank);
}

static void run_kda_case(int H, int K, int taps, const int *ntok, const int *slots, int n_items, int lowrank)
{
    run_kda_case_opt(H, K, taps, ntok, slots, n_items, lowrank, &kda_plain);
}

/* The stream path (one token per item, K = V = 128, the low-rank scratch):
 * the 16 heads of the 1.7B shape with one block per pair and with 5 or 3
 * blocks walking every pair through the ring of shared buffers, taps 2..4,
 * the fla options (the preconv ones through kc_kda_conv first), bf16 state,
 * padding items; then shapes it must refuse (kc_kda_step falls back). */
static void kda_stream_cases(void)
{
    const int one[] = {1, 1, 1, 1}, sl[] = {2, -1, 0, 3}, sl3[] = {1, 3, 0};
    const kda_opts st = {.stream = 1}, st5 = {.stream = 1, .stream_blocks = 5};
    const kda_opts lb = {.stream = 1, .stream_blocks = 3, .lower_bound = -5.0f};
    const kda_opts neg = {.stream = 1, .stream_blocks = 7, .neg_eigval = 1};
    const kda_opts cb = {.stream = 1, .stream_blocks = 4, .conv_bias = 1}, nc = {.stream = 1, .no_conv = 1};
    const kda_opts bf = {.stream = 1, .stream_blocks = 5, .state_bf16 = 1};
    const kda_opts bf_lb = {.stream = 1, .state_bf16 = 1, .lower_bound = -3.0f, .neg_eigval = 1};
    const kda_opts no = {.stream = 2}, no_gva = {.stream = 2, .group = 2};
    run_kda_case_opt(16, 128, 4, one, sl, 4, 1, &st);
    run_kda_case_opt(16, 128, 4, one, sl, 4, 1, &st5);
    run_kda_case_opt(4, 128, 3, one, sl3, 3, 1, &lb);
    run_kda_case_opt(3, 128, 2, one, sl3, 3, 1, &neg);
    run_kda_case_opt(2, 128, 4, one, sl, 4, 1, &cb);
    run_kda_case_opt(2, 128, 4, one, sl3, 3, 1, &nc);
    run_kda_case_opt(16, 128, 4, one, sl, 4, 1, &bf);
    run_kda_case_opt(4, 128, 3, one, sl3, 3, 1, &bf_lb);
    run_kda_case_opt(3, 64, 4, one, sl3, 3, 1, &no);
    run_kda_case_opt(2, 128, 4, one, sl3, 3, 0, &no); /* no low-rank scratch */
    run_kda_case_opt(4, 128, 4, one, sl3, 3, 1, &no_gva);
}

#endif

/*
 * lab_kda_step_tiled.c - test and benchmark of the kernel lab's column-tiled
 * KDA step (kda_step_tiled.cu) against the production kernel.
 *
 *   lab_kda_step_tiled            the cases of tests/kernels/kda_step_cases.h
 *                                 (CPU reference, tolerances there) that the
 *                                 variant accepts, at 2 and 3 blocks per SM and
 *                                 with 3 clusters walking all (item, head) pairs
 *   lab_kda_step_tiled --bench    1.7B shape (16 heads, K = V = 128, fp32
 *                                 state), B = 64 and 256: kc_kda_step and the
 *                                 variant, ms (median of 20 CUDA-event timings)
 *                                 and their fraction of a device-to-device copy
 *                                 measured in the same process
 *
 * Skips (77) without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cuda_ops.h"
#include "kt_util.h"
#include "lab_kda_step_tiled.h"

#include "kda_step_cases.h"

static int lab_occ = 2, lab_clusters = 0;
static int launch_tiled(const kc_kda_args *a, cudaStream_t s) { return lab_kda_step_tiled(a, lab_occ, lab_clusters, s); }

/* What the variant accepts: K 32 / 64 / 128 with the low-rank scratch. */
static void tiled_cases(void)
{
    const kda_opts lb = {.lower_bound = -5.0f}, neg = {.neg_eigval = 1}, cb = {.conv_bias = 1};
    const kda_opts nc = {.no_conv = 1}, gva2 = {.group = 2};
    const kda_opts all = {.group = 2, .lower_bound = -3.0f, .neg_eigval = 1, .conv_bias = 1};
    { const int nt[] = {1, 1, 1}, sl[] = {1, 3, 0}; run_kda_case(3, 64, 4, nt, sl, 3, 1); }
    { const int nt[] = {1, 5, 1, 70}, sl[] = {0, 1, -1, 3}; run_kda_case(4, 128, 4, nt, sl, 4, 1); }
    { const int nt[] = {2, 1}, sl[] = {1, 2}; run_kda_case(2, 32, 3, nt, sl, 2, 1); }
    { const int nt[] = {1, 1, 9}, sl[] = {1, 3, 0}; run_kda_case_opt(3, 64, 4, nt, sl, 3, 1, &lb); }
    { const int nt[] = {1, 5, 1, 30}, sl[] = {0, 1, -1, 3}; run_kda_case_opt(2, 128, 4, nt, sl, 4, 1, &neg); }
    { const int nt[] = {2, 1, 11}, sl[] = {1, 2, 0}; run_kda_case_opt(2, 32, 3, nt, sl, 3, 1, &cb); }
    { const int nt[] = {1, 6, 1}, sl[] = {3, 0, -1}; run_kda_case_opt(2, 64, 4, nt, sl, 3, 1, &nc); }
    { const int nt[] = {1, 4, 13}, sl[] = {0, 2, 1}; run_kda_case_opt(4, 64, 4, nt, sl, 3, 1, &gva2); }
    { const int nt[] = {1, 9}, sl[] = {3, 0}; run_kda_case_opt(4, 32, 2, nt, sl, 2, 1, &all); }
}

static void test_tiled_matches_reference(void **st)
{
    (void)st;
    kda_launch = launch_tiled;
    const int cfg[3][2] = {{2, 0}, {2, 3}, {3, 0}}; /* (blocks per SM, cluster cap) */
    for (int c = 0; c < 3; c++) {
        lab_occ = cfg[c][0], lab_clusters = cfg[c][1];
        printf("tiled KDA step: %d blocks/SM, %s\n", lab_occ, lab_clusters ? "3 clusters" : "as many clusters as fit");
        tiled_cases();
    }
    kda_launch = kc_kda_step;
}

/* Arguments outside the variant's contract are refused, never run. */
static void test_tiled_refuses_what_it_cannot_do(void **st)
{
    (void)st;
    kc_kda_args a;
    memset(&a, 0, sizeof a);
    a.n_items = 1, a.H = 2, a.K = 16, a.V = 16, a.R = 16, a.taps = 4;
    a.convw = (const float *)&a; /* non-NULL; nothing is launched */
    a.lowrank = (float *)&a;
    assert_int_equal(lab_kda_step_tiled(&a, 2, 0, 0), -5); /* K = 16 */
    a.K = 64, a.V = 48;
    assert_int_equal(lab_kda_step_tiled(&a, 2, 0, 0), -5); /* V % 32 */
    a.V = 64, a.lowrank = NULL;
    assert_int_equal(lab_kda_step_tiled(&a, 2, 0, 0), -5); /* no low-rank scratch */
    a.lowrank = (float *)&a, a.state_bf16 = 1;
    assert_int_equal(lab_kda_step_tiled(&a, 2, 0, 0), -5); /* bf16 state */
    a.state_bf16 = 0;
    assert_int_equal(lab_kda_step_tiled(&a, 4, 0, 0), -5); /* blocks per SM */
}

/* ---- benchmark ---- */

static float median_ms(int (*fn)(const kc_kda_args *, cudaStream_t), const kc_kda_args *a, const void *src,
                       void *dst, size_t copy_bytes)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ts[20];
    for (int r = -2; r < 20; r++) {
        cudaEventRecord(e0, 0);
        if (fn) {
            if (fn(a, 0)) return -1.0f;
        } else {
            cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, 0);
        }
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        if (r >= 0) cudaEventElapsedTime(&ts[r], e0, e1);
    }
    for (int i = 0; i < 20; i++)
        for (int j = i + 1; j < 20; j++)
            if (ts[j] < ts[i]) { float t = ts[i]; ts[i] = ts[j]; ts[j] = t; }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ts[10];
}

static int launch_occ3(const kc_kda_args *a, cudaStream_t s) { return lab_kda_step_tiled(a, 3, 0, s); }
static int launch_occ2(const kc_kda_args *a, cudaStream_t s) { return lab_kda_step_tiled(a, 2, 0, s); }

static int bench(void)
{
    const int H = 16, K = 128, V = 128, R = 128, HK = H * K, HV = H * V, C = 2 * HK + HV;
    for (int B = 64; B <= 256; B *= 4) {
        kc_kda_args a;
        memset(&a, 0, sizeof a);
        a.ldp = C + 2 * R + H + 8;
        a.off_f0 = C, a.off_g0 = C + R, a.off_beta = C + 2 * R;
        a.H = H, a.K = K, a.V = V, a.R = R, a.taps = 4, a.eps = 1e-6f, a.n_items = B, a.ldy = HV;
        a.slot_stride = ((size_t)H * K * V + 3 * C + 3) & ~(size_t)3;
        int32_t *meta = malloc((size_t)3 * B * 4);
        for (int i = 0; i < B; i++) meta[i] = i, meta[B + i] = 1, meta[2 * B + i] = i;
        int32_t *dmeta = kt_dev(meta, (size_t)3 * B * 4);
        a.item_row0 = dmeta, a.item_ntok = dmeta + B, a.item_slot = dmeta + 2 * B;
        const size_t np = (size_t)B * a.ldp, nv = (size_t)C * 4 + HV + H + HK + V, nw = (size_t)R * (HK + HV);
        float *hp = malloc(np * 4), *hv = malloc(nv * 4);
        kt_fill(hp, np, 1.0f);
        kt_fill(hv, nv, 0.5f);
        float *hw = malloc(nw * 4);
        kt_fill(hw, nw, 0.05f);
        uint16_t *hwb = kt_to_bf16(hw, nw);
        float *proj = kt_dev(hp, np * 4), *vecs = kt_dev(hv, nv * 4);
        uint16_t *w = kt_dev(hwb, nw * 2);
        float *state;
        cudaMalloc((void **)&state, a.slot_stride * B * 4);
        cudaMemset(state, 0, a.slot_stride * B * 4);
        a.proj = proj, a.state = state, a.convw = vecs, a.g_bias = vecs + C * 4, a.A_log = a.g_bias + HV;
        a.dt_bias = a.A_log + H, a.onorm = a.dt_bias + HK, a.f1t = w, a.g1t = w + (size_t)R * HK;
        a.y = kt_dev_poison((size_t)B * HV * 2);
        a.lowrank = kt_dev_poison((size_t)B * (HK + HV) * 4), a.lowrank_rows = B;
        const size_t state_bytes = (size_t)B * H * K * V * 4;
        void *csrc, *cdst;
        cudaMalloc(&csrc, state_bytes);
        cudaMalloc(&cdst, state_bytes);
        const float copy = median_ms(NULL, NULL, csrc, cdst, state_bytes); /* reads + writes state_bytes */
        const char *names[3] = {"kc_kda_step (production, block per head)", "lab tiled, 2 blocks/SM", "lab tiled, 3 blocks/SM"};
        int (*fns[3])(const kc_kda_args *, cudaStream_t) = {kc_kda_step, launch_occ2, launch_occ3};
        printf("B=%d: device copy of the state %.3f ms (%.0f GB/s read + write)\n", B, copy,
               2.0 * state_bytes / copy / 1e6);
        for (int f = 0; f < 3; f++) {
            const float ms = median_ms(fns[f], &a, NULL, NULL, 0);
            if (ms < 0) { fprintf(stderr, "%s failed\n", names[f]); return 1; }
            printf("  %-44s %.4f ms  %.0f GB/s  %.0f%% of copy\n", names[f], ms, 2.0 * state_bytes / ms / 1e6,
                   100.0 * copy / ms);
        }
        cudaFree(csrc), cudaFree(cdst), cudaFree(state), cudaFree(proj), cudaFree(vecs), cudaFree(w);
        cudaFree(a.y), cudaFree(a.lowrank), cudaFree(dmeta);
        free(meta), free(hp), free(hv), free(hw), free(hwb);
    }
    return 0;
}

int main(int argc, char **argv)
{
    kt_skip_without_gpu();
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiled_refuses_what_it_cannot_do),
        cmocka_unit_test(test_tiled_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_kda_step_emu.c - the KDA decode step kernels of kernels/ops_kda.cu
 * (kc_kda_step: the low-rank pass, the block-per-head kernel and the stream
 * path) against the CPU reference on the CPU emulator (emu/), so their
 * indexing, barriers, cp.async groups and numerics are checked on every
 * machine. The cases are tests/kernels/kda_step_cases.h's, which
 * test_kernels also runs on the GPU; tolerances there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cuda_ops.h"
#include "kt_util.h"

#include "kda_step_cases.h"

static void test_kda_step_block_per_head(void **st)
{
    (void)st;
    { const int nt[] = {1, 3, 17, 2}, sl[] = {2, -1, 0, 3}; run_kda_case(2, 16, 4, nt, sl, 4, 1); }
    { const int nt[] = {1, 5, 1, 9}, sl[] = {0, 1, -1, 3}; run_kda_case(2, 128, 4, nt, sl, 4, 1); }
    const kda_opts bf = {.state_bf16 = 1}, gva = {.group = 2, .conv_bias = 1};
    { const int nt[] = {1, 4}, sl[] = {1, 2}; run_kda_case_opt(2, 128, 3, nt, sl, 2, 0, &bf); }
    { const int nt[] = {1, 4, 3}, sl[] = {0, 2, 1}; run_kda_case_opt(4, 64, 4, nt, sl, 3, 1, &gva); }
}

static void test_kda_step_stream(void **st)
{
    (void)st;
    kda_stream_cases();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kda_step_block_per_head),
        cmocka_unit_test(test_kda_step_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

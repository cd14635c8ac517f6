/*
 * kc_bench.h - per-kernel bandwidth at the 1.7B shapes against a
 * device-to-device copy measured in the same process (kda-cli bench prints
 * and records the rows). Built as a stub returning KDA_EUNSUP without CUDA.
 */
#ifndef KDA_KC_BENCH_H
#define KDA_KC_BENCH_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[128];
    double ms;        /* median of CUDA-event timings */
    double bytes;     /* bytes the kernel must move (counted, not measured) */
    double tbps;      /* bytes / ms */
    double of_copy;   /* tbps / the copy's TB/s */
} kc_bench_row;

/* Fills up to max rows (the first is the copy itself); returns the row count,
 * or a negative KDA_E* code. */
int kc_bench_kernels(kc_bench_row *rows, int max);

#ifdef __cplusplus
}
#endif

#endif

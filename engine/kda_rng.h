/*
 * kda_rng.h - the counter-based RNG every backend draws samples with: the
 * same (seed, counter) gives the same uniform in [0, 1) on the CPU and on the
 * GPU, so a seeded request samples the same tokens on either device. One
 * definition, compiled as host code by the C compiler and as host + device
 * code by nvcc.
 */
#ifndef KDA_RNG_H
#define KDA_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define KDA_HD __host__ __device__
#else
#define KDA_HD
#endif

static inline KDA_HD uint64_t kda_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static inline KDA_HD double kda_rng_uniform(uint64_t seed, uint64_t counter)
{
    return (double)(kda_splitmix64(seed ^ kda_splitmix64(counter)) >> 11) * 0x1.0p-53;
}

#endif

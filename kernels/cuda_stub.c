/* Built when the CUDA backend is not: --device cuda then fails with a clear message. */
#include <stdio.h>

#include "model.h"

int cuda_backend_create(backend **out, const backend_params *p, char *err, size_t errlen)
{
    (void)p;
    *out = NULL;
    snprintf(err, errlen, "this build has no CUDA backend (rebuild with nvcc and -Dcuda=enabled)");
    return KDA_EUNSUP;
}

int cuda_device_available(void) { return 0; }

/* kda-cli bench's per-kernel table needs the CUDA build. */
#include <stdio.h>
int cuda_bench_kernels(FILE *json, FILE *table);
int cuda_bench_kernels(FILE *json, FILE *table)
{
    (void)json, (void)table;
    return KDA_EUNSUP;
}

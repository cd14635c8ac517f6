/* Built when the CUDA backend is not: --device cuda then fails with a clear message. */
#include <stdio.h>

#include "kc_bench.h"
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
int kc_bench_kernels(kc_bench_row *rows, int max)
{
    (void)rows, (void)max;
    return KDA_EUNSUP;
}

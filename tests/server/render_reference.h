/* render_reference.h - the pre-json_out renderers (render_reference.c), the oracle of test_render.c. */
#ifndef TEST_RENDER_REFERENCE_H
#define TEST_RENDER_REFERENCE_H

#include "api.h"

char *ref_render(api_job *j, int *status, size_t *len);
int ref_render_stream(api_job *j, api_buf *out);

#endif

/*
 * fields.h - the request fields each endpoint reads, and the check that no
 * sampling field is silently ignored. server/openapi.json describes the same
 * fields; tests/server/test_openapi.py checks the two against each other.
 */
#ifndef SRV_FIELDS_H
#define SRV_FIELDS_H

#include <cjson/cJSON.h>

#include "api.h"

/* NULL-terminated field names of an API_* kind. */
const char *const *api_fields(int kind);

/* A 400 naming the first field of o that changes sampling but that this
 * server does not implement (a known name from vLLM, llama.cpp, TGI or HF
 * generate, or an unknown name that looks like one). Other unknown fields
 * are ignored. Returns 0 or -1 with e filled. */
int api_check_fields(int kind, const cJSON *o, api_error *e);

#endif

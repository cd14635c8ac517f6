/*
 * sampling.h - the CPU sampler (semantics in engine.h, kda_sampling). The
 * CUDA backend's sampler implements the same function and is tested against
 * this one.
 */
#ifndef KDA_SAMPLING_H
#define KDA_SAMPLING_H

#include <stdint.h>

#include "engine.h"

/* Draws one token from logits[vocab] (not modified). work must hold
 * 2 * vocab floats. Returns the token id. */
int32_t sampling_draw(const float *logits, int vocab, const kda_sampling *s, float *work);

/* Raw log-probs: lse = logsumexp(logits); writes the n best (id, logit - lse),
 * best first, ties by lower id. */
void sampling_top_n(const float *logits, int vocab, float lse, int n, int32_t *ids, float *lps);

#endif

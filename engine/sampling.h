/*
 * sampling.h - the CPU sampler (semantics in engine.h, kda_sampling). The
 * CUDA backend's sampler implements the same function and is tested against
 * this one.
 */
#ifndef KDA_SAMPLING_H
#define KDA_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* Bytes of the workspace sampling_draw needs for a vocabulary (allocated
 * once by the caller, at load: the draw itself never allocates). */
size_t sampling_work_bytes(int vocab);

/* Draws one token from logits[vocab] (not modified). hist[n_hist] is the
 * sequence's whole token history (the first s->n_prompt tokens are the
 * prompt); the RNG counter is n_hist - s->n_prompt. work: sampling_work_bytes
 * bytes, 8-byte aligned. Returns the token id. */
int32_t sampling_draw(const float *logits, int vocab, const kda_sampling *s, const int32_t *hist, int n_hist,
                      void *work);

/* Raw log-probs: lse = logsumexp(logits); writes the n best (id, logit - lse),
 * best first, ties by lower id. */
void sampling_top_n(const float *logits, int vocab, float lse, int n, int32_t *ids, float *lps);

#endif

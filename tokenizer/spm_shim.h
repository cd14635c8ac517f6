/*
 * spm_shim.h - the few calls the tokenizer needs from libsentencepiece
 * (C++), behind a C interface. Internal to tokenizer/: nothing else includes
 * it. A spm_model is immutable after spm_load; SentencePiece's Encode/Decode
 * are const, so every call here may run on many threads at once.
 */
#ifndef KDA_SPM_SHIM_H
#define KDA_SPM_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spm_model spm_model;

spm_model *spm_load(const char *path, char *err, size_t errlen);
void spm_free(spm_model *m);

int spm_vocab_size(const spm_model *m);
int spm_bos_id(const spm_model *m);   /* -1 if the model has none */
int spm_eos_id(const spm_model *m);
int spm_unk_id(const spm_model *m);
int spm_is_byte(const spm_model *m, int32_t id);   /* a <0xNN> byte-fallback piece */
/* Pieces live as long as the model. id must be in range. */
const char *spm_id_to_piece(const spm_model *m, int32_t id);
int32_t spm_piece_to_id(const spm_model *m, const char *piece);   /* -1 if unknown */

/* Both return 0 or -1 with a message; outputs are malloc'd. *ids has room
 * for one id more than *n_ids, so the caller can prepend BOS in place. */
int spm_encode(const spm_model *m, const char *text, size_t len, int32_t **ids, int *n_ids,
               char *err, size_t errlen);
int spm_decode(const spm_model *m, const int32_t *ids, int n_ids, char **text, size_t *len,
               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif

/*
 * spm_stub.c - stands in for spm_shim.cpp when libsentencepiece is not
 * found at configure time: loading fails with a message saying so, and the
 * byte tokenizer keeps working.
 */
#include <stdio.h>

#include "spm_shim.h"

spm_model *spm_load(const char *path, char *err, size_t errlen) {
    if (err && errlen)
        snprintf(err, errlen, "tokenizer: cannot load %s: built without libsentencepiece", path);
    return NULL;
}
/* Unreachable: no spm_model ever exists in this build. */
void spm_free(spm_model *m) { (void)m; }
int spm_vocab_size(const spm_model *m) { (void)m; return 0; }
int spm_bos_id(const spm_model *m) { (void)m; return -1; }
int spm_eos_id(const spm_model *m) { (void)m; return -1; }
int spm_unk_id(const spm_model *m) { (void)m; return -1; }
int spm_is_byte(const spm_model *m, int32_t id) { (void)m; (void)id; return 0; }
const char *spm_id_to_piece(const spm_model *m, int32_t id) { (void)m; (void)id; return NULL; }
int32_t spm_piece_to_id(const spm_model *m, const char *piece) { (void)m; (void)piece; return -1; }
int spm_encode(const spm_model *m, const char *text, size_t len, int32_t **ids, int *n_ids,
               char *err, size_t errlen) {
    (void)m; (void)text; (void)len; (void)err; (void)errlen;
    *ids = NULL; *n_ids = 0;
    return -1;
}
int spm_decode(const spm_model *m, const int32_t *ids, int n_ids, char **text, size_t *len,
               char *err, size_t errlen) {
    (void)m; (void)ids; (void)n_ids; (void)err; (void)errlen;
    *text = NULL; *len = 0;
    return -1;
}

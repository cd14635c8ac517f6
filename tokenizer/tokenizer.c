/*
 * tokenizer.c - opening a tokenizer and one-shot encode/decode.
 *
 * SentencePiece: everything goes through the library (spm_shim.cpp), so ids
 * and text match the Python sentencepiece package exactly. Invalid UTF-8 in
 * the input is the library's business: its normalizer turns each ill-formed
 * byte into U+FFFD before tokenizing (encode(x) == encode(sanitize(x))).
 *
 * Bytes: ids are the input bytes verbatim, invalid UTF-8 included (that is
 * the model's alphabet, nothing is lost on the way in); decode applies the
 * U+FFFD rule of tokenizer.h, so decoded text is always valid UTF-8. No
 * BOS/EOS: the byte models of the trainer have none.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "kda_file.h"
#include "tok_internal.h"

static int fail(char *err, size_t errlen, const char *msg, const char *arg) {
    if (err && errlen) snprintf(err, errlen, msg, arg);
    return -1;
}

int tok_open_bytes(tok_tokenizer **out) {
    tok_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return -1;
    t->vocab = 256;
    t->bos = t->eos = -1;
    /* Spelled as SentencePiece spells its byte-fallback pieces. */
    for (int i = 0; i < 256; i++) snprintf(t->byte_pieces[i], sizeof(t->byte_pieces[i]), "<0x%02X>", i);
    *out = t;
    return 0;
}

int tok_open_spm(tok_tokenizer **out, const char *model_path, char *err, size_t errlen) {
    *out = NULL;
    spm_model *m = spm_load(model_path, err, errlen);
    if (!m) return -1;
    tok_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) {
        spm_free(m);
        return fail(err, errlen, "tokenizer: out of memory opening %s", model_path);
    }
    t->spm = m;
    t->vocab = spm_vocab_size(m);
    t->bos = spm_bos_id(m);
    t->eos = spm_eos_id(m);
    (void)tok_surface_build(t); /* on failure decoding stays with the library */
    *out = t;
    return 0;
}

int tok_open_dir(tok_tokenizer **out, const char *model_dir, char *err, size_t errlen) {
    *out = NULL;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/tokenizer.model", model_dir);
    if (stat(path, &st) == 0) return tok_open_spm(out, path, err, errlen);

    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    size_t len;
    char why[512];
    char *text = kda_file_read(path, KDA_MAX_CONFIG_BYTES, &len, why, sizeof why);
    if (!text) {
        if (err && errlen) snprintf(err, errlen, "tokenizer: %s has no tokenizer.model and %s", model_dir, why);
        return -1;
    }
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cfg) return fail(err, errlen, "tokenizer: %s is not valid JSON", path);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer");
    int is_bytes = cJSON_IsString(kind) && strcmp(kind->valuestring, "bytes") == 0;
    cJSON_Delete(cfg);
    if (!is_bytes)
        return fail(err, errlen,
                    "tokenizer: %s has no tokenizer.model and its config.json does not say "
                    "\"tokenizer\": \"bytes\"", model_dir);
    return tok_open_bytes(out);
}

void tok_close(tok_tokenizer *t) {
    if (!t) return;
    tok_surface_free(t->surf);
    if (t->spm) spm_free(t->spm);
    free(t);
}

int tok_vocab_size(const tok_tokenizer *t) { return t->vocab; }
int tok_bos_id(const tok_tokenizer *t) { return t->bos; }
int tok_eos_id(const tok_tokenizer *t) { return t->eos; }
int tok_is_bytes(const tok_tokenizer *t) { return t->spm == NULL; }
int tok_decodes_by_table(const tok_tokenizer *t) { return t->surf != NULL; }

int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_bos,
               int32_t **ids, int *n_ids, char *err, size_t errlen) {
    *ids = NULL;
    *n_ids = 0;
    if (len > (size_t)INT32_MAX - 1)
        return fail(err, errlen, "tokenizer: input too long (%s)", "2^31 bytes or more");
    int bos = add_bos && t->bos >= 0;
    if (t->spm) {
        int32_t *raw;
        int n;
        if (spm_encode(t->spm, text, len, &raw, &n, err, errlen) != 0) return -1;
        if (bos) {
            /* spm_encode leaves room for one more id. */
            memmove(raw + 1, raw, (size_t)n * sizeof(int32_t));
            raw[0] = t->bos;
            n++;
        }
        *ids = raw;
        *n_ids = n;
        return 0;
    }
    int32_t *out = malloc((len + (size_t)bos + 1) * sizeof(int32_t));
    if (!out) return fail(err, errlen, "tokenizer: out of memory (%s)", "encode");
    int n = 0;
    if (bos) out[n++] = t->bos;
    for (size_t i = 0; i < len; i++) out[n++] = (unsigned char)text[i];
    *ids = out;
    *n_ids = n;
    return 0;
}

static int check_ids(const tok_tokenizer *t, const int32_t *ids, int n_ids, char *err, size_t errlen) {
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab) {
            if (err && errlen)
                snprintf(err, errlen, "tokenizer: id %d at position %d is outside the vocabulary (0..%d)",
                         (int)ids[i], i, t->vocab - 1);
            return -1;
        }
    }
    return 0;
}

int tok_decode_len(const tok_tokenizer *t, const int32_t *ids, int n_ids, char **text, size_t *len,
                   char *err, size_t errlen) {
    *text = NULL;
    *len = 0;
    if (check_ids(t, ids, n_ids, err, errlen) != 0) return -1;
    if (t->surf) {
        if (tok_surface_decode(t, ids, n_ids, text, len) == 0) return 0;
        return fail(err, errlen, "tokenizer: decode failed (%s)", "out of memory");
    }
    if (t->spm) return spm_decode(t->spm, ids, n_ids, text, len, err, errlen);
    char *raw = malloc((size_t)n_ids + 1);
    if (!raw) return fail(err, errlen, "tokenizer: out of memory (%s)", "decode");
    for (int i = 0; i < n_ids; i++) raw[i] = (char)ids[i];
    *text = tok_utf8_sanitize(raw, (size_t)n_ids, len);
    free(raw);
    if (!*text) return fail(err, errlen, "tokenizer: out of memory (%s)", "decode");
    return 0;
}

int tok_decode(const tok_tokenizer *t, const int32_t *ids, int n_ids, char **text,
               char *err, size_t errlen) {
    size_t len;
    return tok_decode_len(t, ids, n_ids, text, &len, err, errlen);
}

const char *tok_id_to_piece(const tok_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->vocab) return NULL;
    return t->spm ? spm_id_to_piece(t->spm, id) : t->byte_pieces[id];
}

int32_t tok_piece_to_id(const tok_tokenizer *t, const char *piece) {
    if (t->spm) return spm_piece_to_id(t->spm, piece);
    unsigned v;
    char tail;
    if (strlen(piece) == 6 && sscanf(piece, "<0x%2X%c", &v, &tail) == 2 && tail == '>' &&
        strcmp(piece, t->byte_pieces[v]) == 0)
        return (int32_t)v;
    return -1;
}

int tok_is_byte_piece(const tok_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->vocab) return 0;
    if (t->surf) return t->surf->byte[id] >= 0;
    return t->spm ? spm_is_byte(t->spm, id) : 1;
}

/*
 * tok_internal.h - the tokenizer struct, shared by the files of tokenizer/
 * only. Immutable after open (see tokenizer.h on threads).
 */
#ifndef KDA_TOK_INTERNAL_H
#define KDA_TOK_INTERNAL_H

#include <stdint.h>

#include "spm_shim.h"
#include "tokenizer.h"

/* SentencePiece decoding by table (surface.c): for every id the text it adds
 * once the decoded text is non-empty, text[off[id] .. off[id + 1]); the length
 * of decode([id]) alone; its byte if it is a <0xNN> piece, else -1. */
typedef struct {
    uint32_t *off;
    uint32_t *solo;
    int16_t *byte;
    char *text;
} tok_surface;

struct tok_tokenizer {
    spm_model *spm;    /* NULL for the byte tokenizer */
    tok_surface *surf; /* NULL: decode through the library only (bytes, or the table's check failed) */
    int vocab;         /* 256 for bytes */
    int bos, eos;      /* -1 if none */
    char byte_pieces[256][7];   /* "<0x41>": the byte tokenizer's pieces */
};

/* tok_utf8_sanitize into out (room for 3 bytes per input byte, no NUL added);
 * returns the bytes written. */
size_t tok_utf8_sanitize_to(char *out, const char *s, size_t len);

/* Builds t->surf and checks it against the library; -1 (t->surf NULL) if it
 * cannot be built or disagrees anywhere. */
int tok_surface_build(tok_tokenizer *t);
void tok_surface_free(tok_surface *s);
/* decode(ids[0..n)) with t->surf set; ids already checked. */
int tok_surface_decode(const tok_tokenizer *t, const int32_t *ids, int n, char **text, size_t *len);

#endif

/*
 * tok_internal.h - the tokenizer struct, shared by the files of tokenizer/
 * only. Immutable after open (see tokenizer.h on threads).
 */
#ifndef KDA_TOK_INTERNAL_H
#define KDA_TOK_INTERNAL_H

#include "spm_shim.h"
#include "tokenizer.h"

struct tok_tokenizer {
    spm_model *spm;    /* NULL for the byte tokenizer */
    int vocab;         /* 256 for bytes */
    int bos, eos;      /* -1 if none */
    char byte_pieces[256][7];   /* "<0x41>": the byte tokenizer's pieces */
};

#endif

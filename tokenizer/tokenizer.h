/*
 * tokenizer.h - text <-> token ids (tok_ prefix).
 *
 * Two kinds: SentencePiece (tokenizer.model in the model directory, through
 * libsentencepiece behind a small extern "C" shim) and bytes (config.json
 * says "tokenizer": "bytes"; ids 0..255 are the bytes themselves).
 *
 * Thread safety: a tok_tokenizer is immutable after open; encode/decode may
 * be called from many threads at once. A tok_stream belongs to one thread.
 * Errors: int status (0 ok, <0 error) + message in err[errlen].
 */
#ifndef KDA_TOKENIZER_H
#define KDA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tok_tokenizer tok_tokenizer;

/* Opens the tokenizer of a model directory: tokenizer.model if present,
 * else config.json's "tokenizer": "bytes". */
int tok_open_dir(tok_tokenizer **out, const char *model_dir, char *err, size_t errlen);
int tok_open_spm(tok_tokenizer **out, const char *model_path, char *err, size_t errlen);
int tok_open_bytes(tok_tokenizer **out);
void tok_close(tok_tokenizer *t);

int tok_vocab_size(const tok_tokenizer *t);
int tok_bos_id(const tok_tokenizer *t);   /* -1 if none */
int tok_eos_id(const tok_tokenizer *t);   /* -1 if none */
int tok_is_bytes(const tok_tokenizer *t);

/* Encodes len bytes of text. *ids is malloc'd (caller frees), *n_ids its
 * length. add_bos prepends the BOS id (if the tokenizer has one). Invalid
 * UTF-8 is never an error: SentencePiece reads each ill-formed byte as
 * U+FFFD (its normalizer's rule, so encode(x) == encode(sanitize(x)), see
 * tok_utf8_sanitize); the byte tokenizer keeps the bytes as they are.
 * Cost: libsentencepiece's BPE encoder (0.1.97) is superlinear in the input
 * length, ~10 ms for an 8192-token prompt but seconds for 1 MB of text, so
 * a server should cap the prompt's byte length before calling this. */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int add_bos,
               int32_t **ids, int *n_ids, char *err, size_t errlen);
/* Decodes ids into a malloc'd NUL-terminated string. Out-of-range ids are an error. */
int tok_decode(const tok_tokenizer *t, const int32_t *ids, int n_ids, char **text,
               char *err, size_t errlen);
/* 1 if a SentencePiece tokenizer decodes from its per-id table (surface.c:
 * built and checked against the library at open), 0 if through the library
 * for every call (or the byte tokenizer). Same text either way. */
int tok_decodes_by_table(const tok_tokenizer *t);
/* Same, also giving the length (decoded text never holds a NUL unless an id
 * stands for one, e.g. byte 0). */
int tok_decode_len(const tok_tokenizer *t, const int32_t *ids, int n_ids, char **text, size_t *len,
                   char *err, size_t errlen);
/* The piece string of one id (e.g. "▁the", "<0xE2>"), NULL if out of range. */
const char *tok_id_to_piece(const tok_tokenizer *t, int32_t id);
int32_t tok_piece_to_id(const tok_tokenizer *t, const char *piece);   /* -1 if unknown */
/* 1 if id is a single byte (<0xNN> byte-fallback piece, or any id of the byte tokenizer). */
int tok_is_byte_piece(const tok_tokenizer *t, int32_t id);

/* Streaming detokenizer: feed ids one at a time, receive only complete UTF-8
 * text. The concatenation of all outputs (plus tok_stream_flush) equals
 * tok_decode of the whole id list. */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const tok_tokenizer *t);
void tok_stream_free(tok_stream *s);
/* Appends id; returns a pointer to the newly completed text (NUL-terminated,
 * valid until the next call; "" when nothing is complete yet) and its
 * length in *len. Ids outside the vocabulary are ignored (tok_decode
 * rejects them; callers validate). NULL from tok_stream_new: out of memory. */
const char *tok_stream_push(tok_stream *s, int32_t id, size_t *len);
/* Returns whatever remains (incomplete UTF-8 bytes are emitted as U+FFFD)
 * and resets the stream to the start of a new text. */
const char *tok_stream_flush(tok_stream *s, size_t *len);

/* Stop strings across streamed chunks: holds back text that could be the
 * start of a stop string. feed() returns text safe to emit now; *stopped is
 * set once a stop string is complete (the returned text ends right before it;
 * the earliest match wins; later feeds return "" with *stopped set). flush()
 * returns the held-back text when generation ends without a stop. Empty
 * stop strings are ignored. Returned pointers live until the next call. */
typedef struct tok_stopper tok_stopper;
tok_stopper *tok_stopper_new(const char *const *stops, int n_stops);
void tok_stopper_free(tok_stopper *s);
const char *tok_stopper_feed(tok_stopper *s, const char *text, size_t len, size_t *out_len, int *stopped);
const char *tok_stopper_flush(tok_stopper *s, size_t *out_len);

/* UTF-8 policy, shared by both tokenizer kinds and by the stream. A byte
 * that does not start a well-formed sequence (Unicode 3.9 table 3-7: no
 * overlongs, no surrogates, nothing past U+10FFFF; a truncated sequence is
 * ill-formed) becomes one U+FFFD and decoding resumes at the next byte.
 * That is SentencePiece's own rule for byte pieces, so decoded text is
 * always valid UTF-8 whatever the ids, and safe to put into JSON. */
/* Malloc'd NUL-terminated copy with the rule applied; NULL only if out of memory. */
char *tok_utf8_sanitize(const char *s, size_t len, size_t *out_len);
/* Length (1..4) of the well-formed sequence starting at s[0], 0 if none. */
int tok_utf8_char_len(const char *s, size_t len);
/* Bytes at the end of s (0..3) that are an unfinished but so far well-formed
 * sequence: more bytes could still make them a character. */
size_t tok_utf8_incomplete_tail(const char *s, size_t len);

#ifdef __cplusplus
}
#endif
#endif

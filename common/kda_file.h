/*
 * kda_file.h - opening the files of a model directory (config.json, the
 * tokenizer, chat templates, name and config maps, safetensors), which
 * nobody vouches for: only regular files are opened, checked without ever
 * blocking (a FIFO would hang open() until a writer came), and text files
 * are read whole under a size cap (/dev/zero would never end). Errors name
 * the file. Shared by engine/, tokenizer/ and server/.
 */
#ifndef KDA_FILE_H
#define KDA_FILE_H

#include <stddef.h>
#include <sys/stat.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Caps on the text files a model directory may hold; far above any real
 * one (llama-2's tokenizer.model is 0.5 MB, a 256k-vocab one 4 MB, the
 * largest tokenizer_config.json with added tokens a few MB). */
#define KDA_MAX_CONFIG_BYTES (16u << 20)      /* config.json, model.safetensors.index.json */
#define KDA_MAX_TOKENIZER_BYTES (64u << 20)   /* tokenizer.model, tokenizer_config.json, chat templates */
#define KDA_MAX_MAP_BYTES (1u << 20)          /* --name-map, --config-map files */

/* A read-only descriptor of path if it is a regular file, with *st filled;
 * -1 otherwise, with errno (ENOENT when it does not exist, EISDIR, EINVAL
 * for a FIFO, device or socket) and err "PATH: why". */
int kda_file_open(const char *path, struct stat *st, char *err, size_t errlen);

/* The whole of the regular file path, NUL-terminated (*len bytes without
 * it; len may be NULL); free() it. NULL on failure with errno as above, or
 * EFBIG when it holds more than max bytes, and err "PATH: why". */
char *kda_file_read(const char *path, size_t max, size_t *len, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif

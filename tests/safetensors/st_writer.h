/*
 * st_writer.h - builds .safetensors bytes for the reader's tests (stw_ prefix).
 *
 * Written from the format description (u64 LE header length, JSON header,
 * data section), not from engine/safetensors.c, so the tests check the reader
 * against the format rather than against itself.
 */
#ifndef KDA_ST_WRITER_H
#define KDA_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    unsigned char *buf;   /* malloc'd, exactly size bytes (ASan sees over-reads) */
    size_t size;
} stw_blob;

#define STW_MAX_TENSORS 32

typedef struct {
    const char *name, *dtype;    /* dtype as the JSON string, e.g. "BF16" */
    int ndim;
    int64_t shape[8];
    const void *data;
    size_t nbytes;
} stw_tensor;

typedef struct {
    stw_tensor t[STW_MAX_TENSORS];
    int n;
    const char *metadata;        /* JSON object text for __metadata__, or NULL */
} stw_file;

void stw_add(stw_file *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
             const void *data, size_t nbytes);
/* Header with offsets in add order, padded with spaces to a multiple of 8. */
stw_blob stw_build(const stw_file *f);
/* Any header text (not validated) followed by data_len bytes of data (data
 * may be NULL: zeros). */
stw_blob stw_raw(const char *header, const void *data, size_t data_len);
void stw_put_u64le(unsigned char *p, uint64_t v);
void stw_free(stw_blob *b);

/* Scratch directory under $TMPDIR (or /tmp); rm removes it and its files. */
char *stw_tmpdir(void);
char *stw_path(const char *dir, const char *name);   /* malloc'd dir/name */
void stw_write(const char *path, const void *buf, size_t size);
void stw_write_blob(const char *dir, const char *name, stw_blob b);
void stw_rmtree(char *dir);                          /* also frees dir */

#endif

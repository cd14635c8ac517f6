/*
 * safetensors.h - zero-copy reader for .safetensors files (st_ prefix).
 *
 * A file is mmapped read-only (or read into private memory:
 * st_open_dir_private); tensors are views into it, valid until st_close(). The header is validated completely before any view is
 * handed out: 8-byte length inside the file, JSON object, every entry a known
 * dtype with a shape whose element count times dtype size equals its byte
 * range (overflow-checked), offsets inside the data section, ranges sorted
 * and non-overlapping. Any violation is an error naming the file and tensor.
 */
#ifndef KDA_SAFETENSORS_H
#define KDA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_N_DTYPES
} st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data;      /* into the mapping */
    size_t nbytes;
    int file;              /* index into st_set.files */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t map_size;
} st_file;

typedef struct st_set {
    st_file *files;
    int n_files;
    st_tensor *tensors;    /* sorted by name */
    int n_tensors;
} st_set;

const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);

/* One file. */
int st_open_file(st_set **out, const char *path, char *err, size_t errlen);
/* A model directory: model.safetensors, or model.safetensors.index.json with
 * its shards (every shard listed in weight_map is opened once; a tensor the
 * index maps to a shard that lacks it is an error; a name in two shards too). */
int st_open_dir(st_set **out, const char *dir, char *err, size_t errlen);
/* The same, each file read into private anonymous memory instead of mapped:
 * the views then no longer depend on the file, which may be truncated or
 * rewritten underneath without effect (a mapping would give SIGBUS on the
 * next touch of a page past the new end, or silently mixed weights). What
 * a long-running server wants; costs the files' size in anonymous memory,
 * which the mapping's pages would take once touched anyway. */
int st_open_dir_private(st_set **out, const char *dir, char *err, size_t errlen);
/* Validate a header held in memory (what st_open_file does after mmap; exposed
 * for tests and fuzzing). buf is the whole file. On success fills s's tensors
 * for that one file index. */
int st_parse(st_set *s, int file_index, const void *buf, size_t size, const char *label,
             char *err, size_t errlen);
const st_tensor *st_find(const st_set *s, const char *name);
void st_close(st_set *s);

#endif

/* st_writer.c - see st_writer.h. Aborts on I/O trouble: these are fixtures. */
#include "st_writer.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void stw_die(const char *what) {
    perror(what);
    abort();
}

void stw_put_u64le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

void stw_add(stw_file *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
             const void *data, size_t nbytes) {
    if (f->n >= STW_MAX_TENSORS || ndim > 8) abort();
    stw_tensor *t = &f->t[f->n++];
    t->name = name;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->data = data;
    t->nbytes = nbytes;
}

typedef struct { char *s; size_t len, cap; } stw_str;

static void stw_cat(stw_str *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->len + (size_t)n + 1 > b->cap) {
        b->cap = (b->len + (size_t)n + 1) * 2;
        if (!(b->s = realloc(b->s, b->cap))) stw_die("realloc");
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

stw_blob stw_build(const stw_file *f) {
    stw_str h = {0};
    size_t off = 0, total = 0;
    stw_cat(&h, "{");
    if (f->metadata) stw_cat(&h, "\"__metadata__\":%s", f->metadata);
    for (int i = 0; i < f->n; i++) {
        const stw_tensor *t = &f->t[i];
        stw_cat(&h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", (i || f->metadata) ? "," : "",
                t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) stw_cat(&h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        stw_cat(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t->nbytes);
        off += t->nbytes;
    }
    stw_cat(&h, "}");
    while (h.len % 8) stw_cat(&h, " ");
    total = off;

    unsigned char *data = malloc(total ? total : 1);
    if (!data) stw_die("malloc");
    off = 0;
    for (int i = 0; i < f->n; i++) {
        if (f->t[i].nbytes) memcpy(data + off, f->t[i].data, f->t[i].nbytes);
        off += f->t[i].nbytes;
    }
    stw_blob b = stw_raw(h.s, data, total);
    free(data);
    free(h.s);
    return b;
}

stw_blob stw_raw(const char *header, const void *data, size_t data_len) {
    size_t hl = strlen(header);
    stw_blob b = { malloc(8 + hl + data_len), 8 + hl + data_len };
    if (!b.buf) stw_die("malloc");
    stw_put_u64le(b.buf, hl);
    memcpy(b.buf + 8, header, hl);
    if (data) memcpy(b.buf + 8 + hl, data, data_len);
    else memset(b.buf + 8 + hl, 0, data_len);
    return b;
}

void stw_free(stw_blob *b) {
    free(b->buf);
    b->buf = NULL;
    b->size = 0;
}

char *stw_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char *p = stw_path(base && *base ? base : "/tmp", "st_test_XXXXXX");
    if (!mkdtemp(p)) stw_die("mkdtemp");
    return p;
}

char *stw_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p) stw_die("malloc");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

void stw_write(const char *path, const void *buf, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) stw_die(path);
    if (size && fwrite(buf, 1, size, f) != size) stw_die(path);
    if (fclose(f)) stw_die(path);
}

void stw_write_blob(const char *dir, const char *name, stw_blob b) {
    char *p = stw_path(dir, name);
    stw_write(p, b.buf, b.size);
    free(p);
}

/* One level deep is all the tests create. */
void stw_rmtree(char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = stw_path(dir, e->d_name);
            if (unlink(p) != 0) rmdir(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

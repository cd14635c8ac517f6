/*
 * safetensors.c - zero-copy .safetensors reader (see safetensors.h).
 *
 * File layout: u64 little-endian N, then N bytes of JSON header, then the data
 * section. The header maps tensor names to {dtype, shape, data_offsets}, with
 * offsets relative to the start of the data section.
 *
 * Everything in a header is untrusted: st_parse builds the tensor list in a
 * scratch array, checks all of it, and only then appends to the set, so a
 * rejected file leaves the set exactly as it was. Validation follows the
 * reference Rust implementation (huggingface/safetensors), including its rule
 * that the tensors' byte ranges tile the data section exactly: sorted by
 * offset, the first starts at 0, each starts where the previous ended, and the
 * last ends at the end of the file. Holes and trailing bytes are errors.
 */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kda_file.h"

#define ST_MAX_HEADER   100000000ull          /* the reference's limit */
#define ST_MAX_JSON_INT 9007199254740992.0    /* 2^53: doubles are exact below */
#define ST_MAX_INDEX    (64u << 20)           /* index.json is a few KB in practice */

static const struct { const char *name; size_t size; } st_dtypes[ST_N_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_I16] = {"I16", 2},         [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},         [ST_F64] = {"F64", 8}, [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(st_dtype t) {
    return (unsigned)t < ST_N_DTYPES ? st_dtypes[t].name : "?";
}

size_t st_dtype_size(st_dtype t) {
    return (unsigned)t < ST_N_DTYPES ? st_dtypes[t].size : 0;
}

static int st_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

const st_tensor *st_find(const st_set *s, const char *name) {
    if (!s || !name) return NULL;
    int lo = 0, hi = s->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, s->tensors[mid].name);
        if (c == 0) return &s->tensors[mid];
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return NULL;
}

void st_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n_files; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].map_size);
        free(s->files[i].path);
    }
    for (int i = 0; i < s->n_tensors; i++) free(s->tensors[i].name);
    free(s->files);
    free(s->tensors);
    free(s);
}

/* ---- header validation ------------------------------------------------- */

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF): the
 * reference rejects headers that are not valid UTF-8, and names end up in
 * error messages and logs. */
static size_t st_utf8_bad_at(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len;
        unsigned min, cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; cp = c & 0x07; }
        else return i;
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

/* A JSON number that is an exact non-negative integer below 2^53. Written so
 * that NaN and infinities (strtod turns 1e999 into inf) fail every test. */
static int st_json_uint(const cJSON *j, int64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0 && v < ST_MAX_JSON_INT)) return 0;
    int64_t i = (int64_t)v;
    if ((double)i != v) return 0;
    *out = i;
    return 1;
}

static int st_parse_dtype(const char *s, st_dtype *out) {
    for (int t = 0; t < ST_N_DTYPES; t++)
        if (strcmp(s, st_dtypes[t].name) == 0) { *out = (st_dtype)t; return 1; }
    return 0;
}

/* "[2, 3]" for messages; truncates quietly on absurd shapes. */
static const char *st_shape_str(char *buf, size_t len, const int64_t *shape, int ndim) {
    size_t o = 0;
    o += snprintf(buf + o, len - o, "[");
    for (int d = 0; d < ndim && o < len; d++)
        o += snprintf(buf + o, len - o, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

/* One header entry -> t (name not yet copied). begin/end are data-section
 * offsets; the caller checks how the ranges fit together. */
static int st_parse_entry(const cJSON *e, st_tensor *t, uint64_t *begin, uint64_t *end,
                          uint64_t data_size, const char *label, char *err, size_t errlen) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return st_fail(err, errlen, "%s: tensor \"%s\": entry is not a JSON object", label, name);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!jd) return st_fail(err, errlen, "%s: tensor \"%s\": missing \"dtype\"", label, name);
    if (!js) return st_fail(err, errlen, "%s: tensor \"%s\": missing \"shape\"", label, name);
    if (!jo) return st_fail(err, errlen, "%s: tensor \"%s\": missing \"data_offsets\"", label, name);

    if (!cJSON_IsString(jd))
        return st_fail(err, errlen, "%s: tensor \"%s\": dtype is not a string", label, name);
    if (!st_parse_dtype(jd->valuestring, &t->dtype))
        return st_fail(err, errlen, "%s: tensor \"%s\": unknown dtype \"%s\"", label, name,
                       jd->valuestring);

    if (!cJSON_IsArray(js))
        return st_fail(err, errlen, "%s: tensor \"%s\": shape is not an array", label, name);
    int ndim = cJSON_GetArraySize(js);
    if (ndim > ST_MAX_DIMS)
        return st_fail(err, errlen, "%s: tensor \"%s\": shape has %d dims, at most %d supported",
                       label, name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    int d = 0, has_zero = 0;
    for (const cJSON *jv = js->child; jv; jv = jv->next, d++) {
        if (!st_json_uint(jv, &t->shape[d]))
            return st_fail(err, errlen, "%s: tensor \"%s\": shape dim %d is not a non-negative "
                           "integer below 2^53", label, name, d);
        has_zero |= t->shape[d] == 0;
    }
    /* A zero dim makes the tensor empty whatever the others are, so it is
     * not an overflow even if the product of the rest would be. */
    int64_t numel = 1;
    for (d = 0; d < ndim && !has_zero; d++) {
        if (numel > INT64_MAX / t->shape[d]) {
            char sb[256];
            return st_fail(err, errlen, "%s: tensor \"%s\": shape %s element count overflows",
                           label, name, st_shape_str(sb, sizeof sb, t->shape, ndim));
        }
        numel *= t->shape[d];
    }
    if (has_zero) numel = 0;
    t->numel = numel;
    size_t dsz = st_dtypes[t->dtype].size;
    if ((uint64_t)numel > UINT64_MAX / dsz || (uint64_t)numel * dsz > SIZE_MAX) {
        char sb[256];
        return st_fail(err, errlen, "%s: tensor \"%s\": %s shape %s byte size overflows",
                       label, name, st_dtype_name(t->dtype),
                       st_shape_str(sb, sizeof sb, t->shape, ndim));
    }
    uint64_t need = (uint64_t)numel * dsz;

    int64_t b, en;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 ||
        !st_json_uint(jo->child, &b) || !st_json_uint(jo->child->next, &en))
        return st_fail(err, errlen, "%s: tensor \"%s\": data_offsets must be [begin, end] with "
                       "non-negative integers below 2^53", label, name);
    if (b > en)
        return st_fail(err, errlen, "%s: tensor \"%s\": data_offsets [%lld, %lld] has begin > end",
                       label, name, (long long)b, (long long)en);
    if ((uint64_t)(en - b) != need) {
        char sb[256];
        return st_fail(err, errlen, "%s: tensor \"%s\": data_offsets [%lld, %lld] but %s shape %s "
                       "needs %llu bytes", label, name, (long long)b, (long long)en,
                       st_dtype_name(t->dtype), st_shape_str(sb, sizeof sb, t->shape, ndim),
                       (unsigned long long)need);
    }
    if ((uint64_t)en > data_size)
        return st_fail(err, errlen, "%s: tensor \"%s\": data_offsets [%lld, %lld] end past the "
                       "data section (%llu bytes; file truncated?)", label, name, (long long)b,
                       (long long)en, (unsigned long long)data_size);
    t->nbytes = (size_t)need;
    *begin = (uint64_t)b;
    *end = (uint64_t)en;
    return 0;
}

/* Scratch record for the range check: sort by (begin, end) so that empty
 * tensors sitting at an offset come before the tensor that starts there. */
typedef struct { uint64_t begin, end; int idx; } st_range;

static int st_cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int st_check_ranges(st_range *r, int n, const st_tensor *ts, uint64_t data_size,
                           const char *label, char *err, size_t errlen) {
    qsort(r, (size_t)n, sizeof *r, st_cmp_range);
    uint64_t cursor = 0;
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        const char *name = ts[r[i].idx].name;
        if (r[i].begin < cursor)
            return st_fail(err, errlen, "%s: tensor \"%s\": data_offsets [%llu, %llu] overlap "
                           "tensor \"%s\" (which ends at %llu)", label, name,
                           (unsigned long long)r[i].begin, (unsigned long long)r[i].end, prev,
                           (unsigned long long)cursor);
        if (r[i].begin > cursor)
            return st_fail(err, errlen, "%s: tensor \"%s\": data_offsets [%llu, %llu] leave a hole: "
                           "bytes [%llu, %llu) of the data section belong to no tensor", label,
                           name, (unsigned long long)r[i].begin, (unsigned long long)r[i].end,
                           (unsigned long long)cursor, (unsigned long long)r[i].begin);
        cursor = r[i].end;
        prev = name;
    }
    if (cursor != data_size)
        return st_fail(err, errlen, "%s: data section is %llu bytes but tensors cover only %llu "
                       "(trailing bytes belong to no tensor)", label,
                       (unsigned long long)data_size, (unsigned long long)cursor);
    return 0;
}

static const char *st_file_label(const st_set *s, int file) {
    return file >= 0 && file < s->n_files && s->files[file].path ? s->files[file].path : "?";
}

/* Builds the validated tensor list of one file in ts/n (names owned). */
static int st_parse_header(const cJSON *root, const unsigned char *data, uint64_t data_size,
                           int file_index, const char *label, st_tensor **out_ts, int *out_n,
                           char *err, size_t errlen) {
    int cap = cJSON_GetArraySize(root);
    st_tensor *ts = calloc((size_t)cap + 1, sizeof *ts);
    st_range *rg = calloc((size_t)cap + 1, sizeof *rg);
    int n = 0, rc = -1;
    if (!ts || !rg) { st_fail(err, errlen, "%s: out of memory", label); goto done; }

    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            /* Free-form string->string map (e.g. {"format": "pt"}); unused. */
            if (!cJSON_IsObject(e)) {
                st_fail(err, errlen, "%s: __metadata__ is not a JSON object", label);
                goto done;
            }
            for (const cJSON *m = e->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    st_fail(err, errlen, "%s: __metadata__ value \"%s\" is not a string",
                            label, m->string);
                    goto done;
                }
            continue;
        }
        st_tensor *t = &ts[n];
        if (st_parse_entry(e, t, &rg[n].begin, &rg[n].end, data_size, label, err, errlen))
            goto done;
        if (!(t->name = strdup(e->string))) { st_fail(err, errlen, "%s: out of memory", label); goto done; }
        t->data = data + rg[n].begin;
        t->file = file_index;
        rg[n].idx = n;
        n++;
    }
    if (st_check_ranges(rg, n, ts, data_size, label, err, errlen)) goto done;

    /* JSON objects may repeat a key; cJSON keeps both, so sort and compare. */
    qsort(ts, (size_t)n, sizeof *ts, st_cmp_name);
    for (int i = 1; i < n; i++)
        if (strcmp(ts[i - 1].name, ts[i].name) == 0) {
            st_fail(err, errlen, "%s: tensor \"%s\": name appears twice in the header", label,
                    ts[i].name);
            goto done;
        }
    rc = 0;
done:
    free(rg);
    if (rc) {
        for (int i = 0; i < n; i++) free(ts[i].name);
        free(ts);
        return rc;
    }
    *out_ts = ts;
    *out_n = n;
    return 0;
}

int st_parse(st_set *s, int file_index, const void *buf, size_t size, const char *label,
             char *err, size_t errlen) {
    const unsigned char *p = buf;
    st_tensor *ts = NULL;
    int n = 0;
    if (!label) label = "safetensors";
    if (!s) return st_fail(err, errlen, "%s: st_parse needs a set", label);
    if (size < 8)
        return st_fail(err, errlen, "%s: file is %zu bytes, shorter than the 8-byte header length",
                       label, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > size - 8)
        return st_fail(err, errlen, "%s: header length %llu runs past end of file (%zu bytes)",
                       label, (unsigned long long)hlen, size);
    if (hlen > ST_MAX_HEADER)
        return st_fail(err, errlen, "%s: header length %llu exceeds the %llu-byte limit", label,
                       (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen == 0) return st_fail(err, errlen, "%s: header length is 0", label);
    size_t bad = st_utf8_bad_at(p + 8, (size_t)hlen);
    if (bad != hlen)
        return st_fail(err, errlen, "%s: header is not valid UTF-8 (byte %zu)", label, bad);
    /* JSON forbids raw control characters (in strings too) and cJSON does
     * not check; a NUL would also end the copy below early. */
    for (size_t i = 0; i < hlen; i++) {
        unsigned char c = p[8 + i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
            return st_fail(err, errlen, "%s: header contains control byte 0x%02x at byte %zu",
                           label, c, i);
    }

    /* cJSON wants a terminated string; the mapping is read-only and the
     * header's last byte is followed by tensor data, so copy it. */
    char *json = malloc((size_t)hlen + 1);
    if (!json) return st_fail(err, errlen, "%s: out of memory for %llu-byte header", label,
                              (unsigned long long)hlen);
    memcpy(json, p + 8, (size_t)hlen);
    json[hlen] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 0);
    int rc = -1;
    if (!root) {
        /* cJSON points end at the error (cJSON_GetErrorPtr is a global). */
        size_t off = end && end >= json && end <= json + hlen ? (size_t)(end - json) : 0;
        st_fail(err, errlen, "%s: header is not valid JSON (near byte %zu)", label, off);
        goto done;
    }
    /* The writer pads the header with spaces to align the data section. */
    for (; *end; end++)
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            st_fail(err, errlen, "%s: trailing bytes after the header's JSON object (byte %zu)",
                    label, (size_t)(end - json));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        st_fail(err, errlen, "%s: header is not a JSON object", label);
        goto done;
    }

    if (st_parse_header(root, p + 8 + hlen, size - 8 - hlen, file_index, label, &ts, &n,
                        err, errlen))
        goto done;

    /* Merge into the set. Names are unique within the file; across files
     * (shards) a repeat is an error that names both files. */
    for (int i = 0; i < n; i++) {
        const st_tensor *other = st_find(s, ts[i].name);
        if (other) {
            st_fail(err, errlen, "%s: tensor \"%s\": also present in %s", label, ts[i].name,
                    st_file_label(s, other->file));
            goto drop;
        }
    }
    if (n > 0) {
        if (s->n_tensors > INT32_MAX - n) { st_fail(err, errlen, "%s: too many tensors", label); goto drop; }
        st_tensor *all = realloc(s->tensors, (size_t)(s->n_tensors + n) * sizeof *all);
        if (!all) { st_fail(err, errlen, "%s: out of memory", label); goto drop; }
        memcpy(all + s->n_tensors, ts, (size_t)n * sizeof *ts);
        s->tensors = all;
        s->n_tensors += n;
        qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, st_cmp_name);
    }
    free(ts);
    rc = 0;
    goto done;
drop:
    for (int i = 0; i < n; i++) free(ts[i].name);
    free(ts);
done:
    cJSON_Delete(root);
    free(json);
    return rc;
}

/* ---- files and directories --------------------------------------------- */

/* Reads the whole of fd (size bytes) into fresh anonymous memory, page
 * aligned like a mapping (st_close munmaps either), then drops the file's
 * pages from the page cache so the weights are not held twice. A file that
 * shrinks while it is read is an error naming it. */
static void *st_read_private(int fd, size_t size, const char *path, char *err, size_t errlen) {
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        st_fail(err, errlen, "%s: cannot allocate %zu bytes to read it into: %s", path, size, strerror(errno));
        return NULL;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, (char *)mem + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r < 0) st_fail(err, errlen, "%s: read failed: %s", path, strerror(errno));
            else st_fail(err, errlen, "%s: changed while it was read (%zu of %zu bytes)", path, got, size);
            munmap(mem, size);
            return NULL;
        }
        got += (size_t)r;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    mprotect(mem, size, PROT_READ);   /* as read-only as the mapping it replaces */
    return mem;
}

/* Maps (or, with copy, reads) path and appends it (and its tensors) to s.
 * On error s is unchanged. */
static int st_add_file(st_set *s, const char *path, int copy, char *err, size_t errlen) {
    struct stat sb;
    char why[512];
    int fd = kda_file_open(path, &sb, why, sizeof why);   /* a FIFO or device: an error at once, never a hang */
    if (fd < 0) return st_fail(err, errlen, "%s", why);
    if ((uint64_t)sb.st_size > SIZE_MAX) { close(fd); return st_fail(err, errlen, "%s: too large", path); }

    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0 && copy) {
        map = st_read_private(fd, size, path, err, errlen);
        if (!map) {
            close(fd);
            return -1;
        }
    } else if (size > 0) {      /* mmap of length 0 is EINVAL; st_parse reports it as too short */
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return st_fail(err, errlen, "%s: mmap of %zu bytes failed: %s", path, size, strerror(e));
        }
    }
    close(fd);       /* the mapping keeps the file alive; a copy needs it no more */

    st_file *files = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *files);
    char *dup = strdup(path);
    if (!files || !dup) {
        if (files) s->files = files;
        free(dup);
        if (map) munmap(map, size);
        return st_fail(err, errlen, "%s: out of memory", path);
    }
    s->files = files;
    /* Registered before parsing so a cross-file duplicate can name this file;
     * dropped again if the header is rejected. */
    s->files[s->n_files] = (st_file){ .path = dup, .map = map, .map_size = size };
    if (st_parse(s, s->n_files, map ? map : "", size, path, err, errlen)) {
        if (map) munmap(map, size);
        free(dup);
        return -1;
    }
    s->n_files++;
    return 0;
}

int st_open_file(st_set **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    st_set *s = calloc(1, sizeof *s);
    if (!s) return st_fail(err, errlen, "%s: out of memory", path);
    if (st_add_file(s, path, 0, err, errlen)) { st_close(s); return -1; }
    *out = s;
    return 0;
}

static char *st_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) { memcpy(p, dir, a); p[a] = '/'; memcpy(p + a + 1, name, b + 1); }
    return p;
}

/* A shard name from the index is joined to the model directory, so it must
 * not be able to point anywhere else. */
static int st_plain_file_name(const char *n) {
    return n[0] && !strchr(n, '/') && !strstr(n, "..");
}

static int st_open_index(st_set *s, const char *dir, const char *ipath, int copy, char *err, size_t errlen) {
    char why[512];
    char *text = kda_file_read(ipath, ST_MAX_INDEX, NULL, why, sizeof why);
    if (!text) return st_fail(err, errlen, "%s", why);
    cJSON *root = cJSON_Parse(text);
    free(text);
    int rc = -1;
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!root) { st_fail(err, errlen, "%s: not valid JSON", ipath); goto done; }
    if (!cJSON_IsObject(wm)) { st_fail(err, errlen, "%s: no \"weight_map\" object", ipath); goto done; }
    if (!wm->child) { st_fail(err, errlen, "%s: weight_map is empty", ipath); goto done; }

    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e)) {
            st_fail(err, errlen, "%s: weight_map entry \"%s\" is not a string", ipath, e->string);
            goto done;
        }
        if (!st_plain_file_name(e->valuestring)) {
            st_fail(err, errlen, "%s: tensor \"%s\": shard \"%s\" is not a plain file name in "
                    "the model directory", ipath, e->string, e->valuestring);
            goto done;
        }
    }
    /* Open each distinct shard once, in order of first mention. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        int seen = 0;
        for (const cJSON *p = wm->child; p != e && !seen; p = p->next)
            seen = strcmp(p->valuestring, e->valuestring) == 0;
        if (seen) continue;
        char *path = st_join(dir, e->valuestring);
        if (!path) { st_fail(err, errlen, "%s: out of memory", ipath); goto done; }
        int r = st_add_file(s, path, copy, err, errlen);
        free(path);
        if (r) goto done;
    }
    /* Every tensor the index names must live in the shard it names. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        const st_tensor *t = st_find(s, e->string);
        const char *in = t ? strrchr(s->files[t->file].path, '/') + 1 : NULL;
        if (!t) {
            st_fail(err, errlen, "%s: tensor \"%s\" is mapped to %s, which has no such tensor",
                    ipath, e->string, e->valuestring);
            goto done;
        }
        if (strcmp(in, e->valuestring) != 0) {
            st_fail(err, errlen, "%s: tensor \"%s\" is mapped to %s but found in %s", ipath,
                    e->string, e->valuestring, in);
            goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

static int st_open_dir_as(st_set **out, const char *dir, int copy, char *err, size_t errlen) {
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0) return st_fail(err, errlen, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return st_fail(err, errlen, "%s: not a directory", dir);

    char *ipath = st_join(dir, "model.safetensors.index.json");
    char *mpath = st_join(dir, "model.safetensors");
    st_set *s = calloc(1, sizeof *s);
    int rc = -1;
    if (!ipath || !mpath || !s) { st_fail(err, errlen, "%s: out of memory", dir); goto done; }
    if (access(ipath, F_OK) == 0)
        rc = st_open_index(s, dir, ipath, copy, err, errlen);
    else if (access(mpath, F_OK) == 0)
        rc = st_add_file(s, mpath, copy, err, errlen);
    else
        st_fail(err, errlen, "%s: neither model.safetensors nor model.safetensors.index.json "
                "found", dir);
done:
    free(ipath);
    free(mpath);
    if (rc) { st_close(s); return -1; }
    *out = s;
    return 0;
}

int st_open_dir(st_set **out, const char *dir, char *err, size_t errlen) {
    return st_open_dir_as(out, dir, 0, err, errlen);
}

int st_open_dir_private(st_set **out, const char *dir, char *err, size_t errlen) {
    return st_open_dir_as(out, dir, 1, err, errlen);
}

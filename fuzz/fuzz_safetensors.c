/*
 * fuzz_safetensors.c - the safetensors header parser (engine/safetensors.c,
 * st_parse) on arbitrary file contents.
 *
 * Input: a whole .safetensors file. An accepted file must satisfy the header
 * contract of safetensors.h: every view lies inside the data section, its
 * byte size is its element count times the dtype size, the ranges tile the
 * data section, names are unique and sorted (st_find finds each). A rejected
 * file leaves the set empty with a message that names the file. The same
 * file parsed again as a second shard must be rejected (every name repeats).
 */
#include "fuzz_common.h"

#include "safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    return 0;
}

static void check_accepted(const st_set *s, const unsigned char *buf, size_t size)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    const unsigned char *lo = buf + 8 + hlen, *hi = buf + size;
    uint64_t covered = 0;
    volatile unsigned sink = 0;
    for (int i = 0; i < s->n_tensors; i++) {
        const st_tensor *t = &s->tensors[i];
        FZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "tensor %s: ndim %d", t->name, t->ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FZ_CHECK(t->shape[d] >= 0, "tensor %s: dim %d is %lld", t->name, d, (long long)t->shape[d]);
            numel = t->shape[d] == 0 || numel == 0 ? 0 : numel * t->shape[d];
        }
        FZ_CHECK(numel == t->numel, "tensor %s: numel %lld, shape gives %lld", t->name, (long long)t->numel,
                 (long long)numel);
        FZ_CHECK(t->nbytes == (size_t)t->numel * st_dtype_size(t->dtype), "tensor %s: %zu bytes", t->name, t->nbytes);
        const unsigned char *d = t->data;
        FZ_CHECK(d >= lo && d + t->nbytes <= hi, "tensor %s: view outside the data section", t->name);
        /* read every byte: ASan checks the view against the exact-size buffer */
        for (size_t k = 0; k < t->nbytes; k++) sink += d[k];
        covered += t->nbytes;
        FZ_CHECK(st_find(s, t->name) == t, "st_find(%s) does not find it", t->name);
        if (i) FZ_CHECK(strcmp(s->tensors[i - 1].name, t->name) < 0, "names not sorted and unique at %s", t->name);
    }
    FZ_CHECK(covered == (uint64_t)(hi - lo), "tensors cover %llu of %llu data bytes", (unsigned long long)covered,
             (unsigned long long)(hi - lo));
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char *buf = malloc(size ? size : 1);   /* exact size: no slack for an over-read */
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    st_set *s = calloc(1, sizeof *s);
    if (!s) abort();
    char err[512] = "";
    int rc = st_parse(s, 0, buf, size, "fuzz.safetensors", err, sizeof err);
    FZ_CHECK(rc == 0 || rc == -1, "st_parse returned %d", rc);
    if (rc) {
        FZ_CHECK(s->n_tensors == 0, "rejected file left %d tensors", s->n_tensors);
        FZ_CHECK(!strncmp(err, "fuzz.safetensors: ", 18), "message does not name the file: %s", err);
    } else {
        check_accepted(s, buf, size);
        int n = s->n_tensors;
        err[0] = 0;
        int again = st_parse(s, 1, buf, size, "shard2", err, sizeof err);
        if (n > 0) {
            FZ_CHECK(again == -1 && strstr(err, "also present"), "a second shard with the same names: rc %d (%s)",
                     again, err);
            FZ_CHECK(s->n_tensors == n, "rejected shard changed the set");
        } else {
            FZ_CHECK(again == 0, "an empty file rejected the second time: %s", err);
        }
        FZ_CHECK(st_find(s, "") == NULL || st_find(s, "")->name[0] == 0, "st_find(\"\")");
    }
    st_close(s);
    free(buf);
    return 0;
}

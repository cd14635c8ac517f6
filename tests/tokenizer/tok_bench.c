/*
 * tok_bench.c - tokenizer throughput on one core.
 *
 *   tok_bench MODEL.model|MODEL_DIR TEXTFILE
 *
 * Prints encode and decode MB/s over TEXTFILE (as one string), streaming
 * decode MB/s (one id per push), and the encode time of an 8192-token
 * prompt, each the best of several runs. MB = 10^6 bytes of text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return NULL; }
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.model|MODEL_DIR TEXTFILE\n", argv[0]);
        return 2;
    }
    char err[512];
    tok_tokenizer *t;
    struct stat st;
    int rc = stat(argv[1], &st) == 0 && S_ISDIR(st.st_mode) ? tok_open_dir(&t, argv[1], err, sizeof(err))
                                                             : tok_open_spm(&t, argv[1], err, sizeof(err));
    if (rc != 0) { fprintf(stderr, "%s\n", err); return 1; }
    size_t len;
    char *text = slurp(argv[2], &len);
    if (!text) { fprintf(stderr, "cannot read %s\n", argv[2]); return 1; }

    int32_t *ids = NULL;
    int n = 0;
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        free(ids);
        double t0 = now();
        if (tok_encode(t, text, len, 0, &ids, &n, err, sizeof(err)) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("text: %zu bytes, %d tokens (%.2f bytes/token)\n", len, n, (double)len / n);
    printf("encode:          %8.2f MB/s\n", (double)len / best / 1e6);

    best = 1e30;
    for (int r = 0; r < 3; r++) {
        char *out;
        double t0 = now();
        if (tok_decode(t, ids, n, &out, err, sizeof(err)) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        double dt = now() - t0;
        if (dt < best) best = dt;
        free(out);
    }
    printf("decode:          %8.2f MB/s\n", (double)len / best / 1e6);

    best = 1e30;
    for (int r = 0; r < 3; r++) {
        tok_stream *s = tok_stream_new(t);
        size_t k, total = 0;
        double t0 = now();
        for (int i = 0; i < n; i++) { tok_stream_push(s, ids[i], &k); total += k; }
        tok_stream_flush(s, &k);
        double dt = now() - t0;
        if (dt < best) best = dt;
        tok_stream_free(s);
    }
    printf("stream decode:   %8.2f MB/s (%.2f us/token)\n", (double)len / best / 1e6, best / n * 1e6);

    /* An 8192-token prompt: the longest prefix of the text that encodes to
     * at most 8192 tokens, found by bisection on the byte length. */
    size_t lo = 0, hi = len;
    while (lo < hi) {
        size_t mid = (lo + hi + 1) / 2;
        while (mid < len && (((unsigned char)text[mid]) & 0xC0) == 0x80) mid++;
        int32_t *p;
        int m;
        tok_encode(t, text, mid, 1, &p, &m, err, sizeof(err));
        free(p);
        if (m <= 8192) lo = mid; else hi = mid - 1;
    }
    best = 1e30;
    int m = 0;
    for (int r = 0; r < 10; r++) {
        int32_t *p;
        double t0 = now();
        tok_encode(t, text, lo, 1, &p, &m, err, sizeof(err));
        double dt = now() - t0;
        if (dt < best) best = dt;
        free(p);
    }
    printf("prompt encode:   %8.2f ms for %d tokens (%zu bytes, %.2f MB/s)\n", best * 1e3, m, lo,
           (double)lo / best / 1e6);
    free(ids);
    free(text);
    tok_close(t);
    return 0;
}

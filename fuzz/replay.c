/*
 * replay.c - runs a harness's entry point on files, without libFuzzer: the
 * regression tests (fuzz/regressions/HARNESS/) and the seed corpora, in the
 * ordinary build (and so under the ASan+UBSan build of scripts/test-all.sh).
 *
 *   fuzz_replay_HARNESS DIR_OR_FILE...
 *
 * A crash or a sanitizer report fails the test; it prints each file before
 * running it, so the log names the input. Exits 0 when all ran.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open %s\n", path); return -1; }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            unsigned char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "replay: out of memory reading %s\n", path); return -1; }
    /* an exact-size copy, as libFuzzer hands inputs over */
    unsigned char *exact = malloc(n ? n : 1);
    if (!exact) { free(buf); return -1; }
    memcpy(exact, buf, n);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Files of a directory in name order (the log reads the same every run). */
static int run_path(const char *path, int *count)
{
    struct stat sb;
    if (stat(path, &sb)) { fprintf(stderr, "replay: %s does not exist\n", path); return -1; }
    if (!S_ISDIR(sb.st_mode)) { (*count)++; return run_file(path); }
    DIR *d = opendir(path);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;   /* ., .., .gitkeep */
        if (n == cap) names = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        if (run_path(p, count)) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0, count = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &count)) rc = 1;
    fprintf(stderr, "replay: %d inputs ran%s\n", count, rc ? ", some paths could not be read" : "");
    return rc;
}

/*
 * fuzz_common.h - what every harness in fuzz/ shares: the libFuzzer entry
 * points, a reader that splits one input into fields, and the check that
 * turns a broken invariant into a crash (so the fuzzer records the input).
 *
 * Harnesses build two ways: with -fsanitize=fuzzer (clang, -Dfuzz=true) and
 * linked with replay.c in any build, which runs files through the same entry
 * point (the regression tests). They must not depend on libFuzzer.
 */
#ifndef KDA_FUZZ_COMMON_H
#define KDA_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A broken invariant: the input is a finding even though no sanitizer fired. */
#define FZ_CHECK(cond, ...)                                                     \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz invariant failed at %s:%d: %s\n", __FILE__,   \
                    __LINE__, #cond);                                           \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* Consumes an input front to back; reads past the end give zeros / empty. */
typedef struct {
    const uint8_t *p;
    size_t n;
} fz_reader;

static inline unsigned fz_byte(fz_reader *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

/* The bytes up to (not including) the next sep, or the rest; sep is consumed. */
static inline size_t fz_until(fz_reader *r, uint8_t sep, const uint8_t **out)
{
    const uint8_t *e = memchr(r->p, sep, r->n);
    size_t k = e ? (size_t)(e - r->p) : r->n;
    *out = r->p;
    r->p += k + (e ? 1 : 0);
    r->n -= k + (e ? 1 : 0);
    return k;
}

/* A NUL-terminated heap copy of n bytes: exactly n + 1 bytes, so ASan sees any
 * read past the terminator. */
static inline char *fz_strndup(const uint8_t *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

/* The repository's root (configs/, models/): compiled in by fuzz/meson.build. */
#ifndef FUZZ_SRC_ROOT
#define FUZZ_SRC_ROOT "."
#endif

#endif

/*
 * json_out.c - cJSON-identical JSON text into a growing buffer (see json_out.h).
 *
 * Numbers: cJSON 1.7 prints "%1.15g", reads it back with sscanf and keeps it when
 * |back - d| <= max(|back|, |d|) * DBL_EPSILON, else prints "%1.17g". json_number does
 * exactly that. json_float does not: a float32 needs 9 significant digits to read back
 * as itself, and the 17 that cJSON gives its double (-2.9283137321472168 for
 * -2.92831373) make a log-prob response ~40% larger and ~40% slower for a client's
 * JSON parser (an 8 x 1,040-token echo + logprobs answer: 652 -> 464 KB, Python's
 * json.loads 19.5 -> 11.0 ms on the dev VM). It prints "%.9g" (integers below 10^15
 * as their digits, as cJSON does), without the C library for a normal float: a float
 * is m * 2^e with m < 2^24, so d * 10^s for s <= 44 is an exact 128-bit integer
 * shifted by e + s bits, which rounds to 9 digits exactly (ties to even, as glibc's
 * printf).
 */
#include "json_out.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

int json_reserve(json_buf *b, size_t n)
{
    if (b->failed) return -1;
    if (b->len + n + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->failed = 1; return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

void json_raw(json_buf *b, const char *s, size_t n)
{
    if (json_reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void json_char(json_buf *b, char c)
{
    if (json_reserve(b, 1)) return;
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}

void json_buf_free(json_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- strings ---- */

/* 0: the byte as it is; else the letter after '\\' ('u' for \u00XX) */
static const char esc[256] = {
    ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't', ['"'] = '"', ['\\'] = '\\',
    [0x00] = 'u', [0x01] = 'u', [0x02] = 'u', [0x03] = 'u', [0x04] = 'u', [0x05] = 'u', [0x06] = 'u', [0x07] = 'u',
    [0x0B] = 'u', [0x0E] = 'u', [0x0F] = 'u', [0x10] = 'u', [0x11] = 'u', [0x12] = 'u', [0x13] = 'u', [0x14] = 'u',
    [0x15] = 'u', [0x16] = 'u', [0x17] = 'u', [0x18] = 'u', [0x19] = 'u', [0x1A] = 'u', [0x1B] = 'u', [0x1C] = 'u',
    [0x1D] = 'u', [0x1E] = 'u', [0x1F] = 'u',
};

void json_str(json_buf *b, const char *s, size_t n)
{
    if (json_reserve(b, n * 6 + 2)) return;   /* the worst case: every byte \u00XX */
    char *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e = esc[c];
        if (!e) { *o++ = (char)c; continue; }
        *o++ = '\\';
        *o++ = e;
        if (e == 'u') {
            static const char hex[] = "0123456789abcdef";
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    *o++ = '"';
    *o = '\0';
    b->len = (size_t)(o - b->p);
}

int utf8_sequence_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = *p;
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || c == 0 || len > end - p) return 0;
    if (len == 1) return 1;
    unsigned cp = c & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

void json_text(json_buf *b, const char *s, size_t n)
{
    if (json_reserve(b, n * 6 + 2)) return;   /* each byte: at most \u00XX, or 3 for U+FFFD */
    char *o = b->p + b->len;
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    *o++ = '"';
    while (p < end) {
        unsigned char c = *p;
        char e = esc[c];
        if (c >= 0x20 && c < 0x80 && !e) { *o++ = (char)c; p++; continue; }
        if (c < 0x80 && c) {   /* a control byte, '"' or '\\' */
            *o++ = '\\';
            *o++ = e;
            if (e == 'u') {
                static const char hex[] = "0123456789abcdef";
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
            p++;
            continue;
        }
        o = utf8_put_clean(o, &p, end);
    }
    *o++ = '"';
    *o = '\0';
    b->len = (size_t)(o - b->p);
}

char *json_str_dup(const char *s, size_t n, size_t *out_len)
{
    json_buf b = {0};
    json_str(&b, s, n);
    if (b.failed) { json_buf_free(&b); return NULL; }
    *out_len = b.len;
    return b.p;
}

/* ---- integers ---- */

static const char digit_pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                  "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                  "8081828384858687888990919293949596979899";

/* exactly 8 digits of v < 10^8 ending at end */
static void digits8(char *end, uint32_t v)
{
    for (int k = 0; k < 4; k++) {
        uint32_t r = v % 100;
        v /= 100;
        memcpy(end - 2 * k - 2, digit_pairs + 2 * r, 2);
    }
}

/* the digits of v right-aligned ending at end; returns the first */
static char *digits_u64(char *end, uint64_t v)
{
    char *p = end;
    while (v >= 100000000) {   /* 8 at a time in 32-bit arithmetic */
        digits8(p, (uint32_t)(v % 100000000));
        v /= 100000000;
        p -= 8;
    }
    uint32_t w = (uint32_t)v;
    while (w >= 100) {
        uint32_t r = w % 100;
        w /= 100;
        p -= 2;
        memcpy(p, digit_pairs + 2 * r, 2);
    }
    if (w >= 10) {
        p -= 2;
        memcpy(p, digit_pairs + 2 * w, 2);
    } else {
        *--p = (char)('0' + w);
    }
    return p;
}

char *json_put_int(char *o, int64_t v)
{
    char buf[24], *end = buf + sizeof buf;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    char *p = digits_u64(end, u);
    if (v < 0) *--p = '-';
    memcpy(o, p, (size_t)(end - p));
    return o + (end - p);
}

void json_int(json_buf *b, int64_t v)
{
    if (json_reserve(b, JSON_NUMBER_MAX)) return;
    char *o = json_put_int(b->p + b->len, v);
    *o = '\0';
    b->len = (size_t)(o - b->p);
}

/* ---- doubles ---- */

static int close_enough(double a, double b)   /* cJSON's compare_double */
{
    double max = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return fabs(a - b) <= max * DBL_EPSILON;
}

static u128 pow5(int s)   /* s <= 54 */
{
    static const uint64_t p5[28] = {
        1ull, 5ull, 25ull, 125ull, 625ull, 3125ull, 15625ull, 78125ull, 390625ull, 1953125ull, 9765625ull,
        48828125ull, 244140625ull, 1220703125ull, 6103515625ull, 30517578125ull, 152587890625ull,
        762939453125ull, 3814697265625ull, 19073486328125ull, 95367431640625ull, 476837158203125ull,
        2384185791015625ull, 11920928955078125ull, 59604644775390625ull, 298023223876953125ull,
        1490116119384765625ull, 7450580596923828125ull};
    return s <= 27 ? (u128)p5[s] : (u128)p5[27] * p5[s - 27];
}

/* m * 2^e * 10^s as an integer: the truncated part and how the rest compares with one
 * half (-1 below, 0 exactly, 1 above; 2 when there is no rest). -1 outside the range
 * this handles exactly. */
static int scaled(uint32_t m, int e, int s, uint64_t *ip, int *rest)
{
    if (s < 0 || s > 44) return -1;
    u128 n = (u128)m * pow5(s);   /* < 2^24 * 5^44 < 2^127 */
    int sh = e + s;
    if (sh >= 0) {
        if (sh > 40 || n >> (64 - sh)) return -1;   /* n << sh must fit 64 bits */
        *ip = (uint64_t)(n << sh);
        *rest = 2;
        return 0;
    }
    int r = -sh;
    if (r >= 127) return -1;
    u128 q = n >> r, low = n & (((u128)1 << r) - 1), half = (u128)1 << (r - 1);
    if (q >> 64) return -1;
    *ip = (uint64_t)q;
    *rest = low == 0 ? 2 : low < half ? -1 : low == half ? 0 : 1;
    return 0;
}

static const uint64_t pow10_u64[18] = {1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
                                       100000000ull, 1000000000ull, 10000000000ull, 100000000000ull,
                                       1000000000000ull, 10000000000000ull, 100000000000000ull,
                                       1000000000000000ull, 10000000000000000ull, 100000000000000000ull};

/* "%1.Pg" of (sign) q * 10^(X-P+1), q having exactly P digits. Returns the length. */
static int format_g(char *out, int neg, uint64_t q, int X, int P)
{
    char dig[24], *end = dig + sizeof dig;
    char *d = digits_u64(end, q);   /* P digits */
    int nd = P;
    while (nd > 1 && d[nd - 1] == '0') nd--;   /* %g drops trailing zeros */
    char *o = out;
    if (neg) *o++ = '-';
    if (X < -4 || X >= P) {
        *o++ = d[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        *o++ = 'e';
        *o++ = X < 0 ? '-' : '+';
        int ax = X < 0 ? -X : X;
        if (ax >= 100) *o++ = (char)('0' + ax / 100);
        *o++ = (char)('0' + ax / 10 % 10);
        *o++ = (char)('0' + ax % 10);
    } else if (X >= 0) {
        int ni = X + 1;
        memcpy(o, d, (size_t)ni);
        o += ni;
        if (nd > ni) {
            *o++ = '.';
            memcpy(o, d + ni, (size_t)(nd - ni));
            o += nd - ni;
        }
    } else {
        *o++ = '0';
        *o++ = '.';
        for (int k = 0; k < -X - 1; k++) *o++ = '0';
        memcpy(o, d, (size_t)nd);
        o += nd;
    }
    return (int)(o - out);
}

/* The number's bytes from o on (at most JSON_NUMBER_MAX); returns the end. */
static char *put_number(char *o, double d)
{
    if (isnan(d) || isinf(d)) { memcpy(o, "null", 4); return o + 4; }
    int n = snprintf(o, JSON_NUMBER_MAX, "%1.15g", d);
    double back = 0;
    if (sscanf(o, "%lg", &back) != 1 || !close_enough(back, d)) n = snprintf(o, JSON_NUMBER_MAX, "%1.17g", d);
    return o + n;
}

/* 10^k for k in [-38, 17], the nearest doubles: a first guess at a float's decimal
 * exponent (round_9 corrects it where the guess is one off) */
static const double approx_pow10[56] = {
    1e-38, 1e-37, 1e-36, 1e-35, 1e-34, 1e-33, 1e-32, 1e-31, 1e-30, 1e-29, 1e-28, 1e-27, 1e-26, 1e-25, 1e-24,
    1e-23, 1e-22, 1e-21, 1e-20, 1e-19, 1e-18, 1e-17, 1e-16, 1e-15, 1e-14, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9,
    1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
    1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17};

/* v = m * 2^e (m < 2^24) rounded to 9 significant digits: q9 in [10^8, 10^9) with
 * v ~ q9 * 10^(x9-8), rounded once from the exact value (half to even). */
static int round_9(uint32_t m, int e, int X, uint64_t *q9, int *x9)
{
    uint64_t ip;
    int rest;
    for (int tries = 0; tries < 3; tries++) {
        if (scaled(m, e, 8 - X, &ip, &rest)) return -1;
        if (ip < pow10_u64[8]) { X--; continue; }
        if (ip >= pow10_u64[9]) { X++; continue; }
        uint64_t q = ip + (rest == 1 || (rest == 0 && (ip & 1)));
        if (q == pow10_u64[9]) { q = pow10_u64[8]; X++; }
        *q9 = q;
        *x9 = X;
        return 0;
    }
    return -1;
}

char *json_put_float(char *o, float f)
{
    double d = f;
    if (isnan(d) || isinf(d)) { memcpy(o, "null", 4); return o + 4; }
    double a = fabs(d);
    if (a < 1e15 && d == floor(d)) {   /* an integer below 10^15: its digits, as cJSON prints them */
        if (d == 0 && signbit(d)) { memcpy(o, "-0", 2); return o + 2; }
        return json_put_int(o, (int64_t)d);
    }
    if (a >= 1e-36 && a < 1e9) {   /* a normal float (from 2^23 up every float is an integer) */
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        int be = (int)((bits >> 23) & 0xFF);
        uint32_t m = (bits & 0x7FFFFF) | 0x800000;
        int e = be - 150;
        while (!(m & 1) && e < 0) { m >>= 1; e++; }
        int X = ((be - 127) * 78913) >> 18;   /* floor(log10(2^(be-127))): X or one below */
        if (a >= approx_pow10[X + 39]) X++;
        uint64_t q9;
        int x9;
        if (!round_9(m, e, X, &q9, &x9)) return o + format_g(o, d < 0, q9, x9, 9);
    }
    return o + snprintf(o, JSON_NUMBER_MAX, "%.9g", d);
}

void json_number(json_buf *b, double d)
{
    if (json_reserve(b, JSON_NUMBER_MAX)) return;
    char *o = put_number(b->p + b->len, d);
    *o = '\0';
    b->len = (size_t)(o - b->p);
}

void json_float(json_buf *b, float f)
{
    if (json_reserve(b, JSON_NUMBER_MAX)) return;
    char *o = json_put_float(b->p + b->len, f);
    *o = '\0';
    b->len = (size_t)(o - b->p);
}

/*
 * jinja.c - see jinja.h. Three parts: a lexer that cuts the source into
 * text and tag tokens (applying trim_blocks, lstrip_blocks and the - / +
 * whitespace controls there, as Jinja2's lexer does), a recursive-descent
 * parser to a tree with Jinja2's operator precedence, and a tree-walking
 * renderer over Python-like values.
 *
 * Memory: the tree lives in the template's arena; every value made while
 * rendering lives in a per-render arena freed at the end, so errors unwind
 * with longjmp and nothing leaks.
 */
#include "jinja.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_OUTPUT (4u << 20)      /* bytes one render may produce */
#define MAX_STEPS 2000000L         /* loop iterations + calls per render */
#define MAX_DEPTH 200              /* nesting of expressions / blocks */
#define MAX_RENDER_MEMORY (256u << 20) /* bytes of values one render may make (strings built in loops) */

/* ---- arena ---- */

typedef struct blk { struct blk *next; size_t used, cap; max_align_t data[]; } blk;
typedef struct { blk *head; size_t total, limit; int over; } arena;   /* limit 0: none; over: limit hit */

static void *arena_try(arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->cap) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->limit && a->total + cap > a->limit) { a->over = 1; return NULL; }
        a->total += cap;
        blk *b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(arena *a)
{
    for (blk *b = a->head; b;) {
        blk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

/* ---- errors (parse and render share the jump) ---- */

typedef struct {
    jmp_buf jb;
    char *err;
    size_t errlen;
    int raised;        /* raise_exception() */
    arena *a;
} failer;

static void fail(failer *f, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(failer *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err, f->errlen, fmt, ap);
    va_end(ap);
    longjmp(f->jb, 1);
}

static void *alloc(failer *f, size_t n)
{
    void *p = arena_try(f->a, n);
    if (!p && f->a->over)
        fail(f, "the template needs more than %u MiB of memory", (unsigned)(f->a->limit >> 20));
    if (!p) fail(f, "out of memory");
    memset(p, 0, n);
    return p;
}

static char *dupn(failer *f, const char *s, size_t n)
{
    char *p = alloc(f, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---- lexer ---- */

enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct {
    int type, line;
    const char *s;      /* text, name, decoded string or operator */
    size_t n;
    long long i;
    double f;
} token;

typedef struct {
    failer *f;
    const char *src;
    size_t len, pos;
    int line;
    token *toks;
    int n, cap;
} lexer;

static token *push_tok(lexer *L, int type)
{
    if (L->n == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        token *t = alloc(L->f, (size_t)cap * sizeof *t);
        if (L->n) memcpy(t, L->toks, (size_t)L->n * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    token *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = L->line;
    return t;
}

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static void push_text(lexer *L, const char *s, size_t n)
{
    if (!n) return;
    token *t = push_tok(L, T_TEXT);
    t->s = s;
    t->n = n;
}

static void utf8_put(char *o, size_t *k, unsigned cp)
{
    if (cp < 0x80) o[(*k)++] = (char)cp;
    else if (cp < 0x800) { o[(*k)++] = (char)(0xC0 | cp >> 6); o[(*k)++] = (char)(0x80 | (cp & 63)); }
    else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | cp >> 12); o[(*k)++] = (char)(0x80 | ((cp >> 6) & 63));
        o[(*k)++] = (char)(0x80 | (cp & 63));
    } else {
        o[(*k)++] = (char)(0xF0 | cp >> 18); o[(*k)++] = (char)(0x80 | ((cp >> 12) & 63));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 63)); o[(*k)++] = (char)(0x80 | (cp & 63));
    }
}

/* A quoted string at L->pos, decoded with Python's unicode-escape rules. */
static void lex_string(lexer *L)
{
    char q = L->src[L->pos++];
    size_t start = L->pos;
    while (L->pos < L->len && L->src[L->pos] != q) {
        if (L->src[L->pos] == '\\') L->pos++;
        L->pos++;
    }
    if (L->pos >= L->len) fail(L->f, "line %d: unterminated string", L->line);
    const char *s = L->src + start;
    size_t n = L->pos - start, k = 0;
    L->pos++;
    char *o = alloc(L->f, n * 4 + 1);
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i]; continue; }
        char c = s[++i];
        unsigned cp = 0;
        int hex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (hex && i + (size_t)hex < n) {
            int ok = 1;
            for (int j = 1; j <= hex; j++) {
                char h = s[i + (size_t)j];
                if (!isxdigit((unsigned char)h)) { ok = 0; break; }
                cp = cp * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
            }
            if (ok && cp <= 0x10FFFF) { utf8_put(o, &k, cp); i += (size_t)hex; continue; }
        }
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '0': o[k++] = '\0'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': case '\'': case '"': o[k++] = c; break;
        case '\n': break;
        default: o[k++] = '\\'; o[k++] = c; break;
        }
    }
    token *t = push_tok(L, T_STRING);
    t->s = o;
    t->n = k;
    L->line += count_lines(s, n);
}

/* Tokens of one tag up to its closer ("}}" or "%}" at bracket depth 0).
 * Returns whether the closer had a '-' (strip the whitespace after it). */
static int lex_tag(lexer *L, char closer)
{
    int depth = 0;
    for (;;) {
        while (L->pos < L->len && isspace((unsigned char)L->src[L->pos])) {
            if (L->src[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->len) fail(L->f, "line %d: tag not closed", L->line);
        const char *p = L->src + L->pos;
        size_t left = L->len - L->pos;
        if (depth == 0) {
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == closer && p[2] == '}') {
                L->pos += 3;
                return p[0] == '-';
            }
            if (left >= 2 && p[0] == closer && p[1] == '}') {
                L->pos += 2;
                return 0;
            }
        }
        if (isalpha((unsigned char)*p) || *p == '_') {
            size_t n = 1;
            while (n < left && (isalnum((unsigned char)p[n]) || p[n] == '_')) n++;
            token *t = push_tok(L, T_NAME);
            t->s = p;
            t->n = n;
            L->pos += n;
        } else if (isdigit((unsigned char)*p)) {
            size_t n = 0;
            int is_float = 0;
            char buf[64];
            size_t k = 0;
            /* The literal without its underscores; a longer one would be cut
             * (and change value), so it is an error. */
#define NUM_PUT(ch) do { if (k == sizeof buf - 1) fail(L->f, "line %d: number literal longer than %d characters", \
                                                      L->line, (int)sizeof buf - 1); buf[k++] = (ch); } while (0)
            while (n < left && (isdigit((unsigned char)p[n]) || p[n] == '_')) { if (p[n] != '_') NUM_PUT(p[n]); n++; }
            if (n + 1 < left && p[n] == '.' && isdigit((unsigned char)p[n + 1])) {
                is_float = 1;
                NUM_PUT(p[n]);
                n++;
                while (n < left && (isdigit((unsigned char)p[n]) || p[n] == '_')) { if (p[n] != '_') NUM_PUT(p[n]); n++; }
            }
            if (n < left && (p[n] == 'e' || p[n] == 'E')) {
                size_t m = n + 1;
                if (m < left && (p[m] == '+' || p[m] == '-')) m++;
                if (m < left && isdigit((unsigned char)p[m])) {
                    is_float = 1;
                    while (n < m) { NUM_PUT(p[n]); n++; }
                    while (n < left && isdigit((unsigned char)p[n])) { NUM_PUT(p[n]); n++; }
                }
            }
#undef NUM_PUT
            buf[k] = '\0';
            token *t = push_tok(L, is_float ? T_FLOAT : T_INT);
            if (is_float) t->f = strtod(buf, NULL);
            else t->i = strtoll(buf, NULL, 10);
            L->pos += n;
        } else if (*p == '\'' || *p == '"') {
            lex_string(L);
        } else {
            static const char *const ops2[] = {"**", "//", "==", "!=", "<=", ">="};
            size_t n = 1;
            for (int i = 0; i < 6; i++)
                if (left >= 2 && p[0] == ops2[i][0] && p[1] == ops2[i][1]) n = 2;
            if (n == 1 && !strchr("+-*/%~<>=()[]{},.:|!", *p))
                fail(L->f, "line %d: unexpected character '%c'", L->line, *p);
            if (*p == '(' || *p == '[' || *p == '{') depth++;
            if (*p == ')' || *p == ']' || *p == '}') depth--;
            token *t = push_tok(L, T_OP);
            t->s = p;
            t->n = n;
            L->pos += n;
        }
    }
}

static int only_blanks(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t') return 0;
    return 1;
}

static void lex(lexer *L)
{
    size_t text_start = 0;
    int strip_next = 0;    /* the previous tag ended with '-' */
    while (L->pos <= L->len) {
        const char *open = NULL;
        for (size_t i = L->pos; i + 1 < L->len; i++)
            if (L->src[i] == '{' && (L->src[i + 1] == '{' || L->src[i + 1] == '%' || L->src[i + 1] == '#')) {
                open = L->src + i;
                break;
            }
        size_t end = open ? (size_t)(open - L->src) : L->len;
        const char *text = L->src + text_start;
        size_t tn = end - text_start;
        if (strip_next)
            while (tn && isspace((unsigned char)*text)) { text++; tn--; }
        if (!open) {
            push_text(L, text, tn);
            L->line += count_lines(L->src + L->pos, L->len - L->pos);
            return;
        }
        char kind = open[1], mod = open + 2 < L->src + L->len ? open[2] : 0;
        if (mod == '-') {
            while (tn && isspace((unsigned char)text[tn - 1])) tn--;
        } else if (kind != '{' && mod != '+') {
            /* lstrip_blocks: blanks between a line start and a block tag go */
            size_t nl = tn;
            while (nl && text[nl - 1] != '\n') nl--;
            int line_start = nl > 0 || text == L->src || text[-1] == '\n';
            if (line_start && only_blanks(text + nl, tn - nl)) tn = nl;
        }
        push_text(L, text, tn);
        L->line += count_lines(L->src + L->pos, end - L->pos);
        L->pos = end + 2 + (mod == '-' || mod == '+');
        int stripped;
        if (kind == '#') {
            const char *c = NULL;
            for (size_t i = L->pos; i + 1 < L->len; i++)
                if (L->src[i] == '#' && L->src[i + 1] == '}') { c = L->src + i; break; }
            if (!c) fail(L->f, "line %d: comment not closed", L->line);
            stripped = c > L->src + L->pos && c[-1] == '-';
            L->line += count_lines(L->src + L->pos, (size_t)(c - (L->src + L->pos)));
            L->pos = (size_t)(c - L->src) + 2;
        } else {
            push_tok(L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN);
            stripped = lex_tag(L, kind == '{' ? '}' : '%');
            push_tok(L, kind == '{' ? T_VAR_END : T_BLOCK_END);
        }
        /* trim_blocks: the first newline after a block or comment tag goes */
        if (!stripped && kind != '{' && L->pos < L->len && L->src[L->pos] == '\n') { L->pos++; L->line++; }
        strip_next = stripped;
        text_start = L->pos;
    }
}

/* ---- tree ---- */

enum {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_BREAK, N_CONTINUE,
    /* expressions */
    N_CONST_STR, N_CONST_INT, N_CONST_FLOAT, N_CONST_BOOL, N_CONST_NONE, N_NAME, N_ATTR, N_ITEM, N_SLICE,
    N_CALL, N_FILTER, N_TEST, N_BINOP, N_NOT, N_NEG, N_POS, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT,
};

typedef struct node node;
struct node {
    int kind, line;
    node *a, *b, *c;                 /* operands; N_IF: a cond; N_FOR: a iter, b filter */
    node **args; int n_args;         /* call/filter/test args, list items, dict keys, bodies */
    node **kw; const char **kw_names; int n_kw;   /* keyword args; dict values */
    node **body; int n_body;
    node **orelse; int n_orelse;
    const char *s; size_t n;         /* name, string, operator */
    const char **targets; int n_targets;          /* for targets; set: [name] or [ns, attr] */
    long long i;
    double f;
    int negate;                      /* "is not" */
};

struct jinja_template {
    arena a;
    node **body;
    int n_body;
};

typedef struct {
    failer *f;
    token *t;
    int n, i, depth;
} parser;

static token *peek(parser *P) { return &P->t[P->i < P->n ? P->i : P->n - 1]; }
static token *next_tok(parser *P) { token *t = peek(P); if (P->i < P->n) P->i++; return t; }

static int is_op(const token *t, const char *op) { return t->type == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static int is_name(const token *t, const char *nm) { return t->type == T_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n); }

static void expect_op(parser *P, const char *op)
{
    token *t = next_tok(P);
    if (!is_op(t, op)) fail(P->f, "line %d: expected '%s'", t->line, op);
}

static const char *expect_name(parser *P)
{
    token *t = next_tok(P);
    if (t->type != T_NAME) fail(P->f, "line %d: expected a name", t->line);
    return dupn(P->f, t->s, t->n);
}

static node *mk(parser *P, int kind)
{
    node *n = alloc(P->f, sizeof *n);
    n->kind = kind;
    n->line = peek(P)->line;
    return n;
}

typedef struct { node **v; int n, cap; } nodevec;
static void nv_push(failer *f, nodevec *v, node *x)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        node **p = alloc(f, (size_t)cap * sizeof *p);
        if (v->n) memcpy(p, v->v, (size_t)v->n * sizeof *p);
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static node *parse_expr(parser *P);
static node *parse_or(parser *P);
static node *parse_unary(parser *P, int with_filter);

/* (a, b=c, ...) after the callee; the '(' is next. */
static void parse_call_args(parser *P, node *call)
{
    expect_op(P, "(");
    nodevec args = {0}, kw = {0};
    int n_kw = 0;
    const char **names = NULL;
    int names_cap = 0;
    while (!is_op(peek(P), ")")) {
        if (peek(P)->type == T_NAME && P->i + 1 < P->n && is_op(&P->t[P->i + 1], "=")) {
            const char *nm = expect_name(P);
            next_tok(P);
            if (n_kw == names_cap) {
                names_cap = names_cap ? names_cap * 2 : 4;
                const char **nn = alloc(P->f, (size_t)names_cap * sizeof *nn);
                if (n_kw) memcpy(nn, names, (size_t)n_kw * sizeof *nn);
                names = nn;
            }
            names[n_kw++] = nm;
            nv_push(P->f, &kw, parse_expr(P));
        } else {
            nv_push(P->f, &args, parse_expr(P));
        }
        if (!is_op(peek(P), ",")) break;
        next_tok(P);
    }
    expect_op(P, ")");
    call->args = args.v;
    call->n_args = args.n;
    call->kw = kw.v;
    call->kw_names = names;
    call->n_kw = n_kw;
}

static node *parse_primary(parser *P)
{
    token *t = next_tok(P);
    node *n;
    switch (t->type) {
    case T_NAME:
        if (is_name(t, "true") || is_name(t, "True")) { n = mk(P, N_CONST_BOOL); n->i = 1; return n; }
        if (is_name(t, "false") || is_name(t, "False")) { n = mk(P, N_CONST_BOOL); return n; }
        if (is_name(t, "none") || is_name(t, "None")) return mk(P, N_CONST_NONE);
        n = mk(P, N_NAME);
        n->s = dupn(P->f, t->s, t->n);
        n->n = t->n;
        return n;
    case T_STRING: {
        /* adjacent literals concatenate */
        size_t total = t->n;
        int j = P->i;
        while (j < P->n && P->t[j].type == T_STRING) total += P->t[j++].n;
        char *s = alloc(P->f, total + 1);
        memcpy(s, t->s, t->n);
        size_t k = t->n;
        while (peek(P)->type == T_STRING) { token *u = next_tok(P); memcpy(s + k, u->s, u->n); k += u->n; }
        n = mk(P, N_CONST_STR);
        n->s = s;
        n->n = total;
        return n;
    }
    case T_INT: n = mk(P, N_CONST_INT); n->i = t->i; return n;
    case T_FLOAT: n = mk(P, N_CONST_FLOAT); n->f = t->f; return n;
    default: break;
    }
    if (is_op(t, "(")) {
        if (is_op(peek(P), ")")) { next_tok(P); return mk(P, N_TUPLE); }
        node *e = parse_expr(P);
        if (is_op(peek(P), ",")) {
            nodevec items = {0};
            nv_push(P->f, &items, e);
            while (is_op(peek(P), ",")) {
                next_tok(P);
                if (is_op(peek(P), ")")) break;
                nv_push(P->f, &items, parse_expr(P));
            }
            e = mk(P, N_TUPLE);
            e->args = items.v;
            e->n_args = items.n;
        }
        expect_op(P, ")");
        return e;
    }
    if (is_op(t, "[")) {
        nodevec items = {0};
        while (!is_op(peek(P), "]")) {
            nv_push(P->f, &items, parse_expr(P));
            if (!is_op(peek(P), ",")) break;
            next_tok(P);
        }
        expect_op(P, "]");
        n = mk(P, N_LIST);
        n->args = items.v;
        n->n_args = items.n;
        return n;
    }
    if (is_op(t, "{")) {
        nodevec keys = {0}, vals = {0};
        while (!is_op(peek(P), "}")) {
            nv_push(P->f, &keys, parse_expr(P));
            expect_op(P, ":");
            nv_push(P->f, &vals, parse_expr(P));
            if (!is_op(peek(P), ",")) break;
            next_tok(P);
        }
        expect_op(P, "}");
        n = mk(P, N_DICT);
        n->args = keys.v;
        n->n_args = keys.n;
        n->kw = vals.v;
        n->n_kw = vals.n;
        return n;
    }
    fail(P->f, "line %d: unexpected %s", t->line, t->type == T_OP ? "operator" : "end of tag");
}

static node *parse_postfix(parser *P, node *n)
{
    for (;;) {
        token *t = peek(P);
        if (is_op(t, ".")) {
            next_tok(P);
            token *nm = next_tok(P);
            node *a = mk(P, N_ATTR);
            a->a = n;
            if (nm->type == T_NAME) a->s = dupn(P->f, nm->s, nm->n), a->n = nm->n;
            else if (nm->type == T_INT) { a->kind = N_ITEM; a->b = mk(P, N_CONST_INT); a->b->i = nm->i; }
            else fail(P->f, "line %d: expected an attribute name after '.'", nm->line);
            n = a;
        } else if (is_op(t, "[")) {
            next_tok(P);
            node *lo = NULL, *hi = NULL, *st = NULL;
            int slice = 0;
            if (!is_op(peek(P), ":")) lo = parse_expr(P);
            if (is_op(peek(P), ":")) {
                slice = 1;
                next_tok(P);
                if (!is_op(peek(P), "]") && !is_op(peek(P), ":")) hi = parse_expr(P);
                if (is_op(peek(P), ":")) {
                    next_tok(P);
                    if (!is_op(peek(P), "]")) st = parse_expr(P);
                }
            }
            expect_op(P, "]");
            node *a = mk(P, slice ? N_SLICE : N_ITEM);
            a->a = n;
            a->b = lo;
            if (slice) { a->args = alloc(P->f, 2 * sizeof *a->args); a->args[0] = hi; a->args[1] = st; }
            n = a;
        } else if (is_op(t, "(")) {
            node *c = mk(P, N_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static node *parse_filter_expr(parser *P, node *n)
{
    for (;;) {
        token *t = peek(P);
        if (is_op(t, "|")) {
            next_tok(P);
            node *f = mk(P, N_FILTER);
            f->a = n;
            f->s = expect_name(P);
            while (is_op(peek(P), ".")) {   /* dotted filter names do not exist in HF templates */
                fail(P->f, "line %d: dotted filter names are not supported", peek(P)->line);
            }
            if (is_op(peek(P), "(")) parse_call_args(P, f);
            n = f;
        } else if (is_name(t, "is")) {
            next_tok(P);
            node *te = mk(P, N_TEST);
            te->a = n;
            if (is_name(peek(P), "not")) { next_tok(P); te->negate = 1; }
            token *nm = next_tok(P);
            if (nm->type != T_NAME && !(nm->type == T_OP && (is_op(nm, "==") || is_op(nm, "!=") || is_op(nm, "<") ||
                                                               is_op(nm, ">") || is_op(nm, "<=") || is_op(nm, ">="))))
                fail(P->f, "line %d: expected a test name after 'is'", nm->line);
            if (nm->type == T_NAME && (is_name(nm, "none") || is_name(nm, "None"))) te->s = "none";
            else if (nm->type == T_NAME && (is_name(nm, "true") || is_name(nm, "True"))) te->s = "true";
            else if (nm->type == T_NAME && (is_name(nm, "false") || is_name(nm, "False"))) te->s = "false";
            else te->s = dupn(P->f, nm->s, nm->n);
            if (is_op(peek(P), "(")) {
                parse_call_args(P, te);
            } else {
                /* one bare argument: "is divisibleby 3", "is sameas x", "is eq 1" */
                token *u = peek(P);
                int starts_arg = u->type == T_STRING || u->type == T_INT || u->type == T_FLOAT ||
                                 (u->type == T_NAME && !is_name(u, "and") && !is_name(u, "or") && !is_name(u, "else") &&
                                  !is_name(u, "if") && !is_name(u, "in") && !is_name(u, "is") && !is_name(u, "not")) ||
                                 is_op(u, "[") || is_op(u, "{");
                if (starts_arg) {
                    te->args = alloc(P->f, sizeof *te->args);
                    te->args[0] = parse_unary(P, 0);
                    te->n_args = 1;
                }
            }
            n = te;
        } else if (is_op(t, "(")) {
            node *c = mk(P, N_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static node *parse_unary(parser *P, int with_filter)
{
    if (++P->depth > MAX_DEPTH) fail(P->f, "line %d: expression nested too deeply", peek(P)->line);
    node *n;
    if (is_op(peek(P), "-") || is_op(peek(P), "+")) {
        int neg = is_op(next_tok(P), "-");
        n = mk(P, neg ? N_NEG : N_POS);
        n->a = parse_unary(P, 0);
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static node *binop(parser *P, const char *op, node *l, node *r)
{
    node *n = mk(P, N_BINOP);
    n->s = op;
    n->a = l;
    n->b = r;
    return n;
}

static node *parse_pow(parser *P)
{
    node *l = parse_unary(P, 1);
    while (is_op(peek(P), "**")) { next_tok(P); l = binop(P, "**", l, parse_unary(P, 1)); }
    return l;
}

static node *parse_math2(parser *P)
{
    node *l = parse_pow(P);
    for (;;) {
        token *t = peek(P);
        const char *op = is_op(t, "*") ? "*" : is_op(t, "/") ? "/" : is_op(t, "//") ? "//" : is_op(t, "%") ? "%" : NULL;
        if (!op) return l;
        next_tok(P);
        l = binop(P, op, l, parse_pow(P));
    }
}

static node *parse_concat(parser *P)
{
    node *l = parse_math2(P);
    while (is_op(peek(P), "~")) { next_tok(P); l = binop(P, "~", l, parse_math2(P)); }
    return l;
}

static node *parse_math1(parser *P)
{
    node *l = parse_concat(P);
    for (;;) {
        token *t = peek(P);
        const char *op = is_op(t, "+") ? "+" : is_op(t, "-") ? "-" : NULL;
        if (!op) return l;
        next_tok(P);
        l = binop(P, op, l, parse_concat(P));
    }
}

static node *parse_compare(parser *P)
{
    node *l = parse_math1(P);
    for (;;) {
        token *t = peek(P);
        const char *op = NULL;
        static const char *const cmp[] = {"==", "!=", "<=", ">=", "<", ">"};
        for (int i = 0; i < 6 && !op; i++)
            if (is_op(t, cmp[i])) op = cmp[i];
        if (!op && is_name(t, "in")) op = "in";
        if (!op && is_name(t, "not") && P->i + 1 < P->n && is_name(&P->t[P->i + 1], "in")) { next_tok(P); op = "not in"; }
        if (!op) return l;
        next_tok(P);
        l = binop(P, op, l, parse_math1(P));
    }
}

static node *parse_not(parser *P)
{
    if (is_name(peek(P), "not")) {
        next_tok(P);
        node *n = mk(P, N_NOT);
        n->a = parse_not(P);
        return n;
    }
    return parse_compare(P);
}

static node *parse_and(parser *P)
{
    node *l = parse_not(P);
    while (is_name(peek(P), "and")) {
        next_tok(P);
        node *n = mk(P, N_AND);
        n->a = l;
        n->b = parse_not(P);
        l = n;
    }
    return l;
}

static node *parse_or(parser *P)
{
    node *l = parse_and(P);
    while (is_name(peek(P), "or")) {
        next_tok(P);
        node *n = mk(P, N_OR);
        n->a = l;
        n->b = parse_and(P);
        l = n;
    }
    return l;
}

static node *parse_expr(parser *P)
{
    node *e = parse_or(P);
    while (is_name(peek(P), "if")) {
        next_tok(P);
        node *c = mk(P, N_COND);
        c->a = parse_or(P);
        c->b = e;
        if (is_name(peek(P), "else")) { next_tok(P); c->c = parse_expr(P); }
        e = c;
    }
    return e;
}

/* "a, b" without brackets is a tuple (in {{ }} and set). */
static node *parse_tuple_expr(parser *P)
{
    node *e = parse_expr(P);
    if (!is_op(peek(P), ",")) return e;
    nodevec items = {0};
    nv_push(P->f, &items, e);
    while (is_op(peek(P), ",")) {
        next_tok(P);
        if (peek(P)->type == T_VAR_END || peek(P)->type == T_BLOCK_END) break;
        nv_push(P->f, &items, parse_expr(P));
    }
    node *t = mk(P, N_TUPLE);
    t->args = items.v;
    t->n_args = items.n;
    return t;
}

static void expect_block_end(parser *P)
{
    token *t = next_tok(P);
    if (t->type != T_BLOCK_END) fail(P->f, "line %d: expected the end of the block tag", t->line);
}

/* Parses statements until a block tag whose first name is in stops
 * (NULL-terminated); returns that name (its tag's BLOCK_BEGIN and name are
 * consumed) or NULL at the end of input (allowed only when stops is empty). */
static const char *parse_body(parser *P, nodevec *out, const char *const *stops)
{
    if (++P->depth > MAX_DEPTH) fail(P->f, "line %d: blocks nested too deeply", peek(P)->line);
    for (;;) {
        token *t = next_tok(P);
        if (t->type == T_EOF) {
            if (stops[0]) {
                int last = 0;
                while (stops[last + 1]) last++;
                fail(P->f, "unexpected end of template: missing {%% %s %%}", stops[last]);
            }
            P->depth--;
            return NULL;
        }
        if (t->type == T_TEXT) {
            node *n = mk(P, N_TEXT);
            n->s = t->s;
            n->n = t->n;
            nv_push(P->f, out, n);
            continue;
        }
        if (t->type == T_VAR_BEGIN) {
            node *n = mk(P, N_OUTPUT);
            n->a = parse_tuple_expr(P);
            token *e = next_tok(P);
            if (e->type != T_VAR_END) fail(P->f, "line %d: expected '}}'", e->line);
            nv_push(P->f, out, n);
            continue;
        }
        if (t->type != T_BLOCK_BEGIN) fail(P->f, "line %d: unexpected token", t->line);
        token *kw = next_tok(P);
        if (kw->type != T_NAME) fail(P->f, "line %d: expected a statement name", kw->line);
        for (int i = 0; stops[i]; i++)
            if (is_name(kw, stops[i])) { P->depth--; return stops[i]; }
        if (is_name(kw, "if")) {
            node *n = mk(P, N_IF);
            node *cur = n;
            cur->a = parse_expr(P);
            expect_block_end(P);
            for (;;) {
                static const char *const st[] = {"elif", "else", "endif", NULL};
                nodevec body = {0};
                const char *end = parse_body(P, &body, st);
                cur->body = body.v;
                cur->n_body = body.n;
                if (!strcmp(end, "endif")) { expect_block_end(P); break; }
                if (!strcmp(end, "else")) {
                    expect_block_end(P);
                    static const char *const st2[] = {"endif", NULL};
                    nodevec eb = {0};
                    parse_body(P, &eb, st2);
                    expect_block_end(P);
                    cur->orelse = eb.v;
                    cur->n_orelse = eb.n;
                    break;
                }
                node *el = mk(P, N_IF);   /* elif: an if in the else branch */
                el->a = parse_expr(P);
                expect_block_end(P);
                cur->orelse = alloc(P->f, sizeof *cur->orelse);
                cur->orelse[0] = el;
                cur->n_orelse = 1;
                cur = el;
            }
            nv_push(P->f, out, n);
        } else if (is_name(kw, "for")) {
            node *n = mk(P, N_FOR);
            const char *names[8];
            int nn = 0;
            int paren = is_op(peek(P), "(");
            if (paren) next_tok(P);
            do {
                if (nn == 8) fail(P->f, "line %d: too many loop targets", kw->line);
                names[nn++] = expect_name(P);
            } while (is_op(peek(P), ",") && next_tok(P));
            if (paren) expect_op(P, ")");
            n->targets = alloc(P->f, (size_t)nn * sizeof *n->targets);
            memcpy(n->targets, names, (size_t)nn * sizeof *names);
            n->n_targets = nn;
            if (!is_name(next_tok(P), "in")) fail(P->f, "line %d: expected 'in' in the for tag", kw->line);
            n->a = parse_or(P);   /* no conditional here: "if" starts the loop filter */
            if (is_name(peek(P), "if")) { next_tok(P); n->b = parse_expr(P); }
            if (is_name(peek(P), "recursive")) fail(P->f, "line %d: recursive loops are not supported", kw->line);
            expect_block_end(P);
            static const char *const st[] = {"else", "endfor", NULL};
            nodevec body = {0};
            const char *end = parse_body(P, &body, st);
            n->body = body.v;
            n->n_body = body.n;
            expect_block_end(P);
            if (!strcmp(end, "else")) {
                static const char *const st2[] = {"endfor", NULL};
                nodevec eb = {0};
                parse_body(P, &eb, st2);
                expect_block_end(P);
                n->orelse = eb.v;
                n->n_orelse = eb.n;
            }
            nv_push(P->f, out, n);
        } else if (is_name(kw, "set")) {
            node *n = mk(P, N_SET);
            const char *a = expect_name(P);
            if (is_op(peek(P), ".")) {
                next_tok(P);
                n->targets = alloc(P->f, 2 * sizeof *n->targets);
                n->targets[0] = a;
                n->targets[1] = expect_name(P);
                n->n_targets = 2;
            } else {
                const char *names[8];
                int nn = 0;
                names[nn++] = a;
                while (is_op(peek(P), ",")) {
                    next_tok(P);
                    if (nn == 8) fail(P->f, "line %d: too many set targets", kw->line);
                    names[nn++] = expect_name(P);
                }
                n->targets = alloc(P->f, (size_t)nn * sizeof *n->targets);
                memcpy(n->targets, names, (size_t)nn * sizeof *names);
                n->n_targets = nn;
                n->negate = nn > 1;   /* unpack */
            }
            if (is_op(peek(P), "=")) {
                next_tok(P);
                n->a = parse_tuple_expr(P);
                expect_block_end(P);
            } else {
                if (n->n_targets != 1) fail(P->f, "line %d: a block set takes one name", kw->line);
                n->kind = N_SET_BLOCK;
                expect_block_end(P);
                static const char *const st[] = {"endset", NULL};
                nodevec body = {0};
                parse_body(P, &body, st);
                expect_block_end(P);
                n->body = body.v;
                n->n_body = body.n;
            }
            nv_push(P->f, out, n);
        } else if (is_name(kw, "break") || is_name(kw, "continue")) {
            node *n = mk(P, is_name(kw, "break") ? N_BREAK : N_CONTINUE);
            expect_block_end(P);
            nv_push(P->f, out, n);
        } else if (is_name(kw, "generation") || is_name(kw, "endgeneration")) {
            expect_block_end(P);   /* HF's AssistantTracker marks: no output of their own */
        } else {
            fail(P->f, "line %d: {%% %.*s %%} is not supported by this server's Jinja subset", kw->line, (int)kw->n,
                 kw->s);
        }
    }
}

static void parse_all(jinja_template *t, failer *f, const char *src, size_t n)
{
    char *copy = dupn(f, src, n);
    lexer L = {.f = f, .src = copy, .len = n, .line = 1};
    lex(&L);
    push_tok(&L, T_EOF);
    parser P = {.f = f, .t = L.toks, .n = L.n};
    nodevec body = {0};
    static const char *const none[] = {NULL};
    parse_body(&P, &body, none);
    t->body = body.v;
    t->n_body = body.n;
}

static int parse_guarded(jinja_template *t, const char *src, size_t n, char *err, size_t errlen)
{
    failer f = {.err = err, .errlen = errlen, .a = &t->a};
    if (setjmp(f.jb)) return -1;
    parse_all(t, &f, src, n);
    return 0;
}

int jinja_parse(const char *src, size_t len, jinja_template **out, char *err, size_t errlen)
{
    *out = NULL;
    /* Jinja2's keep_trailing_newline=False: one final newline is not text */
    size_t n = len && src[len - 1] == '\n' ? len - (len > 1 && src[len - 2] == '\r' ? 2 : 1) : len;
    jinja_template *t = calloc(1, sizeof *t);
    if (!t) { snprintf(err, errlen, "out of memory"); return -1; }
    if (parse_guarded(t, src, n, err, errlen)) {
        arena_free(&t->a);
        free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_template *t)
{
    if (!t) return;
    arena_free(&t->a);
    free(t);
}

/* ---- values ---- */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_TUPLE, V_DICT, V_NS, V_FUNC };

typedef struct value value;
typedef struct { value *v; int n, cap; } vlist;
typedef struct { value *k, *v; int n, cap; } vdict;

enum {
    F_NONE, F_RANGE, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME,
    /* str methods */
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER, M_TITLE, M_CAPITALIZE,
    M_REPLACE, M_FIND, M_JOIN, M_COUNT, M_SPLITLINES,
    /* dict methods */
    M_ITEMS, M_KEYS, M_VALUES, M_GET,
};

struct value {
    int k;
    union {
        int b;
        long long i;
        double f;
        struct { const char *p; size_t n; } s;
        vlist *l;
        vdict *d;
        struct { int id; value *self; } fn;
    } u;
};

static const value UNDEF = {.k = V_UNDEF};
static value v_none(void) { return (value){.k = V_NONE}; }
static value v_bool(int b) { value v = {.k = V_BOOL}; v.u.b = !!b; return v; }
static value v_int(long long i) { value v = {.k = V_INT}; v.u.i = i; return v; }
static value v_float(double f) { value v = {.k = V_FLOAT}; v.u.f = f; return v; }
static value v_str(const char *p, size_t n) { value v = {.k = V_STR}; v.u.s.p = p; v.u.s.n = n; return v; }

typedef struct scope scope;
struct scope {
    scope *up;
    vdict vars;
};

typedef struct {
    failer f;
    arena a;
    char *out;
    size_t len, cap;
    long steps;
    int depth;
    scope *sc;
    int loop_ctl;     /* 1 break, 2 continue */
} rctx;

static value v_strdup(rctx *c, const char *p, size_t n) { return v_str(dupn(&c->f, p, n), n); }

static vlist *list_new(rctx *c, int cap)
{
    vlist *l = alloc(&c->f, sizeof *l);
    l->cap = cap > 0 ? cap : 4;
    l->v = alloc(&c->f, (size_t)l->cap * sizeof *l->v);
    return l;
}

static void list_push(rctx *c, vlist *l, value v)
{
    if (l->n == l->cap) {
        int cap = l->cap * 2;
        value *p = alloc(&c->f, (size_t)cap * sizeof *p);
        memcpy(p, l->v, (size_t)l->n * sizeof *p);
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

static value v_list(vlist *l, int tuple) { value v = {.k = tuple ? V_TUPLE : V_LIST}; v.u.l = l; return v; }

static vdict *dict_new(rctx *c)
{
    vdict *d = alloc(&c->f, sizeof *d);
    return d;
}

static int v_equal(const value *a, const value *b);

static value *dict_find(vdict *d, const value *key)
{
    for (int i = 0; i < d->n; i++)
        if (v_equal(&d->k[i], key)) return &d->v[i];
    return NULL;
}

static value *dict_find_str(vdict *d, const char *s, size_t n)
{
    for (int i = 0; i < d->n; i++)
        if (d->k[i].k == V_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, s, n)) return &d->v[i];
    return NULL;
}

static void dict_set(rctx *c, vdict *d, value key, value v)
{
    value *slot = dict_find(d, &key);
    if (slot) { *slot = v; return; }
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 8;
        value *k = alloc(&c->f, (size_t)cap * sizeof *k), *vv = alloc(&c->f, (size_t)cap * sizeof *vv);
        if (d->n) { memcpy(k, d->k, (size_t)d->n * sizeof *k); memcpy(vv, d->v, (size_t)d->n * sizeof *vv); }
        d->k = k;
        d->v = vv;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n++] = v;
}

static void dict_set_str(rctx *c, vdict *d, const char *name, value v)
{
    dict_set(c, d, v_str(name, strlen(name)), v);
}

static value v_dict(vdict *d, int ns) { value v = {.k = ns ? V_NS : V_DICT}; v.u.d = d; return v; }
static value v_func(rctx *c, int id, const value *self)
{
    value v = {.k = V_FUNC};
    v.u.fn.id = id;
    if (self) { v.u.fn.self = alloc(&c->f, sizeof *self); *v.u.fn.self = *self; }
    return v;
}

static value from_json(rctx *c, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return v_none();
    if (cJSON_IsBool(j)) return v_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double x = j->valuedouble;
        if (x == floor(x) && fabs(x) < 9e15) return v_int((long long)x);
        return v_float(x);
    }
    if (cJSON_IsString(j)) return v_str(j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        vlist *l = list_new(c, cJSON_GetArraySize(j));
        const cJSON *it;
        cJSON_ArrayForEach(it, j) list_push(c, l, from_json(c, it));
        return v_list(l, 0);
    }
    vdict *d = dict_new(c);
    const cJSON *it;
    cJSON_ArrayForEach(it, j) dict_set(c, d, v_str(it->string, strlen(it->string)), from_json(c, it));
    return v_dict(d, 0);
}

static const char *kind_name(int k)
{
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "tuple",
                                        "dict", "Namespace", "function"};
    return names[k];
}

static int truthy(const value *v)
{
    switch (v->k) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: return v->u.b;
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.f != 0;
    case V_STR: return v->u.s.n != 0;
    case V_LIST: case V_TUPLE: return v->u.l->n != 0;
    case V_DICT: case V_NS: return v->u.d->n != 0;
    default: return 1;
    }
}

static int is_num(const value *v) { return v->k == V_INT || v->k == V_FLOAT || v->k == V_BOOL; }
static double num(const value *v) { return v->k == V_FLOAT ? v->u.f : v->k == V_INT ? (double)v->u.i : v->u.b; }

/* Python's ==: containers compare item by item, an item that is the same
 * object as its counterpart is equal without a look inside (so a namespace
 * that holds itself equals itself), and past MAX_DEPTH levels of distinct
 * containers (a cycle of two) the answer is "not equal" where Python would
 * raise RecursionError. */
static int v_equal_at(const value *a, const value *b, int level)
{
    if (is_num(a) && is_num(b)) return num(a) == num(b);
    if (level > MAX_DEPTH) return 0;
    if (a->k != b->k) {
        if ((a->k == V_LIST || a->k == V_TUPLE) && (b->k == V_LIST || b->k == V_TUPLE)) return 0;
        return 0;
    }
    switch (a->k) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case V_LIST: case V_TUPLE:
        if (a->u.l == b->u.l) return 1;
        if (a->u.l->n != b->u.l->n) return 0;
        for (int i = 0; i < a->u.l->n; i++)
            if (!v_equal_at(&a->u.l->v[i], &b->u.l->v[i], level + 1)) return 0;
        return 1;
    case V_DICT: case V_NS:
        if (a->u.d == b->u.d) return 1;
        if (a->u.d->n != b->u.d->n) return 0;
        for (int i = 0; i < a->u.d->n; i++) {
            value *o = dict_find(b->u.d, &a->u.d->k[i]);
            if (!o || !v_equal_at(&a->u.d->v[i], o, level + 1)) return 0;
        }
        return 1;
    case V_FUNC: return a->u.fn.id == b->u.fn.id;
    default: return 0;
    }
}

static int v_equal(const value *a, const value *b) { return v_equal_at(a, b, 0); }

/* ---- text of values (Python's str / repr / json.dumps) ---- */

typedef struct { rctx *c; char *p; size_t n, cap; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        if (cap > MAX_OUTPUT * 2) fail(&b->c->f, "template output exceeds %u bytes", MAX_OUTPUT);
        char *p = alloc(&b->c->f, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Python's repr(float): the shortest digits that round-trip; exponent form
 * below 1e-4 and from 1e16. */
static void put_float(sbuf *b, double x)
{
    if (isnan(x)) { sb_puts(b, "nan"); return; }
    if (isinf(x)) { sb_puts(b, x > 0 ? "inf" : "-inf"); return; }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* buf: [-]d.ddde[+-]XX */
    char digits[32];
    int nd = 0, neg = buf[0] == '-';
    const char *p = buf + neg;
    for (; *p && *p != 'e'; p++)
        if (isdigit((unsigned char)*p)) digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    int k = 0;
    if (neg) out[k++] = '-';
    if (exp >= -5 + 1 && exp < 16) {
        if (exp < 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[k++] = i < nd ? digits[i] : '0';
            out[k++] = '.';
            if (nd > exp + 1) for (int i = exp + 1; i < nd; i++) out[k++] = digits[i];
            else out[k++] = '0';
        }
        out[k] = '\0';
    } else {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    sb_puts(b, out);
}

static void put_value(sbuf *b, const value *v, int repr);

static void put_repr_str(sbuf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '\\') sb_puts(b, "\\\\");
        else if (ch == (unsigned char)q) { esc[0] = '\\'; esc[1] = (char)q; sb_put(b, esc, 2); }
        else if (ch == '\n') sb_puts(b, "\\n");
        else if (ch == '\r') sb_puts(b, "\\r");
        else if (ch == '\t') sb_puts(b, "\\t");
        else if (ch < 0x20 || ch == 0x7f) { snprintf(esc, sizeof esc, "\\x%02x", ch); sb_puts(b, esc); }
        else sb_put(b, (const char *)&ch, 1);
    }
    sb_put(b, &q, 1);
}

/* Nesting of printed values: a namespace can be made to hold itself
 * ({% set ns.a = ns %}), so printing it would recurse without end. */
static void put_value_at(sbuf *b, const value *v, int repr, int level);
static void put_value(sbuf *b, const value *v, int repr) { put_value_at(b, v, repr, 0); }

static void put_value_at(sbuf *b, const value *v, int repr, int level)
{
    char buf[32];
    if (level > MAX_DEPTH) fail(&b->c->f, "value nested too deeply to print (a namespace or list that holds itself?)");
    switch (v->k) {
    case V_UNDEF: break;
    case V_NONE: sb_puts(b, "None"); break;
    case V_BOOL: sb_puts(b, v->u.b ? "True" : "False"); break;
    case V_INT: snprintf(buf, sizeof buf, "%lld", v->u.i); sb_puts(b, buf); break;
    case V_FLOAT: put_float(b, v->u.f); break;
    case V_STR: if (repr) put_repr_str(b, v->u.s.p, v->u.s.n); else sb_put(b, v->u.s.p, v->u.s.n); break;
    case V_LIST: case V_TUPLE:
        sb_puts(b, v->k == V_LIST ? "[" : "(");
        for (int i = 0; i < v->u.l->n; i++) {
            if (i) sb_puts(b, ", ");
            put_value_at(b, &v->u.l->v[i], 1, level + 1);
        }
        if (v->k == V_TUPLE && v->u.l->n == 1) sb_puts(b, ",");
        sb_puts(b, v->k == V_LIST ? "]" : ")");
        break;
    case V_DICT: case V_NS:
        sb_puts(b, v->k == V_NS ? "<Namespace {" : "{");
        for (int i = 0; i < v->u.d->n; i++) {
            if (i) sb_puts(b, ", ");
            put_value_at(b, &v->u.d->k[i], 1, level + 1);
            sb_puts(b, ": ");
            put_value_at(b, &v->u.d->v[i], 1, level + 1);
        }
        sb_puts(b, v->k == V_NS ? "}>" : "}");
        break;
    default: sb_puts(b, "<built-in function>"); break;
    }
}

static void put_json_str(sbuf *b, const char *s, size_t n)
{
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        switch (ch) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\r': sb_puts(b, "\\r"); break;
        case '\t': sb_puts(b, "\\t"); break;
        case '\b': sb_puts(b, "\\b"); break;
        case '\f': sb_puts(b, "\\f"); break;
        default:
            if (ch < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", ch); sb_puts(b, esc); }
            else sb_put(b, (const char *)&ch, 1);
        }
    }
    sb_puts(b, "\"");
}

typedef struct { int indent; const char *item_sep, *key_sep; int sort_keys; } json_opts;

static void put_json(sbuf *b, const value *v, const json_opts *o, int level);

static void json_newline(sbuf *b, const json_opts *o, int level)
{
    sb_puts(b, "\n");
    for (int i = 0; i < o->indent * level; i++) sb_puts(b, " ");
}

static int cmp_values(rctx *c, const value *a, const value *b);

static void put_json(sbuf *b, const value *v, const json_opts *o, int level)
{
    if (level > MAX_DEPTH) fail(&b->c->f, "tojson: nesting too deep");
    switch (v->k) {
    case V_NONE: sb_puts(b, "null"); return;
    case V_BOOL: sb_puts(b, v->u.b ? "true" : "false"); return;
    case V_INT: case V_FLOAT:
        if (v->k == V_FLOAT && isnan(v->u.f)) sb_puts(b, "NaN");
        else if (v->k == V_FLOAT && isinf(v->u.f)) sb_puts(b, v->u.f > 0 ? "Infinity" : "-Infinity");
        else put_value(b, v, 0);
        return;
    case V_STR: put_json_str(b, v->u.s.p, v->u.s.n); return;
    case V_LIST: case V_TUPLE: {
        if (!v->u.l->n) { sb_puts(b, "[]"); return; }
        sb_puts(b, "[");
        for (int i = 0; i < v->u.l->n; i++) {
            if (i) sb_puts(b, o->item_sep);
            if (o->indent >= 0) json_newline(b, o, level + 1);
            put_json(b, &v->u.l->v[i], o, level + 1);
        }
        if (o->indent >= 0) json_newline(b, o, level);
        sb_puts(b, "]");
        return;
    }
    case V_DICT: case V_NS: {
        vdict *d = v->u.d;
        if (!d->n) { sb_puts(b, "{}"); return; }
        int order[d->n > 0 ? d->n : 1];
        for (int i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys)
            for (int i = 1; i < d->n; i++)
                for (int j = i; j > 0 && cmp_values(b->c, &d->k[order[j - 1]], &d->k[order[j]]) > 0; j--) {
                    int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
                }
        sb_puts(b, "{");
        for (int ii = 0; ii < d->n; ii++) {
            int i = order[ii];
            if (ii) sb_puts(b, o->item_sep);
            if (o->indent >= 0) json_newline(b, o, level + 1);
            const value *k = &d->k[i];
            if (k->k == V_STR) put_json_str(b, k->u.s.p, k->u.s.n);
            else {
                sbuf kb = {.c = b->c};
                if (k->k == V_NONE) sb_puts(&kb, "null");
                else if (k->k == V_BOOL) sb_puts(&kb, k->u.b ? "true" : "false");
                else if (k->k == V_INT || k->k == V_FLOAT) put_value(&kb, k, 0);
                else fail(&b->c->f, "tojson: keys must be str, int, float, bool or None, not %s", kind_name(k->k));
                put_json_str(b, kb.p ? kb.p : "", kb.n);
            }
            sb_puts(b, o->key_sep);
            put_json(b, &d->v[i], o, level + 1);
        }
        if (o->indent >= 0) json_newline(b, o, level);
        sb_puts(b, "}");
        return;
    }
    default: fail(&b->c->f, "tojson: Object of type %s is not JSON serializable", kind_name(v->k));
    }
}

static value to_str(rctx *c, const value *v)
{
    if (v->k == V_STR) return *v;
    sbuf b = {.c = c};
    put_value(&b, v, 0);
    return v_str(b.p ? b.p : "", b.n);
}

/* ---- rendering ---- */

static void emit(rctx *c, const char *s, size_t n)
{
    if (c->len + n > MAX_OUTPUT) fail(&c->f, "template output exceeds %u bytes", MAX_OUTPUT);
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4096;
        while (cap < c->len + n + 1) cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p) fail(&c->f, "out of memory");
        c->out = p;
        c->cap = cap;
    }
    memcpy(c->out + c->len, s, n);
    c->len += n;
    c->out[c->len] = '\0';
}

static void tick(rctx *c)
{
    if (++c->steps > MAX_STEPS) fail(&c->f, "template ran more than %ld steps", MAX_STEPS);
}

static value lookup(rctx *c, const char *name, size_t n)
{
    for (scope *s = c->sc; s; s = s->up) {
        value *v = dict_find_str(&s->vars, name, n);
        if (v) return *v;
    }
    static const struct { const char *name; int id; } globals[] = {
        {"range", F_RANGE}, {"namespace", F_NAMESPACE}, {"dict", F_DICT}, {"raise_exception", F_RAISE},
        {"strftime_now", F_STRFTIME},
    };
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strlen(globals[i].name) == n && !memcmp(globals[i].name, name, n)) return v_func(c, globals[i].id, NULL);
    return UNDEF;
}

static void scope_set(rctx *c, const char *name, value v)
{
    dict_set(c, &c->sc->vars, v_str(name, strlen(name)), v);
}

static value eval(rctx *c, const node *n);

static long long as_int(rctx *c, const value *v, const char *what)
{
    if (v->k == V_INT) return v->u.i;
    if (v->k == V_BOOL) return v->u.b;
    fail(&c->f, "%s must be an integer, not %s", what, kind_name(v->k));
}

/* Python's index normalisation for one position. */
static int norm_index(long long i, int n) { return (int)(i < 0 ? i + n : i); }

static value get_item(rctx *c, const value *obj, const value *key, int line);

static value str_method(rctx *c, const char *name, size_t n, const value *self)
{
    static const struct { const char *name; int id; } m[] = {
        {"strip", M_STRIP}, {"lstrip", M_LSTRIP}, {"rstrip", M_RSTRIP}, {"split", M_SPLIT},
        {"startswith", M_STARTSWITH}, {"endswith", M_ENDSWITH}, {"upper", M_UPPER}, {"lower", M_LOWER},
        {"title", M_TITLE}, {"capitalize", M_CAPITALIZE}, {"replace", M_REPLACE}, {"find", M_FIND},
        {"join", M_JOIN}, {"count", M_COUNT}, {"splitlines", M_SPLITLINES},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (strlen(m[i].name) == n && !memcmp(m[i].name, name, n)) return v_func(c, m[i].id, self);
    return UNDEF;
}

static value get_attr(rctx *c, const value *obj, const char *name, size_t n, int line)
{
    switch (obj->k) {
    case V_UNDEF: fail(&c->f, "line %d: '%.*s' of an undefined value", line, (int)n, name);
    case V_STR: return str_method(c, name, n, obj);
    case V_DICT: case V_NS: {
        if (obj->k == V_DICT) {
            static const struct { const char *name; int id; } m[] = {
                {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"get", M_GET}};
            for (size_t i = 0; i < 4; i++)
                if (strlen(m[i].name) == n && !memcmp(m[i].name, name, n)) return v_func(c, m[i].id, obj);
        }
        value *v = dict_find_str(obj->u.d, name, n);
        return v ? *v : UNDEF;
    }
    default: return UNDEF;
    }
}

static value get_item(rctx *c, const value *obj, const value *key, int line)
{
    switch (obj->k) {
    case V_UNDEF: fail(&c->f, "line %d: subscript of an undefined value", line);
    case V_LIST: case V_TUPLE: {
        if (key->k != V_INT && key->k != V_BOOL) return UNDEF;
        int i = norm_index(as_int(c, key, "an index"), obj->u.l->n);
        return i >= 0 && i < obj->u.l->n ? obj->u.l->v[i] : UNDEF;
    }
    case V_STR: {
        if (key->k != V_INT) return UNDEF;
        int i = norm_index(key->u.i, (int)obj->u.s.n);
        return i >= 0 && (size_t)i < obj->u.s.n ? v_str(obj->u.s.p + i, 1) : UNDEF;
    }
    case V_DICT: case V_NS: {
        value *v = dict_find(obj->u.d, key);
        if (v) return *v;
        if (key->k == V_STR) return get_attr(c, obj, key->u.s.p, key->u.s.n, line);
        return UNDEF;
    }
    default: return UNDEF;
    }
}

/* Python slice semantics over n elements. */
static void slice_bounds(rctx *c, const value *lo, const value *hi, const value *st, int n, long long *start,
                         long long *stop, long long *step)
{
    *step = st && st->k != V_NONE && st->k != V_UNDEF ? as_int(c, st, "a slice step") : 1;
    if (*step == 0) fail(&c->f, "slice step cannot be zero");
    long long def_start = *step > 0 ? 0 : n - 1, def_stop = *step > 0 ? n : -1;
    long long s = lo && lo->k != V_NONE && lo->k != V_UNDEF ? as_int(c, lo, "a slice bound") : def_start;
    long long e = hi && hi->k != V_NONE && hi->k != V_UNDEF ? as_int(c, hi, "a slice bound") : def_stop;
    int s_given = lo && lo->k != V_NONE && lo->k != V_UNDEF, e_given = hi && hi->k != V_NONE && hi->k != V_UNDEF;
    if (s_given) {
        if (s < 0) s += n;
        if (*step > 0) s = s < 0 ? 0 : s > n ? n : s;
        else s = s < -1 ? -1 : s > n - 1 ? n - 1 : s;
    }
    if (e_given) {
        if (e < 0) e += n;
        if (*step > 0) e = e < 0 ? 0 : e > n ? n : e;
        else e = e < -1 ? -1 : e > n - 1 ? n - 1 : e;
    }
    *start = s;
    *stop = e;
}

static value do_slice(rctx *c, const value *obj, const value *lo, const value *hi, const value *st, int line)
{
    long long s, e, step;
    if (obj->k == V_LIST || obj->k == V_TUPLE) {
        slice_bounds(c, lo, hi, st, obj->u.l->n, &s, &e, &step);
        vlist *l = list_new(c, 4);
        for (long long i = s; step > 0 ? i < e : i > e; i += step) list_push(c, l, obj->u.l->v[i]);
        return v_list(l, obj->k == V_TUPLE);
    }
    if (obj->k == V_STR) {
        slice_bounds(c, lo, hi, st, (int)obj->u.s.n, &s, &e, &step);
        sbuf b = {.c = c};
        for (long long i = s; step > 0 ? i < e : i > e; i += step) sb_put(&b, obj->u.s.p + i, 1);
        return v_str(b.p ? b.p : "", b.n);
    }
    if (obj->k == V_UNDEF) fail(&c->f, "line %d: slice of an undefined value", line);
    fail(&c->f, "line %d: cannot slice a %s", line, kind_name(obj->k));
}

/* Iterating: lists, tuples, dict keys, string characters (bytes here:
 * templates iterate strings only in exotic cases). */
static vlist *iter_items(rctx *c, const value *v, int line)
{
    if (v->k == V_LIST || v->k == V_TUPLE) return v->u.l;
    vlist *l = list_new(c, 4);
    if (v->k == V_UNDEF || v->k == V_NONE) {
        if (v->k == V_NONE) fail(&c->f, "line %d: 'NoneType' object is not iterable", line);
        return l;
    }
    if (v->k == V_DICT || v->k == V_NS) {
        for (int i = 0; i < v->u.d->n; i++) list_push(c, l, v->u.d->k[i]);
        return l;
    }
    if (v->k == V_STR) {
        for (size_t i = 0; i < v->u.s.n;) {
            size_t k = 1;
            unsigned char ch = (unsigned char)v->u.s.p[i];
            if (ch >= 0xF0) k = 4; else if (ch >= 0xE0) k = 3; else if (ch >= 0xC0) k = 2;
            if (i + k > v->u.s.n) k = v->u.s.n - i;
            list_push(c, l, v_str(v->u.s.p + i, k));
            i += k;
        }
        return l;
    }
    fail(&c->f, "line %d: '%s' object is not iterable", line, kind_name(v->k));
}

static int cmp_values(rctx *c, const value *a, const value *b)
{
    if (is_num(a) && is_num(b)) { double x = num(a), y = num(b); return x < y ? -1 : x > y; }
    if (a->k == V_STR && b->k == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.p, b->u.s.p, n);
        return r ? (r < 0 ? -1 : 1) : a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    fail(&c->f, "'<' not supported between instances of '%s' and '%s'", kind_name(a->k), kind_name(b->k));
}

static int contains(rctx *c, const value *hay, const value *needle, int line)
{
    if (hay->k == V_STR) {
        if (needle->k != V_STR) fail(&c->f, "line %d: 'in <string>' requires string as left operand", line);
        if (!needle->u.s.n) return 1;
        for (size_t i = 0; i + needle->u.s.n <= hay->u.s.n; i++)
            if (!memcmp(hay->u.s.p + i, needle->u.s.p, needle->u.s.n)) return 1;
        return 0;
    }
    if (hay->k == V_DICT || hay->k == V_NS) return dict_find(hay->u.d, needle) != NULL;
    if (hay->k == V_LIST || hay->k == V_TUPLE) {
        for (int i = 0; i < hay->u.l->n; i++)
            if (v_equal(&hay->u.l->v[i], needle)) return 1;
        return 0;
    }
    if (hay->k == V_UNDEF) return 0;
    fail(&c->f, "line %d: argument of type '%s' is not iterable", line, kind_name(hay->k));
}

static value concat_str(rctx *c, const value *a, const value *b)
{
    value x = to_str(c, a), y = to_str(c, b);
    char *p = alloc(&c->f, x.u.s.n + y.u.s.n + 1);
    memcpy(p, x.u.s.p, x.u.s.n);
    memcpy(p + x.u.s.n, y.u.s.p, y.u.s.n);
    return v_str(p, x.u.s.n + y.u.s.n);
}

static value arith(rctx *c, const char *op, const value *a, const value *b, int line)
{
    if (a->k == V_UNDEF || b->k == V_UNDEF) fail(&c->f, "line %d: '%s' on an undefined value", line, op);
    if (!strcmp(op, "+")) {
        if (a->k == V_STR && b->k == V_STR) return concat_str(c, a, b);
        if ((a->k == V_LIST || a->k == V_TUPLE) && a->k == b->k) {
            vlist *l = list_new(c, a->u.l->n + b->u.l->n);
            for (int i = 0; i < a->u.l->n; i++) list_push(c, l, a->u.l->v[i]);
            for (int i = 0; i < b->u.l->n; i++) list_push(c, l, b->u.l->v[i]);
            return v_list(l, a->k == V_TUPLE);
        }
    }
    if (!strcmp(op, "*") && ((a->k == V_STR && b->k == V_INT) || (a->k == V_INT && b->k == V_STR))) {
        const value *s = a->k == V_STR ? a : b;
        long long k = a->k == V_INT ? a->u.i : b->u.i;
        sbuf sb = {.c = c};
        for (long long i = 0; i < k; i++) { tick(c); sb_put(&sb, s->u.s.p, s->u.s.n); }
        return v_str(sb.p ? sb.p : "", sb.n);
    }
    if (!is_num(a) || !is_num(b))
        fail(&c->f, "line %d: unsupported operand types for %s: '%s' and '%s'", line, op, kind_name(a->k),
             kind_name(b->k));
    int ints = a->k != V_FLOAT && b->k != V_FLOAT;
    double x = num(a), y = num(b);
    /* Integers stay integers (not via double: 2^63 - 1 is no double); a result
     * past 64 bits, which Python would make a big integer, is an error. */
    long long i = !ints ? 0 : a->k == V_INT ? a->u.i : a->u.b, j = !ints ? 0 : b->k == V_INT ? b->u.i : b->u.b, r;
    int over = 0;
    if (!strcmp(op, "+")) {
        if (!ints) return v_float(x + y);
        over = __builtin_add_overflow(i, j, &r);
    } else if (!strcmp(op, "-")) {
        if (!ints) return v_float(x - y);
        over = __builtin_sub_overflow(i, j, &r);
    } else if (!strcmp(op, "*")) {
        if (!ints) return v_float(x * y);
        over = __builtin_mul_overflow(i, j, &r);
    } else if (!strcmp(op, "**") && ints && j >= 0) {
        if (i == 0 || i == 1) r = j == 0 ? 1 : i;
        else if (i == -1) r = j % 2 ? -1 : 1;
        else for (long long k = (r = 1, 0); k < j && !over; k++) over = __builtin_mul_overflow(r, i, &r);   /* |i| >= 2: overflows within 64 */
    } else if (!strcmp(op, "**")) {
        return v_float(pow(x, y));
    } else {
        goto divide;
    }
    if (over) fail(&c->f, "line %d: integer result of %s does not fit in 64 bits", line, op);
    return v_int(r);
divide:
    if (y == 0) fail(&c->f, "line %d: division by zero", line);
    if (ints && i == LLONG_MIN && j == -1) fail(&c->f, "line %d: integer result of %s does not fit in 64 bits", line, op);
    if (!strcmp(op, "/")) return v_float(x / y);
    if (!strcmp(op, "//")) {
        if (ints) { long long q = i / j; if ((i % j != 0) && ((i < 0) != (j < 0))) q--; return v_int(q); }
        return v_float(floor(x / y));
    }
    /* % with Python's sign rule */
    if (ints) { r = i % j; if (r != 0 && ((r < 0) != (j < 0))) r += j; return v_int(r); }
    double fr = fmod(x, y);
    if (fr != 0 && ((fr < 0) != (y < 0))) fr += y;
    return v_float(fr);
}

/* Keyword argument by name, or the positional one at pos, or NULL. */
typedef struct { value *pos; int n_pos; const char **kw_names; value *kw; int n_kw; } argv_t;

static value *arg(argv_t *a, int pos, const char *name)
{
    for (int i = 0; i < a->n_kw; i++)
        if (!strcmp(a->kw_names[i], name)) return &a->kw[i];
    return pos >= 0 && pos < a->n_pos ? &a->pos[pos] : NULL;
}

static argv_t eval_args(rctx *c, const node *n, const value *first)
{
    argv_t a = {0};
    int extra = first != NULL;
    a.n_pos = n->n_args + extra;
    a.pos = alloc(&c->f, (size_t)(a.n_pos + 1) * sizeof *a.pos);
    if (first) a.pos[0] = *first;
    for (int i = 0; i < n->n_args; i++) a.pos[i + extra] = eval(c, n->args[i]);
    a.n_kw = n->n_kw;
    a.kw_names = n->kw_names;
    a.kw = alloc(&c->f, (size_t)(a.n_kw + 1) * sizeof *a.kw);
    for (int i = 0; i < n->n_kw; i++) a.kw[i] = eval(c, n->kw[i]);
    return a;
}

static int is_space_char(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

static value strip(rctx *c, const value *s, const value *chars, int left, int right)
{
    if (s->k != V_STR) fail(&c->f, "strip() of a %s", kind_name(s->k));
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    int use_chars = chars && chars->k == V_STR;
#define STRIPPABLE(ch) (use_chars ? memchr(chars->u.s.p, (ch), chars->u.s.n) != NULL : is_space_char(ch))
    if (left) while (n && STRIPPABLE(*p)) { p++; n--; }
    if (right) while (n && STRIPPABLE(p[n - 1])) n--;
#undef STRIPPABLE
    return v_str(p, n);
}

static value split(rctx *c, const value *s, const value *sep, const value *maxsplit)
{
    vlist *l = list_new(c, 8);
    long long max = maxsplit && maxsplit->k == V_INT ? maxsplit->u.i : -1;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (!sep || sep->k == V_NONE || sep->k == V_UNDEF) {
        size_t i = 0;
        while (i < n) {
            while (i < n && is_space_char(p[i])) i++;
            if (i >= n) break;
            if (max >= 0 && l->n == max) {
                size_t e = n;
                while (e > i && is_space_char(p[e - 1])) e--;
                list_push(c, l, v_str(p + i, e - i));
                break;
            }
            size_t j = i;
            while (j < n && !is_space_char(p[j])) j++;
            list_push(c, l, v_str(p + i, j - i));
            i = j;
        }
        return v_list(l, 0);
    }
    if (sep->k != V_STR || !sep->u.s.n) fail(&c->f, "split(): empty or non-string separator");
    size_t start = 0;
    for (size_t i = 0; i + sep->u.s.n <= n;) {
        if ((max < 0 || l->n < max) && !memcmp(p + i, sep->u.s.p, sep->u.s.n)) {
            list_push(c, l, v_str(p + start, i - start));
            i += sep->u.s.n;
            start = i;
        } else {
            i++;
        }
    }
    list_push(c, l, v_str(p + start, n - start));
    return v_list(l, 0);
}

static value replace(rctx *c, const value *s, const value *old, const value *new_, const value *count)
{
    if (s->k != V_STR || !old || old->k != V_STR || !new_ || new_->k != V_STR)
        fail(&c->f, "replace() takes strings");
    long long max = count && count->k == V_INT ? count->u.i : -1, done = 0;
    sbuf b = {.c = c};
    size_t i = 0;
    if (!old->u.s.n) {   /* Python inserts the replacement between every character */
        for (; i <= s->u.s.n; i++) {
            if (max < 0 || done < max) { sb_put(&b, new_->u.s.p, new_->u.s.n); done++; }
            if (i < s->u.s.n) sb_put(&b, s->u.s.p + i, 1);
        }
        return v_str(b.p ? b.p : "", b.n);
    }
    while (i < s->u.s.n) {
        if ((max < 0 || done < max) && i + old->u.s.n <= s->u.s.n && !memcmp(s->u.s.p + i, old->u.s.p, old->u.s.n)) {
            sb_put(&b, new_->u.s.p, new_->u.s.n);
            i += old->u.s.n;
            done++;
        } else {
            sb_put(&b, s->u.s.p + i++, 1);
        }
    }
    return v_str(b.p ? b.p : "", b.n);
}

static value change_case(rctx *c, const value *s, int mode)   /* 0 upper, 1 lower, 2 title, 3 capitalize */
{
    if (s->k != V_STR) fail(&c->f, "case conversion of a %s", kind_name(s->k));
    char *p = dupn(&c->f, s->u.s.p, s->u.s.n);
    int prev_alpha = 0;
    for (size_t i = 0; i < s->u.s.n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch >= 0x80) { prev_alpha = 1; continue; }   /* ASCII only */
        if (mode == 0) p[i] = (char)toupper(ch);
        else if (mode == 1) p[i] = (char)tolower(ch);
        else if (mode == 2) p[i] = (char)(prev_alpha ? tolower(ch) : toupper(ch));
        else p[i] = (char)(i == 0 ? toupper(ch) : tolower(ch));
        prev_alpha = isalpha(ch) != 0;
    }
    return v_str(p, s->u.s.n);
}

static int affix(const value *s, const value *x, int end)
{
    if (x->k != V_STR || x->u.s.n > s->u.s.n) return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - x->u.s.n : 0), x->u.s.p, x->u.s.n);
}

static value join(rctx *c, const value *seq, const value *sep, const value *attribute)
{
    vlist *l = iter_items(c, seq, 0);
    sbuf b = {.c = c};
    value s = sep ? to_str(c, sep) : v_str("", 0);
    for (int i = 0; i < l->n; i++) {
        if (i) sb_put(&b, s.u.s.p, s.u.s.n);
        value item = l->v[i];
        if (attribute && attribute->k == V_STR) item = get_item(c, &item, attribute, 0);
        value t = to_str(c, &item);
        sb_put(&b, t.u.s.p, t.u.s.n);
    }
    return v_str(b.p ? b.p : "", b.n);
}

static value call_func(rctx *c, const value *fn, argv_t *a, int line)
{
    tick(c);
    value *self = fn->u.fn.self;
    value *a0 = arg(a, 0, "\x01"), *a1 = arg(a, 1, "\x01"), *a2 = arg(a, 2, "\x01");
    switch (fn->u.fn.id) {
    case F_RANGE: {
        long long lo = 0, hi, st = 1;
        if (a->n_pos == 1) hi = as_int(c, a0, "range()");
        else if (a->n_pos >= 2) { lo = as_int(c, a0, "range()"); hi = as_int(c, a1, "range()"); if (a2) st = as_int(c, a2, "range()"); }
        else fail(&c->f, "line %d: range() needs an argument", line);
        if (st == 0) fail(&c->f, "line %d: range() step must not be zero", line);
        vlist *l = list_new(c, 8);
        /* the step past the last item may leave long long (range(2**63 - 2, 2**63 - 1, 2)) */
        for (long long i = lo; st > 0 ? i < hi : i > hi;) {
            tick(c);
            list_push(c, l, v_int(i));
            if (__builtin_add_overflow(i, st, &i)) break;
        }
        return v_list(l, 0);
    }
    case F_NAMESPACE: case F_DICT: {
        vdict *d = dict_new(c);
        if (a->n_pos && (a0->k == V_DICT || a0->k == V_NS))
            for (int i = 0; i < a0->u.d->n; i++) dict_set(c, d, a0->u.d->k[i], a0->u.d->v[i]);
        for (int i = 0; i < a->n_kw; i++) dict_set_str(c, d, a->kw_names[i], a->kw[i]);
        return v_dict(d, fn->u.fn.id == F_NAMESPACE);
    }
    case F_RAISE: {
        value m = a0 ? to_str(c, a0) : v_str("", 0);
        c->f.raised = 1;
        /* An empty message (or one that starts with a NUL) would reach the
         * client as an error without a reason: name the call instead. */
        if (!m.u.s.n || !m.u.s.p[0]) fail(&c->f, "line %d: the template called raise_exception() without a message", line);
        fail(&c->f, "%.*s", (int)m.u.s.n, m.u.s.p);
    }
    case F_STRFTIME: {
        if (!a0 || a0->k != V_STR) fail(&c->f, "line %d: strftime_now() takes a format string", line);
        char fmt[256], out[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)a0->u.s.n, a0->u.s.p);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(out, sizeof out, fmt, &tm);
        return v_strdup(c, out, n);
    }
    case M_STRIP: return strip(c, self, a0, 1, 1);
    case M_LSTRIP: return strip(c, self, a0, 1, 0);
    case M_RSTRIP: return strip(c, self, a0, 0, 1);
    case M_SPLIT: return split(c, self, arg(a, 0, "sep"), arg(a, 1, "maxsplit"));
    case M_SPLITLINES: {
        vlist *l = list_new(c, 8);
        size_t st = 0;
        for (size_t i = 0; i < self->u.s.n; i++)
            if (self->u.s.p[i] == '\n') { list_push(c, l, v_str(self->u.s.p + st, i - st)); st = i + 1; }
        if (st < self->u.s.n) list_push(c, l, v_str(self->u.s.p + st, self->u.s.n - st));
        return v_list(l, 0);
    }
    case M_STARTSWITH: case M_ENDSWITH: {
        if (!a0) fail(&c->f, "line %d: startswith()/endswith() need an argument", line);
        int end = fn->u.fn.id == M_ENDSWITH;
        if (a0->k == V_TUPLE || a0->k == V_LIST) {
            for (int i = 0; i < a0->u.l->n; i++)
                if (affix(self, &a0->u.l->v[i], end)) return v_bool(1);
            return v_bool(0);
        }
        return v_bool(affix(self, a0, end));
    }
    case M_UPPER: return change_case(c, self, 0);
    case M_LOWER: return change_case(c, self, 1);
    case M_TITLE: return change_case(c, self, 2);
    case M_CAPITALIZE: return change_case(c, self, 3);
    case M_REPLACE: return replace(c, self, a0, a1, a2);
    case M_FIND: case M_COUNT: {
        if (!a0 || a0->k != V_STR) fail(&c->f, "line %d: find()/count() take a string", line);
        long long found = -1, count = 0;
        for (size_t i = 0; i + a0->u.s.n <= self->u.s.n;) {
            if (!memcmp(self->u.s.p + i, a0->u.s.p, a0->u.s.n)) {
                if (found < 0) found = (long long)i;
                count++;
                i += a0->u.s.n ? a0->u.s.n : 1;
            } else {
                i++;
            }
        }
        return v_int(fn->u.fn.id == M_FIND ? found : count);
    }
    case M_JOIN: return a0 ? join(c, a0, self, NULL) : v_str("", 0);
    case M_ITEMS: case M_KEYS: case M_VALUES: {
        vlist *l = list_new(c, self->u.d->n);
        for (int i = 0; i < self->u.d->n; i++) {
            if (fn->u.fn.id == M_KEYS) list_push(c, l, self->u.d->k[i]);
            else if (fn->u.fn.id == M_VALUES) list_push(c, l, self->u.d->v[i]);
            else {
                vlist *pair = list_new(c, 2);
                list_push(c, pair, self->u.d->k[i]);
                list_push(c, pair, self->u.d->v[i]);
                list_push(c, l, v_list(pair, 1));
            }
        }
        return v_list(l, 0);
    }
    case M_GET: {
        if (!a0) fail(&c->f, "line %d: get() needs a key", line);
        value *v = dict_find(self->u.d, a0);
        return v ? *v : a1 ? *a1 : v_none();
    }
    default: fail(&c->f, "line %d: not callable", line);
    }
}

static value apply_filter(rctx *c, const char *name, argv_t *a, int line);
static int apply_test(rctx *c, const char *name, const value *v, argv_t *a, int line);

static value length_of(rctx *c, const value *v, int line)
{
    switch (v->k) {
    case V_UNDEF: return v_int(0);
    case V_STR: {
        long long n = 0;   /* code points, as Python counts */
        for (size_t i = 0; i < v->u.s.n; i++) n += ((unsigned char)v->u.s.p[i] & 0xC0) != 0x80;
        return v_int(n);
    }
    case V_LIST: case V_TUPLE: return v_int(v->u.l->n);
    case V_DICT: case V_NS: return v_int(v->u.d->n);
    default: fail(&c->f, "line %d: object of type '%s' has no len()", line, kind_name(v->k));
    }
}

/* selectattr / rejectattr / select / reject */
static value select_items(rctx *c, argv_t *a, int by_attr, int keep, int line)
{
    vlist *src = iter_items(c, &a->pos[0], line), *out = list_new(c, src->n);
    value *attr = by_attr ? arg(a, 1, "\x01") : NULL;
    int test_pos = by_attr ? 2 : 1;
    value *test = arg(a, test_pos, "\x01");
    for (int i = 0; i < src->n; i++) {
        value item = src->v[i];
        if (attr) {
            value nm = to_str(c, attr);
            item = get_item(c, &item, &nm, line);
        }
        int ok;
        if (test && test->k == V_STR) {
            char tname[64];
            snprintf(tname, sizeof tname, "%.*s", (int)test->u.s.n, test->u.s.p);
            argv_t ta = {.pos = a->pos + test_pos + 1, .n_pos = a->n_pos - test_pos - 1 > 0 ? a->n_pos - test_pos - 1 : 0};
            ok = apply_test(c, tname, &item, &ta, line);
        } else {
            ok = truthy(&item);
        }
        if (ok == keep) list_push(c, out, src->v[i]);
    }
    return v_list(out, 0);
}

static value apply_filter(rctx *c, const char *name, argv_t *a, int line)
{
    tick(c);
    value *v = &a->pos[0];
    if (!strcmp(name, "trim")) return strip(c, v->k == V_STR ? v : (value[]){to_str(c, v)}, arg(a, 1, "chars"), 1, 1);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return length_of(c, v, line);
    if (!strcmp(name, "upper")) return change_case(c, (value[]){to_str(c, v)}, 0);
    if (!strcmp(name, "lower")) return change_case(c, (value[]){to_str(c, v)}, 1);
    if (!strcmp(name, "title")) return change_case(c, (value[]){to_str(c, v)}, 2);
    if (!strcmp(name, "capitalize")) return change_case(c, (value[]){to_str(c, v)}, 3);
    if (!strcmp(name, "string")) return to_str(c, v);
    if (!strcmp(name, "safe") || !strcmp(name, "escape") || !strcmp(name, "e")) {
        if (name[0] == 's') return *v;
        value s = to_str(c, v);
        sbuf b = {.c = c};
        for (size_t i = 0; i < s.u.s.n; i++) {
            char ch = s.u.s.p[i];
            const char *rep = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;"
                            : ch == '\'' ? "&#39;" : NULL;
            if (rep) sb_puts(&b, rep); else sb_put(&b, &ch, 1);
        }
        return v_str(b.p ? b.p : "", b.n);
    }
    if (!strcmp(name, "tojson")) {
        value *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"), *sk = arg(a, 4, "sort_keys");
        json_opts o = {.indent = ind && ind->k == V_INT ? (int)ind->u.i : -1, .sort_keys = sk && truthy(sk)};
        if (o.indent > 64) o.indent = 64;
        o.item_sep = o.indent >= 0 ? "," : ", ";
        o.key_sep = ": ";
        if (sep && (sep->k == V_TUPLE || sep->k == V_LIST) && sep->u.l->n == 2 && sep->u.l->v[0].k == V_STR &&
            sep->u.l->v[1].k == V_STR) {
            o.item_sep = dupn(&c->f, sep->u.l->v[0].u.s.p, sep->u.l->v[0].u.s.n);
            o.key_sep = dupn(&c->f, sep->u.l->v[1].u.s.p, sep->u.l->v[1].u.s.n);
        }
        sbuf b = {.c = c};
        put_json(&b, v, &o, 0);
        return v_str(b.p ? b.p : "", b.n);
    }
    if (!strcmp(name, "list")) {
        vlist *src = iter_items(c, v, line), *l = list_new(c, src->n);
        for (int i = 0; i < src->n; i++) list_push(c, l, src->v[i]);
        return v_list(l, 0);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        vlist *src = iter_items(c, v, line);
        if (!src->n) return UNDEF;
        return src->v[name[0] == 'f' ? 0 : src->n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v->k == V_STR) {
            char *p = alloc(&c->f, v->u.s.n + 1);
            for (size_t i = 0; i < v->u.s.n; i++) p[i] = v->u.s.p[v->u.s.n - 1 - i];
            return v_str(p, v->u.s.n);
        }
        vlist *src = iter_items(c, v, line), *l = list_new(c, src->n);
        for (int i = src->n - 1; i >= 0; i--) list_push(c, l, src->v[i]);
        return v_list(l, 0);
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        value *dflt = arg(a, 1, "default_value"), *boolean = arg(a, 2, "boolean");
        int use = v->k == V_UNDEF || (boolean && truthy(boolean) && !truthy(v));
        return use ? (dflt ? *dflt : v_str("", 0)) : *v;
    }
    if (!strcmp(name, "join")) return join(c, v, arg(a, 1, "d"), arg(a, 2, "attribute"));
    if (!strcmp(name, "replace")) {
        value s = to_str(c, v);
        return replace(c, &s, arg(a, 1, "old"), arg(a, 2, "new"), arg(a, 3, "count"));
    }
    if (!strcmp(name, "int")) {
        if (v->k == V_INT) return *v;
        if (v->k == V_FLOAT) return v_int((long long)v->u.f);
        if (v->k == V_BOOL) return v_int(v->u.b);
        if (v->k == V_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v->u.s.n < 63 ? v->u.s.n : 63), v->u.s.p);
            char *end;
            long long x = strtoll(buf, &end, 10);
            if (*end == '\0' && end != buf) return v_int(x);
            double d = strtod(buf, &end);
            if (*end == '\0' && end != buf) return v_int((long long)d);
        }
        value *dflt = arg(a, 1, "default");
        return dflt ? *dflt : v_int(0);
    }
    if (!strcmp(name, "float")) {
        if (is_num(v)) return v_float(num(v));
        if (v->k == V_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v->u.s.n < 63 ? v->u.s.n : 63), v->u.s.p);
            char *end;
            double d = strtod(buf, &end);
            if (*end == '\0' && end != buf) return v_float(d);
        }
        value *dflt = arg(a, 1, "default");
        return dflt ? *dflt : v_float(0);
    }
    if (!strcmp(name, "abs")) {
        if (v->k == V_INT) return v_int(v->u.i < 0 ? -v->u.i : v->u.i);
        if (v->k == V_FLOAT) return v_float(fabs(v->u.f));
        fail(&c->f, "line %d: abs() of a %s", line, kind_name(v->k));
    }
    if (!strcmp(name, "items")) {
        if (v->k == V_UNDEF) return v_list(list_new(c, 1), 0);
        if (v->k != V_DICT && v->k != V_NS) fail(&c->f, "line %d: items of a %s", line, kind_name(v->k));
        value fn = v_func(c, M_ITEMS, v);
        argv_t none = {0};
        return call_func(c, &fn, &none, line);
    }
    if (!strcmp(name, "unique")) {
        vlist *src = iter_items(c, v, line), *l = list_new(c, src->n);
        for (int i = 0; i < src->n; i++) {
            int seen = 0;
            for (int j = 0; j < l->n && !seen; j++) seen = v_equal(&l->v[j], &src->v[i]);
            if (!seen) list_push(c, l, src->v[i]);
        }
        return v_list(l, 0);
    }
    if (!strcmp(name, "selectattr")) return select_items(c, a, 1, 1, line);
    if (!strcmp(name, "rejectattr")) return select_items(c, a, 1, 0, line);
    if (!strcmp(name, "select")) return select_items(c, a, 0, 1, line);
    if (!strcmp(name, "reject")) return select_items(c, a, 0, 0, line);
    if (!strcmp(name, "map")) {
        vlist *src = iter_items(c, v, line), *l = list_new(c, src->n);
        value *attr = arg(a, -1, "attribute");
        value *fname = a->n_pos > 1 ? &a->pos[1] : NULL;
        for (int i = 0; i < src->n; i++) {
            if (attr) {
                value nm = to_str(c, attr), item = get_item(c, &src->v[i], &nm, line);
                value *dflt = arg(a, -1, "default");
                list_push(c, l, item.k == V_UNDEF && dflt ? *dflt : item);
            } else if (fname && fname->k == V_STR) {
                char fn[64];
                snprintf(fn, sizeof fn, "%.*s", (int)fname->u.s.n, fname->u.s.p);
                argv_t fa = {.pos = alloc(&c->f, (size_t)(a->n_pos) * sizeof(value)), .n_pos = a->n_pos - 1};
                fa.pos[0] = src->v[i];
                for (int k = 2; k < a->n_pos; k++) fa.pos[k - 1] = a->pos[k];
                list_push(c, l, apply_filter(c, fn, &fa, line));
            } else {
                fail(&c->f, "line %d: map() needs a filter name or attribute=", line);
            }
        }
        return v_list(l, 0);
    }
    if (!strcmp(name, "indent")) {
        value s = to_str(c, v), *w = arg(a, 1, "width"), *first = arg(a, 2, "first"), *blank = arg(a, 3, "blank");
        value pad = w && w->k == V_STR ? *w : v_str("    ", w && w->k == V_INT ? (size_t)(w->u.i < 0 ? 0 : w->u.i > 64 ? 64 : w->u.i) : 4);
        if (w && w->k == V_INT) { char *p = alloc(&c->f, pad.u.s.n + 1); memset(p, ' ', pad.u.s.n); pad.u.s.p = p; }
        sbuf b = {.c = c};
        int at_line_start = first && truthy(first);
        for (size_t i = 0; i < s.u.s.n; i++) {
            if (at_line_start) {
                int empty = s.u.s.p[i] == '\n';
                if (!empty || (blank && truthy(blank))) sb_put(&b, pad.u.s.p, pad.u.s.n);
                at_line_start = 0;
            }
            sb_put(&b, s.u.s.p + i, 1);
            if (s.u.s.p[i] == '\n') at_line_start = 1;
        }
        return v_str(b.p ? b.p : "", b.n);
    }
    fail(&c->f, "line %d: filter '%s' is not supported by this server's Jinja subset", line, name);
}

static int apply_test(rctx *c, const char *name, const value *v, argv_t *a, int line)
{
    value *x = a->n_pos > 0 ? &a->pos[0] : NULL;
    if (!strcmp(name, "defined")) return v->k != V_UNDEF;
    if (!strcmp(name, "undefined")) return v->k == V_UNDEF;
    if (!strcmp(name, "none")) return v->k == V_NONE;
    if (!strcmp(name, "boolean")) return v->k == V_BOOL;
    if (!strcmp(name, "true")) return v->k == V_BOOL && v->u.b;
    if (!strcmp(name, "false")) return v->k == V_BOOL && !v->u.b;
    if (!strcmp(name, "integer")) return v->k == V_INT;
    if (!strcmp(name, "float")) return v->k == V_FLOAT;
    if (!strcmp(name, "number")) return is_num(v);
    if (!strcmp(name, "string")) return v->k == V_STR;
    if (!strcmp(name, "mapping")) return v->k == V_DICT || v->k == V_NS;
    if (!strcmp(name, "iterable")) return v->k == V_STR || v->k == V_LIST || v->k == V_TUPLE || v->k == V_DICT || v->k == V_NS;
    if (!strcmp(name, "sequence")) return v->k == V_STR || v->k == V_LIST || v->k == V_TUPLE || v->k == V_DICT || v->k == V_NS;
    if (!strcmp(name, "callable")) return v->k == V_FUNC;
    if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        long long i = as_int(c, v, "the operand of 'odd'/'even'");
        return (i % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "divisibleby")) {
        if (!x) fail(&c->f, "line %d: divisibleby needs an argument", line);
        long long d = as_int(c, x, "divisibleby()");
        if (!d) fail(&c->f, "line %d: division by zero", line);
        return as_int(c, v, "divisibleby()") % d == 0;
    }
    static const char *const binary[] = {"eq", "equalto", "==", "ne", "!=", "in", "sameas",
                                         "lt", "<", "gt", ">", "le", "<=", "ge", ">="};
    for (size_t i = 0; !x && i < sizeof binary / sizeof binary[0]; i++)
        if (!strcmp(name, binary[i])) fail(&c->f, "line %d: test '%s' needs an argument", line, name);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return v_equal(v, x);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !v_equal(v, x);
    if (!strcmp(name, "sameas")) return v_equal(v, x) && v->k == x->k;
    if (!strcmp(name, "in")) return contains(c, x, v, line);
    if (!strcmp(name, "lt") || !strcmp(name, "<")) return cmp_values(c, v, x) < 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">")) return cmp_values(c, v, x) > 0;
    if (!strcmp(name, "le") || !strcmp(name, "<=")) return cmp_values(c, v, x) <= 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return cmp_values(c, v, x) >= 0;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->k != V_STR) return 0;
        for (size_t i = 0; i < v->u.s.n; i++)
            if (name[0] == 'l' ? isupper((unsigned char)v->u.s.p[i]) : islower((unsigned char)v->u.s.p[i])) return 0;
        return 1;
    }
    fail(&c->f, "line %d: test '%s' is not supported by this server's Jinja subset", line, name);
}

static value eval(rctx *c, const node *n)
{
    if (++c->depth > MAX_DEPTH) fail(&c->f, "line %d: expression nested too deeply", n->line);
    value r;
    switch (n->kind) {
    case N_CONST_STR: r = v_str(n->s, n->n); break;
    case N_CONST_INT: r = v_int(n->i); break;
    case N_CONST_FLOAT: r = v_float(n->f); break;
    case N_CONST_BOOL: r = v_bool((int)n->i); break;
    case N_CONST_NONE: r = v_none(); break;
    case N_NAME: r = lookup(c, n->s, n->n); break;
    case N_ATTR: { value o = eval(c, n->a); r = get_attr(c, &o, n->s, n->n, n->line); break; }
    case N_ITEM: { value o = eval(c, n->a), k = eval(c, n->b); r = get_item(c, &o, &k, n->line); break; }
    case N_SLICE: {
        value o = eval(c, n->a);
        value lo = n->b ? eval(c, n->b) : v_none(), hi = n->args[0] ? eval(c, n->args[0]) : v_none(),
              st = n->args[1] ? eval(c, n->args[1]) : v_none();
        r = do_slice(c, &o, &lo, &hi, &st, n->line);
        break;
    }
    case N_CALL: {
        value fn = eval(c, n->a);
        if (fn.k != V_FUNC) {
            if (fn.k == V_UNDEF) fail(&c->f, "line %d: call of an undefined function", n->line);
            fail(&c->f, "line %d: '%s' object is not callable", n->line, kind_name(fn.k));
        }
        argv_t a = eval_args(c, n, NULL);
        r = call_func(c, &fn, &a, n->line);
        break;
    }
    case N_FILTER: {
        value v = eval(c, n->a);
        argv_t a = eval_args(c, n, &v);
        r = apply_filter(c, n->s, &a, n->line);
        break;
    }
    case N_TEST: {
        value v = eval(c, n->a);
        argv_t a = eval_args(c, n, NULL);
        int t = apply_test(c, n->s, &v, &a, n->line);
        r = v_bool(n->negate ? !t : t);
        break;
    }
    case N_BINOP: {
        value a = eval(c, n->a), b = eval(c, n->b);
        const char *op = n->s;
        if (!strcmp(op, "==")) r = v_bool(v_equal(&a, &b));
        else if (!strcmp(op, "!=")) r = v_bool(!v_equal(&a, &b));
        else if (!strcmp(op, "<")) r = v_bool(cmp_values(c, &a, &b) < 0);
        else if (!strcmp(op, ">")) r = v_bool(cmp_values(c, &a, &b) > 0);
        else if (!strcmp(op, "<=")) r = v_bool(cmp_values(c, &a, &b) <= 0);
        else if (!strcmp(op, ">=")) r = v_bool(cmp_values(c, &a, &b) >= 0);
        else if (!strcmp(op, "in")) r = v_bool(contains(c, &b, &a, n->line));
        else if (!strcmp(op, "not in")) r = v_bool(!contains(c, &b, &a, n->line));
        else if (!strcmp(op, "~")) r = concat_str(c, &a, &b);
        else r = arith(c, op, &a, &b, n->line);
        break;
    }
    case N_NOT: { value a = eval(c, n->a); r = v_bool(!truthy(&a)); break; }
    case N_NEG: case N_POS: {
        value a = eval(c, n->a);
        if (a.k == V_INT) r = v_int(n->kind == N_NEG ? -a.u.i : a.u.i);
        else if (a.k == V_FLOAT) r = v_float(n->kind == N_NEG ? -a.u.f : a.u.f);
        else if (a.k == V_BOOL) r = v_int(n->kind == N_NEG ? -a.u.b : a.u.b);
        else fail(&c->f, "line %d: bad operand type for unary %c: '%s'", n->line, n->kind == N_NEG ? '-' : '+',
                  kind_name(a.k));
        break;
    }
    case N_AND: { value a = eval(c, n->a); r = truthy(&a) ? eval(c, n->b) : a; break; }
    case N_OR: { value a = eval(c, n->a); r = truthy(&a) ? a : eval(c, n->b); break; }
    case N_COND: { value t = eval(c, n->a); r = truthy(&t) ? eval(c, n->b) : n->c ? eval(c, n->c) : UNDEF; break; }
    case N_LIST: case N_TUPLE: {
        vlist *l = list_new(c, n->n_args);
        for (int i = 0; i < n->n_args; i++) list_push(c, l, eval(c, n->args[i]));
        r = v_list(l, n->kind == N_TUPLE);
        break;
    }
    case N_DICT: {
        vdict *d = dict_new(c);
        for (int i = 0; i < n->n_args; i++) dict_set(c, d, eval(c, n->args[i]), eval(c, n->kw[i]));
        r = v_dict(d, 0);
        break;
    }
    default: fail(&c->f, "line %d: internal error: bad expression node", n->line);
    }
    c->depth--;
    return r;
}

static void exec_body(rctx *c, node *const *body, int n);

static void output(rctx *c, const value *v)
{
    if (v->k == V_STR) { emit(c, v->u.s.p, v->u.s.n); return; }
    value s = to_str(c, v);
    emit(c, s.u.s.p, s.u.s.n);
}

static void assign_targets(rctx *c, const char *const *targets, int n, const value *v, int unpack, int line)
{
    if (!unpack) { scope_set(c, targets[0], *v); return; }
    if ((v->k != V_LIST && v->k != V_TUPLE) || v->u.l->n != n)
        fail(&c->f, "line %d: cannot unpack into %d names", line, n);
    for (int i = 0; i < n; i++) scope_set(c, targets[i], v->u.l->v[i]);
}

static void exec_for(rctx *c, const node *n)
{
    value it = eval(c, n->a);
    vlist *src = iter_items(c, &it, n->line);
    /* the loop filter runs before loop.* is computed, as in Jinja2 */
    vlist *items = src;
    if (n->b) {
        items = list_new(c, src->n);
        for (int i = 0; i < src->n; i++) {
            scope fs = {.up = c->sc};
            c->sc = &fs;
            assign_targets(c, n->targets, n->n_targets, &src->v[i], n->n_targets > 1, n->line);
            value ok = eval(c, n->b);
            c->sc = fs.up;
            if (truthy(&ok)) list_push(c, items, src->v[i]);
        }
    }
    if (!items->n) {
        exec_body(c, n->orelse, n->n_orelse);
        return;
    }
    for (int i = 0; i < items->n; i++) {
        tick(c);
        scope s = {.up = c->sc};   /* each iteration starts afresh (Jinja2's scoping) */
        c->sc = &s;
        vdict *loop = dict_new(c);
        int len = items->n;
        dict_set_str(c, loop, "index", v_int(i + 1));
        dict_set_str(c, loop, "index0", v_int(i));
        dict_set_str(c, loop, "revindex", v_int(len - i));
        dict_set_str(c, loop, "revindex0", v_int(len - i - 1));
        dict_set_str(c, loop, "first", v_bool(i == 0));
        dict_set_str(c, loop, "last", v_bool(i == len - 1));
        dict_set_str(c, loop, "length", v_int(len));
        dict_set_str(c, loop, "depth", v_int(1));
        dict_set_str(c, loop, "depth0", v_int(0));
        dict_set_str(c, loop, "previtem", i > 0 ? items->v[i - 1] : UNDEF);
        dict_set_str(c, loop, "nextitem", i + 1 < len ? items->v[i + 1] : UNDEF);
        scope_set(c, "loop", v_dict(loop, 0));
        assign_targets(c, n->targets, n->n_targets, &items->v[i], n->n_targets > 1, n->line);
        exec_body(c, n->body, n->n_body);
        c->sc = s.up;
        if (c->loop_ctl == 1) { c->loop_ctl = 0; break; }
        c->loop_ctl = 0;
    }
}

static void exec_body(rctx *c, node *const *body, int nb)
{
    if (++c->depth > MAX_DEPTH) fail(&c->f, "blocks nested too deeply");
    for (int i = 0; i < nb && !c->loop_ctl; i++) {
        const node *n = body[i];
        switch (n->kind) {
        case N_TEXT: emit(c, n->s, n->n); break;
        case N_OUTPUT: { value v = eval(c, n->a); output(c, &v); break; }
        case N_IF: {
            value t = eval(c, n->a);
            if (truthy(&t)) exec_body(c, n->body, n->n_body);
            else exec_body(c, n->orelse, n->n_orelse);
            break;
        }
        case N_FOR: exec_for(c, n); break;
        case N_SET: {
            value v = eval(c, n->a);
            if (n->n_targets == 2 && !n->negate) {
                value ns = lookup(c, n->targets[0], strlen(n->targets[0]));
                if (ns.k != V_NS) fail(&c->f, "line %d: cannot assign an attribute of '%s' (not a namespace)", n->line,
                                       n->targets[0]);
                dict_set_str(c, ns.u.d, n->targets[1], v);
            } else {
                assign_targets(c, n->targets, n->n_targets, &v, n->negate, n->line);
            }
            break;
        }
        case N_SET_BLOCK: {
            size_t mark = c->len;
            exec_body(c, n->body, n->n_body);
            value v = v_strdup(c, c->out ? c->out + mark : "", c->len - mark);
            c->len = mark;
            if (c->out) c->out[c->len] = '\0';
            scope_set(c, n->targets[0], v);
            break;
        }
        case N_BREAK: c->loop_ctl = 1; break;
        case N_CONTINUE: c->loop_ctl = 2; break;
        default: fail(&c->f, "line %d: internal error: bad statement node", n->line);
        }
    }
    c->depth--;
}

int jinja_render(const jinja_template *t, const cJSON *vars, char **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    rctx *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); return -1; }
    c->f.err = err;
    c->f.errlen = errlen;
    c->f.a = &c->a;
    c->a.limit = MAX_RENDER_MEMORY;
    if (setjmp(c->f.jb)) {
        int rc = c->f.raised ? -2 : -1;
        free(c->out);
        arena_free(&c->a);
        free(c);
        return rc;
    }
    scope top = {0};
    c->sc = &top;
    const cJSON *it;
    cJSON_ArrayForEach(it, vars) scope_set(c, it->string, from_json(c, it));
    emit(c, "", 0);
    exec_body(c, t->body, t->n_body);
    *out = c->out;
    *out_len = c->len;
    arena_free(&c->a);
    free(c);
    return 0;
}

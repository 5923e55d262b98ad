/* dim.c - interning, canonical arithmetic, evaluation and printing of symbolic dims. */
#include "ir/dim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"

struct kiln_dimtab {
    kiln_arena arena;
    const kiln_expr **slots; /* open addressing */
    size_t cap, count;
    uint32_t next_id;
    const kiln_expr **syms; /* by sym_index */
    int n_syms, cap_syms;
    int n_fresh;
};

static const kiln_expr unknown_expr = {.kind = KILN_EXPR_UNKNOWN, .name = "?"};

kiln_dim kiln_dim_unknown(void) { return (kiln_dim){0, &unknown_expr}; }
bool kiln_dim_is_unknown(kiln_dim d) { return d.e && d.e->kind == KILN_EXPR_UNKNOWN; }

kiln_dimtab *kiln_dimtab_create(void)
{
    return calloc(1, sizeof(kiln_dimtab));
}

void kiln_dimtab_free(kiln_dimtab *t)
{
    if (!t) return;
    kiln_arena_release(&t->arena);
    free(t->slots);
    free(t->syms);
    free(t);
}

int kiln_dimtab_sym_count(const kiln_dimtab *t) { return t ? t->n_syms : 0; }
const kiln_expr *kiln_dimtab_sym(const kiln_dimtab *t, int i) { return t->syms[i]; }

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t dim_hash(kiln_dim d) { return d.e ? d.e->hash : mix(7, (uint64_t)d.c); }

static uint64_t expr_hash(const kiln_expr *x)
{
    uint64_t h = mix((uint64_t)x->kind, (uint64_t)x->c);
    if (x->name)
        for (const char *p = x->name; *p; p++) h = mix(h, (unsigned char)*p);
    for (int i = 0; i < x->n; i++) {
        h = mix(h, dim_hash(x->args[i]));
        if (x->coef) h = mix(h, (uint64_t)x->coef[i]);
    }
    return h;
}

static bool expr_same(const kiln_expr *a, const kiln_expr *b)
{
    if (a->kind != b->kind || a->c != b->c || a->n != b->n) return false;
    if ((a->name || b->name) && (!a->name || !b->name || strcmp(a->name, b->name))) return false;
    for (int i = 0; i < a->n; i++) {
        if (!kiln_dim_equal(a->args[i], b->args[i])) return false;
        if (a->coef && a->coef[i] != b->coef[i]) return false;
    }
    return true;
}

static bool grow(kiln_dimtab *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    const kiln_expr **slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < t->cap; i++) {
        const kiln_expr *x = t->slots[i];
        if (!x) continue;
        size_t j = x->hash & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = x;
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return true;
}

/* Interns a candidate expression (args/coef/name may point at temporaries). */
static kiln_dim intern(kiln_dimtab *t, const kiln_expr *cand)
{
    if (!t) return kiln_dim_unknown();
    kiln_expr x = *cand;
    x.hash = expr_hash(&x);
    if ((t->count + 1) * 2 > t->cap && !grow(t)) return kiln_dim_unknown();
    size_t j = x.hash & (t->cap - 1);
    while (t->slots[j]) {
        if (t->slots[j]->hash == x.hash && expr_same(t->slots[j], &x))
            return (kiln_dim){0, t->slots[j]};
        j = (j + 1) & (t->cap - 1);
    }
    kiln_expr *n = kiln_arena_alloc(&t->arena, sizeof *n);
    kiln_dim *args = x.n ? kiln_arena_calloc(&t->arena, (size_t)x.n, sizeof *args) : NULL;
    int64_t *coef = x.coef ? kiln_arena_calloc(&t->arena, (size_t)x.n, sizeof *coef) : NULL;
    char *name = x.name ? kiln_arena_strdup(&t->arena, x.name) : NULL;
    if (!n || (x.n && !args) || (x.coef && !coef) || (x.name && !name)) return kiln_dim_unknown();
    if (x.n) memcpy(args, x.args, (size_t)x.n * sizeof *args);
    if (coef) memcpy(coef, x.coef, (size_t)x.n * sizeof *coef);
    *n = x;
    n->args = args;
    n->coef = coef;
    n->name = name;
    n->id = t->next_id++;
    n->sym_index = -1;
    if (n->kind == KILN_EXPR_SYM) {
        if (t->n_syms == t->cap_syms) {
            int cap = t->cap_syms ? t->cap_syms * 2 : 16;
            const kiln_expr **s = realloc(t->syms, (size_t)cap * sizeof *s);
            if (!s) return kiln_dim_unknown();
            t->syms = s;
            t->cap_syms = cap;
        }
        n->sym_index = t->n_syms;
        t->syms[t->n_syms++] = n;
    }
    t->slots[j] = n;
    t->count++;
    return (kiln_dim){0, n};
}

kiln_dim kiln_dim_sym(kiln_dimtab *t, const char *name)
{
    if (!t) return kiln_dim_unknown();
    char buf[32];
    if (!name || !*name) {
        snprintf(buf, sizeof buf, "?%d", ++t->n_fresh);
        name = buf;
    }
    kiln_expr x = {.kind = KILN_EXPR_SYM, .name = name};
    return intern(t, &x);
}

kiln_dim kiln_dim_fresh(kiln_dimtab *t, const char *hint)
{
    if (!t) return kiln_dim_unknown();
    char buf[96];
    snprintf(buf, sizeof buf, "%s_%d", hint && *hint ? hint : "?", ++t->n_fresh);
    return kiln_dim_sym(t, buf);
}

/* ---- canonical polynomial arithmetic ---- */

#define LIN_MAX 32

typedef struct lin {
    int64_t c;
    int n;
    int64_t coef[LIN_MAX];
    const kiln_expr *term[LIN_MAX]; /* atoms or products; never SUM */
} lin;

static void to_lin(kiln_dim d, lin *l)
{
    l->n = 0;
    l->c = 0;
    if (!d.e) {
        l->c = d.c;
    } else if (d.e->kind == KILN_EXPR_SUM) {
        l->c = d.e->c;
        l->n = d.e->n;
        for (int i = 0; i < l->n; i++) {
            l->coef[i] = d.e->coef[i];
            l->term[i] = d.e->args[i].e;
        }
    } else {
        l->n = 1;
        l->coef[0] = 1;
        l->term[0] = d.e;
    }
}

static int cmp_term(const void *a, const void *b)
{
    const kiln_expr *x = *(const kiln_expr *const *)a, *y = *(const kiln_expr *const *)b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static kiln_dim from_lin(kiln_dimtab *t, lin *l)
{
    /* sort terms by id (insertion sort on the pair arrays), merge equal ones */
    for (int i = 1; i < l->n; i++)
        for (int j = i; j > 0 && l->term[j - 1]->id > l->term[j]->id; j--) {
            const kiln_expr *tt = l->term[j];
            l->term[j] = l->term[j - 1];
            l->term[j - 1] = tt;
            int64_t cc = l->coef[j];
            l->coef[j] = l->coef[j - 1];
            l->coef[j - 1] = cc;
        }
    int m = 0;
    for (int i = 0; i < l->n; i++) {
        if (m && l->term[m - 1] == l->term[i]) {
            if (__builtin_add_overflow(l->coef[m - 1], l->coef[i], &l->coef[m - 1]))
                return kiln_dim_unknown();
        } else {
            l->term[m] = l->term[i];
            l->coef[m++] = l->coef[i];
        }
    }
    int k = 0;
    for (int i = 0; i < m; i++)
        if (l->coef[i]) {
            l->term[k] = l->term[i];
            l->coef[k++] = l->coef[i];
        }
    l->n = k;
    if (k == 0) return kiln_dim_const(l->c);
    if (k == 1 && l->c == 0 && l->coef[0] == 1) return (kiln_dim){0, l->term[0]};
    kiln_dim args[LIN_MAX];
    for (int i = 0; i < k; i++) args[i] = (kiln_dim){0, l->term[i]};
    kiln_expr x = {.kind = KILN_EXPR_SUM, .c = l->c, .n = k, .args = args, .coef = l->coef};
    return intern(t, &x);
}

static bool any_unknown(kiln_dim a, kiln_dim b) { return kiln_dim_is_unknown(a) || kiln_dim_is_unknown(b); }

kiln_dim kiln_dim_add(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    if (any_unknown(a, b)) return kiln_dim_unknown();
    if (!a.e && !b.e) {
        int64_t r;
        return __builtin_add_overflow(a.c, b.c, &r) ? kiln_dim_unknown() : kiln_dim_const(r);
    }
    if (!t) return kiln_dim_unknown();
    lin x, y;
    to_lin(a, &x);
    to_lin(b, &y);
    if (x.n + y.n > LIN_MAX || __builtin_add_overflow(x.c, y.c, &x.c)) return kiln_dim_unknown();
    for (int i = 0; i < y.n; i++) {
        x.term[x.n] = y.term[i];
        x.coef[x.n++] = y.coef[i];
    }
    return from_lin(t, &x);
}

kiln_dim kiln_dim_sub(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    return kiln_dim_add(t, a, kiln_dim_mul(t, b, kiln_dim_const(-1)));
}

/* product of two non-constant, non-sum terms */
static const kiln_expr *mul_terms(kiln_dimtab *t, const kiln_expr *x, const kiln_expr *y)
{
    const kiln_expr *f[LIN_MAX];
    int n = 0;
    const kiln_expr *src[2] = {x, y};
    for (int s = 0; s < 2; s++) {
        if (src[s]->kind == KILN_EXPR_PROD) {
            for (int i = 0; i < src[s]->n; i++) {
                if (n == LIN_MAX) return NULL;
                f[n++] = src[s]->args[i].e;
            }
        } else {
            if (n == LIN_MAX) return NULL;
            f[n++] = src[s];
        }
    }
    qsort(f, (size_t)n, sizeof *f, cmp_term);
    kiln_dim args[LIN_MAX];
    for (int i = 0; i < n; i++) args[i] = (kiln_dim){0, f[i]};
    kiln_expr p = {.kind = KILN_EXPR_PROD, .n = n, .args = args};
    kiln_dim d = intern(t, &p);
    return kiln_dim_is_unknown(d) ? NULL : d.e;
}

kiln_dim kiln_dim_mul(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    if (any_unknown(a, b)) return kiln_dim_unknown();
    if (!a.e && !b.e) {
        int64_t r;
        return __builtin_mul_overflow(a.c, b.c, &r) ? kiln_dim_unknown() : kiln_dim_const(r);
    }
    if ((!a.e && a.c == 0) || (!b.e && b.c == 0)) return kiln_dim_const(0);
    if (!t) return kiln_dim_unknown();
    lin x, y, r = {0};
    to_lin(a, &x);
    to_lin(b, &y);
    /* (x.c + sum) * (y.c + sum) */
    if (__builtin_mul_overflow(x.c, y.c, &r.c)) return kiln_dim_unknown();
    for (int i = 0; i < x.n; i++) {
        if (r.n == LIN_MAX || __builtin_mul_overflow(x.coef[i], y.c, &r.coef[r.n])) return kiln_dim_unknown();
        r.term[r.n++] = x.term[i];
    }
    for (int j = 0; j < y.n; j++) {
        if (r.n == LIN_MAX || __builtin_mul_overflow(y.coef[j], x.c, &r.coef[r.n])) return kiln_dim_unknown();
        r.term[r.n++] = y.term[j];
    }
    for (int i = 0; i < x.n; i++)
        for (int j = 0; j < y.n; j++) {
            if (r.n == LIN_MAX) return kiln_dim_unknown();
            const kiln_expr *p = mul_terms(t, x.term[i], y.term[j]);
            if (!p || __builtin_mul_overflow(x.coef[i], y.coef[j], &r.coef[r.n])) return kiln_dim_unknown();
            r.term[r.n++] = p;
        }
    return from_lin(t, &r);
}

static int64_t floordiv64(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static int64_t mod64(int64_t a, int64_t b)
{
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

static kiln_dim binary(kiln_dimtab *t, kiln_expr_kind k, kiln_dim a, kiln_dim b)
{
    kiln_dim args[2] = {a, b};
    kiln_expr x = {.kind = k, .n = 2, .args = args};
    return intern(t, &x);
}

kiln_dim kiln_dim_floordiv(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    if (any_unknown(a, b) || (!b.e && b.c == 0)) return kiln_dim_unknown();
    if (!a.e && !b.e) {
        if (a.c == INT64_MIN && b.c == -1) return kiln_dim_unknown();
        return kiln_dim_const(floordiv64(a.c, b.c));
    }
    if (!b.e && b.c == 1) return a;
    if (!t) return kiln_dim_unknown();
    if (!b.e && b.c > 0) {
        lin x;
        to_lin(a, &x);
        bool exact = x.c % b.c == 0;
        for (int i = 0; i < x.n; i++) exact = exact && x.coef[i] % b.c == 0;
        if (exact) {
            x.c /= b.c;
            for (int i = 0; i < x.n; i++) x.coef[i] /= b.c;
            return from_lin(t, &x);
        }
    }
    if (kiln_dim_equal(a, b)) return kiln_dim_const(1);
    return binary(t, KILN_EXPR_FLOORDIV, a, b);
}

kiln_dim kiln_dim_ceildiv(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    /* ceil(a / b) = -floor(-a / b) */
    kiln_dim na = kiln_dim_mul(t, a, kiln_dim_const(-1));
    return kiln_dim_mul(t, kiln_dim_floordiv(t, na, b), kiln_dim_const(-1));
}

kiln_dim kiln_dim_mod(kiln_dimtab *t, kiln_dim a, kiln_dim b)
{
    if (any_unknown(a, b) || (!b.e && b.c == 0)) return kiln_dim_unknown();
    if (!a.e && !b.e) return kiln_dim_const(mod64(a.c, b.c));
    if (!b.e && (b.c == 1 || b.c == -1)) return kiln_dim_const(0);
    if (kiln_dim_equal(a, b)) return kiln_dim_const(0);
    if (!t) return kiln_dim_unknown();
    return binary(t, KILN_EXPR_MOD, a, b);
}

static kiln_dim minmax(kiln_dimtab *t, kiln_expr_kind k, kiln_dim a, kiln_dim b)
{
    if (any_unknown(a, b)) return kiln_dim_unknown();
    bool is_min = k == KILN_EXPR_MIN;
    if (!a.e && !b.e) return kiln_dim_const(is_min ? (a.c < b.c ? a.c : b.c) : (a.c > b.c ? a.c : b.c));
    if (kiln_dim_equal(a, b)) return a;
    if (!t) return kiln_dim_unknown();
    /* absorption: max(a, min(a, x)) = a and min(a, max(a, x)) = a */
    kiln_expr_kind dual = is_min ? KILN_EXPR_MAX : KILN_EXPR_MIN;
    for (int swap = 0; swap < 2; swap++) {
        kiln_dim p = swap ? b : a, q = swap ? a : b;
        if (q.e && q.e->kind == dual && (kiln_dim_equal(q.e->args[0], p) || kiln_dim_equal(q.e->args[1], p)))
            return p;
    }
    kiln_dim d = kiln_dim_sub(t, a, b);
    if (!d.e) return (d.c <= 0) == is_min ? a : b;
    /* canonical operand order */
    uint64_t ka = a.e ? (uint64_t)a.e->id + 1 : 0, kb = b.e ? (uint64_t)b.e->id + 1 : 0;
    if (ka > kb || (ka == kb && a.c > b.c)) {
        kiln_dim s = a;
        a = b;
        b = s;
    }
    return binary(t, k, a, b);
}

kiln_dim kiln_dim_min(kiln_dimtab *t, kiln_dim a, kiln_dim b) { return minmax(t, KILN_EXPR_MIN, a, b); }
kiln_dim kiln_dim_max(kiln_dimtab *t, kiln_dim a, kiln_dim b) { return minmax(t, KILN_EXPR_MAX, a, b); }

/* ---- evaluation and printing ---- */

bool kiln_dim_eval(kiln_dim d, const int64_t *syms, int n, int64_t *out)
{
    if (!d.e) {
        *out = d.c;
        return true;
    }
    const kiln_expr *x = d.e;
    int64_t a, b, r;
    switch (x->kind) {
    case KILN_EXPR_SYM:
        if (x->sym_index < 0 || x->sym_index >= n || syms[x->sym_index] < 0) return false;
        *out = syms[x->sym_index];
        return true;
    case KILN_EXPR_SUM:
        r = x->c;
        for (int i = 0; i < x->n; i++) {
            int64_t p;
            if (!kiln_dim_eval(x->args[i], syms, n, &a) || __builtin_mul_overflow(a, x->coef[i], &p) ||
                __builtin_add_overflow(r, p, &r))
                return false;
        }
        *out = r;
        return true;
    case KILN_EXPR_PROD:
        r = 1;
        for (int i = 0; i < x->n; i++)
            if (!kiln_dim_eval(x->args[i], syms, n, &a) || __builtin_mul_overflow(r, a, &r)) return false;
        *out = r;
        return true;
    case KILN_EXPR_UNKNOWN: return false;
    default: break;
    }
    if (!kiln_dim_eval(x->args[0], syms, n, &a) || !kiln_dim_eval(x->args[1], syms, n, &b)) return false;
    switch (x->kind) {
    case KILN_EXPR_FLOORDIV:
        if (b == 0 || (a == INT64_MIN && b == -1)) return false;
        *out = floordiv64(a, b);
        return true;
    case KILN_EXPR_MOD:
        if (b == 0) return false;
        *out = mod64(a, b);
        return true;
    case KILN_EXPR_MIN: *out = a < b ? a : b; return true;
    case KILN_EXPR_MAX: *out = a > b ? a : b; return true;
    default: return false;
    }
}

static size_t put(char *buf, size_t size, size_t at, const char *s)
{
    size_t len = strlen(s);
    if (at < size) {
        size_t room = size - at - 1;
        memcpy(buf + at, s, len < room ? len : room);
        buf[at + (len < room ? len : room)] = '\0';
    }
    return at + len;
}

static size_t print_rec(kiln_dim d, char *buf, size_t size, size_t at, bool paren)
{
    char tmp[32];
    if (!d.e) {
        snprintf(tmp, sizeof tmp, "%" PRId64, d.c);
        return put(buf, size, at, tmp);
    }
    const kiln_expr *x = d.e;
    switch (x->kind) {
    case KILN_EXPR_SYM:
    case KILN_EXPR_UNKNOWN: return put(buf, size, at, x->name);
    case KILN_EXPR_SUM:
        if (paren) at = put(buf, size, at, "(");
        for (int i = 0; i < x->n; i++) {
            int64_t c = x->coef[i];
            if (i) at = put(buf, size, at, c < 0 ? " - " : " + ");
            else if (c < 0) at = put(buf, size, at, "-");
            int64_t m = c < 0 ? -c : c;
            if (m != 1) {
                snprintf(tmp, sizeof tmp, "%" PRId64 "*", m);
                at = put(buf, size, at, tmp);
            }
            at = print_rec(x->args[i], buf, size, at, true);
        }
        if (x->c) {
            snprintf(tmp, sizeof tmp, " %c %" PRId64, x->c < 0 ? '-' : '+', x->c < 0 ? -x->c : x->c);
            at = put(buf, size, at, tmp);
        }
        if (paren) at = put(buf, size, at, ")");
        return at;
    case KILN_EXPR_PROD:
        for (int i = 0; i < x->n; i++) {
            if (i) at = put(buf, size, at, "*");
            at = print_rec(x->args[i], buf, size, at, true);
        }
        return at;
    case KILN_EXPR_FLOORDIV:
    case KILN_EXPR_MOD:
        if (paren) at = put(buf, size, at, "(");
        at = print_rec(x->args[0], buf, size, at, true);
        at = put(buf, size, at, x->kind == KILN_EXPR_FLOORDIV ? " // " : " % ");
        at = print_rec(x->args[1], buf, size, at, true);
        if (paren) at = put(buf, size, at, ")");
        return at;
    case KILN_EXPR_MIN:
    case KILN_EXPR_MAX:
        at = put(buf, size, at, x->kind == KILN_EXPR_MIN ? "min(" : "max(");
        at = print_rec(x->args[0], buf, size, at, false);
        at = put(buf, size, at, ", ");
        at = print_rec(x->args[1], buf, size, at, false);
        return put(buf, size, at, ")");
    }
    return at;
}

char *kiln_dim_print(kiln_dim d, char *buf, size_t size)
{
    if (!size) return buf;
    buf[0] = '\0';
    print_rec(d, buf, size, 0, false);
    return buf;
}

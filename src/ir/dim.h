/* dim.h - symbolic dimensions: a dim is a constant or an interned expression over named
 * symbols, kept in a canonical form (polynomials with sorted terms, folded constants) so that
 * equal dims compare equal by pointer. */
#ifndef KILN_IR_DIM_H
#define KILN_IR_DIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef struct kiln_expr kiln_expr;
typedef struct kiln_dimtab kiln_dimtab;

/* A dimension: constant `c` when e == NULL, else the expression e (c unused). */
typedef struct kiln_dim {
    int64_t c;
    const kiln_expr *e;
} kiln_dim;

typedef enum kiln_expr_kind {
    KILN_EXPR_SYM,      /* named symbol */
    KILN_EXPR_SUM,      /* c + sum(coef[i] * arg[i]) */
    KILN_EXPR_PROD,     /* product of args (each a non-sum expression), no constant factor */
    KILN_EXPR_FLOORDIV, /* floor(arg0 / arg1) */
    KILN_EXPR_MOD,      /* arg0 mod arg1, sign of the divisor */
    KILN_EXPR_MIN,
    KILN_EXPR_MAX,
    KILN_EXPR_UNKNOWN,  /* a run-time placeholder: the size is decided by a kernel */
} kiln_expr_kind;

struct kiln_expr {
    kiln_expr_kind kind;
    uint32_t id;          /* creation order in its table; canonical sort key */
    uint64_t hash;
    const char *name;     /* SYM */
    int sym_index;        /* SYM: index into the binding array */
    int64_t c;            /* SUM: constant term */
    int n;                /* number of args */
    const kiln_dim *args; /* SUM/PROD: atoms (e != NULL); binary kinds: two dims */
    const int64_t *coef;  /* SUM: one per arg */
};

static inline kiln_dim kiln_dim_const(int64_t c) { return (kiln_dim){c, NULL}; }
static inline bool kiln_dim_is_const(kiln_dim d) { return d.e == NULL; }
/* True when the dim is the run-time placeholder "size decided by the kernel". */
bool kiln_dim_is_unknown(kiln_dim d);
/* The placeholder used at run time for data-dependent sizes. */
kiln_dim kiln_dim_unknown(void);
/* Structural equality; canonical form makes this exact for constants and syntactically
 * equal expressions. */
static inline bool kiln_dim_equal(kiln_dim a, kiln_dim b)
{
    return a.e == b.e && (a.e || a.c == b.c);
}

kiln_dimtab *kiln_dimtab_create(void);
void kiln_dimtab_free(kiln_dimtab *t);
/* Symbol by name (the same name gives the same symbol). NULL name: a fresh unnamed symbol
 * printed as "?N". Returns the unknown placeholder when t is NULL or memory runs out. */
kiln_dim kiln_dim_sym(kiln_dimtab *t, const char *name);
/* A fresh symbol named after `hint` ("hint_N"), for data-dependent sizes. */
kiln_dim kiln_dim_fresh(kiln_dimtab *t, const char *hint);
int kiln_dimtab_sym_count(const kiln_dimtab *t);
const kiln_expr *kiln_dimtab_sym(const kiln_dimtab *t, int i);

/* Arithmetic. t may be NULL when the operands are constants (as at run time); a symbolic
 * operand with t == NULL, or an unknown operand, gives the unknown placeholder. Division and
 * modulo by a constant <= 0 give the unknown placeholder too (callers check divisors). */
kiln_dim kiln_dim_add(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_dim_sub(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_dim_mul(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_dim_floordiv(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_dim_ceildiv(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_dim_mod(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_dim_min(kiln_dimtab *t, kiln_dim a, kiln_dim b);
kiln_dim kiln_dim_max(kiln_dimtab *t, kiln_dim a, kiln_dim b);

/* Evaluates d with symbol values `syms` (indexed by sym_index; n entries, negative = unbound).
 * Returns false if a needed symbol is unbound or d is unknown. */
bool kiln_dim_eval(kiln_dim d, const int64_t *syms, int n, int64_t *out);
/* Writes a readable form ("2*seq + 1") into buf; returns buf. */
char *kiln_dim_print(kiln_dim d, char *buf, size_t size);

#endif

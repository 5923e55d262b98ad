/* test_dim.c - symbolic dims: canonical forms, interning, folding, evaluation, printing. */
#include <stdio.h>
#include <string.h>

#include "ir/dim.h"
#include "unit.h"

static void test_canonical(void)
{
    kiln_dimtab *t = kiln_dimtab_create();
    kiln_dim n = kiln_dim_sym(t, "n"), m = kiln_dim_sym(t, "m"), one = kiln_dim_const(1);
    CHECK(kiln_dim_equal(n, kiln_dim_sym(t, "n")));
    CHECK(!kiln_dim_equal(n, m));
    /* commutativity and association give the same pointer */
    kiln_dim a = kiln_dim_add(t, kiln_dim_add(t, n, m), one);
    kiln_dim b = kiln_dim_add(t, one, kiln_dim_add(t, m, n));
    CHECK(kiln_dim_equal(a, b));
    /* n + n = 2*n ; 2*n - n = n ; n - n = 0 */
    kiln_dim two_n = kiln_dim_add(t, n, n);
    CHECK(kiln_dim_equal(two_n, kiln_dim_mul(t, kiln_dim_const(2), n)));
    CHECK(kiln_dim_equal(kiln_dim_sub(t, two_n, n), n));
    kiln_dim z = kiln_dim_sub(t, n, n);
    CHECK(kiln_dim_is_const(z) && z.c == 0);
    /* distribution: (n + 1) * m = n*m + m */
    kiln_dim p = kiln_dim_mul(t, kiln_dim_add(t, n, one), m);
    CHECK(kiln_dim_equal(p, kiln_dim_add(t, kiln_dim_mul(t, m, n), m)));
    /* exact division folds: (4n + 8) // 4 = n + 2 */
    kiln_dim q = kiln_dim_floordiv(t, kiln_dim_add(t, kiln_dim_mul(t, kiln_dim_const(4), n), kiln_dim_const(8)),
                                   kiln_dim_const(4));
    CHECK(kiln_dim_equal(q, kiln_dim_add(t, n, kiln_dim_const(2))));
    /* min/max decided when the difference is constant */
    CHECK(kiln_dim_equal(kiln_dim_min(t, n, kiln_dim_add(t, n, one)), n));
    CHECK(kiln_dim_equal(kiln_dim_max(t, n, kiln_dim_add(t, n, one)), kiln_dim_add(t, n, one)));
    CHECK(kiln_dim_equal(kiln_dim_max(t, n, m), kiln_dim_max(t, m, n)));
    /* absorption */
    CHECK(kiln_dim_equal(kiln_dim_max(t, n, kiln_dim_min(t, kiln_dim_const(512), n)), n));
    CHECK(kiln_dim_equal(kiln_dim_min(t, kiln_dim_max(t, m, n), n), n));
    kiln_dimtab_free(t);
}

static void test_eval_print(void)
{
    kiln_dimtab *t = kiln_dimtab_create();
    kiln_dim n = kiln_dim_sym(t, "n"), m = kiln_dim_sym(t, "m");
    /* conv output size: (n + 2 - 3) // 2 + 1, and ceil division */
    kiln_dim conv = kiln_dim_add(t, kiln_dim_floordiv(t, kiln_dim_sub(t, n, kiln_dim_const(1)), kiln_dim_const(2)),
                                 kiln_dim_const(1));
    kiln_dim cdiv = kiln_dim_ceildiv(t, m, kiln_dim_const(3));
    int64_t syms[2], v;
    syms[n.e->sym_index] = 7;
    syms[m.e->sym_index] = 10;
    CHECK(kiln_dim_eval(conv, syms, 2, &v) && v == 4);
    CHECK(kiln_dim_eval(cdiv, syms, 2, &v) && v == 4);
    syms[m.e->sym_index] = -1; /* unbound */
    CHECK(!kiln_dim_eval(cdiv, syms, 2, &v));
    char buf[128];
    kiln_dim_print(kiln_dim_add(t, kiln_dim_mul(t, kiln_dim_const(2), n), kiln_dim_const(1)), buf, sizeof buf);
    CHECK(!strcmp(buf, "2*n + 1"));
    /* constants fold without a table, symbols need one */
    CHECK(kiln_dim_add(NULL, kiln_dim_const(2), kiln_dim_const(3)).c == 5);
    CHECK(kiln_dim_is_unknown(kiln_dim_add(NULL, n, kiln_dim_const(1))));
    CHECK(kiln_dim_is_unknown(kiln_dim_floordiv(t, n, kiln_dim_const(0))));
    /* overflow gives unknown, never a wrapped value */
    CHECK(kiln_dim_is_unknown(kiln_dim_mul(NULL, kiln_dim_const(INT64_MAX), kiln_dim_const(2))));
    kiln_dimtab_free(t);
}

int main(void)
{
    test_canonical();
    test_eval_print();
    return unit_report("test_dim");
}

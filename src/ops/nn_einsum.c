/* nn_einsum.c - Einsum: any number of operands, repeated labels (diagonals), ellipsis with
 * broadcasting, explicit or implicit output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/nn_internal.h"
#include "ops/op.h"
#include "ops/util.h"

#define EIN_MAX_OPS    16
#define EIN_LETTERS    52 /* a-z then A-Z; ellipsis dims follow */
#define EIN_MAX_LABELS (EIN_LETTERS + KILN_MAX_RANK)

/* An equation resolved against the operand ranks: each operand dim and output dim gets a
 * label id (letters 0..51, ellipsis dims EIN_LETTERS + j, right-aligned across operands). */
typedef struct ein_spec {
    int n_ops, n_out, n_ell;
    int rank[EIN_MAX_OPS];
    int label[EIN_MAX_OPS][KILN_MAX_RANK];
    int out[KILN_MAX_RANK];
} ein_spec;

static int letter_id(char ch)
{
    if (ch >= 'a' && ch <= 'z') return ch - 'a';
    if (ch >= 'A' && ch <= 'Z') return 26 + ch - 'A';
    return -1;
}

/* Splits one term into letter ids with the ellipsis position (-1 when none). */
static bool ein_term(const char *s, const char *end, int *ids, int *n, int *ell, char *msg, int size)
{
    *n = 0, *ell = -1;
    while (s < end) {
        if (!strncmp(s, "...", 3) && end - s >= 3) {
            if (*ell >= 0) break;
            *ell = *n;
            s += 3;
            continue;
        }
        int id = letter_id(*s);
        if (id < 0 || *n >= KILN_MAX_RANK) break;
        ids[(*n)++] = id;
        s++;
    }
    if (s == end) return true;
    snprintf(msg, (size_t)size, "malformed equation term near '%c'", *s);
    return false;
}

/* Parses the equation for operands of the given ranks. */
static bool ein_parse(const char *eq, int n_ops, const int *ranks, ein_spec *sp, char *msg, int size)
{
    char buf[512];
    int len = 0;
    for (const char *p = eq; *p && len < (int)sizeof buf - 1; p++)
        if (*p != ' ') buf[len++] = *p;
    buf[len] = 0;
    memset(sp, 0, sizeof *sp);
    if (n_ops < 1 || n_ops > EIN_MAX_OPS) {
        snprintf(msg, (size_t)size, "%d operands, 1 to %d supported", n_ops, EIN_MAX_OPS);
        return false;
    }
    sp->n_ops = n_ops;
    char *arrow = strstr(buf, "->");
    char *lhs_end = arrow ? arrow : buf + len;
    const char *s = buf;
    int count[EIN_LETTERS] = {0}, ids[KILN_MAX_RANK], n, ell;
    bool any_ell = false;
    for (int o = 0; o < n_ops; o++) {
        const char *e = memchr(s, ',', (size_t)(lhs_end - s));
        if (!e) e = lhs_end;
        if ((o == n_ops - 1) != (e == lhs_end)) {
            snprintf(msg, (size_t)size, "equation has a different number of terms than the %d inputs", n_ops);
            return false;
        }
        if (!ein_term(s, e, ids, &n, &ell, msg, size)) return false;
        int n_e = ranks[o] - n;
        if (n_e < 0 || (ell < 0 && n_e)) {
            snprintf(msg, (size_t)size, "term %d names %d dims but input %d has rank %d", o, n, o, ranks[o]);
            return false;
        }
        if (ell >= 0) any_ell = true;
        if (n_e > sp->n_ell) sp->n_ell = n_e;
        sp->rank[o] = ranks[o];
        for (int i = 0; i < n; i++) count[ids[i]]++;
        /* ellipsis dims are placed with a provisional right-aligned id fixed below */
        for (int i = 0, d = 0; i < ranks[o]; i++) {
            if (ell >= 0 && i >= ell && i < ell + n_e) sp->label[o][i] = -(n_e - (i - ell));
            else sp->label[o][i] = ids[d++];
        }
        s = e + 1;
    }
    for (int o = 0; o < n_ops; o++)
        for (int i = 0; i < sp->rank[o]; i++)
            if (sp->label[o][i] < 0) sp->label[o][i] = EIN_LETTERS + sp->n_ell + sp->label[o][i];
    if (arrow) {
        if (!ein_term(arrow + 2, buf + len, ids, &n, &ell, msg, size)) return false;
        if (n + (ell >= 0 ? sp->n_ell : 0) > KILN_MAX_RANK) {
            snprintf(msg, (size_t)size, "output rank too large");
            return false;
        }
        for (int i = 0; i < n; i++) {
            if (ell == i)
                for (int j = 0; j < sp->n_ell; j++) sp->out[sp->n_out++] = EIN_LETTERS + j;
            if (!count[ids[i]]) {
                snprintf(msg, (size_t)size, "output label %d does not appear in the inputs", i);
                return false;
            }
            for (int j = 0; j < sp->n_out; j++)
                if (sp->out[j] == ids[i]) {
                    snprintf(msg, (size_t)size, "output repeats a label");
                    return false;
                }
            sp->out[sp->n_out++] = ids[i];
        }
        if (ell == n)
            for (int j = 0; j < sp->n_ell; j++) sp->out[sp->n_out++] = EIN_LETTERS + j;
        if (ell < 0 && any_ell && sp->n_ell) {
            snprintf(msg, (size_t)size, "inputs use '...' but the output does not");
            return false;
        }
        return true;
    }
    /* implicit output: ellipsis dims, then the labels used once, in ASCII order (A-Z, a-z) */
    for (int j = 0; j < sp->n_ell; j++) sp->out[sp->n_out++] = EIN_LETTERS + j;
    for (int pass = 0; pass < 2; pass++)
        for (int id = pass ? 0 : 26; id < (pass ? 26 : EIN_LETTERS); id++)
            if (count[id] == 1) {
                if (sp->n_out >= KILN_MAX_RANK) {
                    snprintf(msg, (size_t)size, "output rank too large");
                    return false;
                }
                sp->out[sp->n_out++] = id;
            }
    return true;
}

static bool ein_spec_for(const kiln_node *n, int n_ops, const int *ranks, ein_spec *sp, char *msg, int size)
{
    const char *eq = kiln_attr_string(n, "equation", NULL);
    if (!eq) {
        snprintf(msg, (size_t)size, "attribute equation is required");
        return false;
    }
    return ein_parse(eq, n_ops, ranks, sp, msg, size);
}

kiln_status kiln_nn_einsum_infer(kiln_infer_ctx *c)
{
    int n_ops = kiln_infer_n_in(c), ranks[EIN_MAX_OPS];
    const kiln_type *t[EIN_MAX_OPS];
    if (n_ops < 1 || n_ops > EIN_MAX_OPS)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%d inputs, 1 to %d supported", n_ops, EIN_MAX_OPS);
    bool known = true;
    for (int o = 0; o < n_ops; o++) {
        t[o] = kiln_infer_in(c, o);
        if (!t[o]) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is missing", o);
        ranks[o] = t[o]->rank;
        known = known && ranks[o] >= 0;
    }
    if (!known) return kiln_infer_set_out_unknown(c, 0, t[0]->dtype);
    ein_spec sp;
    char msg[160];
    if (!ein_spec_for(kiln_infer_node(c), n_ops, ranks, &sp, msg, sizeof msg))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "%s", msg);
    kiln_dim size[EIN_MAX_LABELS];
    bool set[EIN_MAX_LABELS] = {false};
    for (int o = 0; o < n_ops; o++)
        for (int i = 0; i < sp.rank[o]; i++) {
            int l = sp.label[o][i];
            kiln_dim d = t[o]->dims[i];
            bool one = kiln_dim_is_const(d) && d.c == 1;
            if (!set[l] || (l >= EIN_LETTERS && kiln_dim_is_const(size[l]) && size[l].c == 1)) {
                size[l] = d, set[l] = true;
            } else if (!(l >= EIN_LETTERS && one)) {
                KILN_TRY(kiln_infer_require_equal(c, size[l], d, "dims sharing an einsum label"));
            }
        }
    kiln_dim dims[KILN_MAX_RANK];
    for (int i = 0; i < sp.n_out; i++) dims[i] = set[sp.out[i]] ? size[sp.out[i]] : kiln_dim_const(1);
    return kiln_infer_set_out(c, 0, t[0]->dtype, sp.n_out, dims);
}

kiln_status kiln_nn_einsum_run(kiln_run_ctx *c)
{
    int n_ops = kiln_run_n_in(c), ranks[EIN_MAX_OPS];
    const kiln_value *X[EIN_MAX_OPS];
    kiln_value *Y = kiln_run_out(c, 0);
    for (int o = 0; o < n_ops; o++) X[o] = kiln_run_in(c, o), ranks[o] = X[o]->rank;
    ein_spec sp;
    char msg[160];
    if (!ein_spec_for(kiln_run_node(c), n_ops, ranks, &sp, msg, sizeof msg))
        return kiln_run_fail(c, KILN_ERR_MODEL, "%s", msg);
    /* loop order: output labels, then the summed ones; per operand a stride for each */
    int64_t size[EIN_MAX_LABELS];
    int pos[EIN_MAX_LABELS], order[EIN_MAX_LABELS], n_loop = 0;
    for (int l = 0; l < EIN_MAX_LABELS; l++) size[l] = 1, pos[l] = -1;
    for (int o = 0; o < n_ops; o++)
        for (int i = 0; i < ranks[o]; i++)
            if (X[o]->dims[i] != 1) size[sp.label[o][i]] = X[o]->dims[i];
    for (int i = 0; i < sp.n_out; i++) pos[sp.out[i]] = n_loop, order[n_loop++] = sp.out[i];
    for (int o = 0; o < n_ops; o++)
        for (int i = 0; i < ranks[o]; i++)
            if (pos[sp.label[o][i]] < 0) pos[sp.label[o][i]] = n_loop, order[n_loop++] = sp.label[o][i];
    int64_t dims[EIN_MAX_LABELS], idx[EIN_MAX_LABELS] = {0}, stride[EIN_MAX_OPS][EIN_MAX_LABELS];
    int64_t n_sum = 1;
    for (int k = 0; k < n_loop; k++) {
        dims[k] = size[order[k]];
        if (k >= sp.n_out) n_sum *= dims[k];
    }
    memset(stride, 0, sizeof stride);
    bool is_int = kiln_dtype_is_int(X[0]->dtype);
    void *x[EIN_MAX_OPS] = {NULL};
    kiln_status st = KILN_OK;
    for (int o = 0; o < n_ops; o++) {
        int64_t s[KILN_MAX_RANK];
        kiln_strides(ranks[o], X[o]->dims, s);
        for (int i = 0; i < ranks[o]; i++) {
            int l = sp.label[o][i];
            if (X[o]->dims[i] != size[l] && X[o]->dims[i] != 1) {
                st = kiln_run_fail(c, KILN_ERR_SHAPE, "input %d dim %d is %lld, label size is %lld", o, i,
                                   (long long)X[o]->dims[i], (long long)size[l]);
                goto out_free;
            }
            if (X[o]->dims[i] != 1) stride[o][pos[l]] += s[i];
        }
        x[o] = kiln_nn_load_num(X[o], is_int);
        if (!x[o]) {
            st = kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
            goto out_free;
        }
    }
    for (int64_t e = 0; e < Y->numel; e++) {
        double accf = 0;
        uint64_t acci = 0;
        for (int64_t r = 0; r < n_sum; r++) {
            double pf = 1;
            uint64_t pi = 1;
            for (int o = 0; o < n_ops; o++) {
                int64_t off = 0;
                for (int k = 0; k < n_loop; k++) off += idx[k] * stride[o][k];
                if (is_int) pi *= (uint64_t)((int64_t *)x[o])[off];
                else pf *= ((double *)x[o])[off];
            }
            accf += pf, acci += pi;
            kiln_nn_index_next(n_loop - sp.n_out, dims + sp.n_out, idx + sp.n_out);
        }
        if (is_int) kiln_store_i64(Y->dtype, Y->data, e, (int64_t)acci);
        else kiln_store_f64(Y->dtype, Y->data, e, accf);
        kiln_nn_index_next(sp.n_out, dims, idx);
    }
out_free:
    for (int o = 0; o < n_ops; o++) free(x[o]);
    return st;
}

/* fused_ew.c - kiln.FusedElementwise (fused.h): a chain of element-wise nodes as one program.
 * The reference kernel walks Y's elements and runs the program on each in double precision,
 * every instruction's result rounded to its register's dtype and every formula the replaced
 * node's own (elementwise.c), so it computes what the unfused chain computes. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/fused.h"
#include "ops/op.h"
#include "ops/semantics.h"
#include "ops/util.h"

static kiln_status ewp_bad(kiln_err *err, const kiln_node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kiln_status ewp_bad(kiln_err *err, const kiln_node *n, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return kiln_errf(err, KILN_ERR_MODEL, "node '%s' (kiln.FusedElementwise): %s", n->name, why);
}

static bool float_dtype(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16;
}

/* Whether register r (of p's first `upto`) holds a float value. */
static bool float_reg(const kiln_ewp *p, int r, int upto) { return r >= 0 && r < upto && float_dtype(p->dtype[r]); }

static kiln_status ewp_parse(const kiln_node *n, void *params, kiln_err *err)
{
    kiln_ewp *p = params;
    memset(p, 0, sizeof *p);
    const kiln_attr *ops = kiln_node_attr_typed(n, "ops", KILN_ATTR_STRINGS);
    int n_args, n_params, n_dtypes;
    const int64_t *args = kiln_attr_ints(n, "args", &n_args);
    const float *prm = kiln_attr_floats(n, "params", &n_params);
    const int64_t *dtypes = kiln_attr_ints(n, "dtypes", &n_dtypes);
    p->n_in = n->n_in;
    p->n_ins = ops ? ops->n : 0;
    if (p->n_in < 1 || p->n_in > KILN_EWP_MAX_IN) return ewp_bad(err, n, "needs 1 to 16 inputs");
    if (p->n_ins < 1 || p->n_ins > KILN_EWP_MAX_INS) return ewp_bad(err, n, "attribute ops needs 1 to 48 entries");
    if (n_args != 3 * p->n_ins || n_params != 4 * p->n_ins || n_dtypes != p->n_in + p->n_ins)
        return ewp_bad(err, n, "attributes args, params and dtypes do not match ops");
    for (int r = 0; r < n_dtypes; r++) {
        p->dtype[r] = (kiln_dtype)dtypes[r];
        if (dtypes[r] <= 0 || dtypes[r] > 64 || !kiln_dtype_size(p->dtype[r]))
            return ewp_bad(err, n, "attribute dtypes holds an unknown dtype");
        if (r >= p->n_in && !float_dtype(p->dtype[r]))
            return ewp_bad(err, n, "instruction %d's result is not a float type", r - p->n_in);
    }
    for (int k = 0; k < p->n_ins; k++) {
        kiln_ewp_ins *in = &p->ins[k];
        const char *op = ops->strings[k];
        int regs = p->n_in + k; /* readable registers: the inputs and earlier results */
        in->a = (int)args[3 * k], in->b = (int)args[3 * k + 1], in->c = (int)args[3 * k + 2];
        for (int j = 0; j < 4; j++) in->p[j] = prm[4 * k + j];
        bool ok;
        if (!strcmp(op, "Constant")) {
            in->kind = KILN_EWP_CONST;
            ok = in->a == -1 && in->b == -1 && in->c == -1;
        } else if (!strcmp(op, "Cast")) {
            in->kind = KILN_EWP_CAST;
            ok = in->a >= 0 && in->a < regs && in->b == -1 && in->c == -1;
        } else if (!strcmp(op, "Clip")) {
            in->kind = KILN_EWP_CLIP;
            ok = float_reg(p, in->a, regs) && in->b == -1 && in->c == -1;
        } else if (!strcmp(op, "Where")) {
            in->kind = KILN_EWP_WHERE;
            ok = in->a >= 0 && in->a < regs && p->dtype[in->a] == KILN_DTYPE_BOOL && float_reg(p, in->b, regs) &&
                 float_reg(p, in->c, regs);
        } else {
            /* the op's code through a node of that type (its attributes come from params) */
            kiln_node probe = {.name = n->name, .op_type = op, .domain = "", .n_in = in->b >= 0 ? 2 : 1};
            double unused[4];
            in->code = in->b >= 0 ? kiln_ops_binary_code(&probe) : kiln_ops_unary_code(&probe, unused);
            in->kind = in->b >= 0 ? KILN_EWP_BINARY : KILN_EWP_UNARY;
            ok = in->code >= 0 && float_reg(p, in->a, regs) && (in->b < 0 || float_reg(p, in->b, regs)) && in->c == -1;
        }
        if (!ok) return ewp_bad(err, n, "instruction %d (%s) has bad operands", k, op);
    }
    return KILN_OK;
}

static kiln_status ewp_infer(kiln_infer_ctx *c)
{
    const kiln_ewp *p = kiln_infer_node(c)->params;
    if (!p) return kiln_infer_fail(c, KILN_ERR_MODEL, "attributes not parsed");
    int n = kiln_infer_n_in(c);
    if (n != p->n_in) return kiln_infer_fail(c, KILN_ERR_MODEL, "has %d inputs, its program %d", n, p->n_in);
    const kiln_type *ins[KILN_EWP_MAX_IN];
    for (int i = 0; i < n; i++) {
        ins[i] = kiln_infer_in(c, i);
        if (!ins[i]) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is absent", i);
        if (ins[i]->dtype && ins[i]->dtype != p->dtype[i])
            return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is %s, its program reads %s", i,
                                   kiln_dtype_name(ins[i]->dtype), kiln_dtype_name(p->dtype[i]));
    }
    int rank;
    kiln_dim dims[KILN_MAX_RANK];
    KILN_TRY(kiln_infer_broadcast(c, n, ins, &rank, dims));
    kiln_dtype out = p->dtype[p->n_in + p->n_ins - 1];
    if (rank < 0) return kiln_infer_set_out_unknown(c, 0, out);
    return kiln_infer_set_out(c, 0, out, rank, dims);
}

/* Instruction `in` on the registers r (double), rounded to dt. */
static double ewp_step(const kiln_ewp_ins *in, const double *r, kiln_dtype dt)
{
    double v;
    switch (in->kind) {
    case KILN_EWP_UNARY: v = kiln_ops_unary_eval(in->code, r[in->a], in->p); break;
    case KILN_EWP_BINARY: v = kiln_ops_binary_eval(in->code, r[in->a], r[in->b]); break;
    case KILN_EWP_CAST: v = r[in->a]; break;
    case KILN_EWP_CLIP: v = isnan(r[in->a]) ? r[in->a] : fmin(fmax(r[in->a], in->p[0]), in->p[1]); break;
    case KILN_EWP_WHERE: v = r[in->a] != 0 ? r[in->b] : r[in->c]; break;
    default: v = in->p[0]; break;
    }
    return kiln_round_to(dt, v);
}

static kiln_status ewp_run(kiln_run_ctx *c)
{
    const kiln_ewp *p = kiln_run_node(c)->params;
    kiln_value *y = kiln_run_out(c, 0);
    int64_t strides[KILN_EWP_MAX_IN][KILN_MAX_RANK];
    const kiln_value *x[KILN_EWP_MAX_IN];
    for (int i = 0; i < p->n_in; i++) {
        x[i] = kiln_run_in(c, i);
        if (x[i]->dtype != p->dtype[i])
            return kiln_run_fail(c, KILN_ERR_RUNTIME, "input %d is %s, its program reads %s", i,
                                 kiln_dtype_name(x[i]->dtype), kiln_dtype_name(p->dtype[i]));
        kiln_bcast_strides(y->rank, y->dims, x[i]->rank, x[i]->dims, strides[i]);
    }
    double r[KILN_EWP_MAX_IN + KILN_EWP_MAX_INS];
    int64_t idx[KILN_MAX_RANK] = {0};
    for (int64_t e = 0; e < y->numel; e++) {
        for (int i = 0; i < p->n_in; i++) {
            int64_t off = 0;
            for (int d = 0; d < y->rank; d++) off += idx[d] * strides[i][d];
            r[i] = kiln_load_f64(x[i]->dtype, x[i]->data, off);
        }
        for (int k = 0; k < p->n_ins; k++) r[p->n_in + k] = ewp_step(&p->ins[k], r, p->dtype[p->n_in + k]);
        kiln_store_f64(y->dtype, y->data, e, r[p->n_in + p->n_ins - 1]);
        for (int d = y->rank - 1; d >= 0 && ++idx[d] == y->dims[d]; d--) idx[d] = 0;
    }
    return KILN_OK;
}

/* In place: an input 0 of the output's size is read at element i only, before element i is
 * stored, here and in the generated kernels (ops_fused.c). */
static const kiln_op_def defs[] = {
    {"kiln", "FusedElementwise", 1, ewp_infer, ewp_run, KILN_OP_INPLACE, 0, ewp_parse, sizeof(kiln_ewp)},
};

const kiln_op_table kiln_ops_fused_ew = {defs, sizeof defs / sizeof defs[0]};

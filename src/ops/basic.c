/* basic.c - Identity and Constant. */
#include <string.h>

#include "ops/op.h"

static kiln_status identity_infer(kiln_infer_ctx *c)
{
    return kiln_infer_same_as_input(c, 0, 0);
}

static kiln_status identity_run(kiln_run_ctx *c)
{
    kiln_value *y;
    KILN_TRY(kiln_value_copy(kiln_run_in(c, 0), &y, kiln_run_err(c)));
    return kiln_run_set_out(c, 0, y);
}

/* Constant: exactly one of value, value_float(s), value_int(s), value_string(s). */
static kiln_status constant_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_attr *a = n->n_attrs == 1 ? &n->attrs[0] : NULL;
    if (!a) return kiln_infer_fail(c, KILN_ERR_MODEL, "needs exactly one attribute, has %d", n->n_attrs);
    kiln_dim d[1];
    if (!strcmp(a->name, "value") && a->t) {
        kiln_dim dims[KILN_MAX_RANK];
        for (int k = 0; k < a->t->rank; k++) dims[k] = kiln_dim_const(a->t->dims[k]);
        KILN_TRY(kiln_infer_set_out(c, 0, a->t->dtype, a->t->rank, dims));
        return kiln_infer_set_out_const(c, 0, a->t);
    }
    if (!strcmp(a->name, "value_float")) return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 0, NULL);
    if (!strcmp(a->name, "value_int")) return kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, 0, NULL);
    if (!strcmp(a->name, "value_string")) return kiln_infer_set_out(c, 0, KILN_DTYPE_STRING, 0, NULL);
    d[0] = kiln_dim_const(a->n);
    if (!strcmp(a->name, "value_floats")) return kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 1, d);
    if (!strcmp(a->name, "value_ints")) return kiln_infer_set_out(c, 0, KILN_DTYPE_INT64, 1, d);
    if (!strcmp(a->name, "value_strings")) return kiln_infer_set_out(c, 0, KILN_DTYPE_STRING, 1, d);
    return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "attribute '%s' is not supported", a->name);
}

static kiln_status constant_run(kiln_run_ctx *c)
{
    const kiln_attr *a = &kiln_run_node(c)->attrs[0];
    kiln_value *y = kiln_run_out(c, 0);
    if (!strcmp(a->name, "value")) {
        KILN_TRY(kiln_value_copy(a->t, &y, kiln_run_err(c)));
        return kiln_run_set_out(c, 0, y);
    }
    if (!strcmp(a->name, "value_float")) ((float *)y->data)[0] = a->f;
    else if (!strcmp(a->name, "value_int")) ((int64_t *)y->data)[0] = a->i;
    else if (!strcmp(a->name, "value_string")) return kiln_tensor_set_string(y, 0, a->s, a->s_len, kiln_run_err(c));
    else if (!strcmp(a->name, "value_floats")) memcpy(y->data, a->floats, (size_t)a->n * sizeof(float));
    else if (!strcmp(a->name, "value_ints")) memcpy(y->data, a->ints, (size_t)a->n * sizeof(int64_t));
    else if (!strcmp(a->name, "value_strings"))
        for (int i = 0; i < a->n; i++) KILN_TRY(kiln_tensor_set_string(y, i, a->strings[i], a->string_lens[i], kiln_run_err(c)));
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"", "Identity", 1, identity_infer, identity_run},
    {"", "Constant", 1, constant_infer, constant_run, KILN_OP_X_OPTIONAL},
};

const kiln_op_table kiln_ops_basic = {defs, sizeof defs / sizeof defs[0]};

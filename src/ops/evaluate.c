/* evaluate.c - one node's reference kernel run on constant inputs at compile time (constant
 * folding, src/passes/fold_constants.c): run-time inference with the constants' exact types,
 * outputs allocated zeroed under a byte bound, then the op's run. No executor, no frames. */
#include <stdint.h>
#include <stdlib.h>

#include "ops/ctx.h"
#include "ops/eval.h"

static bool all_const(const kiln_type *t)
{
    if (t->kind != KILN_VALUE_TENSOR || t->rank < 0 || !kiln_dtype_valid(t->dtype)) return false;
    for (int k = 0; k < t->rank; k++)
        if (!kiln_dim_is_const(t->dims[k])) return false;
    return true;
}

kiln_status kiln_node_evaluate(const kiln_node *n, size_t max_bytes, kiln_value **out, kiln_err *err)
{
    for (int i = 0; i < n->n_out; i++) out[i] = NULL;
    if (n->kernel || kiln_node_has_subgraphs(n) || !n->op || !n->op->run)
        return kiln_errf(err, KILN_ERR_RUNTIME, "internal: node '%s' cannot be evaluated at compile time", n->name);
    size_t ni = (size_t)n->n_in + 1, no = (size_t)n->n_out + 1;
    const kiln_value **in = calloc(ni, sizeof *in);
    const kiln_type **in_type = calloc(ni, sizeof *in_type);
    kiln_type *types = calloc(ni + no, sizeof *types), *out_type = types ? types + ni : NULL;
    kiln_status st = KILN_OK;
    if (!in || !in_type || !types) {
        st = kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n->n_in; i++) {
        in[i] = n->in[i] ? n->in[i]->init : NULL;
        if (n->in[i] && !in[i]) {
            st = kiln_errf(err, KILN_ERR_RUNTIME, "node '%s' (%s): input '%s' is not a constant", n->name, n->op_type,
                           n->in[i]->name);
            goto done;
        }
        kiln_type_of_value(in[i], &types[i]);
        in_type[i] = in[i] ? &types[i] : NULL;
    }
    for (int i = 0; i < n->n_out; i++) kiln_type_unknown(&out_type[i]);
    if (n->op->infer) {
        kiln_infer_ctx ic = {.node = n, .in = in_type, .in_val = in, .out = out_type, .err = err};
        if ((st = n->op->infer(&ic))) goto done;
    }
    kiln_run_ctx rc = {.node = n, .in = in, .out = out, .err = err, .alloc_limit = max_bytes};
    for (int i = 0; i < n->n_out; i++) {
        if (!all_const(&out_type[i])) continue; /* left to the kernel (kiln_run_alloc_out) */
        int64_t dims[KILN_MAX_RANK], numel;
        for (int k = 0; k < out_type[i].rank; k++) dims[k] = out_type[i].dims[k].c;
        size_t es = kiln_dtype_size(out_type[i].dtype);
        if ((st = kiln_dims_numel(out_type[i].rank, dims, &numel, err))) goto done;
        if (max_bytes && (uint64_t)numel > max_bytes / (es ? es : 1)) {
            st = kiln_errf(err, KILN_ERR_UNSUPPORTED, "node '%s' (%s): output %d larger than %zu bytes", n->name,
                           n->op_type, i, max_bytes);
            goto done;
        }
        if ((st = kiln_tensor_new(out_type[i].dtype, out_type[i].rank, dims, &out[i], err))) goto done;
    }
    st = n->op->run(&rc);
    for (int i = 0; !st && i < n->n_out; i++)
        if (n->out[i] && !out[i])
            st = kiln_errf(err, KILN_ERR_RUNTIME, "node '%s' (%s): kernel produced no output %d", n->name, n->op_type, i);
    for (int i = 0; i < n->n_out; i++)
        if (st || !n->out[i]) {
            kiln_value_free(out[i]);
            out[i] = NULL;
        }
done:
    if (st)
        for (int i = 0; i < n->n_out; i++) {
            kiln_value_free(out[i]);
            out[i] = NULL;
        }
    free(in);
    free(in_type);
    free(types);
    return st;
}

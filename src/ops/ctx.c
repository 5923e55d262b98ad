/* ctx.c - the run context API of src/ops/op.h (kiln_run_*): what a kernel reads and writes.
 * The executor and compile-time evaluation fill the context (src/ops/ctx.h). */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ctx.h"

const kiln_node *kiln_run_node(const kiln_run_ctx *c) { return c->node; }
int kiln_run_opset(const kiln_run_ctx *c) { return c->node->opset; }
int kiln_run_n_in(const kiln_run_ctx *c) { return c->node->n_in; }
int kiln_run_n_out(const kiln_run_ctx *c) { return c->node->n_out; }
kiln_err *kiln_run_err(kiln_run_ctx *c) { return c->err; }
kiln_threadpool *kiln_run_threadpool(const kiln_run_ctx *c) { return c->pool; }

struct kiln_scratch *kiln_run_scratch(const kiln_run_ctx *c) { return c->scratch; }

const kiln_value *kiln_run_in(const kiln_run_ctx *c, int i)
{
    return i >= 0 && i < c->node->n_in ? c->in[i] : NULL;
}

kiln_status kiln_run_with_in(kiln_run_ctx *c, int i, const kiln_value *v, kiln_status (*fn)(kiln_run_ctx *c))
{
    int n = c->node->n_in;
    if (i < 0 || i >= n) return kiln_run_fail(c, KILN_ERR_RUNTIME, "input %d of %d replaced", i, n);
    const kiln_value **in = malloc((size_t)n * sizeof *in);
    if (!in) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    memcpy(in, c->in, (size_t)n * sizeof *in);
    in[i] = v;
    kiln_run_ctx c2 = *c; /* outputs, errors and the pool are shared with c */
    c2.in = in;
    kiln_status st = fn(&c2);
    free(in);
    return st;
}

kiln_value *kiln_run_out(kiln_run_ctx *c, int i)
{
    return i >= 0 && i < c->node->n_out ? c->out[i] : NULL;
}

bool kiln_run_has_out(const kiln_run_ctx *c, int i)
{
    return i >= 0 && i < c->node->n_out && c->node->out[i];
}

/* A compile-time evaluation's bound on one output, checked before allocating it. */
static kiln_status check_limit(const kiln_run_ctx *c, kiln_dtype dt, int rank, const int64_t *dims)
{
    if (!c->alloc_limit) return KILN_OK;
    int64_t numel;
    KILN_TRY(kiln_dims_numel(rank, dims, &numel, c->err));
    if ((uint64_t)numel > c->alloc_limit / (kiln_dtype_size(dt) ? kiln_dtype_size(dt) : 1))
        return kiln_errf(c->err, KILN_ERR_UNSUPPORTED, "output larger than %zu bytes", c->alloc_limit);
    return KILN_OK;
}

kiln_status kiln_run_alloc_out(kiln_run_ctx *c, int i, kiln_dtype dt, int rank, const int64_t *dims,
                               kiln_value **out)
{
    if (out) *out = NULL;
    if (i < 0 || i >= c->node->n_out)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "kernel wrote output %d of %d", i, c->node->n_out);
    KILN_TRY(check_limit(c, dt, rank, dims));
    kiln_value *v;
    kiln_status st = kiln_tensor_new(dt, rank, dims, &v, c->err);
    if (st) return kiln_err_prefix(c->err, "node '%s' (%s): output %d", c->node->name, c->node->op_type, i);
    kiln_value_free(c->out[i]);
    c->out[i] = v;
    if (out) *out = v;
    return KILN_OK;
}

kiln_status kiln_run_set_out(kiln_run_ctx *c, int i, kiln_value *v)
{
    if (i < 0 || i >= c->node->n_out) {
        kiln_value_free(v);
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "kernel wrote output %d of %d", i, c->node->n_out);
    }
    kiln_value_free(c->out[i]);
    c->out[i] = v;
    return KILN_OK;
}

kiln_status kiln_run_fail(kiln_run_ctx *c, kiln_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln_status st = kiln_errv_node(c->err, code, c->node->name, c->node->op_type, fmt, ap);
    va_end(ap);
    return st;
}

kiln_status kiln_run_subgraph(kiln_run_ctx *c, const kiln_graph *g, int n_in, const kiln_value *const *in,
                              kiln_value **out)
{
    if (n_in != g->n_inputs)
        return kiln_run_fail(c, KILN_ERR_MODEL, "subgraph '%s' takes %d inputs, %d given", g->name, g->n_inputs, n_in);
    if (!c->subgraph) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "subgraph '%s' cannot run here", g->name);
    return c->subgraph(c, g, in, out);
}

/* run.c - the run loop: walks a graph's nodes in order, gives each node's outputs the shapes
 * its plan evaluated from the bound symbols (or, where those are not known before the node
 * runs, from its op's inference over the actual inputs), allocates them in the arena, runs the
 * kernel, releases values after their last reader. Frames chain to give subgraphs their
 * outer-scope values; a subgraph's call binds its own plan (src/exec/subgraph.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/scratch.h"
#include "exec/ctx.h"
#include "exec/plan.h"
#include "exec/subgraph.h"

static kiln_status exec_frame(kiln_frame *f, const kiln_value *const *inputs, kiln_value **outputs, kiln_err *err);

/* Symbols a subgraph call binds on the stack; models with more run subgraphs with inference. */
#define SUBGRAPH_MAX_SYMS 512

/* kiln_run_subgraph's executor side (kiln_run_ctx.subgraph): the subgraph's compiled plan for
 * this call's binding when it binds (src/exec/subgraph.h), else inference at run time. */
static kiln_status run_subgraph(kiln_run_ctx *c, const kiln_graph *g, const kiln_value *const *in, kiln_value **out)
{
    const kiln_frame *pf = c->frame;
    kiln_frame f = {.g = g, .parent = pf, .pool = pf->pool, .scratch = pf->scratch};
    kiln_subprog *sp = g->prog;
    int64_t syms[SUBGRAPH_MAX_SYMS];
    kiln_plan *plan = NULL;
    void *arena = NULL;
    kiln_arena_view mem = {0};
    kiln_status st = KILN_OK;
    if (sp && pf->syms && pf->n_syms <= SUBGRAPH_MAX_SYMS) {
        if (pf->n_syms) memcpy(syms, pf->syms, (size_t)pf->n_syms * sizeof *syms);
        if (kiln_subgraph_bind(sp, in, syms, pf->n_syms)) {
            st = kiln_plan_cache_get(&sp->plans, &sp->memprog, syms, pf->n_syms, &plan, c->err);
            if (st) return st;
            arena = plan->peak ? kiln_scratch_get(f.scratch, plan->peak) : NULL;
            if (plan->peak && !arena) {
                kiln_plan_cache_put(&sp->plans, plan);
                return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory allocating a %zu-byte arena", plan->peak);
            }
            mem = (kiln_arena_view){.base = arena, .offset = plan->offset, .size = plan->size,
                                    .in_place = plan->in_place};
            f.mem = &mem;
            f.plan = plan;
            f.syms = syms;
            f.n_syms = pf->n_syms;
        }
    }
    st = exec_frame(&f, in, out, c->err);
    const kiln_frame *top = pf;
    while (top->parent) top = top->parent;
    if (top->mem) top->mem->heap_fallbacks += mem.heap_fallbacks;
    kiln_scratch_put(f.scratch, arena);
    if (plan) kiln_plan_cache_put(&sp->plans, plan);
    return st;
}

/* ---- frames ---- */

/* The value of v for a CPU reader: its host copy when it lives on the device. */
static const kiln_value *frame_get(const kiln_frame *f, const kiln_ir_value *v)
{
    for (; f; f = f->parent)
        if (f->g == v->graph) {
            const kiln_value *x = f->vals[v->id] ? f->vals[v->id] : v->init;
            if (x && x->on_device && f->alt && f->alt[v->id]) x = f->alt[v->id];
            return x;
        }
    return v->init;
}

/* Gives frame f its value arrays, zeroed, in one block (from the session's scratch: no
 * allocation once a run of this size has been made). */
static kiln_status frame_init(kiln_frame *f, bool alt, kiln_err *err)
{
    size_t nv = (size_t)f->g->n_values + 1;
    size_t bytes = nv * (sizeof *f->vals + (alt ? sizeof *f->alt : 0)) + nv * sizeof *f->owned;
    f->block = kiln_scratch_get(f->scratch, bytes);
    if (!f->block) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    memset(f->block, 0, bytes);
    f->vals = f->block;
    f->alt = alt ? f->vals + nv : NULL;
    f->owned = (bool *)(f->vals + nv * (alt ? 2 : 1));
    return KILN_OK;
}

static void frame_release(kiln_frame *f)
{
    if (!f->block) return;
    for (int i = 0; i < f->g->n_values; i++) {
        if (f->owned[i]) kiln_value_free(f->vals[i]);
        if (f->alt) kiln_value_free(f->alt[i]);
    }
    kiln_scratch_put(f->scratch, f->block);
    f->block = NULL;
}

/* The planned slot of value id in the host or device arena, or NULL. */
static void *arena_slot(const kiln_frame *f, int id, bool device, size_t nbytes)
{
    const kiln_arena_view *mem = f->mem;
    unsigned char *base = !mem ? NULL : device ? mem->device_base : mem->base;
    if (!base || mem->offset[id] == SIZE_MAX || nbytes > mem->size[id]) return NULL;
    return base + mem->offset[id];
}

/* Device runs (main graph): main-graph value v in device or host memory, for a reader on that
 * side. Values cross between the sides through the copy nodes of the graph
 * (src/exec/partition.c), so the only ones given here are constants a device kernel reads (the
 * device provider's upload, a view) and the host copies observers are shown (kept in f->alt
 * until v is released); anything else on the wrong side is an internal error. */
static kiln_status value_at(kiln_frame *f, const kiln_ir_value *v, bool device, bool observing,
                            const kiln_value **out, kiln_err *err)
{
    const kiln_value *p = f->vals[v->id] ? f->vals[v->id] : v->init;
    *out = p;
    if (!p || p->kind != KILN_VALUE_TENSOR || p->on_device == device) return KILN_OK;
    if (!observing && !kiln_ir_constant(v))
        return kiln_errf(err, KILN_ERR_RUNTIME, "internal: '%s' is in %s memory and read on the %s without a copy node",
                         v->name, p->on_device ? "device" : "host", device ? "device" : "host");
    if (!f->alt[v->id]) {
        void *dst = observing ? NULL : arena_slot(f, v->id, device, p->nbytes);
        const kiln_provider_i *dev = f->env->dev;
        kiln_provider_run *r = f->env->dev_run;
        /* a download makes what the host computes next depend on the inputs' contents */
        if (!device && dev->unrecordable) dev->unrecordable(r, "'%s' is copied to the host to be observed", v->name);
        KILN_TRY(device ? dev->to_device(r, v, p, dst, &f->alt[v->id], err)
                        : dev->to_host(r, p, dst, &f->alt[v->id], err));
    }
    *out = f->alt[v->id];
    return KILN_OK;
}

/* A copy node (KILN_OP_COPY, src/exec/partition.c): its input in the memory of its side
 * (n->on_device: the device), through the device provider's copies, in its output's arena slot
 * of that side; a view when the input is there already. A copy to the host makes what the host
 * computes next depend on the inputs' contents: such a run cannot be recorded. */
static kiln_status run_copy(const kiln_node *n, kiln_frame *f, kiln_err *err)
{
    const kiln_ir_value *v = n->in[0], *y = n->out[0];
    const kiln_value *x = f->vals[v->id] ? f->vals[v->id] : v->init;
    const kiln_provider_i *dev = f->env ? f->env->dev : NULL;
    if (!dev || v->graph != f->g || !y)
        return kiln_errf(err, KILN_ERR_RUNTIME, "internal: copy node '%s' outside a device run", n->name);
    if (!x) return kiln_errf(err, KILN_ERR_RUNTIME, "node '%s' (%s): input '%s' has no value", n->name, n->op_type, v->name);
    if (x->kind != KILN_VALUE_TENSOR)
        return kiln_errf(err, KILN_ERR_UNSUPPORTED, "node '%s' (%s): '%s' is not a tensor", n->name, n->op_type, v->name);
    bool device = n->on_device;
    kiln_provider_run *r = f->env->dev_run;
    if (!device && dev->unrecordable) {
        if (v->is_input) dev->unrecordable(r, "node '%s' (%s) reads input '%s' on the host", n->name, n->op_type, v->name);
        else dev->unrecordable(r, "'%s' is copied to the host in the middle of the run", v->name);
    }
    void *dst = arena_slot(f, y->id, device, x->nbytes);
    kiln_value *out;
    /* already there: an input in the caller's memory (host or device, live for the run; a
     * recorded run's key holds the device address, see session.c), a view: readers never write
     * their inputs, and a node that works in place gets this copy's slot, not the caller's
     * buffer */
    if (x->on_device == device) {
        KILN_TRY(kiln_value_view(x->dtype, x->rank, x->dims, x->data, &out, err));
        out->on_device = x->on_device;
    } else {
        if (!dst && x->nbytes && f->mem && f->mem->offset[y->id] != SIZE_MAX) f->mem->heap_fallbacks++;
        KILN_TRY(device ? dev->to_device(r, v, x, dst, &out, err) : dev->to_host(r, x, dst, &out, err));
    }
    f->vals[y->id] = out;
    f->owned[y->id] = true;
    return KILN_OK;
}

static bool reads_type_only(const kiln_node *n) { return n->op->flags & KILN_OP_READS_TYPE_ONLY; }

static bool all_const(const kiln_type *t)
{
    if (t->kind != KILN_VALUE_TENSOR || t->rank < 0 || !kiln_dtype_valid(t->dtype)) return false;
    for (int k = 0; k < t->rank; k++)
        if (!kiln_dim_is_const(t->dims[k])) return false;
    return true;
}

/* An output tensor: in the arena slot the plan gave the value when it fits, else on the
 * heap; zeroed for reference kernels (`zero`), left as it is for provider kernels, which write
 * every element. On the GPU: in the device arena's slot or the device pool, not zeroed. */
static void scratch_release(void *data, void *scratch) { kiln_scratch_put(scratch, data); }

/* An intermediate tensor the plan could not place (its size is decided at run time), in a block
 * of the session's scratch: from glibc, the large ones were mapped afresh on every run. */
static kiln_status scratch_tensor(kiln_scratch *scratch, const kiln_type *t, const int64_t *dims, bool zero,
                                  kiln_value **out, kiln_err *err)
{
    int64_t numel;
    KILN_TRY(kiln_dims_numel(t->rank, dims, &numel, err));
    size_t nbytes = (size_t)numel * kiln_dtype_size(t->dtype);
    void *p = nbytes ? kiln_scratch_get(scratch, nbytes) : NULL;
    if (nbytes && !p) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory allocating %zu bytes", nbytes);
    kiln_status st = kiln_value_view(t->dtype, t->rank, dims, p, out, err);
    if (st) {
        kiln_scratch_put(scratch, p);
        return st;
    }
    if (p) {
        (*out)->owns_data = true;
        (*out)->release = scratch_release;
        (*out)->release_ctx = scratch;
        if (zero) memset(p, 0, nbytes);
#ifndef NDEBUG
        else memset(p, 0xff, nbytes);
#endif
    }
    return KILN_OK;
}

/* The storage the caller gave for main-graph output v (kiln_run_env.out_bind), or NULL. */
static const kiln_value *out_bound(const kiln_frame *f, const kiln_ir_value *v)
{
    if (!v || !v->is_output || f->parent || !f->env || !f->env->out_bind) return NULL;
    for (int j = 0; j < f->g->n_outputs; j++) {
        const kiln_value *b = f->env->out_bind[j];
        if (f->g->outputs[j] == v && b && b->kind == KILN_VALUE_TENSOR) return b;
    }
    return NULL;
}

static kiln_status alloc_output(kiln_frame *f, const kiln_ir_value *v, const kiln_type *t, const int64_t *dims,
                                bool device, bool zero, kiln_value **out, kiln_err *err)
{
    kiln_arena_view *mem = f->mem;
    if (device) {
        int64_t numel;
        KILN_TRY(kiln_dims_numel(t->rank, dims, &numel, err));
        size_t nbytes = (size_t)numel * kiln_dtype_size(t->dtype);
        /* a main-graph output the caller gave device storage for */
        const kiln_value *b = out_bound(f, v);
        if (b && b->on_device && b->dtype == t->dtype && nbytes <= b->nbytes && (!nbytes || b->data))
            return f->env->dev->tensor(f->env->dev_run, t->dtype, t->rank, dims, nbytes ? b->data : NULL, out, err);
        void *dst = v ? arena_slot(f, v->id, true, nbytes) : NULL;
        if (v && mem && mem->offset[v->id] != SIZE_MAX && !dst && nbytes) mem->heap_fallbacks++;
        return f->env->dev->tensor(f->env->dev_run, t->dtype, t->rank, dims, dst, out, err);
    }
    /* a main-graph output the caller gave storage for */
    const kiln_value *b = t->dtype != KILN_DTYPE_STRING ? out_bound(f, v) : NULL;
    if (b && !b->on_device) {
        int64_t numel;
        KILN_TRY(kiln_dims_numel(t->rank, dims, &numel, err));
        if (b->dtype == t->dtype && (size_t)numel <= b->nbytes / kiln_dtype_size(t->dtype) && (!numel || b->data))
            return kiln_value_view(t->dtype, t->rank, dims, numel ? b->data : NULL, out, err);
    }
    /* an arena of 0 bytes (every planned tensor empty) has no base; graph outputs are handed
     * to the caller, never views of the arena */
    if (!mem || !mem->base || !v || v->is_output || mem->offset[v->id] == SIZE_MAX || t->dtype == KILN_DTYPE_STRING) {
        if (v && !v->is_output && t->dtype != KILN_DTYPE_STRING && f->scratch)
            return scratch_tensor(f->scratch, t, dims, zero, out, err);
        if (zero) return kiln_tensor_new(t->dtype, t->rank, dims, out, err);
        KILN_TRY(kiln_tensor_new_unset(t->dtype, t->rank, dims, out, err)); /* a fast kernel writes it all */
#ifndef NDEBUG
        if ((*out)->nbytes && t->dtype != KILN_DTYPE_STRING) memset((*out)->data, 0xff, (*out)->nbytes);
#endif
        return KILN_OK;
    }
    kiln_value *x;
    KILN_TRY(kiln_value_view(t->dtype, t->rank, dims, mem->base + mem->offset[v->id], &x, err));
    if (x->nbytes > mem->size[v->id]) {
        /* inference at run time disagrees with the compile-time size: never overrun */
        kiln_value_free(x);
        mem->heap_fallbacks++;
        return kiln_tensor_new(t->dtype, t->rank, dims, out, err);
    }
    /* an in-place output shares its input's bytes: the kernel reads them before writing */
    if (x->nbytes && !mem->in_place[v->id]) {
        if (zero) memset(x->data, 0, x->nbytes);
#ifndef NDEBUG
        else memset(x->data, 0xff, x->nbytes); /* debug builds: an element a kernel forgets reads as NaN */
#endif
    }
    *out = x;
    return KILN_OK;
}

/* Whether x, the value of input v, has the shape v's plan evaluated (a constant's type is its
 * own): then the node's compile-time inference holds for this call. */
static bool input_planned(const kiln_frame *f, const kiln_ir_value *v, const kiln_value *x)
{
    if (x == v->init && !v->is_input) return true;
    while (f && f->g != v->graph) f = f->parent;
    const kiln_plan *p = f ? f->plan : NULL;
    if (!p || !p->vok[v->id] || x->kind != KILN_VALUE_TENSOR || x->on_device) return false;
    int r = p->rank[v->id];
    return x->rank == r && x->dtype == v->type.dtype &&
           (!r || !memcmp(x->dims, p->vdims + p->dim_at[v->id], (size_t)r * sizeof x->dims[0]));
}

/* Hands the kernel's outputs out[] over to the frame. */
static kiln_status keep_outputs(const kiln_node *n, kiln_frame *f, kiln_value **out, kiln_err *err)
{
    for (int i = 0; i < n->n_out; i++) {
        kiln_ir_value *v = n->out[i];
        if (!v) {
            kiln_value_free(out[i]);
            out[i] = NULL;
            continue;
        }
        if (!out[i])
            return kiln_errf(err, KILN_ERR_RUNTIME, "node '%s' (%s): kernel produced no output %d", n->name,
                             n->op_type, i);
        f->vals[v->id] = out[i];
        f->owned[v->id] = true;
        out[i] = NULL;
    }
    return KILN_OK;
}

/* Runs n with the output shapes of the frame's plan, when every input has the shape the plan
 * gave it (*ran false otherwise, nothing done: the caller infers). No allocation besides the
 * outputs' headers. */
static kiln_status run_planned(const kiln_node *n, kiln_frame *f, bool *ran, kiln_err *err)
{
    const kiln_plan *p = f->plan;
    const kiln_value *in[KILN_PLANNED_MAX_IO];
    kiln_value *out[KILN_PLANNED_MAX_IO];
    *ran = false;
    for (int i = 0; i < n->n_in; i++) {
        in[i] = n->in[i] ? frame_get(f, n->in[i]) : NULL;
        if (n->in[i] && (!in[i] || !input_planned(f, n->in[i], in[i]))) return KILN_OK;
    }
    *ran = true;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n->n_out; i++) out[i] = NULL;
    for (int i = 0; i < n->n_out && !st; i++) {
        const kiln_ir_value *v = n->out[i];
        st = alloc_output(f, v, &v->type, p->vdims + p->dim_at[v->id], false, !n->kernel, &out[i], err);
        if (st) kiln_err_prefix(err, "node '%s' (%s): output %d", n->name, n->op_type, i);
    }
    if (!st) {
        kiln_run_ctx rc = {.node = n, .frame = f, .in = in, .out = out, .err = err, .pool = f->pool,
                           .scratch = f->scratch};
        st = n->kernel ? n->kernel(&rc) : n->op->run(&rc);
    }
    if (!st) st = keep_outputs(n, f, out, err);
    if (st)
        for (int i = 0; i < n->n_out; i++) kiln_value_free(out[i]);
    return st;
}

/* Nodes with at most this many inputs and outputs keep their run-time types on the stack. */
#define RUN_NODE_STACK_IO 8

static kiln_status run_node(const kiln_node *n, kiln_frame *f, kiln_err *err)
{
    if (!n->op || !n->op->run)
        return kiln_errf(err, KILN_ERR_UNSUPPORTED, "node '%s': operator %s%s%s (opset %d) is not supported",
                         n->name, n->domain, *n->domain ? "." : "", n->op_type, n->opset);
    if (n->op->flags & KILN_OP_COPY) return run_copy(n, f, err);
    if (f->plan && f->plan->node_ok[n->index] && !(f->env && f->env->dev)) {
        bool ran;
        kiln_status st = run_planned(n, f, &ran, err);
        if (st || ran) return st;
    }
    /* the run-time types: on the stack for small nodes, else on the heap (subgraphs recurse
     * through here) */
    size_t ni = (size_t)n->n_in + 1, no = (size_t)n->n_out + 1;
    size_t bytes = ni * (sizeof(kiln_value *) + sizeof(kiln_type) + sizeof(kiln_type *)) +
                   no * (sizeof(kiln_type) + sizeof(kiln_value *));
    _Alignas(kiln_type) unsigned char stack[(RUN_NODE_STACK_IO + 1) *
                                            (2 * sizeof(kiln_type) + 3 * sizeof(kiln_value *) + sizeof(kiln_type *))];
    bool small = ni <= RUN_NODE_STACK_IO + 1 && no <= RUN_NODE_STACK_IO + 1;
    void *scratch = small ? stack : calloc(1, bytes);
    if (!scratch) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    if (small) memset(scratch, 0, bytes);
    kiln_type *in_type_store = scratch;
    kiln_type *out_type = in_type_store + ni;
    const kiln_value **in = (const kiln_value **)(out_type + no);
    const kiln_type **in_type = (const kiln_type **)(in + ni);
    kiln_value **out = (kiln_value **)(in_type + ni);
    kiln_status st = KILN_OK;
    /* device runs place each input where the node reads it */
    const kiln_provider_i *dev = f->env ? f->env->dev : NULL;
    bool on_dev = dev && n->on_device;
    for (int i = 0; i < n->n_in; i++) {
        if (dev && n->in[i] && !(!on_dev && reads_type_only(n))) {
            bool device = on_dev && !(n->host_inputs & (1u << i));
            st = value_at(f, n->in[i], device, false, &in[i], err);
            if (st) goto fail;
        } else {
            in[i] = n->in[i] ? frame_get(f, n->in[i]) : NULL;
        }
        if (n->in[i] && !in[i]) {
            st = kiln_errf(err, KILN_ERR_RUNTIME, "node '%s' (%s): input '%s' has no value", n->name,
                           n->op_type, n->in[i]->name);
            goto fail;
        }
        kiln_type_of_value(in[i], &in_type_store[i]);
        in_type[i] = in[i] ? &in_type_store[i] : NULL;
    }
    for (int i = 0; i < n->n_out; i++) {
        kiln_type_unknown(&out_type[i]);
        out[i] = NULL;
    }
    if (n->op->infer) {
        kiln_infer_ctx ic = {.node = n, .in = in_type, .in_val = in, .out = out_type, .err = err};
        st = n->op->infer(&ic);
        if (st) goto fail;
    }
    for (int i = 0; i < n->n_out; i++) {
        if (!all_const(&out_type[i])) continue;
        int64_t dims[KILN_MAX_RANK];
        for (int k = 0; k < out_type[i].rank; k++) dims[k] = out_type[i].dims[k].c;
        st = alloc_output(f, n->out[i], &out_type[i], dims, on_dev, !n->kernel, &out[i], err);
        if (st) {
            kiln_err_prefix(err, "node '%s' (%s): output %d", n->name, n->op_type, i);
            goto fail;
        }
    }
    /* subgraphs run with the pool of the main graph's run */
    kiln_run_ctx rc = {.node = n, .frame = f, .in = in, .out = out, .err = err, .pool = f->pool,
                       .scratch = f->scratch, .dev = on_dev ? f->env->dev_run : NULL, .subgraph = run_subgraph};
    st = n->kernel ? n->kernel(&rc) : n->op->run(&rc);
    if (st) goto fail;
    if (dev) dev->count_node(f->env->dev_run, on_dev);
    st = keep_outputs(n, f, out, err);
    if (st) goto fail;
    if (!small) free(scratch);
    return KILN_OK;
fail:
    for (int i = 0; i < n->n_out; i++) kiln_value_free(out[i]);
    if (!small) free(scratch);
    return st;
}

/* Testing hook: reverses the elements of v in place, the values kept in the wrong places. */
static void reverse_elements(kiln_value *v)
{
    if (!v || v->kind != KILN_VALUE_TENSOR || v->numel < 2) return;
    size_t es = kiln_dtype_size(v->dtype);
    unsigned char *p = v->data, tmp[16];
    for (int64_t i = 0, j = v->numel - 1; i < j; i++, j--) {
        memcpy(tmp, p + (size_t)i * es, es);
        memcpy(p + (size_t)i * es, p + (size_t)j * es, es);
        memcpy(p + (size_t)j * es, tmp, es);
    }
}

/* Tells the observer about node n (host copies of device values); nonzero from it stops
 * the run. */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static kiln_status observe(const kiln_run_env *env, const kiln_node *n, kiln_frame *f, double started,
                           kiln_err *err)
{
    const char *names_store[64], *onames_store[64];
    const kiln_value *in_store[64], *out_store[64];
    if (n->n_in > 64 || n->n_out > 64) return KILN_OK; /* such nodes are not shown */
    for (int i = 0; i < n->n_in; i++) {
        names_store[i] = n->in[i] ? n->in[i]->name : "";
        in_store[i] = NULL;
        if (n->in[i] && env->dev) KILN_TRY(value_at(f, n->in[i], false, true, &in_store[i], err));
        else if (n->in[i]) in_store[i] = frame_get(f, n->in[i]);
    }
    for (int i = 0; i < n->n_out; i++) {
        onames_store[i] = n->out[i] ? n->out[i]->name : "";
        out_store[i] = NULL;
        if (n->out[i] && env->dev) KILN_TRY(value_at(f, n->out[i], false, true, &out_store[i], err));
        else if (n->out[i]) out_store[i] = f->vals[n->out[i]->id];
    }
    double ms = now_ms() - started;
    /* values in a provider's private layout (kiln_layout) are shown as plain copies */
    kiln_value *plain[128];
    int n_plain = 0;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n->n_in + n->n_out && !st; i++) {
        const kiln_ir_value *iv = i < n->n_in ? n->in[i] : n->out[i - n->n_in];
        const kiln_value **shown = i < n->n_in ? &in_store[i] : &out_store[i - n->n_in];
        if (!iv || iv->layout == KILN_LAYOUT_PLAIN || !*shown || !env->host->to_plain) continue;
        st = env->host->to_plain(iv, *shown, &plain[n_plain], err);
        if (!st && plain[n_plain]) *shown = plain[n_plain++];
    }
    int stop = 0;
    if (!st) {
        kiln_node_event ev = {.node = env->node_ids ? env->node_ids[n->index] : n->index,
                              .node_name = n->name, .op_type = n->op_type,
                              .n_inputs = n->n_in, .input_names = names_store, .inputs = in_store,
                              .n_outputs = n->n_out, .output_names = onames_store, .outputs = out_store,
                              .ms = ms};
        stop = env->observer(env->observer_user, &ev);
    }
    for (int i = 0; i < n_plain; i++) kiln_value_free(plain[i]);
    if (st) return st;
    if (stop)
        return kiln_errf(err, KILN_ERR_RUNTIME, "run stopped by the observer after node '%s' (%s)", n->name, n->op_type);
    return KILN_OK;
}

kiln_status kiln_output_place(const kiln_run_env *env, int j, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    const kiln_provider_i *d = env ? env->dev : NULL;
    const kiln_value *b = env && env->out_bind ? env->out_bind[j] : NULL;
    bool to_dev = env && env->out_device && env->out_device[j] && x->kind == KILN_VALUE_TENSOR && x->dtype != KILN_DTYPE_STRING;
    bool fits = b && b->kind == KILN_VALUE_TENSOR && b->on_device == to_dev && b->dtype == x->dtype &&
                x->nbytes <= b->nbytes && b->data && x->nbytes;
    void *dst = fits ? b->data : NULL;
    /* a kernel wrote it into the caller's device memory already: a view of it */
    if (b && b->kind == KILN_VALUE_TENSOR && b->on_device && x->on_device && b->data && b->data == x->data)
        return d->tensor(env->dev_run, x->dtype, x->rank, x->dims, x->data, out, err);
    if (to_dev) return dst ? d->to_device(env->dev_run, NULL, x, dst, out, err) : d->output(env->dev_run, x, out, err);
    if (x->on_device) return d->to_host(env->dev_run, x, dst, out, err);
    if (!dst) return kiln_value_copy(x, out, err);
    KILN_TRY(kiln_value_view(x->dtype, x->rank, x->dims, dst, out, err));
    if (dst != x->data) memcpy(dst, x->data, x->nbytes);
    return KILN_OK;
}

kiln_status kiln_execute(const kiln_graph *g, const kiln_frame *parent, const kiln_run_env *env,
                         const kiln_value *const *inputs, kiln_value **outputs, kiln_err *err)
{
    kiln_frame f = {.g = g, .parent = parent, .env = env};
    if (env) {
        f.mem = env->mem;
        f.plan = env->plan;
        f.syms = env->syms;
        f.n_syms = env->n_syms;
        f.pool = env->pool;
        f.scratch = env->scratch;
    } else if (parent) {
        f.pool = parent->pool;
        f.scratch = parent->scratch;
    }
    return exec_frame(&f, inputs, outputs, err);
}

/* Runs f's graph (f set up but for its value arrays). */
static kiln_status exec_frame(kiln_frame *f_, const kiln_value *const *inputs, kiln_value **outputs, kiln_err *err)
{
    kiln_frame f = *f_;
    const kiln_graph *g = f.g;
    const kiln_run_env *env = f.env;
    for (int j = 0; j < g->n_outputs; j++) outputs[j] = NULL;
    kiln_status st = frame_init(&f, env && env->dev, err);
    if (st) return st;
    for (int i = 0; i < g->n_inputs; i++) {
        const kiln_value *v = inputs && inputs[i] ? inputs[i] : g->inputs[i]->init;
        f.vals[g->inputs[i]->id] = (kiln_value *)v; /* borrowed, never written */
    }
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        double started = env && env->observer ? now_ms() : 0;
        st = run_node(n, &f, err);
        if (st) goto out;
        if (env && env->fault_node && n->n_out && n->out[0] && !strcmp(n->name, env->fault_node) &&
            f.vals[n->out[0]->id] && !f.vals[n->out[0]->id]->on_device)
            reverse_elements(f.vals[n->out[0]->id]);
        if (env && env->observer) {
            st = observe(env, n, &f, started, err);
            if (st) goto out;
        }
        for (int r = 0; r < n->n_release; r++) {
            int id = n->release[r]->id;
            if (f.owned[id]) {
                kiln_value_free(f.vals[id]);
                f.owned[id] = false;
            }
            f.vals[id] = NULL;
            if (f.alt) {
                kiln_value_free(f.alt[id]);
                f.alt[id] = NULL;
            }
        }
    }
    for (int j = 0; j < g->n_outputs; j++) {
        const kiln_ir_value *v = g->outputs[j];
        if (v->graph == g && f.vals[v->id] && f.vals[v->id]->on_device) {
            const kiln_value *x = f.vals[v->id];
            const kiln_provider_i *dev = env->dev;
            if (dev->capturing && dev->capturing(env->dev_run)) {
                /* recording: a device view, placed after each launch; the caller's device
                 * storage a kernel wrote (its address is in the recording's key) as it is */
                const kiln_value *b = env->out_bind ? env->out_bind[j] : NULL;
                st = b && b->on_device && b->data && b->data == x->data
                         ? dev->tensor(env->dev_run, x->dtype, x->rank, x->dims, x->data, &outputs[j], err)
                         : dev->capture_output(env->dev_run, x, &outputs[j], err);
                if (st) goto out;
                continue;
            }
            /* a new tensor for the caller, or the caller's storage */
            st = kiln_output_place(env, j, x, &outputs[j], err);
            if (st) goto out;
            continue;
        }
        if (env && env->dev && env->dev->unrecordable)
            env->dev->unrecordable(env->dev_run, "output '%s' is computed on the host", v->name);
        const kiln_value *src = NULL;
        if (v->graph == g && f.owned[v->id]) {
            src = f.vals[v->id];
        } else {
            for (int p = 0; p < j && !src; p++)
                if (g->outputs[p] == v) src = outputs[p];
            if (!src) src = frame_get(&f, v);
            if (!src) {
                st = kiln_errf(err, KILN_ERR_RUNTIME, "graph output '%s' has no value", v->name);
                goto out;
            }
        }
        bool to_dev = env && env->out_device && env->out_device[j] && src->kind == KILN_VALUE_TENSOR &&
                      src->dtype != KILN_DTYPE_STRING;
        if (!to_dev && !src->on_device && v->graph == g && src == f.vals[v->id] && f.owned[v->id]) {
            /* hand over the frame's value; a second listing of it gets a copy */
            outputs[j] = f.vals[v->id];
            f.owned[v->id] = false;
            continue;
        }
        st = kiln_output_place(env, j, src, &outputs[j], err);
        if (st) goto out;
    }
out:
    if (st)
        for (int j = 0; j < g->n_outputs; j++) {
            kiln_value_free(outputs[j]);
            outputs[j] = NULL;
        }
    frame_release(&f);
    return st;
}

/* run.c - the run loop: walks a graph's nodes in order, runs each op's inference with the
 * actual input types, allocates outputs, runs the kernel, releases values after their last
 * reader. Frames chain to give subgraphs their outer-scope values. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/scratch.h"
#include "exec/ctx.h"

/* kiln_run_subgraph's executor side (kiln_run_ctx.subgraph). */
static kiln_status run_subgraph(kiln_run_ctx *c, const kiln_graph *g, const kiln_value *const *in, kiln_value **out)
{
    return kiln_execute(g, c->frame, NULL, in, out, c->err);
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

static void frame_release(kiln_frame *f)
{
    for (int i = 0; i < f->g->n_values; i++) {
        if (f->owned[i]) kiln_value_free(f->vals[i]);
        if (f->alt) kiln_value_free(f->alt[i]);
    }
    free(f->vals);
    free(f->owned);
    free(f->alt);
}

/* The planned slot of value id in the host or device arena, or NULL. */
static void *arena_slot(const kiln_frame *f, int id, bool device, size_t nbytes)
{
    const kiln_arena_view *mem = f->env ? f->env->mem : NULL;
    unsigned char *base = !mem ? NULL : device ? mem->device_base : mem->base;
    if (!base || mem->offset[id] == SIZE_MAX || nbytes > mem->size[id]) return NULL;
    return base + mem->offset[id];
}

/* Device runs (main graph): main-graph value v in device or host memory. The first reader on the
 * other side gets a copy, kept in f->alt for later readers and placed in v's arena slot of
 * that side when v has one. */
static kiln_status value_at(kiln_frame *f, const kiln_ir_value *v, bool device, const kiln_value **out, kiln_err *err)
{
    const kiln_value *p = f->vals[v->id] ? f->vals[v->id] : v->init;
    *out = p;
    if (!p || p->kind != KILN_VALUE_TENSOR || p->on_device == device) return KILN_OK;
    if (!f->alt[v->id]) {
        void *dst = arena_slot(f, v->id, device, p->nbytes);
        const kiln_provider_i *dev = f->env->dev;
        kiln_provider_run *r = f->env->dev_run;
        /* a download makes what the host computes next depend on the inputs' contents: the
         * run cannot be recorded (uploads can: see kiln_provider_i.capture_mode) */
        if (!device && dev->unrecordable) dev->unrecordable(r, "'%s' is copied to the host in the middle of the run", v->name);
        KILN_TRY(device ? dev->to_device(r, v, p, dst, &f->alt[v->id], err)
                        : dev->to_host(r, p, dst, &f->alt[v->id], err));
    }
    *out = f->alt[v->id];
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
 * every element. On the device: in the device arena's slot or the device pool, not zeroed. */
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

static kiln_status alloc_output(kiln_frame *f, const kiln_ir_value *v, const kiln_type *t, const int64_t *dims,
                                bool device, bool zero, kiln_value **out, kiln_err *err)
{
    kiln_arena_view *mem = f->env ? f->env->mem : NULL;
    if (device) {
        int64_t numel;
        KILN_TRY(kiln_dims_numel(t->rank, dims, &numel, err));
        size_t nbytes = (size_t)numel * kiln_dtype_size(t->dtype);
        void *dst = v ? arena_slot(f, v->id, true, nbytes) : NULL;
        if (v && mem && mem->offset[v->id] != SIZE_MAX && !dst && nbytes) mem->heap_fallbacks++;
        return f->env->dev->tensor(f->env->dev_run, t->dtype, t->rank, dims, dst, out, err);
    }
    /* an arena of 0 bytes (every planned tensor empty) has no base; graph outputs are handed
     * to the caller, never views of the arena */
    if (!mem || !mem->base || !v || v->is_output || mem->offset[v->id] == SIZE_MAX || t->dtype == KILN_DTYPE_STRING) {
        if (v && !v->is_output && t->dtype != KILN_DTYPE_STRING && f->env && f->env->scratch)
            return scratch_tensor(f->env->scratch, t, dims, zero, out, err);
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

static kiln_status run_node(const kiln_node *n, kiln_frame *f, kiln_err *err)
{
    if (!n->op || !n->op->run)
        return kiln_errf(err, KILN_ERR_UNSUPPORTED, "node '%s': operator %s%s%s (opset %d) is not supported",
                         n->name, n->domain, *n->domain ? "." : "", n->op_type, n->opset);
    /* per-node scratch on the heap: subgraphs recurse through here */
    size_t ni = (size_t)n->n_in + 1, no = (size_t)n->n_out + 1;
    void *scratch = calloc(1, ni * (sizeof(kiln_value *) + sizeof(kiln_type) + sizeof(kiln_type *)) +
                                  no * (sizeof(kiln_type) + sizeof(kiln_value *)));
    if (!scratch) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    kiln_type *in_type_store = scratch;
    kiln_type *out_type = in_type_store + ni;
    const kiln_value **in = (const kiln_value **)(out_type + no);
    const kiln_type **in_type = (const kiln_type **)(in + ni);
    kiln_value **out = (kiln_value **)(in_type + ni);
    kiln_status st = KILN_OK;
    /* device runs place each input where the node reads it */
    const kiln_provider_i *dev = f->env ? f->env->dev : NULL;
    bool on_dev = dev && n->on_device;
    if (dev && !n->on_device && kiln_node_has_subgraphs(n))
        /* subgraphs read outer values through frame_get: give every device value a host copy */
        for (int id = 0; id < f->g->n_values && !st; id++)
            if (f->vals[id] && f->vals[id]->on_device) {
                const kiln_value *unused;
                st = value_at(f, f->g->values[id], false, &unused, err);
            }
    if (st) goto fail;
    for (int i = 0; i < n->n_in; i++) {
        if (dev && n->in[i] && !(!on_dev && reads_type_only(n))) {
            bool device = on_dev && !(n->host_inputs & (1u << i));
            /* the host reading a graph input's contents: a recording would keep them */
            if (!device && n->in[i]->is_input && !n->in[i]->init && dev->unrecordable)
                dev->unrecordable(f->env->dev_run, "node '%s' (%s) reads input '%s' on the host", n->name, n->op_type,
                                  n->in[i]->name);
            st = value_at(f, n->in[i], device, &in[i], err);
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
    const kiln_frame *top = f;
    while (top->parent) top = top->parent;
    kiln_run_ctx rc = {.node = n, .frame = f, .in = in, .out = out, .err = err,
                       .pool = top->env ? top->env->pool : NULL, .scratch = top->env ? top->env->scratch : NULL,
                       .dev = on_dev ? f->env->dev_run : NULL, .subgraph = run_subgraph};
    st = n->kernel ? n->kernel(&rc) : n->op->run(&rc);
    if (st) goto fail;
    if (dev) dev->count_node(f->env->dev_run, on_dev);
    for (int i = 0; i < n->n_out; i++) {
        kiln_ir_value *v = n->out[i];
        if (!v) {
            kiln_value_free(out[i]);
            continue;
        }
        if (!out[i]) {
            st = kiln_errf(err, KILN_ERR_RUNTIME, "node '%s' (%s): kernel produced no output %d", n->name,
                           n->op_type, i);
            goto fail;
        }
        f->vals[v->id] = out[i];
        f->owned[v->id] = true;
        out[i] = NULL;
    }
    free(scratch);
    return KILN_OK;
fail:
    for (int i = 0; i < n->n_out; i++) kiln_value_free(out[i]);
    free(scratch);
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
        if (n->in[i] && env->dev) KILN_TRY(value_at(f, n->in[i], false, &in_store[i], err));
        else if (n->in[i]) in_store[i] = frame_get(f, n->in[i]);
    }
    for (int i = 0; i < n->n_out; i++) {
        onames_store[i] = n->out[i] ? n->out[i]->name : "";
        out_store[i] = NULL;
        if (n->out[i] && env->dev) KILN_TRY(value_at(f, n->out[i], false, &out_store[i], err));
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

kiln_status kiln_execute(const kiln_graph *g, const kiln_frame *parent, const kiln_run_env *env,
                         const kiln_value *const *inputs, kiln_value **outputs, kiln_err *err)
{
    kiln_frame f = {.g = g, .parent = parent, .env = env};
    f.vals = calloc((size_t)g->n_values + 1, sizeof *f.vals);
    f.owned = calloc((size_t)g->n_values + 1, sizeof *f.owned);
    if (env && env->dev) f.alt = calloc((size_t)g->n_values + 1, sizeof *f.alt);
    for (int j = 0; j < g->n_outputs; j++) outputs[j] = NULL;
    if (!f.vals || !f.owned || (env && env->dev && !f.alt)) {
        free(f.vals);
        free(f.owned);
        free(f.alt);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    kiln_status st = KILN_OK;
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
                /* recording: a device view, downloaded after each launch */
                st = dev->capture_output(env->dev_run, x, &outputs[j], err);
                if (st) goto out;
                continue;
            }
            /* a new tensor for the caller */
            st = env->device_outputs ? dev->output(env->dev_run, x, &outputs[j], err)
                                     : dev->to_host(env->dev_run, x, NULL, &outputs[j], err);
            if (st) goto out;
            continue;
        }
        if (env && env->dev && env->dev->unrecordable)
            env->dev->unrecordable(env->dev_run, "output '%s' is computed on the host", v->name);
        if (v->graph == g && f.owned[v->id]) {
            /* hand over the frame's value; a second listing of it gets a copy */
            outputs[j] = f.vals[v->id];
            f.owned[v->id] = false;
        } else {
            const kiln_value *src = NULL;
            for (int p = 0; p < j && !src; p++)
                if (g->outputs[p] == v) src = outputs[p];
            if (!src) src = frame_get(&f, v);
            if (!src) {
                st = kiln_errf(err, KILN_ERR_RUNTIME, "graph output '%s' has no value", v->name);
                goto out;
            }
            st = src->on_device ? env->dev->output(env->dev_run, src, &outputs[j], err)
                                : kiln_value_copy(src, &outputs[j], err);
            if (st) goto out;
        }
        const kiln_value *h = outputs[j];
        if (env && env->device_outputs && h->kind == KILN_VALUE_TENSOR && h->dtype != KILN_DTYPE_STRING && !h->on_device) {
            kiln_value *host = outputs[j];
            st = env->dev->output(env->dev_run, host, &outputs[j], err);
            kiln_value_free(host);
            if (st) goto out;
        }
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

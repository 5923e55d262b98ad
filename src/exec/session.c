/* session.c - the public session API: create (load, bind ops, infer), describe inputs and
 * outputs, bind input shapes to symbols with checks, run. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/scratch.h"
#include "core/threadpool.h"
#include "exec/ctx.h"
#include "exec/plan.h"
#include "exec/partition.h"
#include "exec/providers.h"
#include "exec/subgraph.h"
#include "exec/test_hooks.h"
#include "onnx/load.h"
#include "passes/pass.h"

struct kiln_session {
    kiln_model *model;
    kiln_session_options opt;
    pthread_mutex_t err_lock;
    char last_error[KILN_ERR_MSG_SIZE];
    /* public inputs (graph inputs without an initializer) and outputs */
    int n_in, n_out;
    kiln_ir_value **in_vals;
    kiln_io_info *in_info, *out_info;
    /* memory planning of the main graph */
    kiln_memprog memprog;
    kiln_plan_cache plans;
    pthread_mutex_t stats_lock;
    kiln_session_stats stats;
    int *node_ids;         /* public (depth-first) index of each main-graph node */
    kiln_threadpool *pool; /* intra-op threads of the optimised kernels; NULL when unoptimized */
    kiln_scratch *scratch; /* run arenas and kernel temporaries kept between runs; NULL when unoptimized */
    const kiln_provider_i *host; /* the CPU provider */
    const kiln_provider_i *dev;  /* the device provider (KILN_PROVIDER_CUDA), or NULL */
    kiln_provider *dev_state;    /* its state: the device and its run contexts */
    char *fault_node;      /* kiln_session_set_test_fault's node name (owned), or NULL */
};

const char *kiln_version(void) { return "0.1.0"; }

bool kiln_provider_available(kiln_provider_kind kind)
{
    return kiln_provider_find(kind) != NULL;
}

kiln_session_options kiln_session_options_default(void)
{
    kiln_session_options o;
    memset(&o, 0, sizeof o);
    o.provider = KILN_PROVIDER_CPU;
    o.plan_cache_size = 16;
    return o;
}

static kiln_status set_error(kiln_session *s, const kiln_err *e)
{
    pthread_mutex_lock(&s->err_lock);
    snprintf(s->last_error, sizeof s->last_error, "%s", e->msg);
    pthread_mutex_unlock(&s->err_lock);
    return e->code;
}

const char *kiln_last_error(const kiln_session *s)
{
    return s ? s->last_error : "no session (creation failed before a session existed)";
}

void kiln_last_error_copy(const kiln_session *s, char *buf, size_t size)
{
    if (!buf || !size) return;
    if (!s) {
        snprintf(buf, size, "%s", kiln_last_error(NULL));
        return;
    }
    kiln_session *m = (kiln_session *)s;
    pthread_mutex_lock(&m->err_lock);
    snprintf(buf, size, "%s", s->last_error);
    pthread_mutex_unlock(&m->err_lock);
}

static kiln_status fill_info(kiln_session *s, const kiln_ir_value *v, kiln_io_info *info, kiln_err *err)
{
    kiln_arena *a = &s->model->arena;
    info->name = v->name;
    info->kind = v->type.kind ? v->type.kind : KILN_VALUE_TENSOR;
    info->dtype = v->type.dtype;
    info->rank = v->type.rank;
    int r = v->type.rank > 0 ? v->type.rank : 0;
    int64_t *dims = kiln_arena_calloc(a, (size_t)r + 1, sizeof *dims);
    const char **names = kiln_arena_calloc(a, (size_t)r + 1, sizeof *names);
    if (!dims || !names) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int k = 0; k < r; k++) {
        kiln_dim d = v->type.dims[k];
        if (kiln_dim_is_const(d)) {
            dims[k] = d.c;
            names[k] = NULL;
        } else {
            char buf[256];
            dims[k] = -1;
            names[k] = kiln_arena_strdup(a, kiln_dim_print(d, buf, sizeof buf));
            if (!names[k]) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        }
    }
    info->dims = dims;
    info->dim_names = names;
    return KILN_OK;
}

/* Nodes inside node n's subgraphs, at any depth. */
static int nested_node_count(const kiln_node *n)
{
    int count = 0;
    for (int a = 0; a < n->n_attrs; a++) {
        const kiln_attr *at = &n->attrs[a];
        int ng = at->type == KILN_ATTR_GRAPH ? 1 : at->type == KILN_ATTR_GRAPHS ? at->n : 0;
        for (int q = 0; q < ng; q++) {
            const kiln_graph *sg = at->type == KILN_ATTR_GRAPH ? at->g : at->graphs[q];
            for (int k = 0; k < sg->n_nodes; k++) count += 1 + nested_node_count(sg->nodes[k]);
        }
    }
    return count;
}

/* Frees what providers prepared for their kernels, subgraphs included. */
static void release_kernels(kiln_graph *g)
{
    for (int k = 0; k < g->n_nodes; k++) {
        kiln_node *n = g->nodes[k];
        if (n->kernel_state_free) n->kernel_state_free(n->kernel_state);
        n->kernel_state = NULL;
        n->kernel_state_free = NULL;
        for (int a = 0; a < n->n_attrs; a++) {
            kiln_attr *at = &n->attrs[a];
            if (at->type == KILN_ATTR_GRAPH) release_kernels(at->g);
            for (int q = 0; at->type == KILN_ATTR_GRAPHS && q < at->n; q++) release_kernels(at->graphs[q]);
        }
    }
}

static kiln_status compile(kiln_session *s, kiln_err *err)
{
    kiln_model *m = s->model;
    kiln_graph *g = m->graph;
    KILN_TRY(kiln_bind_ops(g, !s->opt.allow_unsupported, err));
    /* the first provider's passes before folding, the generic ones, inference, then its own */
    const kiln_provider_i *first = s->dev ? s->dev : s->host;
    if (!s->opt.unoptimized && first->pre_passes)
        KILN_TRY(kiln_passes_run(g, first->pre_passes, first->n_pre_passes, NULL, err));
    if (!s->opt.unoptimized) KILN_TRY(kiln_passes_run(g, kiln_passes_generic, kiln_passes_generic_n, NULL, err));
    KILN_TRY(kiln_graph_infer(g, NULL));
    if (!s->opt.unoptimized && first->passes) KILN_TRY(kiln_passes_run(g, first->passes, first->n_passes, NULL, err));
    kiln_arena *a = &m->arena;
    s->in_vals = kiln_arena_calloc(a, (size_t)g->n_inputs + 1, sizeof *s->in_vals);
    s->in_info = kiln_arena_calloc(a, (size_t)g->n_inputs + 1, sizeof *s->in_info);
    s->out_info = kiln_arena_calloc(a, (size_t)g->n_outputs + 1, sizeof *s->out_info);
    if (!s->in_vals || !s->in_info || !s->out_info) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->n_inputs; i++) {
        if (g->inputs[i]->init) continue;
        s->in_vals[s->n_in] = g->inputs[i];
        KILN_TRY(fill_info(s, g->inputs[i], &s->in_info[s->n_in], err));
        s->n_in++;
    }
    for (int j = 0; j < g->n_outputs; j++) KILN_TRY(fill_info(s, g->outputs[j], &s->out_info[j], err));
    s->n_out = g->n_outputs;
    if (!s->opt.unoptimized) {
        kiln_status st = kiln_threadpool_create(s->opt.num_threads, &s->pool);
        if (st) return kiln_errf(err, st, "cannot start %d threads", s->opt.num_threads);
        s->scratch = kiln_scratch_create();
        if (!s->scratch) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        if (s->dev) KILN_TRY(kiln_partition(g, s->dev, s->dev_state, &s->stats.nodes_gpu, &s->stats.nodes_cpu,
                                            &s->stats.nodes_fallback, err));
        /* a host-only session reads packed weights only: their originals may go (a device
         * provider uploads the originals after this, so its sessions keep them) */
        m->release_packed = !s->dev;
        kiln_select_kernels(g, s->host, NULL, s->dev, s->dev_state);
        m->release_packed = false;
        if (s->dev) KILN_TRY(kiln_insert_copies(g, s->dev, err));
        if (s->dev && s->dev->prepare) KILN_TRY(s->dev->prepare(s->dev_state, g, err));
        KILN_TRY(kiln_subgraphs_compile(g, s->opt.plan_cache_size > 0 ? s->opt.plan_cache_size : 16, err));
    }
    /* after the copy nodes: they are planned like any value */
    KILN_TRY(kiln_memprog_build(g, s->dev != NULL, &s->memprog, err));
    s->node_ids = calloc((size_t)g->n_nodes + 1, sizeof *s->node_ids);
    if (!s->node_ids) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    for (int k = 0, id = 0; k < g->n_nodes; k++) {
        s->node_ids[k] = id;
        id += 1 + nested_node_count(g->nodes[k]);
    }
    s->stats.compilations = 1;
    return KILN_OK;
}

static kiln_status session_new(const kiln_session_options *opt, kiln_session **out)
{
    kiln_session *s = calloc(1, sizeof *s);
    *out = s;
    if (!s) return KILN_ERR_NOMEM;
    pthread_mutex_init(&s->err_lock, NULL);
    pthread_mutex_init(&s->stats_lock, NULL);
    s->opt = opt ? *opt : kiln_session_options_default();
    kiln_plan_cache_init(&s->plans, s->opt.plan_cache_size > 0 ? s->opt.plan_cache_size : 16);
    return KILN_OK;
}

/* The session's providers: the host's table, and the device provider asked for, opened. */
static kiln_status open_providers(kiln_session *s, kiln_err *err)
{
    s->host = kiln_provider_find(KILN_PROVIDER_CPU);
    if (s->opt.provider == KILN_PROVIDER_CPU) {
        if (s->opt.device_outputs)
            return kiln_errf(err, KILN_ERR_INVALID_ARG, "device_outputs needs the CUDA provider");
        return KILN_OK;
    }
    if (s->opt.provider != KILN_PROVIDER_CUDA)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "unknown provider %d", (int)s->opt.provider);
    const kiln_provider_i *d = kiln_provider_find(s->opt.provider);
    if (!d) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "%s", kiln_provider_missing(s->opt.provider));
    if (d->open) KILN_TRY(d->open(&s->opt, &s->dev_state, err));
    s->dev = d;
    return KILN_OK;
}

static void close_providers(kiln_session *s)
{
    if (s->dev && s->dev->close) s->dev->close(s->dev_state);
    s->dev = NULL;
    s->dev_state = NULL;
}

static kiln_status session_finish(kiln_session *s, kiln_status st, kiln_err *err)
{
    if (!st) st = open_providers(s, err);
    if (!st) st = compile(s, err);
    if (st) {
        set_error(s, err);
        close_providers(s);
        if (s->model) release_kernels(s->model->graph);
        if (s->model) kiln_subgraphs_release(s->model->graph);
        kiln_model_free(s->model);
        s->model = NULL;
    }
    return st;
}

kiln_status kiln_session_create(const char *path, const kiln_session_options *opt, kiln_session **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    if (session_new(opt, out)) return KILN_ERR_NOMEM;
    kiln_err err = {0};
    kiln_status st = path ? kiln_onnx_load_file(path, &(*out)->model, &err)
                          : kiln_errf(&err, KILN_ERR_INVALID_ARG, "model path is NULL");
    return session_finish(*out, st, &err);
}

kiln_status kiln_session_create_from_memory(const void *buf, size_t len, const char *base_dir,
                                            const kiln_session_options *opt, kiln_session **out)
{
    if (!out) return KILN_ERR_INVALID_ARG;
    if (session_new(opt, out)) return KILN_ERR_NOMEM;
    kiln_err err = {0};
    kiln_status st = kiln_onnx_load(buf, len, base_dir, &(*out)->model, &err);
    return session_finish(*out, st, &err);
}

void kiln_session_free(kiln_session *s)
{
    if (!s) return;
    close_providers(s);
    if (s->model) release_kernels(s->model->graph);
    if (s->model) kiln_subgraphs_release(s->model->graph);
    kiln_model_free(s->model);
    kiln_memprog_release(&s->memprog);
    kiln_plan_cache_release(&s->plans);
    free(s->node_ids);
    free(s->fault_node);
    kiln_threadpool_free(s->pool);
    kiln_scratch_free(s->scratch);
    pthread_mutex_destroy(&s->err_lock);
    pthread_mutex_destroy(&s->stats_lock);
    free(s);
}

kiln_status kiln_session_set_test_fault(kiln_session *s, const char *node)
{
    if (!s) return KILN_ERR_INVALID_ARG;
    char *copy = node ? strdup(node) : NULL;
    if (node && !copy) return KILN_ERR_NOMEM;
    free(s->fault_node);
    s->fault_node = copy;
    return KILN_OK;
}

int kiln_session_input_count(const kiln_session *s) { return s && s->model ? s->n_in : 0; }
int kiln_session_output_count(const kiln_session *s) { return s && s->model ? s->n_out : 0; }

kiln_status kiln_session_input_info(const kiln_session *s, int i, kiln_io_info *info)
{
    if (!s || !s->model || !info || i < 0 || i >= s->n_in) return KILN_ERR_INVALID_ARG;
    *info = s->in_info[i];
    return KILN_OK;
}

kiln_status kiln_session_output_info(const kiln_session *s, int i, kiln_io_info *info)
{
    if (!s || !s->model || !info || i < 0 || i >= s->n_out) return KILN_ERR_INVALID_ARG;
    *info = s->out_info[i];
    return KILN_OK;
}

/* Checks one input against its declared type and binds its symbolic dims. */
static kiln_status bind_input(const kiln_ir_value *v, const kiln_value *x, int64_t *syms, const char **sym_src,
                              int n_syms, kiln_err *err)
{
    const kiln_type *t = &v->type;
    if (t->kind && x->kind != t->kind)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "input '%s': expected a %s, got a %s", v->name,
                         t->kind == KILN_VALUE_TENSOR ? "tensor" : t->kind == KILN_VALUE_SEQUENCE ? "sequence" : "optional",
                         x->kind == KILN_VALUE_TENSOR ? "tensor" : x->kind == KILN_VALUE_SEQUENCE ? "sequence" : "optional");
    /* an empty optional or an empty sequence of unknown element type fits any element type */
    bool untyped = (x->kind == KILN_VALUE_OPTIONAL && !x->inner) ||
                   (x->kind == KILN_VALUE_SEQUENCE && !x->n_items && x->dtype == KILN_DTYPE_UNDEFINED);
    if (t->dtype && x->dtype != t->dtype && !untyped)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "input '%s': expected element type %s, got %s", v->name,
                         kiln_dtype_name(t->dtype), kiln_dtype_name(x->dtype));
    if (x->kind != KILN_VALUE_TENSOR || t->rank < 0) return KILN_OK;
    if (x->numel && !x->data)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "input '%s': data is NULL", v->name);
    char want[512];
    if (x->rank != t->rank)
        return kiln_errf(err, KILN_ERR_SHAPE, "input '%s': expected rank %d (%s), got rank %d", v->name, t->rank,
                         kiln_type_print(t, want, sizeof want), x->rank);
    for (int k = 0; k < t->rank; k++) {
        kiln_dim d = t->dims[k];
        if (kiln_dim_is_const(d)) {
            if (d.c != x->dims[k])
                return kiln_errf(err, KILN_ERR_SHAPE, "input '%s': dim %d must be %lld (%s), got %lld", v->name, k,
                                 (long long)d.c, kiln_type_print(t, want, sizeof want), (long long)x->dims[k]);
        } else if (d.e->kind == KILN_EXPR_SYM && d.e->sym_index >= 0 && d.e->sym_index < n_syms) {
            int si = d.e->sym_index;
            if (syms[si] >= 0 && syms[si] != x->dims[k])
                return kiln_errf(err, KILN_ERR_SHAPE,
                                 "input '%s': dim %d is '%s' = %lld, but '%s' already bound '%s' = %lld", v->name, k,
                                 d.e->name, (long long)x->dims[k], sym_src[si], d.e->name, (long long)syms[si]);
            syms[si] = x->dims[k];
            sym_src[si] = v->name;
        }
    }
    return KILN_OK;
}

/* Appends "sym = value (from input 'x')" for each symbol in d, once each, to buf. */
static void describe_syms(kiln_dim d, const int64_t *syms, const char *const *sym_src, int n_syms, char *buf,
                          size_t size)
{
    if (!d.e) return;
    if (d.e->kind == KILN_EXPR_SYM) {
        int i = d.e->sym_index;
        if (i < 0 || i >= n_syms || syms[i] < 0) return;
        char item[160];
        snprintf(item, sizeof item, "%s = %lld from input '%s'", d.e->name, (long long)syms[i], sym_src[i]);
        if (strstr(buf, item)) return;
        size_t l = strlen(buf);
        snprintf(buf + l, size - l, "%s%s", l ? ", " : "", item);
        return;
    }
    for (int k = 0; k < d.e->n; k++) describe_syms(d.e->args[k], syms, sym_src, n_syms, buf, size);
}

/* Checks the constraints recorded at compile time against the symbols the inputs bound. */
static kiln_status check_constraints(const kiln_model *m, const int64_t *syms, const char *const *sym_src,
                                     int n_syms, kiln_err *err)
{
    for (int i = 0; i < m->n_constraints; i++) {
        const kiln_constraint *k = &m->constraints[i];
        int64_t a, b;
        if (k->node->graph != m->graph) continue; /* a subgraph's: checked when it is called */
        if (!kiln_dim_eval(k->a, syms, n_syms, &a) || !kiln_dim_eval(k->b, syms, n_syms, &b)) continue;
        if (a == b || (k->broadcast && (a == 1 || b == 1))) continue;
        char ea[128], eb[128], from[512] = "";
        kiln_dim_print(k->a, ea, sizeof ea);
        kiln_dim_print(k->b, eb, sizeof eb);
        describe_syms(k->a, syms, sym_src, n_syms, from, sizeof from);
        describe_syms(k->b, syms, sym_src, n_syms, from, sizeof from);
        return kiln_errf(err, KILN_ERR_SHAPE, "node '%s' (%s): %s: %lld (%s) vs %lld (%s), where %s", k->node->name,
                         k->node->op_type, k->what, (long long)a, ea, (long long)b, eb, from);
    }
    return KILN_OK;
}

/* A device run by its recording (kiln_provider_i.capture_mode): uploads the host inputs into
 * their arena slots (device inputs are read where they are: their addresses are in the key),
 * then records the run (KILN_CAPTURE_RECORD) and launches it, or launches the recording
 * (KILN_CAPTURE_REPLAY); places the outputs into out[]. *done is false when the capture did not
 * give a recording: the caller runs plainly. */
static kiln_status run_recorded(kiln_session *s, kiln_capture_mode mode, const kiln_run_env *env,
                                const int64_t *key, int n_key, const kiln_value **bound, kiln_value **out,
                                bool *done, kiln_err *err)
{
    const kiln_graph *g = s->model->graph;
    const kiln_arena_view *mem = env->mem;
    const kiln_provider_i *d = env->dev;
    kiln_provider_run *r = env->dev_run;
    *done = false;
    kiln_value **dev = calloc((size_t)g->n_inputs + 1, sizeof *dev);
    const kiln_value **in = calloc((size_t)g->n_inputs + 1, sizeof *in);
    kiln_status st = !dev || !in ? kiln_errf(err, KILN_ERR_NOMEM, "out of memory") : KILN_OK;
    for (int i = 0; i < g->n_inputs && !st; i++) {
        const kiln_ir_value *v = g->inputs[i];
        in[i] = bound[i];
        if (!bound[i] || bound[i]->on_device) continue;
        if (bound[i]->kind != KILN_VALUE_TENSOR || mem->offset[v->id] == SIZE_MAX || bound[i]->nbytes > mem->size[v->id])
            goto out; /* not recordable after all: run plainly */
        st = d->to_device(r, NULL, bound[i], mem->device_base + mem->offset[v->id], &dev[i], err);
        in[i] = dev[i];
    }
    if (!st && mode == KILN_CAPTURE_RECORD) {
        st = d->capture_begin(r, err);
        if (st) goto out;
        kiln_err run_err = {0};
        kiln_status ran = kiln_execute(g, NULL, env, in, out, &run_err);
        bool recorded;
        st = d->capture_end(r, key, n_key, ran == KILN_OK, g->n_outputs, out, &recorded, err);
        for (int j = 0; j < g->n_outputs; j++) {
            kiln_value_free(out[j]); /* views of the device outputs, or what a failed capture left */
            out[j] = NULL;
        }
        if (st || !recorded) goto out;
        mode = KILN_CAPTURE_REPLAY;
    }
    if (!st && mode == KILN_CAPTURE_REPLAY) {
        int n_out;
        kiln_value *const *rec;
        st = d->replay(r, key, n_key, &n_out, &rec, err);
        for (int j = 0; j < n_out && !st; j++)
            st = kiln_output_place(env, j, rec[j], &out[j], err);
        *done = true;
    }
out:
    if (dev)
        for (int i = 0; i < g->n_inputs; i++) kiln_value_free(dev[i]);
    free(dev);
    free(in);
    return st;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

kiln_status kiln_session_run(kiln_session *s, int n_in, const char *const *in_names, const kiln_value *const *inputs,
                             int n_out, const char *const *out_names, kiln_value **outputs)
{
    return kiln_session_run_observed(s, n_in, in_names, inputs, n_out, out_names, outputs, NULL, NULL);
}

kiln_status kiln_session_run_tensors(kiln_session *s, int n_in, const char *const *in_names,
                                     const kiln_tensor_desc *inputs, int n_out, const char *const *out_names,
                                     kiln_value **outputs, kiln_tensor_desc *out_desc)
{
    if (!s) return KILN_ERR_INVALID_ARG;
    kiln_err err = {0};
    if (n_in < 0 || (n_in && (!in_names || !inputs)))
        return kiln_errf(&err, KILN_ERR_INVALID_ARG, "invalid input arrays"), set_error(s, &err);
    kiln_value *stack[8] = {0};
    kiln_value **in = n_in <= 8 ? stack : calloc((size_t)n_in, sizeof *in);
    if (!in) return kiln_errf(&err, KILN_ERR_NOMEM, "out of memory"), set_error(s, &err);
    kiln_status st = KILN_OK;
    for (int i = 0; i < n_in && !st; i++) {
        const kiln_tensor_desc *d = &inputs[i];
        if (d->rank < 0 || d->rank > KILN_MAX_RANK ||
            kiln_value_wrap_tensor(d->dtype, d->rank, d->dims, d->data, d->nbytes, &in[i]))
            st = kiln_errf(&err, KILN_ERR_INVALID_ARG,
                           "input '%s': the description (%s, rank %d, %zu bytes) is not a valid host tensor",
                           in_names[i] ? in_names[i] : "(null)", kiln_dtype_name(d->dtype), d->rank, d->nbytes);
    }
    if (st) {
        for (int j = 0; outputs && j < n_out; j++) outputs[j] = NULL;
        set_error(s, &err);
    } else {
        st = kiln_session_run(s, n_in, in_names, (const kiln_value *const *)in, n_out, out_names, outputs);
    }
    for (int i = 0; i < n_in; i++) kiln_value_free(in[i]);
    if (in != stack) free(in);
    for (int j = 0; !st && out_desc && j < n_out; j++) {
        const kiln_value *v = outputs[j];
        kiln_tensor_desc *d = &out_desc[j];
        if (kiln_value_kind_of(v) != KILN_VALUE_TENSOR || kiln_value_on_device(v)) {
            *d = (kiln_tensor_desc){.dtype = KILN_DTYPE_UNDEFINED, .rank = -1};
            continue;
        }
        d->dtype = kiln_value_dtype(v);
        d->rank = kiln_value_rank(v);
        if (d->rank > 0) memcpy(d->dims, kiln_value_dims(v), (size_t)d->rank * sizeof *d->dims);
        d->data = kiln_value_data(v);
        d->nbytes = kiln_value_nbytes(v);
    }
    return st;
}

/* The runs: bind (host storage, kiln_session_run_bound) or ob (kiln_session_run_with_outputs)
 * says where outputs go; both NULL: as the session's options say. */
static kiln_status session_run(kiln_session *s, int n_in, const char *const *in_names,
                               const kiln_value *const *inputs, int n_out, const char *const *out_names,
                               kiln_value **outputs, kiln_observer_fn observer, void *user, kiln_value *const *bind,
                               const kiln_output_binding *ob);

kiln_status kiln_session_run_observed(kiln_session *s, int n_in, const char *const *in_names,
                                      const kiln_value *const *inputs, int n_out, const char *const *out_names,
                                      kiln_value **outputs, kiln_observer_fn observer, void *user)
{
    return session_run(s, n_in, in_names, inputs, n_out, out_names, outputs, observer, user, NULL, NULL);
}

kiln_status kiln_session_run_with_outputs(kiln_session *s, int n_in, const char *const *in_names,
                                          const kiln_value *const *inputs, int n_out, const char *const *out_names,
                                          const kiln_output_binding *bind, kiln_value **outputs)
{
    return session_run(s, n_in, in_names, inputs, n_out, out_names, outputs, NULL, NULL, NULL, bind);
}

kiln_status kiln_session_run_bound(kiln_session *s, int n_in, const char *const *in_names,
                                   const kiln_value *const *inputs, int n_out, const char *const *out_names,
                                   kiln_value **outputs, kiln_value *const *bind)
{
    return session_run(s, n_in, in_names, inputs, n_out, out_names, outputs, NULL, NULL, bind, NULL);
}

static kiln_status session_run(kiln_session *s, int n_in, const char *const *in_names,
                               const kiln_value *const *inputs, int n_out, const char *const *out_names,
                               kiln_value **outputs, kiln_observer_fn observer, void *user, kiln_value *const *bind,
                               const kiln_output_binding *ob)
{
    if (!s) return KILN_ERR_INVALID_ARG;
    int64_t t_start = now_ns(), t_exec = 0;
    kiln_err err = {0};
    kiln_status st = KILN_OK;
    kiln_plan *plan = NULL;
    void *arena = NULL;
    kiln_provider_run *dev_run = NULL;
    for (int j = 0; outputs && j < n_out; j++) outputs[j] = NULL;
    if (!s->model) return set_error(s, &(kiln_err){KILN_ERR_INVALID_ARG, "session failed to load"});
    const kiln_graph *g = s->model->graph;
    if (n_in < 0 || n_out < 0 || (n_in && (!in_names || !inputs)) || (n_out && (!out_names || !outputs)))
        return kiln_errf(&err, KILN_ERR_INVALID_ARG, "invalid input/output arrays"), set_error(s, &err);
    int n_syms = kiln_dimtab_sym_count(s->model->dims);
    const kiln_value **bound = calloc((size_t)g->n_inputs + 1, sizeof *bound);
    /* the symbols' values, then (the GPU's recording key) whether each input with a default
     * initializer was fed (a recording uploads either the fed value or the default), and the
     * addresses of the device memory it reads and writes in place: (index, address) of each
     * device input and each output bound to the caller's device memory */
    int64_t *syms = malloc(((size_t)n_syms + 3 * (size_t)g->n_inputs + 2 * (size_t)g->n_outputs + 1) * sizeof *syms);
    const char **sym_src = calloc((size_t)n_syms + 1, sizeof *sym_src);
    int *out_idx = calloc((size_t)n_out + 1, sizeof *out_idx);
    kiln_value **all_out = calloc((size_t)g->n_outputs + 1, sizeof *all_out);
    const kiln_value **all_bind = bind || ob ? calloc((size_t)g->n_outputs + 1, sizeof *all_bind) : NULL;
    bool *all_dev = ob || s->opt.device_outputs ? calloc((size_t)g->n_outputs + 1, sizeof *all_dev) : NULL;
    if (!bound || !syms || !sym_src || !out_idx || !all_out || ((bind || ob) && !all_bind) ||
        ((ob || s->opt.device_outputs) && !all_dev)) {
        st = kiln_errf(&err, KILN_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_syms; i++) syms[i] = -1;
    for (int i = 0; i < n_in; i++) {
        if (!in_names[i] || !inputs[i]) {
            st = kiln_errf(&err, KILN_ERR_INVALID_ARG, "input %d: name or value is NULL", i);
            goto out;
        }
        int found = -1;
        for (int k = 0; k < g->n_inputs; k++)
            if (!strcmp(g->inputs[k]->name, in_names[i])) found = k;
        if (found < 0) {
            char names[512] = "";
            for (int k = 0; k < s->n_in; k++) {
                size_t l = strlen(names);
                snprintf(names + l, sizeof names - l, "%s'%s'", k ? ", " : "", s->in_vals[k]->name);
            }
            st = kiln_errf(&err, KILN_ERR_INVALID_ARG, "no input named '%s' (inputs: %s)", in_names[i], names);
            goto out;
        }
        if (bound[found]) {
            st = kiln_errf(&err, KILN_ERR_INVALID_ARG, "input '%s' given twice", in_names[i]);
            goto out;
        }
        if (kiln_value_on_device(inputs[i]) && !s->dev) {
            st = kiln_errf(&err, KILN_ERR_INVALID_ARG,
                           "input '%s' is in device memory: only sessions of a device provider (CUDA) take device tensors",
                           in_names[i]);
            goto out;
        }
        st = bind_input(g->inputs[found], inputs[i], syms, sym_src, n_syms, &err);
        if (st) goto out;
        bound[found] = inputs[i];
    }
    int n_key = n_syms;
    for (int k = 0; k < g->n_inputs; k++) {
        if (g->inputs[k]->init) {
            syms[n_key++] = bound[k] != NULL;
        } else if (!bound[k]) {
            st = kiln_errf(&err, KILN_ERR_INVALID_ARG, "input '%s' is required but was not given", g->inputs[k]->name);
            goto out;
        }
        if (bound[k] && bound[k]->on_device) {
            syms[n_key++] = k;
            syms[n_key++] = (int64_t)(intptr_t)bound[k]->data;
        }
    }
    for (int j = 0; j < n_out; j++) {
        out_idx[j] = -1;
        for (int k = 0; out_names[j] && k < g->n_outputs; k++)
            if (!strcmp(g->outputs[k]->name, out_names[j])) out_idx[j] = k;
        if (out_idx[j] < 0) {
            st = kiln_errf(&err, KILN_ERR_INVALID_ARG, "no output named '%s'", out_names[j] ? out_names[j] : "(null)");
            goto out;
        }
        if (bind && bind[j]) all_bind[out_idx[j]] = bind[j];
        if (ob) {
            if (ob[j].on_device && !s->dev) {
                st = kiln_errf(&err, KILN_ERR_INVALID_ARG,
                               "output '%s': only sessions of a device provider (CUDA) hand out device tensors", out_names[j]);
                goto out;
            }
            all_bind[out_idx[j]] = ob[j].storage;
            all_dev[out_idx[j]] = ob[j].on_device;
        }
    }
    for (int k = 0; !ob && s->opt.device_outputs && k < g->n_outputs; k++) all_dev[k] = true;
    st = check_constraints(s->model, syms, sym_src, n_syms, &err);
    if (st) goto out;
    kiln_arena_view mem = {0};
    kiln_run_env env = {.host = s->host, .observer = observer, .observer_user = user, .node_ids = s->node_ids,
                        .out_device = all_dev,
                        .fault_node = s->fault_node, .pool = s->pool, .scratch = s->scratch,
                        .out_bind = all_bind};
    if (!s->opt.unoptimized) {
        st = kiln_plan_cache_get(&s->plans, &s->memprog, syms, n_syms, &plan, &err);
        if (st) goto out;
        arena = plan->peak ? kiln_scratch_get(s->scratch, plan->peak) : NULL; /* 64-byte aligned */
        if (plan->peak && !arena) {
            st = kiln_errf(&err, KILN_ERR_NOMEM, "out of memory allocating a %zu-byte arena", plan->peak);
            goto out;
        }
        mem = (kiln_arena_view){.base = arena, .offset = plan->offset, .size = plan->size, .in_place = plan->in_place};
        env.mem = &mem;
        if (!s->dev) { /* the nodes take the plan's shapes; subgraphs bind their own */
            env.plan = plan;
            env.syms = syms;
            env.n_syms = n_syms;
        }
    }
    const kiln_provider_i *d = s->dev;
    if (d) {
        st = d->run_begin(s->dev_state, plan ? plan->device_peak : 0, &dev_run, &err);
        if (st) goto out;
        mem.device_base = d->run_arena(dev_run);
        env.dev = d;
        env.dev_run = dev_run;
    }
    t_exec = now_ns();
    for (int k = 0; all_bind && k < g->n_outputs; k++)
        if (all_bind[k] && all_bind[k]->on_device) {
            syms[n_key++] = g->n_inputs + k;
            syms[n_key++] = (int64_t)(intptr_t)all_bind[k]->data;
        }
    bool done = false, recordable = d && d->capture_mode && !observer && !s->fault_node;
    kiln_capture_mode mode = recordable ? d->capture_mode(dev_run, syms, n_key) : KILN_CAPTURE_OFF;
    if (mode != KILN_CAPTURE_OFF) st = run_recorded(s, mode, &env, syms, n_key, bound, all_out, &done, &err);
    if (!st && !done) {
        st = kiln_execute(g, NULL, &env, bound, all_out, &err);
        if (!st && recordable) d->capture_note(dev_run, syms, n_key);
    }
    if (dev_run) {
        kiln_status end = d->run_end(s->dev_state, dev_run, st ? NULL : &err);
        dev_run = NULL;
        if (!st) st = end;
    }
    if (st) goto out;
    pthread_mutex_lock(&s->stats_lock);
    s->stats.runs++;
    s->stats.bind_plan_ns += t_exec - t_start;
    s->stats.run_ns += now_ns() - t_start;
    if (plan) {
        int64_t bytes = (int64_t)(plan->peak + plan->device_peak);
        s->stats.arena_last_bytes = bytes;
        s->stats.lower_bound_last_bytes = (int64_t)plan->lower_bound;
        if (bytes > s->stats.arena_peak_bytes) s->stats.arena_peak_bytes = bytes;
    }
    s->stats.heap_fallbacks += mem.heap_fallbacks;
    pthread_mutex_unlock(&s->stats_lock);
    for (int j = 0; j < n_out; j++) {
        int k = out_idx[j];
        if (all_out[k]) {
            outputs[j] = all_out[k];
            all_out[k] = NULL;
        } else {
            /* the same output asked for twice */
            for (int p = 0; p < j && !outputs[j]; p++)
                if (out_idx[p] == k)
                    st = kiln_value_on_device(outputs[p]) ? s->dev->clone(s->dev_state, outputs[p], &outputs[j], &err)
                                                          : kiln_value_copy(outputs[p], &outputs[j], &err);
            if (st) goto out;
        }
    }
out:
    if (dev_run) s->dev->run_end(s->dev_state, dev_run, NULL);
    kiln_scratch_put(s->scratch, arena);
    kiln_plan_cache_put(&s->plans, plan);
    if (all_out)
        for (int k = 0; k < g->n_outputs; k++) kiln_value_free(all_out[k]);
    if (st)
        for (int j = 0; j < n_out; j++) {
            kiln_value_free(outputs[j]);
            outputs[j] = NULL;
        }
    free(bound);
    free(syms);
    free(sym_src);
    free(out_idx);
    free(all_out);
    free(all_bind);
    free(all_dev);
    return st ? set_error(s, &err) : KILN_OK;
}

bool kiln_session_on_device(const kiln_session *s) { return s && s->dev; }

kiln_status kiln_session_device_alloc(kiln_session *s, size_t bytes, void **p)
{
    if (!s || !p || !bytes) return KILN_ERR_INVALID_ARG;
    *p = NULL;
    kiln_err err = {0};
    if (!s->dev || !s->dev->mem_alloc)
        return kiln_errf(&err, KILN_ERR_UNSUPPORTED, "device memory needs a session of a device provider"),
               set_error(s, &err);
    kiln_status st = s->dev->mem_alloc(s->dev_state, bytes, p, &err);
    return st ? set_error(s, &err) : KILN_OK;
}

void kiln_session_device_free(kiln_session *s, void *p)
{
    if (s && s->dev && s->dev->mem_free) s->dev->mem_free(s->dev_state, p);
}

kiln_status kiln_session_stats_get(const kiln_session *s, kiln_session_stats *out)
{
    if (!s || !out) return KILN_ERR_INVALID_ARG;
    kiln_session *m = (kiln_session *)s;
    pthread_mutex_lock(&m->stats_lock);
    *out = s->stats;
    pthread_mutex_unlock(&m->stats_lock);
    pthread_mutex_lock(&m->plans.lock);
    out->plan_cache_hits = s->plans.hits;
    out->plan_cache_misses = s->plans.misses;
    out->plan_cache_entries = s->plans.count;
    out->plan_cache_capacity = s->plans.capacity;
    pthread_mutex_unlock(&m->plans.lock);
    if (s->dev && s->dev->stats) s->dev->stats(s->dev_state, out);
    return KILN_OK;
}

/* ---- model facts ---- */

int64_t kiln_session_ir_version(const kiln_session *s) { return s && s->model ? s->model->ir_version : 0; }
int kiln_session_opset_count(const kiln_session *s) { return s && s->model ? s->model->n_opsets : 0; }

kiln_status kiln_session_opset(const kiln_session *s, int i, const char **domain, int64_t *version)
{
    if (!s || !s->model || i < 0 || i >= s->model->n_opsets) return KILN_ERR_INVALID_ARG;
    if (domain) *domain = s->model->opsets[i].domain;
    if (version) *version = s->model->opsets[i].version;
    return KILN_OK;
}

static const char *or_empty(const char *s) { return s ? s : ""; }

const char *kiln_session_model_string(const kiln_session *s, const char *field)
{
    if (!s || !s->model || !field) return NULL;
    const kiln_model *m = s->model;
    if (!strcmp(field, "producer_name")) return or_empty(m->producer);
    if (!strcmp(field, "producer_version")) return or_empty(m->producer_version);
    if (!strcmp(field, "domain")) return or_empty(m->domain);
    if (!strcmp(field, "doc_string")) return or_empty(m->doc_string);
    if (!strcmp(field, "graph_name")) return or_empty(m->graph ? m->graph->name : NULL);
    if (!strcmp(field, "graph_doc_string")) return or_empty(m->graph_doc_string);
    return NULL;
}

int64_t kiln_session_model_version(const kiln_session *s) { return s && s->model ? s->model->model_version : 0; }
int kiln_session_metadata_count(const kiln_session *s) { return s && s->model ? s->model->n_props : 0; }

kiln_status kiln_session_metadata(const kiln_session *s, int i, const char **key, const char **value)
{
    if (!s || !s->model || i < 0 || i >= s->model->n_props) return KILN_ERR_INVALID_ARG;
    if (key) *key = s->model->prop_keys[i];
    if (value) *value = s->model->prop_values[i];
    return KILN_OK;
}

/* Visits nodes depth-first; returns the node with index *want (counting down), or NULL. */
static const kiln_node *nth_node(const kiln_graph *g, int *want, int *count)
{
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        if (*want == 0) return n;
        (*want)--;
        (*count)++;
        for (int a = 0; a < n->n_attrs; a++) {
            const kiln_attr *at = &n->attrs[a];
            int ng = at->type == KILN_ATTR_GRAPH ? 1 : at->type == KILN_ATTR_GRAPHS ? at->n : 0;
            for (int q = 0; q < ng; q++) {
                const kiln_node *r = nth_node(at->type == KILN_ATTR_GRAPH ? at->g : at->graphs[q], want, count);
                if (r) return r;
            }
        }
    }
    return NULL;
}

int kiln_session_node_count(const kiln_session *s)
{
    if (!s || !s->model) return 0;
    int want = -1, count = 0;
    nth_node(s->model->graph, &want, &count);
    return count;
}

kiln_status kiln_session_node(const kiln_session *s, int i, const char **name, const char **domain,
                              const char **op_type, bool *supported)
{
    if (!s || !s->model || i < 0) return KILN_ERR_INVALID_ARG;
    int want = i, count = 0;
    const kiln_node *n = nth_node(s->model->graph, &want, &count);
    if (!n) return KILN_ERR_INVALID_ARG;
    if (name) *name = n->name;
    if (domain) *domain = n->domain;
    if (op_type) *op_type = n->op_type;
    if (supported) *supported = n->op != NULL;
    return KILN_OK;
}

kiln_status kiln_session_node_placement(const kiln_session *s, int i, const char **provider, const char **why)
{
    if (!s || !s->model || i < 0) return KILN_ERR_INVALID_ARG;
    int want = i, count = 0;
    const kiln_node *n = nth_node(s->model->graph, &want, &count);
    if (!n) return KILN_ERR_INVALID_ARG;
    bool main_graph = n->graph == s->model->graph;
    if (provider) *provider = n->on_device ? s->dev->name : s->host->name;
    if (why)
        *why = !s->dev || n->on_device ? NULL : main_graph ? n->placement_note : "inside a subgraph (runs on the host)";
    return KILN_OK;
}

bool kiln_session_node_fallback(const kiln_session *s, int i)
{
    if (!s || !s->model || !s->dev || i < 0) return false;
    int want = i, count = 0;
    const kiln_node *n = nth_node(s->model->graph, &want, &count);
    return n && n->graph == s->model->graph && n->host_fallback;
}

/* "name=value" of one attribute into buf at *at */
static void describe_attr(const kiln_attr *a, char *buf, size_t size, size_t *at)
{
#define PUT(...) (*at += (size_t)snprintf(buf + *at, *at < size ? size - *at : 0, __VA_ARGS__))
    PUT(" %s=", a->name);
    switch (a->type) {
    case KILN_ATTR_INT: PUT("%lld", (long long)a->i); break;
    case KILN_ATTR_FLOAT: PUT("%g", a->f); break;
    case KILN_ATTR_STRING: PUT("'%s'", a->s); break;
    case KILN_ATTR_INTS:
        PUT("[");
        for (int k = 0; k < a->n; k++) PUT("%s%lld", k ? ", " : "", (long long)a->ints[k]);
        PUT("]");
        break;
    case KILN_ATTR_FLOATS:
        PUT("[");
        for (int k = 0; k < a->n; k++) PUT("%s%g", k ? ", " : "", a->floats[k]);
        PUT("]");
        break;
    case KILN_ATTR_TENSOR: PUT("<tensor %s, %lld elements>", kiln_dtype_name(a->t->dtype), (long long)a->t->numel); break;
    case KILN_ATTR_GRAPH: PUT("<graph>"); break;
    default: PUT("<%d>", (int)a->type); break;
    }
#undef PUT
}

kiln_status kiln_session_node_describe(const kiln_session *s, int i, char *buf, size_t size)
{
    if (!s || !s->model || i < 0 || !buf || !size) return KILN_ERR_INVALID_ARG;
    int want = i, count = 0;
    const kiln_node *n = nth_node(s->model->graph, &want, &count);
    if (!n) return KILN_ERR_INVALID_ARG;
    size_t at = (size_t)snprintf(buf, size, "%s%s%s", n->domain, *n->domain ? "." : "", n->op_type);
    for (int a = 0; a < n->n_attrs; a++) describe_attr(&n->attrs[a], buf, size, &at);
    return KILN_OK;
}

int64_t kiln_session_initializer_bytes(const kiln_session *s)
{
    if (!s || !s->model) return 0;
    int64_t total = 0;
    for (int i = 0; i < s->model->n_owned; i++) total += (int64_t)s->model->owned[i]->nbytes;
    return total;
}

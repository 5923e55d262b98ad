/* exec.h - compilation (op lookup, symbolic inference) and execution of IR graphs. */
#ifndef KILN_EXEC_EXEC_H
#define KILN_EXEC_EXEC_H

#include "core/error.h"
#include "ir/graph.h"
#include "ops/eval.h"

typedef struct kiln_frame kiln_frame;

/* The run's arena and the plan placing tensors in it, by value id of the graph. */
typedef struct kiln_arena_view {
    unsigned char *base;
    unsigned char *device_base; /* device runs: the device arena, placed by the same plan */
    const size_t *offset; /* SIZE_MAX: not planned, allocated on the heap */
    const size_t *size;   /* planned bytes */
    const int *in_place;  /* 1: the value reuses its producer's input 0 slot (not zeroed) */
    int64_t heap_fallbacks; /* tensors that did not fit their slot (counted, not expected) */
} kiln_arena_view;


/* What a run of the main graph carries besides its values. */
typedef struct kiln_run_env {
    kiln_arena_view *mem;      /* places the planned tensors, or NULL: all on the heap */
    kiln_observer_fn observer; /* called after each node, or NULL */
    void *observer_user;
    const int *node_ids;       /* [n_nodes] public node index of each main-graph node */
    const char *fault_node;    /* testing hook: reverse this node's output 0, or NULL */
    struct kiln_threadpool *pool; /* for the kernels' parallel loops, or NULL */
    struct kiln_scratch *scratch; /* the session's reused temporary blocks, or NULL */
    const struct kiln_provider_i *host; /* the host provider (observers see its layouts as plain) */
    const struct kiln_provider_i *dev; /* sessions with a device provider: its table, else NULL */
    struct kiln_provider_run *dev_run; /* and the run's context on it */
    /* device sessions: [g->n_outputs], true where a tensor output is handed to the caller in
     * (caller-owned) device memory; NULL: every output on the host */
    const bool *out_device;
    /* the binding: the plan whose compile-time shapes the nodes take (kiln_plan: vok, node_ok)
     * and the symbols' values, syms[0..n_syms); NULL: every node infers its shapes at run time */
    const struct kiln_plan *plan;
    const int64_t *syms;
    int n_syms;
    /* main-graph outputs the caller gave storage for, by graph output index ([g->n_outputs],
     * entries NULL where not given), or NULL: an output whose dtype matches, whose bytes fit
     * and which goes where out_bind[j] lives (host or device memory) is written into
     * out_bind[j]->data (the value handed out is a view of it) */
    const kiln_value *const *out_bind;
} kiln_run_env;

/* kiln_session_run_observed with storage for outputs (src/genai's KV cache): bind[j], when not
 * NULL, is a tensor whose data becomes the storage of out_names[j] when its dtype matches and
 * the output's bytes fit (then outputs[j] is a view of bind[j]->data and bind[j] must outlive
 * it); otherwise the output is allocated as usual. bind may alias an input (a KV cache shared
 * by past and present). A host bind takes host outputs, and the download of an output the
 * device computed; a device bind (kiln_session_device_alloc memory) takes an output the device
 * computes, which then never leaves the device (such runs are not recorded as CUDA graphs). */
kiln_status kiln_session_run_bound(kiln_session *s, int n_in, const char *const *in_names,
                                   const kiln_value *const *inputs, int n_out, const char *const *out_names,
                                   kiln_value **outputs, kiln_value *const *bind);

/* Whether the session has a device provider (CUDA). */
bool kiln_session_on_device(const kiln_session *s);
/* `bytes` (> 0) of zeroed memory on the session's device, for device binds of
 * kiln_session_run_bound and inputs wrapped with kiln_value_wrap_device_tensor; released with
 * kiln_session_device_free before kiln_session_free. KILN_ERR_UNSUPPORTED without a device
 * provider; the message is the session's last error. */
kiln_status kiln_session_device_alloc(kiln_session *s, size_t bytes, void **p);
/* Releases kiln_session_device_alloc memory; p NULL: nothing. */
void kiln_session_device_free(kiln_session *s, void *p);

/* Graph output j's value x (on the device or the host; borrowed) as the caller gets it, in
 * *out: in device memory when env->out_device[j], else on the host; in env->out_bind[j]'s
 * memory when that lies there and x fits it (a view of it), else a new caller-owned tensor; a
 * view of env->out_bind[j] when a kernel wrote x there already (device binds). */
kiln_status kiln_output_place(const kiln_run_env *env, int j, const kiln_value *x, kiln_value **out, kiln_err *err);

/* Runs graph g. inputs[i] is bound to g->inputs[i] (NULL: use its initializer). On success
 * outputs[j] (j < g->n_outputs) receive owned values. parent gives outer-scope values for
 * subgraphs (NULL for the main graph); env is the main graph's (NULL for subgraphs). */
kiln_status kiln_execute(const kiln_graph *g, const kiln_frame *parent, const kiln_run_env *env,
                         const kiln_value *const *inputs, kiln_value **outputs, kiln_err *err);

#endif

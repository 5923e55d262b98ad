/* provider.h - the execution provider interface: one versioned table of function pointers per
 * provider (src/cpu/provider.c, src/gpu/provider.c), listed in src/exec/providers.c, the one
 * file with a build switch. The core (src/exec/) reaches a provider only through this table;
 * it lives beside op.h because it is the kernels' layer: providers include nothing of src/exec/.
 *
 * A session has a host provider (the CPU) and at most one device provider (a GPU). The core
 * partitions the main graph (src/exec/partition.c): a node goes to the device provider when
 * its supports() accepts it, else to the host; then each provider's select() picks the kernels
 * of its nodes. Members marked optional may be NULL; the core then does what the comment says.
 * Device members (marked "device") are required when `device` is true and unused otherwise. */
#ifndef KILN_OPS_PROVIDER_H
#define KILN_OPS_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>

#include "ops/op.h"
struct kiln_pass; /* src/passes/pass.h */

#define KILN_PROVIDER_API 1

/* A provider's state for one session (its device, uploaded constants, run contexts). Each
 * provider defines the struct; the core only passes the pointer back. */
typedef struct kiln_provider kiln_provider;
/* One run's context on a device provider (a stream, a device arena, staging memory). */
typedef struct kiln_provider_run kiln_provider_run;

/* How a device run of one binding goes, when the provider can record whole runs. */
typedef enum kiln_capture_mode {
    KILN_CAPTURE_OFF,    /* run the executor plainly */
    KILN_CAPTURE_RECORD, /* run the executor while the provider records its device work */
    KILN_CAPTURE_REPLAY, /* launch the recording; the executor does not run */
} kiln_capture_mode;

typedef struct kiln_provider_i {
    int api_version;            /* KILN_PROVIDER_API */
    const char *name;           /* "cpu", "cuda": what kiln info and the node placement report */
    kiln_provider_kind kind;    /* the kiln_session_options.provider value that asks for it */
    bool device;                /* its tensors live in device memory: the device members below */

    /* Optional: opens the provider's state for a session created with opt (opens the device).
     * NULL: the provider keeps no state (its kiln_provider * is NULL). */
    kiln_status (*open)(const kiln_session_options *opt, kiln_provider **out, kiln_err *err);
    /* Optional: frees what open made. Called once per session, also after a failed compile;
     * p may be NULL. */
    void (*close)(kiln_provider *p);

    /* Optional: passes over the bound, not yet inferred main graph, run before the generic
     * pipeline (constant folding) when it is the session's first provider and the session is
     * optimised: rewrites that need what folding would remove (n_pre_passes entries). */
    const struct kiln_pass *pre_passes;
    int n_pre_passes;
    /* Optional: the provider's own pass pipeline (n_passes entries, src/passes/pass.h), run
     * over the inferred main graph when it is the session's first provider and the session is
     * optimised. NULL: no passes of its own. */
    const struct kiln_pass *passes;
    int n_passes;

    /* Optional: whether select() has a kernel for n as compiled (types from compile-time
     * inference, dims may be symbolic; constants known). On false it writes a short reason
     * into why (at most size bytes), which kiln info and kiln_session_node_placement show.
     * NULL: every node that has an op. */
    bool (*supports)(const kiln_provider *p, const kiln_node *n, char *why, size_t size);

    /* Required. The kernel for node n, which the core placed on this provider, or NULL to run
     * n's reference kernel (host providers only: a device provider returns a kernel for every
     * node its supports() accepted). It may prepare data for the kernel (packed weights) in
     * n->kernel_state with its destructor in n->kernel_state_free. *host_inputs receives the
     * mask of inputs the kernel reads in host memory (bit i: input i; device providers; 0 for
     * the host). A selected kernel computes what the reference kernel computes (up to float
     * rounding) for every input the types allow, or fails cleanly; it runs under the contract
     * of kiln_op_def.run, except that its outputs are not zeroed: it writes every element. */
    kiln_kernel_fn (*select)(kiln_provider *p, kiln_node *n, unsigned *host_inputs);

    /* Optional: after every node is placed and has its kernel (uploads the constants its
     * nodes read). NULL: nothing to do. */
    kiln_status (*prepare)(kiln_provider *p, const kiln_graph *g, kiln_err *err);

    /* Optional: adds the provider's counters to the session statistics. */
    void (*stats)(kiln_provider *p, kiln_session_stats *st);

    /* Optional: a plain copy (ONNX layout) of value v of IR value iv when the provider keeps iv
     * in a private layout (iv->layout), for observers; *out NULL when v is plain already.
     * NULL: the provider has no private layouts. */
    kiln_status (*to_plain)(const kiln_ir_value *iv, const kiln_value *v, kiln_value **out, kiln_err *err);

    /* ---- device: runs and memory ---- */
    /* Checks out a run context whose device arena holds at least arena_bytes (bytes). */
    kiln_status (*run_begin)(kiln_provider *p, size_t arena_bytes, kiln_provider_run **out, kiln_err *err);
    /* Waits for the run's work, reports a device error that happened in it (err may be NULL:
     * the run failed already), returns the context. r may be NULL. */
    kiln_status (*run_end)(kiln_provider *p, kiln_provider_run *r, kiln_err *err);
    /* The run's device arena, placed by the session's memory plan. */
    unsigned char *(*run_arena)(kiln_provider_run *r);
    /* Counts one node run, on the device or on the host, for the statistics. */
    void (*count_node)(kiln_provider_run *r, bool on_device);
    /* A device tensor of these dims at dst (a view) or, dst NULL, from the device pool
     * (released with the value). Not zeroed. */
    kiln_status (*tensor)(kiln_provider_run *r, kiln_dtype dt, int rank, const int64_t *dims, void *dst,
                          kiln_value **out, kiln_err *err);
    /* A device copy of host (host memory, or a caller's device tensor) for IR value iv (NULL
     * for graph inputs): the uploaded copy for constants, else placed at dst (NULL: pool). */
    kiln_status (*to_device)(kiln_provider_run *r, const kiln_ir_value *iv, const kiln_value *host, void *dst,
                             kiln_value **out, kiln_err *err);
    /* A host copy of device tensor dev at dst (NULL: a new owned tensor). Waits. */
    kiln_status (*to_host)(kiln_provider_run *r, const kiln_value *dev, void *dst, kiln_value **out, kiln_err *err);
    /* A caller-owned device tensor holding x (on the device or the host), for device_outputs. */
    kiln_status (*output)(kiln_provider_run *r, const kiln_value *x, kiln_value **out, kiln_err *err);
    /* Outside runs: a caller-owned copy of device tensor x. Waits. */
    kiln_status (*clone)(kiln_provider *p, const kiln_value *x, kiln_value **out, kiln_err *err);
    /* Outside runs: `bytes` (> 0) of zeroed device memory on the session's device for a caller
     * that binds it as inputs and outputs (src/genai's KV cache); released with mem_free, before
     * the session closes. Waits. */
    kiln_status (*mem_alloc)(kiln_provider *p, size_t bytes, void **out, kiln_err *err);
    /* Releases what mem_alloc gave (NULL: nothing). Waits. */
    void (*mem_free)(kiln_provider *p, void *ptr);

    /* ---- device, optional: recording whole runs of a binding and replaying them ----
     * All NULL or all set. NULL: every run is plain. The contract of each is in
     * src/gpu/device.h, which implements them with CUDA graphs. */
    kiln_capture_mode (*capture_mode)(kiln_provider_run *r, const int64_t *key, int n);
    /* After a plain run of this binding that succeeded. */
    void (*capture_note)(kiln_provider_run *r, const int64_t *key, int n);
    /* Something in this run cannot be recorded; the first reason is kept for the statistics. */
    void (*unrecordable)(kiln_provider_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    bool (*capturing)(const kiln_provider_run *r);
    kiln_status (*capture_begin)(kiln_provider_run *r, kiln_err *err);
    kiln_status (*capture_output)(kiln_provider_run *r, const kiln_value *x, kiln_value **out, kiln_err *err);
    kiln_status (*capture_end)(kiln_provider_run *r, const int64_t *key, int n, bool ok, int n_out,
                               kiln_value *const *outs, bool *recorded, kiln_err *err);
    kiln_status (*replay)(kiln_provider_run *r, const int64_t *key, int n, int *n_out, kiln_value *const **outs,
                          kiln_err *err);
} kiln_provider_i;

#endif

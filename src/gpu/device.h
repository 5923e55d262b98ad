/* device.h - the CUDA provider's runtime behind its provider table (src/gpu/provider.c):
 * sessions, device memory for a run, copies between host and device, recorded runs.
 * Implemented in src/gpu/runtime.c; nothing outside src/gpu/ includes it.
 *
 * A session owns one kiln_gpu_session: the device, the constants its GPU nodes read (uploaded
 * once), and a pool of run contexts. A run checks out one context - a stream, BLAS handles, a
 * device arena mirroring the memory plan, a workspace, pinned staging memory - so concurrent
 * runs of one session never share one. Arena and workspace only grow: in steady state a run
 * makes no device allocation. */
#ifndef KILN_GPU_DEVICE_H
#define KILN_GPU_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "core/value.h"
#include "ops/provider.h"
#include "ir/graph.h"

/* The CUDA provider's state of a session and of a run are the provider interface's opaque
 * structs (src/exec/provider.h), defined in runtime.c. */
typedef struct kiln_provider kiln_gpu_session;
typedef struct kiln_provider_run kiln_gpu_run;

/* Opens GPU opt->device_id for a session. */
kiln_status kiln_gpu_open(const kiln_session_options *opt, kiln_gpu_session **out, kiln_err *err);
/* After placement and kernel selection of g's main graph (its nodes' on_device and
 * host_inputs are set): counts the nodes of each side and uploads the constants that GPU
 * nodes read. */
kiln_status kiln_gpu_prepare(kiln_gpu_session *gs, const kiln_graph *g, kiln_err *err);
void kiln_gpu_session_free(kiln_gpu_session *gs);
/* Adds the session's device counters to the stats fields of the GPU provider. */
void kiln_gpu_session_stats(kiln_gpu_session *gs, kiln_session_stats *st);

/* Checks out a run context whose device arena has at least arena_bytes. */
kiln_status kiln_gpu_run_begin(kiln_gpu_session *gs, size_t arena_bytes, kiln_gpu_run **out, kiln_err *err);
/* Waits for the run's work, reports a device error that happened in it, and returns the
 * context to the pool. r may be NULL. */
kiln_status kiln_gpu_run_end(kiln_gpu_session *gs, kiln_gpu_run *r, kiln_err *err);
unsigned char *kiln_gpu_run_arena(kiln_gpu_run *r);
void kiln_gpu_run_count_node(kiln_gpu_run *r, bool on_gpu);

/* A device tensor of tensor `host` (host memory, or the caller's device tensor) for IR value
 * iv: the session's upload for constants, else a copy placed at `dst` (NULL: a new device
 * allocation). */
kiln_status kiln_gpu_to_device(kiln_gpu_run *r, const kiln_ir_value *iv, const kiln_value *host, void *dst,
                               kiln_value **out, kiln_err *err);
/* A host copy of device tensor `dev`, placed at `dst` (NULL: a new owned tensor). Waits. */
kiln_status kiln_gpu_to_host(kiln_gpu_run *r, const kiln_value *dev, void *dst, kiln_value **out, kiln_err *err);
/* A caller-owned device tensor (device_outputs) holding x, on the device or the host; from
 * the stream-ordered pool, released by kiln_value_free. */
kiln_status kiln_gpu_output(kiln_gpu_run *r, const kiln_value *x, kiln_value **out, kiln_err *err);
/* Outside runs: a caller-owned copy of device tensor x (an output listed twice). Waits. */
kiln_status kiln_gpu_clone(kiln_gpu_session *gs, const kiln_value *x, kiln_value **out, kiln_err *err);
/* Outside runs: zeroed device memory for the caller (kiln_provider_i.mem_alloc), and its release. */
kiln_status kiln_gpu_mem_alloc(kiln_gpu_session *gs, size_t bytes, void **out, kiln_err *err);
void kiln_gpu_mem_free(kiln_gpu_session *gs, void *p);
/* A device tensor with these dims: at `dst` when not NULL (a view), else a new allocation
 * from the device's stream-ordered pool, released with the value. Not zeroed. */
kiln_status kiln_gpu_tensor(kiln_gpu_run *r, kiln_dtype dt, int rank, const int64_t *dims, void *dst,
                            kiln_value **out, kiln_err *err);

/* ---- CUDA graphs: a binding's run recorded once it repeats, then replayed ----
 * A plain run tells kiln_gpu_graph_note whether it could be recorded: every graph input in
 * its arena slot, no fallback, and nothing the host computes depends on the inputs' contents:
 * no host read of a graph input's elements, no copy from the device to the host inside the
 * run. What the host computes then depends on the binding's shapes and the constants alone,
 * so its copies to the device are recorded too (from pinned bytes the recording keeps), as are
 * the allocations and releases of tensors without an arena slot (from the stream-ordered
 * pool). The next run of that binding is captured: inputs are uploaded first, the executor
 * runs with the stream capturing (host work done, device work recorded), outputs come back as
 * device views (copied out of the pool into memory the recording keeps); the graph is then
 * launched. Later runs upload the
 * inputs, launch the graph and download the outputs, skipping the executor. Each run context
 * keeps a few graphs (LRU); growing its arena or workspace drops them, as they point into
 * both. */
kiln_capture_mode kiln_gpu_graph_mode(kiln_gpu_run *r, const int64_t *key, int n);
/* After a plain run of this binding. */
void kiln_gpu_graph_note(kiln_gpu_run *r, const int64_t *key, int n);
/* Something in this run cannot be recorded (see above): the first reason of a run is kept
 * and shows in the session statistics (graphs_note). */
void kiln_gpu_mark_unrecordable(kiln_gpu_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool kiln_gpu_capturing(const kiln_gpu_run *r);
kiln_status kiln_gpu_capture_begin(kiln_gpu_run *r, kiln_err *err);
/* While capturing: graph output x as a device view that outlives the recording's run (x
 * itself when it lies in the arena, else a recorded copy into memory the recording keeps). */
kiln_status kiln_gpu_capture_output(kiln_gpu_run *r, const kiln_value *x, kiln_value **out, kiln_err *err);
/* Ends the capture. ok: the executor succeeded and outs[0..n_out) are the outputs as device
 * views (borrowed: copied into the graph's record). Returns KILN_OK with *recorded true when
 * the graph was kept; a failed capture marks the binding unrecordable (*recorded false) and
 * the caller runs it plainly. */
kiln_status kiln_gpu_capture_end(kiln_gpu_run *r, const int64_t *key, int n, bool ok, int n_out,
                                 kiln_value *const *outs, bool *recorded, kiln_err *err);
/* Launches the recorded graph of this binding; *outs receives its n_out device outputs
 * (borrowed from the record). */
kiln_status kiln_gpu_replay(kiln_gpu_run *r, const int64_t *key, int n, int *n_out, kiln_value *const **outs,
                            kiln_err *err);

#endif

/* kiln.h - the public C API of kiln, an ONNX inference runtime.
 *
 * Usage (tests/unit/test_api.c compiles and runs this example verbatim):
 *
 *     kiln_session *s = NULL;
 *     kiln_session_options opt = kiln_session_options_default();
 *     if (kiln_session_create("model.onnx", &opt, &s) != KILN_OK) {
 *         fprintf(stderr, "%s\n", kiln_last_error(s));   // s may be NULL: a static message
 *         kiln_session_free(s);
 *         return 1;
 *     }
 *     int64_t dims[2] = {2, 3};
 *     float x[6] = {1, 2, 3, 4, 5, 6};
 *     kiln_value *in = NULL, *out = NULL;
 *     kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, dims, x, sizeof x, &in);  // borrows x
 *     const char *in_names[] = {"X"}, *out_names[] = {"Y"};
 *     if (kiln_session_run(s, 1, in_names, (const kiln_value *const *)&in,
 *                          1, out_names, &out) == KILN_OK)
 *         printf("%g\n", ((const float *)kiln_value_data(out))[0]);
 *     kiln_value_free(out);
 *     kiln_value_free(in);
 *     kiln_session_free(s);
 *
 * Conventions:
 *  - Actions return kiln_status; KILN_OK is 0. On failure a message naming what failed (file,
 *    node, op, input, dims) is retrievable with kiln_last_error() from the session.
 *  - Handles are created by kiln_<object>_create and released by kiln_<object>_free;
 *    kiln_<object>_free(NULL) is a no-op.
 *  - Strings returned by accessors are borrowed: valid until the owning handle is freed.
 *  - There is no global mutable state: any number of sessions may live in one process, and
 *    kiln_session_run may be called on one session from several threads at once.
 */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0

/* Version of the library actually linked, as "MAJOR.MINOR.PATCH". Static string. */
const char *kiln_version(void);

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARG = 1, /* a caller passed something invalid (NULL, unknown name, ...) */
    KILN_ERR_MODEL = 2,       /* the model file is malformed or inconsistent */
    KILN_ERR_UNSUPPORTED = 3, /* a valid model uses something kiln does not implement */
    KILN_ERR_SHAPE = 4,       /* shapes of inputs violate what the graph requires */
    KILN_ERR_NOMEM = 5,       /* an allocation failed */
    KILN_ERR_IO = 6,          /* a file could not be read or mapped */
    KILN_ERR_RUNTIME = 7,     /* a kernel failed on the given values (e.g. index out of range) */
} kiln_status;

/* Short static name of a status ("KILN_ERR_SHAPE"). */
const char *kiln_status_name(kiln_status st);

/* Element types. The numeric values equal ONNX's TensorProto.DataType codes. Sub-byte types
 * (INT4, UINT4, FLOAT4E2M1, INT2, UINT2) are stored one element per byte in kiln_value data
 * (the low bits hold the value; signed types are sign-extended). STRING data is an array of
 * NUL-terminated `char *`. */
typedef enum kiln_dtype {
    KILN_DTYPE_UNDEFINED = 0,
    KILN_DTYPE_FLOAT32 = 1,
    KILN_DTYPE_UINT8 = 2,
    KILN_DTYPE_INT8 = 3,
    KILN_DTYPE_UINT16 = 4,
    KILN_DTYPE_INT16 = 5,
    KILN_DTYPE_INT32 = 6,
    KILN_DTYPE_INT64 = 7,
    KILN_DTYPE_STRING = 8,
    KILN_DTYPE_BOOL = 9,
    KILN_DTYPE_FLOAT16 = 10,
    KILN_DTYPE_FLOAT64 = 11,
    KILN_DTYPE_UINT32 = 12,
    KILN_DTYPE_UINT64 = 13,
    KILN_DTYPE_COMPLEX64 = 14,
    KILN_DTYPE_COMPLEX128 = 15,
    KILN_DTYPE_BFLOAT16 = 16,
    KILN_DTYPE_FLOAT8E4M3FN = 17,
    KILN_DTYPE_FLOAT8E4M3FNUZ = 18,
    KILN_DTYPE_FLOAT8E5M2 = 19,
    KILN_DTYPE_FLOAT8E5M2FNUZ = 20,
    KILN_DTYPE_UINT4 = 21,
    KILN_DTYPE_INT4 = 22,
    KILN_DTYPE_FLOAT4E2M1 = 23,
    KILN_DTYPE_FLOAT8E8M0 = 24,
    KILN_DTYPE_UINT2 = 25,
    KILN_DTYPE_INT2 = 26,
    KILN_DTYPE_COUNT_ = 27 /* not a type: one past the last code */
} kiln_dtype;

/* Lower-case name ("float32", "int64", ...) of a dtype; "undefined" for unknown codes. */
const char *kiln_dtype_name(kiln_dtype dt);
/* Bytes one element occupies in kiln_value data (sizeof(char *) for STRING, 1 for sub-byte
 * types); 0 for UNDEFINED or unknown codes. */
size_t kiln_dtype_size(kiln_dtype dt);

/* ---------------------------------------------------------------------------------------- */
/* Values: tensors, sequences of values, optionals.                                          */

#define KILN_MAX_RANK 16

typedef enum kiln_value_kind {
    KILN_VALUE_TENSOR = 1,
    KILN_VALUE_SEQUENCE = 2, /* ordered list of values (tensors in practice) */
    KILN_VALUE_OPTIONAL = 3, /* holds one value or nothing */
} kiln_value_kind;

typedef struct kiln_value kiln_value;

/* Creates a tensor owning a copy of `data` (nbytes must be numel * dtype size; data NULL
 * gives zeros, or empty strings for STRING). For STRING, data is `const char *const *` and
 * each string is copied. On success *out is owned by the caller: release with
 * kiln_value_free. */
kiln_status kiln_value_create_tensor(kiln_dtype dt, int rank, const int64_t *dims,
                                     const void *data, size_t nbytes, kiln_value **out);
/* Creates a tensor that borrows `data` (not copied, not freed); the caller keeps `data`
 * alive and unchanged until the value is freed. Not available for STRING. */
kiln_status kiln_value_wrap_tensor(kiln_dtype dt, int rank, const int64_t *dims, void *data,
                                   size_t nbytes, kiln_value **out);
/* Creates a tensor that borrows device memory: `data` is a pointer on the GPU of the CUDA
 * session the value is given to (not copied, not freed; the caller keeps it alive and
 * unchanged until the run returns). Only KILN_PROVIDER_CUDA sessions take such inputs; they
 * read them on the device without a host copy. Not available for STRING. */
kiln_status kiln_value_wrap_device_tensor(kiln_dtype dt, int rank, const int64_t *dims, void *data,
                                          size_t nbytes, kiln_value **out);
/* Whether tensor v's data is device memory (kiln_value_wrap_device_tensor, or the output of
 * a session with device_outputs). Such values cannot be cloned, decoded or put into
 * sequences and optionals; kiln_value_data gives the device pointer. */
bool kiln_value_on_device(const kiln_value *v);
/* Creates a sequence of the given element dtype holding `items`; takes ownership of each item
 * (also on failure). `items` itself is borrowed. n may be 0. */
kiln_status kiln_value_create_sequence(kiln_dtype elem, kiln_value **items, int64_t n,
                                       kiln_value **out);
/* Creates an optional holding `inner` (ownership taken, also on failure), or nothing if
 * inner is NULL; `elem` is the element dtype the empty optional is typed with. */
kiln_status kiln_value_create_optional(kiln_dtype elem, kiln_value *inner, kiln_value **out);
/* Deep copy. */
kiln_status kiln_value_clone(const kiln_value *v, kiln_value **out);
/* Releases a value and everything it owns. NULL is a no-op. */
void kiln_value_free(kiln_value *v);

kiln_value_kind kiln_value_kind_of(const kiln_value *v);
/* Element dtype of a tensor, or of the elements of a sequence / optional. */
kiln_dtype kiln_value_dtype(const kiln_value *v);
/* Rank and dims of a tensor (0 and NULL for other kinds). dims is borrowed from v. */
int kiln_value_rank(const kiln_value *v);
const int64_t *kiln_value_dims(const kiln_value *v);
int64_t kiln_value_numel(const kiln_value *v);
size_t kiln_value_nbytes(const kiln_value *v);
/* Tensor data, row-major and contiguous; borrowed from v. */
void *kiln_value_data(const kiln_value *v);
/* Sequences: number of items and the item at index i (borrowed). */
int64_t kiln_value_sequence_length(const kiln_value *v);
const kiln_value *kiln_value_sequence_at(const kiln_value *v, int64_t i);
/* Optionals: the held value (borrowed) or NULL when empty. */
const kiln_value *kiln_value_optional_get(const kiln_value *v);

/* Decodes a serialized ONNX TensorProto, SequenceProto or OptionalProto (the `.pb` files of
 * ONNX test data) into a new value owned by the caller. `kind` says which message `buf`
 * holds. `name_out`, if not NULL, receives the proto's name (malloc'd, caller frees; may be
 * NULL). Errors: KILN_ERR_MODEL for malformed bytes; `err` (if not NULL, >= 256 bytes)
 * receives a message. */
kiln_status kiln_value_decode_proto(const void *buf, size_t len, kiln_value_kind kind,
                                    kiln_value **out, char **name_out, char *err,
                                    size_t err_size);

/* ---------------------------------------------------------------------------------------- */
/* Operators.                                                                                 */

/* Number of operator implementations kiln has (one per domain, op type and first opset). */
int kiln_operator_count(void);
/* Operator i: domain ("" for the default ONNX domain), op type and the first opset version the
 * implementation covers. Strings are static. KILN_ERR_INVALID_ARG when i is out of range. */
kiln_status kiln_operator_info(int i, const char **domain, const char **op_type, int *since_version);

/* ---------------------------------------------------------------------------------------- */
/* Sessions.                                                                                  */

typedef struct kiln_session kiln_session;

typedef enum kiln_provider_kind {
    KILN_PROVIDER_CPU = 0,  /* the optimised CPU kernels (the reference ones when unoptimized) */
    KILN_PROVIDER_CUDA = 1, /* an NVIDIA GPU; nodes it does not support run on the CPU. Session
                             * creation fails with KILN_ERR_UNSUPPORTED, saying why, when kiln
                             * was built without it or no GPU is usable. */
} kiln_provider_kind;

/* Whether this build of kiln has the provider (not whether a device is usable: creating a
 * session says that). KILN_PROVIDER_CPU is always there. */
bool kiln_provider_available(kiln_provider_kind kind);

typedef struct kiln_session_options {
    kiln_provider_kind provider;
    /* Threads one run may use for its kernels' parallel loops (the calling thread included);
     * 0 = the cores this process may run on. Each session has its own threads. */
    int num_threads;
    /* Create the session even if some operators are unsupported (to inspect the model);
     * running it then fails naming the first unsupported node. Default false: creation
     * fails with KILN_ERR_UNSUPPORTED. */
    bool allow_unsupported;
    /* Memory plans kept, one per binding of the model's symbolic dims (LRU); a new binding
     * beyond that evicts the least recently used. Default 16. */
    int plan_cache_size;
    /* The reference configuration: the reference kernels only, on one thread, with no memory
     * planning or buffer reuse (and, as kiln grows optimisations, none of them). `kiln verify`
     * compares a normal session with this one. */
    bool unoptimized;
    /* KILN_PROVIDER_CUDA: the GPU's ordinal. Default 0. */
    int device_id;
    /* KILN_PROVIDER_CUDA: runs return their tensor outputs (strings aside) in device memory
     * on the session's GPU (kiln_value_on_device; kiln_value_free releases it), complete when
     * the run returns. Default false: outputs in host memory. */
    bool device_outputs;
} kiln_session_options;

kiln_session_options kiln_session_options_default(void);

/* Loads and compiles a model from a file. External data files are resolved relative to the
 * model's folder and mapped read-only; they may not lie outside it. opt may be NULL
 * (defaults). On failure *out is still set to a session handle holding only the error
 * message (retrieve it with kiln_last_error, release with kiln_session_free), or to NULL if
 * even that could not be allocated. */
kiln_status kiln_session_create(const char *path, const kiln_session_options *opt,
                                kiln_session **out);
/* Same from a serialized model in memory (copied; external data is resolved relative to
 * `base_dir`, which may be NULL to forbid external data). */
kiln_status kiln_session_create_from_memory(const void *buf, size_t len, const char *base_dir,
                                            const kiln_session_options *opt,
                                            kiln_session **out);
void kiln_session_free(kiln_session *s);

/* Message of the last failure on this session ("" if none). With s == NULL: a static message
 * saying no session exists. Borrowed: valid until the next failing call on s. When several
 * threads run one session, prefer kiln_last_error_copy. */
const char *kiln_last_error(const kiln_session *s);
/* Copies the last failure message into buf (always NUL-terminated when size > 0). */
void kiln_last_error_copy(const kiln_session *s, char *buf, size_t size);

/* Description of one graph input or output. All pointers are borrowed from the session. */
typedef struct kiln_io_info {
    const char *name;
    kiln_value_kind kind;
    kiln_dtype dtype; /* element dtype (UNDEFINED if the model leaves it open) */
    int rank;         /* -1 when the model gives no shape */
    /* per dim: dims[i] >= 0 is a fixed size; otherwise dim_names[i] names the symbol
     * ("batch", or "?N" for a dim the model leaves unnamed). */
    const int64_t *dims;
    const char *const *dim_names;
} kiln_io_info;

int kiln_session_input_count(const kiln_session *s);
int kiln_session_output_count(const kiln_session *s);
/* Fills *info for input/output i; KILN_ERR_INVALID_ARG if i is out of range. */
kiln_status kiln_session_input_info(const kiln_session *s, int i, kiln_io_info *info);
kiln_status kiln_session_output_info(const kiln_session *s, int i, kiln_io_info *info);

/* What an observer sees after a node of the main graph ran. Everything is borrowed for the
 * duration of the callback. Input values show the shapes and types the node read; the data of
 * an input the node overwrote in place (element-wise ops reuse a dead input's buffer) is not
 * preserved, so read outputs, not inputs, for values. */
typedef struct kiln_node_event {
    int node;                          /* index as in kiln_session_node */
    const char *node_name, *op_type;
    int n_inputs;
    const char *const *input_names;    /* "" for an absent optional input */
    const kiln_value *const *inputs;   /* NULL for an absent optional input */
    int n_outputs;
    const char *const *output_names;   /* "" for an output the node does not produce */
    const kiln_value *const *outputs;  /* NULL for an output the node does not produce */
    double ms; /* wall time from the node's start until its values were ready to show (with a
                * GPU provider this includes copying them to the host), without the observer's
                * own time or the runtime's conversion of internal layouts */
} kiln_node_event;

/* Called after each node; return 0 to go on, anything else stops the run (KILN_ERR_RUNTIME). */
typedef int (*kiln_observer_fn)(void *user, const kiln_node_event *ev);

/* kiln_session_run with an observer tapping every intermediate value of the run: the same
 * kernels, memory plan and layouts as a plain run. observer may be NULL. */
kiln_status kiln_session_run_observed(kiln_session *s, int n_in, const char *const *in_names,
                                      const kiln_value *const *inputs, int n_out,
                                      const char *const *out_names, kiln_value **outputs,
                                      kiln_observer_fn observer, void *user);

/* Counters of a session (totals since creation). Fields are only ever added at the end. */
typedef struct kiln_session_stats {
    int64_t compilations;      /* model compilations: 1 per session, whatever the shapes */
    int64_t runs;              /* successful runs */
    int64_t plan_cache_hits;   /* runs whose binding of the symbols already had a memory plan */
    int64_t plan_cache_misses; /* runs that planned memory for a new binding */
    int plan_cache_entries;    /* plans cached now (at most plan_cache_capacity) */
    int plan_cache_capacity;
    int64_t arena_peak_bytes;  /* largest arena of any run (host and device arenas together) */
    int64_t arena_last_bytes;  /* arena of the last run (host and device arenas together) */
    int64_t lower_bound_last_bytes; /* the last run's planner lower bound: peak of live bytes */
    int64_t heap_fallbacks;    /* planned tensors that had to go to the heap (0 when shapes infer right) */
    int64_t bind_plan_ns;      /* total time spent checking inputs, binding symbols and planning */
    int64_t run_ns;            /* total time of successful runs, binding and planning included */
    /* KILN_PROVIDER_CUDA (zero otherwise) */
    int nodes_gpu, nodes_cpu;  /* main-graph nodes placed on the GPU and on the CPU */
    int64_t node_runs_gpu;     /* node executions on the GPU, over all runs */
    int64_t node_runs_cpu;     /* node executions on the CPU, over all runs */
    int64_t device_mallocs;    /* device allocations (cudaMalloc) made by runs: 0 in steady state */
    int64_t copies_to_device;  /* host-to-device tensor copies (inputs, CPU-to-GPU boundaries) */
    int64_t copies_to_host;    /* device-to-host tensor copies (outputs, GPU-to-CPU boundaries) */
    int64_t graphs_captured;   /* runs recorded as a CUDA graph (one per binding, LRU-bounded) */
    int64_t graphs_replayed;   /* runs served by replaying a recorded graph */
    char graphs_note[192];     /* why the last run that could not be recorded could not, or "" */
    /* KILN_PROVIDER_CUDA: main-graph nodes on the CPU that compute tensor data there (the GPU
     * has no kernel for them as compiled, or they hold control flow; kiln_session_node_fallback),
     * which cost copies and time: a warning. Shape arithmetic and ops that read only shapes
     * are on the CPU by design and not counted. */
    int nodes_fallback;
    /* KILN_PROVIDER_CUDA: the most device memory the session held at once: its constants, run
     * arenas and workspaces, and what kiln_generator's KV cache took (transient tensors of the
     * device's memory pool are not counted). 0 on the CPU. */
    int64_t device_bytes_peak;
    /* KILN_PROVIDER_CUDA: kernels generated (NVRTC) for the session's fused element-wise nodes
     * (kiln.FusedElementwise), how many of them the on-disk kernel cache held ($KILN_CACHE_DIR,
     * else $XDG_CACHE_HOME/kiln or ~/.cache/kiln), and why the compiler or the cache could not
     * be used ("" when both were): the one warning an unset, unwritable or corrupt cache gives. */
    int kernels_generated;
    int kernels_from_cache;
    char kernels_note[192];
} kiln_session_stats;

/* Copies the session's counters into *out. Thread-safe. */
kiln_status kiln_session_stats_get(const kiln_session *s, kiln_session_stats *out);

/* Model facts, for tools. Strings are borrowed from the session. */
int64_t kiln_session_ir_version(const kiln_session *s);
int kiln_session_opset_count(const kiln_session *s);
/* Domain ("" for the default ONNX domain) and version of opset import i. */
kiln_status kiln_session_opset(const kiln_session *s, int i, const char **domain, int64_t *version);
/* Metadata of the model file, as ONNX Runtime's ModelMetadata shows it. `field` is one of
 * "producer_name", "producer_version", "domain", "doc_string" (ModelProto's), "graph_name" and
 * "graph_doc_string" (its main graph's). Borrowed from the session; "" when the file leaves
 * the field out; NULL for an unknown field name or a NULL session. */
const char *kiln_session_model_string(const kiln_session *s, const char *field);
/* ModelProto.model_version (0 when absent). */
int64_t kiln_session_model_version(const kiln_session *s);
/* ModelProto.metadata_props: the number of entries, and entry i's key and value (borrowed from
 * the session). KILN_ERR_INVALID_ARG when i is out of range. */
int kiln_session_metadata_count(const kiln_session *s);
kiln_status kiln_session_metadata(const kiln_session *s, int i, const char **key, const char **value);
/* Nodes of the model, its subgraphs included (depth-first, in execution order). */
int kiln_session_node_count(const kiln_session *s);
kiln_status kiln_session_node(const kiln_session *s, int i, const char **name, const char **domain,
                              const char **op_type, bool *supported);
/* Where node i (index as in kiln_session_node) runs: *provider is "cuda" or "cpu"; in a
 * KILN_PROVIDER_CUDA session, *why says why a CPU node is not on the GPU (NULL otherwise).
 * Strings are borrowed from the session. */
kiln_status kiln_session_node_placement(const kiln_session *s, int i, const char **provider, const char **why);
/* Whether node i (index as in kiln_session_node) of a KILN_PROVIDER_CUDA session's main graph
 * runs on the CPU though it computes tensor data (counted in kiln_session_stats.nodes_fallback;
 * kiln_session_node_placement says why): false for GPU nodes, shape arithmetic, ops that read
 * only their inputs' shapes, subgraph nodes, other sessions and bad arguments. */
bool kiln_session_node_fallback(const kiln_session *s, int i);
/* A one-line description of node i (index as in kiln_session_node): op type and attributes,
 * e.g. "Conv kernel_shape=[3, 3] strides=[2, 2]". Writes into buf (always NUL-terminated). */
kiln_status kiln_session_node_describe(const kiln_session *s, int i, char *buf, size_t size);
/* Bytes of all initializers and constant attribute tensors. */
int64_t kiln_session_initializer_bytes(const kiln_session *s);

/* Runs the model. inputs[i] is bound to the graph input named in_names[i] (borrowed; not
 * modified). Every graph input without an initializer must be given. For each
 * out_names[j], outputs[j] receives a new value owned by the caller (release with
 * kiln_value_free). n_out may be 0 with out_names NULL to fetch nothing. On failure no
 * output is returned (all outputs[j] set to NULL) and the session stays usable. Thread-safe. */
kiln_status kiln_session_run(kiln_session *s, int n_in, const char *const *in_names,
                             const kiln_value *const *inputs, int n_out,
                             const char *const *out_names, kiln_value **outputs);

/* A tensor in host memory described in place, for callers that hold raw buffers (language
 * bindings): row-major and contiguous, `dims[0..rank)` used. */
typedef struct kiln_tensor_desc {
    kiln_dtype dtype;
    int rank;
    int64_t dims[KILN_MAX_RANK];
    void *data;    /* borrowed */
    size_t nbytes; /* numel * kiln_dtype_size(dtype) */
} kiln_tensor_desc;

/* kiln_session_run with the inputs given as descriptions of host buffers, borrowed as
 * kiln_value_wrap_tensor borrows (not STRING; give those as kiln_values to kiln_session_run).
 * When out_desc is not NULL, out_desc[j] also describes outputs[j] on success: dims copied,
 * data pointing into outputs[j] (valid until it is freed); for an output that is not a host
 * tensor (a sequence, an optional, a device tensor) dtype is UNDEFINED, rank -1 and data NULL,
 * and STRING tensors have data pointing at their `char *` array. Ownership of outputs, errors
 * and thread safety as for kiln_session_run; a description that does not match its dtype and
 * dims is KILN_ERR_INVALID_ARG naming the input. */
kiln_status kiln_session_run_tensors(kiln_session *s, int n_in, const char *const *in_names,
                                     const kiln_tensor_desc *inputs, int n_out,
                                     const char *const *out_names, kiln_value **outputs,
                                     kiln_tensor_desc *out_desc);

/* Where one output of kiln_session_run_with_outputs goes (ONNX Runtime's IOBinding). */
typedef struct kiln_output_binding {
    /* KILN_PROVIDER_CUDA sessions: the tensor comes back in device memory on the session's GPU
     * (kiln_value_on_device), complete when the run returns, as with the session option
     * device_outputs; false: in host memory. Strings, sequences and optionals stay on the
     * host. true in a session without a device provider is KILN_ERR_INVALID_ARG. */
    bool on_device;
    /* Optional (NULL: kiln allocates the output). A tensor whose memory the output is written
     * into when it lies where on_device says (host memory, or device memory of the session's
     * GPU wrapped with kiln_value_wrap_device_tensor), its dtype matches and the output's bytes
     * fit: outputs[j] is then a view of storage's data (kiln_value_data equal; freeing it
     * leaves that memory alone, which the caller keeps alive while outputs[j] is used).
     * Otherwise the output is allocated as usual: compare the data pointers to tell. Borrowed
     * for the call. */
    const kiln_value *storage;
} kiln_output_binding;

/* kiln_session_run with each output placed as bind[j] says (bind NULL: as kiln_session_run;
 * bind[j] for out_names[j], overriding the session option device_outputs). Inputs may be
 * host tensors or device tensors (kiln_value_wrap_device_tensor) in a CUDA session: a device
 * input is read on the device (no copy through the host). Ownership of outputs, errors and
 * thread safety as for kiln_session_run. */
kiln_status kiln_session_run_with_outputs(kiln_session *s, int n_in, const char *const *in_names,
                                          const kiln_value *const *inputs, int n_out,
                                          const char *const *out_names,
                                          const kiln_output_binding *bind, kiln_value **outputs);

/* ---------------------------------------------------------------------------------------- */
/* Generation: decoder-only LLMs in onnxruntime-genai's model folder layout.                 */
/*
 * A model folder holds genai_config.json and the model file it names (model.decoder.filename,
 * which must lie inside the folder). The config gives the decoder's input and output names
 * (input_ids [batch, seq] int64, attention_mask [batch, total] int64, past_key_values.%d.key
 * and .value [batch, kv_heads, past, head_size], logits [batch, seq, vocab] float32,
 * present.%d.key and .value), the sizes (heads, KV heads, head size, hidden size, layers,
 * context length), the bos/eos/pad token ids and the search defaults. The file is untrusted:
 * a malformed or hostile config is KILN_ERR_MODEL naming the field. Token ids in, token ids
 * out; no tokenizer.
 *
 *     kiln_generator_params p = kiln_generator_params_default();
 *     p.max_length = 64;
 *     kiln_generator *g = NULL;
 *     int64_t len = 3, prompt[3] = {1, 2, 3};
 *     if (kiln_generator_create("model_dir", &p, &g) || kiln_generator_append_tokens(g, 1, &len, prompt))
 *         fprintf(stderr, "%s\n", kiln_generator_last_error(g));
 *     while (!kiln_generator_is_done(g) && kiln_generator_generate_next(g) == KILN_OK) {
 *         const int64_t *next;
 *         kiln_generator_get_next_tokens(g, &next, NULL);
 *         printf("%lld\n", (long long)next[0]);
 *     }
 *     kiln_generator_free(g);
 *
 * The KV cache: the generator allocates, once, max_length positions per layer for keys and
 * for values ([batch, kv_heads, max_length, head_size]). With search.past_present_share_buffer
 * (GroupQueryAttention models) past and present are that one buffer and each step writes its
 * new positions in place; otherwise the model's present (past plus the new positions) is
 * written into a second buffer of the same capacity, which becomes the next step's past. No
 * step allocates cache memory or grows it, a step that would pass max_length fails before
 * running, and the session compiles once for all steps (kiln_generator_session_stats). */

typedef struct kiln_generator kiln_generator;

typedef struct kiln_generator_params {
    /* Tokens per sequence, prompt included; 0 = search.max_length of genai_config.json. At
     * most the config's context_length. */
    int64_t max_length;
    int batch_size;      /* sequences generated together; default 1 */
    /* -1 = search.do_sample of the config, 0 = greedy (argmax, the lowest id on ties),
     * 1 = sampling with temperature, top_k and top_p. */
    int do_sample;
    double temperature;  /* > 0; 0 = the config's */
    int top_k;           /* keep the k likeliest tokens; 0 = no limit; -1 = the config's */
    double top_p;        /* keep the likeliest tokens up to this probability mass, (0, 1]; 0 = the config's */
    uint64_t seed;       /* sampling's random stream; the same seed gives the same tokens */
    kiln_provider_kind provider;
    int num_threads;     /* as kiln_session_options.num_threads */
} kiln_generator_params;

/* Greedy, batch 1, max_length and the rest from the config, seed 0, the CPU provider. */
kiln_generator_params kiln_generator_params_default(void);

/* A model folder opened and compiled once, for any number of generators (onnxruntime-genai's
 * Model): each generator holds a reference, so the model lives until the caller's
 * kiln_genai_model_free and the last of its generators' kiln_generator_free. Generators of one
 * model may run on several threads at once (their session is shared; runs on it are
 * thread-safe); each has its own KV cache. */
typedef struct kiln_genai_model kiln_genai_model;

/* Opens the model folder model_dir (genai_config.json and the model it names) and compiles the
 * model with the session options opt (NULL: kiln_session_options_default(), the CPU). On
 * failure *out is still set to a handle holding only the error message
 * (kiln_genai_model_last_error; release with kiln_genai_model_free), or NULL if even that could
 * not be allocated. */
kiln_status kiln_genai_model_open(const char *model_dir, const kiln_session_options *opt, kiln_genai_model **out);
/* Message of the failure that opened m ("" if none); a static message for NULL. Borrowed. */
const char *kiln_genai_model_last_error(const kiln_genai_model *m);
/* Releases the caller's reference (the generators keep theirs). NULL is a no-op. */
void kiln_genai_model_free(kiln_genai_model *m);

/* A generator of model m (which it references) with its KV cache for params->batch_size x
 * max_length tokens; no compilation. params may be NULL (defaults); its provider and
 * num_threads are not used (m's session options apply). On failure *out as for
 * kiln_generator_create. */
kiln_status kiln_generator_create_from(kiln_genai_model *m, const kiln_generator_params *params, kiln_generator **out);
/* Opens the model folder model_dir for this generator alone (kiln_genai_model_open with
 * params' provider and num_threads, then kiln_generator_create_from): it compiles the model and
 * allocates the KV cache. params may be NULL (defaults). On failure *out is still set to a
 * handle holding only the error message (kiln_generator_last_error; release with
 * kiln_generator_free), or NULL if even that could not be allocated. */
kiln_status kiln_generator_create(const char *model_dir, const kiln_generator_params *params,
                                  kiln_generator **out);
/* Runs the prompt: tokens is [batch, max(lengths)] row-major, row b's first lengths[b] ids
 * used (right-padded; what follows in the row is ignored). batch must equal the generator's
 * batch_size; every length >= 1 and < max_length; ids in [0, vocab). Once per generator;
 * afterwards KILN_ERR_INVALID_ARG. tokens and lengths are borrowed for the call only. */
kiln_status kiln_generator_append_tokens(kiln_generator *g, int batch, const int64_t *lengths,
                                         const int64_t *tokens);
/* Chooses the next token of each sequence from the current logits (greedy or sampled), after
 * running the model on the previous step's tokens when there are some. A sequence that has
 * produced an eos id goes on with pad tokens. Fails with KILN_ERR_INVALID_ARG before any
 * prompt, and once kiln_generator_is_done (max_length reached) - never writing past the cache. */
kiln_status kiln_generator_generate_next(kiln_generator *g);
/* The tokens chosen by the last kiln_generator_generate_next, one per sequence: *tokens is
 * borrowed ([batch]; valid until the next call on g), *n (may be NULL) receives the batch. */
kiln_status kiln_generator_get_next_tokens(const kiln_generator *g, const int64_t **tokens, int *n);
/* The logits of each sequence's last position, the ones the next choice is made from:
 * *logits is borrowed, [batch, vocab] float32 (a model's float16 or bfloat16 logits converted),
 * valid until the next call on g. */
kiln_status kiln_generator_get_logits(const kiln_generator *g, const float **logits, int64_t *vocab);
/* Sequence b so far (prompt then generated ids, pads after an eos included): borrowed,
 * *len ids; NULL when b is out of range. */
const int64_t *kiln_generator_get_sequence(const kiln_generator *g, int b, int64_t *len);
/* Whether every sequence has produced an eos id or reached max_length. NULL: true. */
bool kiln_generator_is_done(const kiln_generator *g);
/* The counters of the generator's session, its model's (compilations stays 1 over all steps
 * and all generators of one model). */
kiln_status kiln_generator_session_stats(const kiln_generator *g, kiln_session_stats *out);
/* Message of the last failure on g ("" if none); a static message for NULL. Borrowed. */
const char *kiln_generator_last_error(const kiln_generator *g);
/* Releases the generator, its KV cache and its reference to its model. NULL is a no-op. */
void kiln_generator_free(kiln_generator *g);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */

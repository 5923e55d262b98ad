/* gpu.h - the GPU execution provider (CUDA, portable to HIP through rt.h).
 *
 * A GPU kernel is an ordinary kiln_kernel_fn (ops/op.h) that the executor calls for a node the
 * provider took over. Its tensor inputs and outputs live in device memory: value->data is a
 * device pointer, dims and numel are on the host as usual. Exceptions are the inputs named in
 * the registry entry's host_inputs mask (kiln_op_def, ops/op.h: shape-like inputs such as
 * Reshape's shape, Slice's starts, Resize's scales, and scalar arguments such as Clip's min),
 * which the executor hands over in host memory, as run-time inference or the kernel's
 * arguments need their contents. Outputs come allocated from the run-time inference and are NOT zeroed: a
 * GPU kernel writes every element of its outputs. Work is queued on kiln_gpu_stream(c); the
 * kernel never synchronises and never allocates device memory itself (kiln_gpu_workspace).
 * Nothing is compiled per shape: kernels take dims and strides as arguments.
 *
 * The kernels of a family live in src/gpu/k_FAMILY.cu (device code and extern "C" launchers
 * declared in k_FAMILY.h, plain C types only, so the .cu files build with nvcc and hipcc) and
 * the C side (support checks, argument unpacking) in src/gpu/ops_FAMILY.c, which exports a
 * kiln_gpu_op_table listed once in src/gpu/registry.c. */
#ifndef KILN_GPU_GPU_H
#define KILN_GPU_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "gpu/rt.h"
#include "ops/op.h"

/* The GPU kernel of one registry op: it covers every registry entry (kiln_op_def) of (domain,
 * op_type), whatever their since-versions, and reads on the host the inputs the entry's
 * host_inputs names. Opset differences within an entry (attributes that became inputs, ...)
 * are the kernel's to handle or to refuse in supports. */
typedef struct kiln_gpu_op {
    const char *domain; /* the registry's domain: "" for the default ONNX domain */
    const char *op_type;
    /* Compile time: whether run covers node n, judged from its attributes, its opset and its
     * inputs' compile-time types (n->in[i]->type: dtype, rank, dims may be symbolic) and
     * constant contents (kiln_ir_constant(n->in[i])). On false, writes a short reason into why
     * ("dtype int8", "mode 'cubic' with antialias") for `kiln info --provider cuda`. NULL:
     * always. */
    bool (*supports)(const kiln_node *n, char *why, size_t size);
    kiln_status (*run)(kiln_run_ctx *c);
    /* Inputs of the entry's host_inputs that this kernel reads in device memory instead
     * (KILN_OP_IN bits): per-row data such as GroupQueryAttention's seqlens_k, which a
     * recorded run must read on the device on every replay. */
    unsigned device_inputs;
} kiln_gpu_op;

typedef struct kiln_gpu_op_table {
    const kiln_gpu_op *ops;
    int n;
} kiln_gpu_op_table;

/* The GPU kernel of registry entry def (a node's n->op); NULL if none. O(GPU ops). */
const kiln_gpu_op *kiln_gpu_op_find(const kiln_op_def *def);

/* ---- what a GPU kernel gets from its run context ---- */

/* The stream of this run; every launch and copy goes on it. */
gpuStream_t kiln_gpu_stream(kiln_run_ctx *c);
/* The run's cuBLAS handle (cublasHandle_t), bound to the stream, with its workspace set;
 * cuBLAS is loaded and the handle made on first use (a failure fails the node). */
kiln_status kiln_gpu_blas(kiln_run_ctx *c, void **handle);
/* The run's cuBLASLt handle (cublasLtHandle_t) and the workspace it may use (the cuBLAS
 * handle's, stream ordered); cuBLASLt is loaded and the handle made on first use. *handle is
 * NULL, with KILN_OK, when cuBLASLt cannot be loaded, KILN_BLASLT=0 is set, or in HIP builds:
 * the caller takes cuBLAS. */
kiln_status kiln_gpu_blaslt(kiln_run_ctx *c, void **handle, void **ws, size_t *ws_size);
/* The run's cuDNN handle (cudnnHandle_t), bound to the stream; cuDNN is loaded and the handle
 * made on first use. *handle is NULL, with KILN_OK, when cuDNN cannot be loaded (or in HIP
 * builds): the caller takes its own kernels. */
kiln_status kiln_gpu_dnn(kiln_run_ctx *c, void **handle);
/* Host state a kernel keeps between its calls on this run context (descriptors, a chosen
 * algorithm), keyed by the running node and key[0..n) (n <= KILN_GPU_MEMO_KEY: the input dims,
 * say); NULL on a miss. A bounded table: a new entry may evict another, so a miss costs time
 * only. kiln_gpu_memo_put stores `state` for the key (the table owns it from then on: `release`
 * frees it on eviction and when the run context goes; NULL: nothing to free). */
#define KILN_GPU_MEMO_KEY 16
void *kiln_gpu_memo_get(kiln_run_ctx *c, const int64_t *key, int n);
void kiln_gpu_memo_put(kiln_run_ctx *c, const int64_t *key, int n, void *state, void (*release)(void *state));
/* The same table keyed by key alone, shared by the nodes of the run context (state that depends
 * on a call's shape, not on the node: a product's descriptors and algorithm). */
void *kiln_gpu_memo_shared_get(kiln_run_ctx *c, const int64_t *key, int n);
void kiln_gpu_memo_shared_put(kiln_run_ctx *c, const int64_t *key, int n, void *state, void (*release)(void *state));
/* The number of runs begun on this run context, this one included: state made in an earlier run
 * can tell it from the current one. */
int64_t kiln_gpu_run_serial(kiln_run_ctx *c);
/* Device scratch of at least `bytes` (256-byte aligned) for this kernel call; valid until
 * the kernel returns (the next kernel may reuse it: it is stream ordered). */
kiln_status kiln_gpu_workspace(kiln_run_ctx *c, size_t bytes, void **p);
/* The run's check word (device int32, zero when the run starts) and this node's code for it:
 * a kernel that finds an input it reads on the device out of range (per-row lengths, positions)
 * skips that work and atomicCAS(word, 0, code)s; the run then fails naming the node. */
kiln_status kiln_gpu_check_word(kiln_run_ctx *c, int32_t **word, int32_t *code);
/* The run context's tickets: KILN_GPU_TICKETS device int32 counters, zero, which a kernel may
 * count on with atomics (its blocks taking tickets, the last one finishing the work) as long as
 * it leaves each counter it used at zero when it ends; nodes use them in turn (stream order).
 * *tickets is NULL, with KILN_OK, when n > KILN_GPU_TICKETS or while the first run that asks
 * for them is recorded: the caller takes a path without them. Allocated once per run context, so
 * a recording keeps a valid address. */
#define KILN_GPU_TICKETS 16384
kiln_status kiln_gpu_tickets(kiln_run_ctx *c, int64_t n, int32_t **tickets);
/* Copies `bytes` of host memory src to device memory dst (workspace) in stream order, through
 * the run's pinned staging (while a run is recorded: pinned memory the recording keeps), so src
 * may change as soon as this returns: for host inputs whose contents a kernel reads on the
 * device (GroupQueryAttention's seqlens_k). */
kiln_status kiln_gpu_upload(kiln_run_ctx *c, void *dst, const void *src, size_t bytes);
/* Fails the node with the runtime's message when e is an error; KILN_OK otherwise. */
kiln_status kiln_gpu_check(kiln_run_ctx *c, gpuError_t e, const char *what);
/* After a launch: checks the launch error (gpuGetLastError) naming the kernel. */
kiln_status kiln_gpu_launched(kiln_run_ctx *c, const char *kernel);
/* Runs the node's reference kernel on host copies of its inputs and copies its outputs back
 * to the device: for the rare run-time cases a GPU kernel does not cover (slow, synchronous,
 * correct). */
kiln_status kiln_gpu_fallback(kiln_run_ctx *c);

/* The kernel generated for the running node when the session was created (kiln.FusedElementwise,
 * ops_fused.c: a CUfunction for kiln_gpu_module_launch), or NULL when it has none. */
void *kiln_gpu_generated_kernel(kiln_run_ctx *c);

/* Unless KILN_GPU_FLASH=0 in the environment (read once): the GPU pipeline fuses written-out
 * attention of float16 and bfloat16 (fuse_attention) and Attention calls the tensor-core kernel
 * takes run there (k_attn.h). =0 keeps the CUDA-core kernel and the unfused products, an A/B. */
bool kiln_gpu_flash_enabled(void);

/* Number of multiprocessors of the run's device (grid sizing). */
int kiln_gpu_sm_count(kiln_run_ctx *c);

/* Grid size for n elements with `block` threads per block (at least 1, at most 2^31-1
 * blocks: kernels loop grid-stride). */
unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#endif

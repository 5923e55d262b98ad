/* provider.c - the CUDA provider's table: placement checks and kernels from the GPU op table
 * (registry.c, keyed by the node's registry entry n->op, whose host_inputs it reports),
 * sessions, runs, copies and recorded runs from runtime.c (device.h). */
#include <stdio.h>

#include "gpu/device.h"
#include "gpu/generated.h"
#include "gpu/gpu.h"
#include "passes/pass.h"
#include "passes/passes.h"

static kiln_status gpu_open(const kiln_session_options *opt, kiln_provider **out, kiln_err *err)
{
    if (opt->unoptimized)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "the CUDA provider does not run unoptimized sessions");
    return kiln_gpu_open(opt, out, err);
}

static bool gpu_supports(const kiln_provider *p, const kiln_node *n, char *why, size_t size)
{
    (void)p;
    const kiln_gpu_op *o = kiln_gpu_op_find(n->op);
    if (!o) {
        snprintf(why, size, "no GPU kernel for %s%s%s", n->domain, *n->domain ? "." : "", n->op_type);
        return false;
    }
    return !o->supports || o->supports(n, why, size);
}

static kiln_kernel_fn gpu_select(kiln_provider *p, kiln_node *n, unsigned *host_inputs)
{
    (void)p;
    const kiln_gpu_op *o = kiln_gpu_op_find(n->op);
    *host_inputs = o ? n->op->host_inputs & ~o->device_inputs : 0;
    return o ? o->run : NULL;
}

/* Attention written out becomes ONNX Attention where the tensor-core kernel takes it (16-bit
 * floats, head size 32 or 64), unless KILN_GPU_FLASH=0: the kernel without tensor cores is
 * slower than the unfused products on cuBLAS at long rows (ViT-B/16 float32 batch 32: 94 ms
 * fused against 33 ms). */
static kiln_status fuse_attention(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    return kiln_gpu_flash_enabled() ? kiln_pass_fuse_attention_gpu(g, fused, err) : KILN_OK;
}

/* The GPU's pass pipeline: written-out 16-bit attention becomes one Attention; a
 * Conv's residual Add and ReLU join it (kiln.FusedConv), which cuDNN
 * applies in the convolution's epilogue; a dense layer's bias joins its MatMul (kiln.FusedMatMul,
 * cuBLASLt's epilogue); a gated MLP's SiLU(gate) * up becomes one kernel, and its int4 gate and
 * up products one product over the stacked weights; what element-wise chains
 * remain become one generated kernel each (kiln.FusedElementwise). */
static const kiln_pass gpu_passes[] = {
    {"fuse_attention", fuse_attention},
    {"fuse_residual", kiln_pass_fuse_residual_gpu},
    {"fuse_activation", kiln_pass_fuse_activation_gpu},
    {"fuse_matmul_bias", kiln_pass_fuse_matmul_bias_gpu},
    {"fuse_silu_mul", kiln_pass_fuse_silu_mul},
    {"fuse_gate_up", kiln_pass_fuse_gate_up},
    {"fuse_elementwise", kiln_gpu_pass_fuse_elementwise},
};

const kiln_provider_i kiln_provider_cuda = {
    .api_version = KILN_PROVIDER_API,
    .name = "cuda",
    .kind = KILN_PROVIDER_CUDA,
    .device = true,
    .open = gpu_open,
    .close = kiln_gpu_session_free,
    .supports = gpu_supports,
    .select = gpu_select,
    .passes = gpu_passes,
    .n_passes = sizeof gpu_passes / sizeof *gpu_passes,
    .prepare = kiln_gpu_prepare,
    .stats = kiln_gpu_session_stats,
    .run_begin = kiln_gpu_run_begin,
    .run_end = kiln_gpu_run_end,
    .run_arena = kiln_gpu_run_arena,
    .count_node = kiln_gpu_run_count_node,
    .tensor = kiln_gpu_tensor,
    .to_device = kiln_gpu_to_device,
    .to_host = kiln_gpu_to_host,
    .output = kiln_gpu_output,
    .clone = kiln_gpu_clone,
    .mem_alloc = kiln_gpu_mem_alloc,
    .mem_free = kiln_gpu_mem_free,
    .capture_mode = kiln_gpu_graph_mode,
    .capture_note = kiln_gpu_graph_note,
    .unrecordable = kiln_gpu_mark_unrecordable,
    .capturing = kiln_gpu_capturing,
    .capture_begin = kiln_gpu_capture_begin,
    .capture_output = kiln_gpu_capture_output,
    .capture_end = kiln_gpu_capture_end,
    .replay = kiln_gpu_replay,
};

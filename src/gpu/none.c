/* none.c - the GPU provider's entry points in a build without CUDA: creating a GPU session
 * fails, saying so; nothing else is reachable. */
#include "gpu/device.h"

bool kiln_gpu_built(void) { return false; }

kiln_status kiln_gpu_session_create(int device_id, kiln_graph *g, kiln_gpu_session **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED,
                     "CUDA provider: this kiln was built without it (configure with a CUDA toolkit, KILN_CUDA=ON)");
}

void kiln_gpu_session_free(kiln_gpu_session *gs) { (void)gs; }
void kiln_gpu_session_nodes(const kiln_gpu_session *gs, int *gpu, int *cpu)
{
    *gpu = *cpu = 0;
}
void kiln_gpu_session_stats(kiln_gpu_session *gs, kiln_session_stats *st) {}
kiln_status kiln_gpu_run_begin(kiln_gpu_session *gs, size_t arena_bytes, kiln_gpu_run **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_run_end(kiln_gpu_session *gs, kiln_gpu_run *r, kiln_err *err)
{
    return KILN_OK;
}
unsigned char *kiln_gpu_run_arena(kiln_gpu_run *r)
{
    return NULL;
}
void kiln_gpu_run_count_node(kiln_gpu_run *r, bool on_gpu)
{
}
kiln_status kiln_gpu_to_device(kiln_gpu_run *r, const kiln_ir_value *iv, const kiln_value *host, void *dst,
                               kiln_value **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_to_host(kiln_gpu_run *r, const kiln_value *dev, void *dst, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_tensor(kiln_gpu_run *r, kiln_dtype dt, int rank, const int64_t *dims, void *dst,
                            kiln_value **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_gpu_mode kiln_gpu_graph_mode(kiln_gpu_run *r, const int64_t *key, int n) { return KILN_GPU_PLAIN; }
void kiln_gpu_graph_note(kiln_gpu_run *r, const int64_t *key, int n) {}
void kiln_gpu_mark_unrecordable(kiln_gpu_run *r, const char *fmt, ...) {}
bool kiln_gpu_capturing(const kiln_gpu_run *r) { return false; }
kiln_status kiln_gpu_output(kiln_gpu_run *r, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_clone(kiln_gpu_session *gs, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_capture_output(kiln_gpu_run *r, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_capture_begin(kiln_gpu_run *r, kiln_err *err)
{
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_capture_end(kiln_gpu_run *r, const int64_t *key, int n, bool ok, int n_out,
                                 kiln_value *const *outs, bool *recorded, kiln_err *err)
{
    *recorded = false;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}
kiln_status kiln_gpu_replay(kiln_gpu_run *r, const int64_t *key, int n, int *n_out, kiln_value *const **outs,
                            kiln_err *err)
{
    *n_out = 0;
    *outs = NULL;
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: not built");
}

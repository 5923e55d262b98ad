/* runtime.c - the GPU provider's runtime: the device a session opened, the constants it
 * uploaded, its pool of run contexts (stream, BLAS handles, device arena, workspace, pinned
 * staging), copies between host and device, and what a GPU kernel asks of its run context. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ctx.h"
#include "gpu/blas.h"
#include "gpu/device.h"
#include "gpu/dnn.h"
#include "gpu/generated.h"
#include "gpu/gpu.h"

#define ALIGN 256
#define BLAS_WORKSPACE (32u << 20)
#define PINNED_MIN (1u << 20)
#define GRAPHS_PER_RUN 8
#define MEMO_SLOTS 1024 /* kernels' host state per run context (kiln_gpu_memo_get) */

/* Memory a recording reads or writes on every replay (see held_alloc). */
typedef struct held_buf {
    void *p;
    bool device;
} held_buf;

/* A kernel's host state for one node and key (kiln_gpu_memo_get). */
typedef struct memo {
    const kiln_node *node; /* NULL: empty */
    int64_t key[KILN_GPU_MEMO_KEY];
    int n_key;
    void *state;
    void (*release)(void *state);
} memo;

/* One binding's recorded run (see device.h). */
typedef struct gpu_graph {
    int64_t *key;
    int n_key;
    int plain_runs;
    bool unrecordable;
    gpuGraphExec_t exec;   /* NULL until recorded */
    int n_out;
    kiln_value **out;      /* device views of the outputs */
    int64_t nodes_gpu, nodes_cpu; /* node runs the recording stands for */
    bool checks;           /* a kernel of the recording writes the run's check word */
    uint64_t used;         /* LRU tick */
    held_buf *held;        /* what the recording keeps (see held_alloc) */
    int n_held;
} gpu_graph;

struct kiln_provider_run {
    kiln_gpu_session *gs;
    gpuStream_t stream;
    gpublasHandle_t blas;
    void *blas_ws;
    void *dnn;             /* cudnnHandle_t, made on first use; NULL without cuDNN */
    void *blaslt;          /* cublasLtHandle_t, made on first use; NULL without cuBLASLt */
    bool blaslt_tried;
    memo memos[MEMO_SLOTS];
    int64_t serial;        /* runs begun on this context (kiln_gpu_run_serial) */
    unsigned char *arena;
    size_t arena_size;
    void *workspace;
    size_t workspace_size;
    unsigned char *pinned; /* staging for host<->device copies */
    size_t pinned_size, pinned_used;
    /* counters of the current run, added to the session's at its end */
    int64_t mallocs, to_device, to_host, nodes_gpu, nodes_cpu;
    gpuError_t error;      /* first device error of the run */
    /* the check word (kiln_gpu_check_word): device int32, 0 or the code of the first node whose
     * kernel found its device-side input out of range; read back at the run's end when used */
    int32_t *check, *check_host;
    bool check_used;
    /* the tickets (kiln_gpu_tickets): KILN_GPU_TICKETS device int32 zeros, or NULL before first use */
    int32_t *tickets;
    bool capturing, unrecordable;
    char why[192];         /* the first reason the run cannot be recorded */
    held_buf *held;        /* memory of the capture in progress */
    int n_held;
    gpu_graph graphs[GRAPHS_PER_RUN];
    uint64_t tick;
    int64_t captured, replayed;
    kiln_gpu_run *next;    /* free list / all contexts */
    kiln_gpu_run *next_all;
};

struct kiln_provider {
    int device;
    int sm_count;
    const kiln_graph *g;
    void *weights;         /* one device buffer holding the uploaded constants */
    kiln_value **weight;   /* [n_values] device views of main-graph constants, or NULL */
    int nodes_gpu, nodes_cpu;
    pthread_mutex_t lock;
    char why[192];         /* the last run's reason it could not be recorded */
    kiln_gpu_run *free_runs, *all_runs;
    int64_t mallocs, to_device, to_host, node_runs_gpu, node_runs_cpu, captured, replayed;
    /* device memory the session holds (constants, run arenas and workspaces, mem_alloc's
     * blocks; not the transient pool tensors) and its peak; under lock */
    int64_t dev_bytes, dev_peak;
    struct mem_block *blocks; /* mem_alloc's, with their sizes */
    kiln_gpu_fused *fused;    /* the generated kernels (generated.h), or NULL */
};

typedef struct mem_block {
    void *p;
    size_t n;
    struct mem_block *next;
} mem_block;

static void dev_bytes_add(kiln_gpu_session *gs, int64_t n)
{
    pthread_mutex_lock(&gs->lock);
    gs->dev_bytes += n;
    if (gs->dev_bytes > gs->dev_peak) gs->dev_peak = gs->dev_bytes;
    pthread_mutex_unlock(&gs->lock);
}

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static kiln_status rt_fail(kiln_err *err, gpuError_t e, const char *what)
{
    return kiln_errf(err, KILN_ERR_RUNTIME, "GPU: %s failed: %s", what, gpuGetErrorString(e));
}

/* ---- sessions ---- */

static kiln_status upload_constants(kiln_gpu_session *gs, kiln_err *err)
{
    const kiln_graph *g = gs->g;
    gs->weight = calloc((size_t)g->n_values + 1, sizeof *gs->weight);
    size_t *at = calloc((size_t)g->n_values + 1, sizeof *at);
    if (!gs->weight || !at) {
        free(at);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    size_t total = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        const kiln_node *n = g->nodes[k];
        if (!n->on_device) continue;
        for (int i = 0; i < n->n_in; i++) {
            const kiln_ir_value *v = n->in[i];
            const kiln_value *h = kiln_ir_constant(v);
            if (!h || (n->host_inputs & (1u << i)) || v->graph != g || at[v->id]) continue;
            if (h->kind != KILN_VALUE_TENSOR || h->dtype == KILN_DTYPE_STRING) continue;
            at[v->id] = total + 1; /* +1: 0 means none */
            total += align_up(h->nbytes ? h->nbytes : 1);
        }
    }
    kiln_status st = KILN_OK;
    if (total) {
        gpuError_t e = gpuMalloc(&gs->weights, total);
        if (e != gpuSuccess) st = rt_fail(err, e, "allocating the constants");
        else dev_bytes_add(gs, (int64_t)total);
    }
    for (int id = 0; id < g->n_values && !st; id++) {
        if (!at[id]) continue;
        const kiln_value *h = g->values[id]->init;
        unsigned char *d = (unsigned char *)gs->weights + (at[id] - 1);
        if (h->nbytes) {
            gpuError_t e = gpuMemcpy(d, h->data, h->nbytes, gpuMemcpyHostToDevice);
            if (e != gpuSuccess) st = rt_fail(err, e, "uploading the constants");
        }
        if (!st) st = kiln_value_view(h->dtype, h->rank, h->dims, d, &gs->weight[id], err);
        if (!st) gs->weight[id]->on_device = true;
    }
    free(at);
    return st;
}

kiln_status kiln_gpu_open(const kiln_session_options *opt, kiln_gpu_session **out, kiln_err *err)
{
    *out = NULL;
    int device_id = opt->device_id, count = 0;
    gpuError_t e = gpuGetDeviceCount(&count);
    if (e != gpuSuccess || count == 0)
        return kiln_errf(err, KILN_ERR_UNSUPPORTED, "CUDA provider: no usable GPU (%s)",
                         e != gpuSuccess ? gpuGetErrorString(e) : "no device found");
    if (device_id < 0 || device_id >= count)
        return kiln_errf(err, KILN_ERR_INVALID_ARG, "CUDA provider: device %d does not exist (%d found)", device_id,
                         count);
    e = gpuSetDevice(device_id);
    if (e != gpuSuccess) return rt_fail(err, e, "selecting the device");
    kiln_gpu_session *gs = calloc(1, sizeof *gs);
    if (!gs) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    gs->device = device_id;
    pthread_mutex_init(&gs->lock, NULL);
    gpuDeviceGetAttribute(&gs->sm_count, gpuDevAttrMultiProcessorCount, device_id);
    /* the pool behind stream-ordered allocations keeps what it got: no release to the OS */
    gpuMemPool_t pool;
    if (gpuDeviceGetDefaultMemPool(&pool, device_id) == gpuSuccess) {
        uint64_t keep = UINT64_MAX;
        gpuMemPoolSetAttribute(pool, gpuMemPoolAttrReleaseThreshold, &keep);
    }
    *out = gs;
    return KILN_OK;
}

kiln_status kiln_gpu_prepare(kiln_gpu_session *gs, const kiln_graph *g, kiln_err *err)
{
    gs->g = g;
    for (int k = 0; k < g->n_nodes; k++) /* copy nodes run on neither side's kernels */
        if (!(g->nodes[k]->op && (g->nodes[k]->op->flags & KILN_OP_COPY)))
            ++*(g->nodes[k]->on_device ? &gs->nodes_gpu : &gs->nodes_cpu);
    KILN_TRY(upload_constants(gs, err));
    return kiln_gpu_fused_prepare(gs->device, g, &gs->fused, err);
}

static void held_free(held_buf **held, int *n)
{
    for (int i = 0; i < *n; i++) {
        if ((*held)[i].device) gpuFree((*held)[i].p);
        else gpuFreeHost((*held)[i].p);
    }
    free(*held);
    *held = NULL;
    *n = 0;
}

/* Forgets g's recording (its key stays). */
static void graph_drop(gpu_graph *g)
{
    if (g->exec) gpuGraphExecDestroy(g->exec);
    g->exec = NULL;
    for (int j = 0; j < g->n_out; j++) kiln_value_free(g->out[j]);
    free(g->out);
    g->out = NULL;
    g->n_out = 0;
    held_free(&g->held, &g->n_held);
}

static void graph_clear(gpu_graph *g)
{
    graph_drop(g);
    free(g->key);
    memset(g, 0, sizeof *g);
}

/* Drops the recorded graphs, keeping what is known of each binding. */
static void graphs_invalidate(kiln_gpu_run *r)
{
    for (int i = 0; i < GRAPHS_PER_RUN; i++) graph_drop(&r->graphs[i]);
}

static void run_free(kiln_gpu_run *r)
{
    for (int i = 0; i < GRAPHS_PER_RUN; i++) graph_clear(&r->graphs[i]);
    held_free(&r->held, &r->n_held);
    if (r->stream) gpuStreamSynchronize(r->stream);
    dev_bytes_add(r->gs, -(int64_t)(r->arena_size + r->workspace_size + (r->blas_ws ? BLAS_WORKSPACE : 0)));
    if (r->blas) gpublasDestroy(r->blas);
    gpuFree(r->blas_ws);
    for (int i = 0; i < MEMO_SLOTS; i++)
        if (r->memos[i].node && r->memos[i].release) r->memos[i].release(r->memos[i].state);
#if !defined(KILN_HIP)
    if (r->dnn) kiln_dnn.destroy((cudnnHandle_t)r->dnn);
    if (r->blaslt) kiln_blaslt.destroy((cublasLtHandle_t)r->blaslt);
#endif
    gpuFree(r->arena);
    gpuFree(r->workspace);
    if (r->pinned) gpuFreeHost(r->pinned);
    gpuFree(r->check);
    gpuFree(r->tickets);
    if (r->check_host) gpuFreeHost(r->check_host);
    if (r->stream) gpuStreamDestroy(r->stream);
    free(r);
}

void kiln_gpu_session_free(kiln_gpu_session *gs)
{
    if (!gs) return;
    gpuSetDevice(gs->device);
    for (kiln_gpu_run *r = gs->all_runs, *nx; r; r = nx) {
        nx = r->next_all;
        run_free(r);
    }
    if (gs->weight)
        for (int id = 0; id < gs->g->n_values; id++) kiln_value_free(gs->weight[id]);
    free(gs->weight);
    gpuFree(gs->weights);
    for (mem_block *b = gs->blocks, *nx; b; b = nx) { /* not given back by the caller */
        nx = b->next;
        gpuFree(b->p);
        free(b);
    }
    kiln_gpu_fused_free(gs->fused);
    pthread_mutex_destroy(&gs->lock);
    free(gs);
}

void kiln_gpu_session_stats(kiln_gpu_session *gs, kiln_session_stats *st)
{
    pthread_mutex_lock(&gs->lock);
    st->nodes_gpu = gs->nodes_gpu;
    st->nodes_cpu = gs->nodes_cpu;
    st->node_runs_gpu = gs->node_runs_gpu;
    st->node_runs_cpu = gs->node_runs_cpu;
    st->device_mallocs = gs->mallocs;
    st->copies_to_device = gs->to_device;
    st->copies_to_host = gs->to_host;
    st->graphs_captured = gs->captured;
    st->graphs_replayed = gs->replayed;
    st->device_bytes_peak = gs->dev_peak;
    snprintf(st->graphs_note, sizeof st->graphs_note, "%s", gs->why);
    kiln_gpu_fused_stats(gs->fused, &st->kernels_generated, &st->kernels_from_cache, st->kernels_note,
                         sizeof st->kernels_note);
    pthread_mutex_unlock(&gs->lock);
}

/* ---- run contexts ---- */

static kiln_status run_new(kiln_gpu_session *gs, kiln_gpu_run **out, kiln_err *err)
{
    kiln_gpu_run *r = calloc(1, sizeof *r);
    if (!r) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    r->gs = gs;
    gpuError_t e = gpuStreamCreate(&r->stream);
    if (e != gpuSuccess) {
        run_free(r);
        return rt_fail(err, e, "creating a stream");
    }
    *out = r;
    return KILN_OK;
}

/* The run context's cuBLAS handle, made (with its workspace, on its stream) when a kernel
 * first asks: sessions without a BLAS node never load cuBLAS. Not while capturing (a
 * recorded binding ran plainly first, so its handle exists). */
static kiln_status blas_ready(kiln_gpu_run *r, kiln_err *err)
{
    if (r->blas) return KILN_OK;
    if (r->capturing) return kiln_errf(err, KILN_ERR_RUNTIME, "GPU: no BLAS handle while recording");
    KILN_TRY(kiln_gpu_blas_open(err));
    gpuError_t e = gpuSuccess;
    if (!r->blas_ws) {
        e = gpuMalloc(&r->blas_ws, BLAS_WORKSPACE);
        if (e != gpuSuccess) return rt_fail(err, e, "allocating the BLAS workspace");
        dev_bytes_add(r->gs, BLAS_WORKSPACE);
    }
    if (gpublasCreate(&r->blas) != GPUBLAS_STATUS_SUCCESS) {
        r->blas = NULL;
        return kiln_errf(err, KILN_ERR_RUNTIME, "GPU: cannot create a BLAS handle");
    }
    if (gpublasSetStream(r->blas, r->stream) != GPUBLAS_STATUS_SUCCESS ||
        gpublasSetWorkspace(r->blas, r->blas_ws, BLAS_WORKSPACE) != GPUBLAS_STATUS_SUCCESS) {
        gpublasDestroy(r->blas);
        r->blas = NULL;
        return kiln_errf(err, KILN_ERR_RUNTIME, "GPU: cannot set up the BLAS handle");
    }
    return KILN_OK;
}

/* Grows *buf to at least `need` bytes, stream ordered (the old buffer is freed after the work
 * queued before), with a quarter more room: sizes that creep up run after run (a decoder's
 * mask and attention rows, one position per step) reallocate now and then, not on every step.
 * Counts the allocation. */
static gpuError_t grow(kiln_gpu_run *r, void **buf, size_t *size, size_t need)
{
    if (*size >= need) return gpuSuccess;
    if (r->capturing) return gpuErrorNotPermitted; /* a recorded run allocates nothing */
    graphs_invalidate(r);
    if (*buf) gpuFreeAsync(*buf, r->stream);
    dev_bytes_add(r->gs, -(int64_t)*size);
    *buf = NULL;
    *size = 0;
    size_t room = need + need / 4 > need ? align_up(need + need / 4) : need;
    gpuError_t e = gpuMallocAsync(buf, room, r->stream);
    if (e != gpuSuccess) return e;
    *size = room;
    dev_bytes_add(r->gs, (int64_t)room);
    r->mallocs++;
    return gpuSuccess;
}

kiln_status kiln_gpu_run_begin(kiln_gpu_session *gs, size_t arena_bytes, kiln_gpu_run **out, kiln_err *err)
{
    *out = NULL;
    gpuError_t e = gpuSetDevice(gs->device);
    if (e != gpuSuccess) return rt_fail(err, e, "selecting the device");
    pthread_mutex_lock(&gs->lock);
    kiln_gpu_run *r = gs->free_runs;
    if (r) gs->free_runs = r->next;
    pthread_mutex_unlock(&gs->lock);
    if (!r) {
        KILN_TRY(run_new(gs, &r, err));
        pthread_mutex_lock(&gs->lock);
        r->next_all = gs->all_runs;
        gs->all_runs = r;
        pthread_mutex_unlock(&gs->lock);
    }
    r->mallocs = r->to_device = r->to_host = r->nodes_gpu = r->nodes_cpu = r->captured = r->replayed = 0;
    r->pinned_used = 0;
    r->serial++;
    r->error = gpuSuccess;
    r->capturing = r->unrecordable = r->check_used = false;
    e = grow(r, (void **)&r->arena, &r->arena_size, align_up(arena_bytes));
    if (e != gpuSuccess) {
        kiln_gpu_run_end(gs, r, NULL);
        return kiln_errf(err, KILN_ERR_NOMEM, "GPU: cannot allocate a %zu-byte device arena: %s", arena_bytes,
                         gpuGetErrorString(e));
    }
    *out = r;
    return KILN_OK;
}

kiln_status kiln_gpu_run_end(kiln_gpu_session *gs, kiln_gpu_run *r, kiln_err *err)
{
    if (!r) return KILN_OK;
    gpuError_t e = r->check_used ? gpuMemcpyAsync(r->check_host, r->check, sizeof *r->check, gpuMemcpyDeviceToHost,
                                                   r->stream)
                                 : gpuSuccess;
    gpuError_t es = gpuStreamSynchronize(r->stream);
    if (e == gpuSuccess) e = es;
    if (e == gpuSuccess) e = r->error;
    if (e == gpuSuccess) e = gpuGetLastError();
    int32_t bad = e == gpuSuccess && r->check_used ? *r->check_host : 0;
    if (bad) { /* cleared for the next run */
        e = gpuMemsetAsync(r->check, 0, sizeof *r->check, r->stream);
        if (e == gpuSuccess) e = gpuStreamSynchronize(r->stream);
    }
    pthread_mutex_lock(&gs->lock);
    gs->mallocs += r->mallocs;
    gs->to_device += r->to_device;
    gs->to_host += r->to_host;
    gs->node_runs_gpu += r->nodes_gpu;
    gs->node_runs_cpu += r->nodes_cpu;
    gs->captured += r->captured;
    gs->replayed += r->replayed;
    if (r->unrecordable) memcpy(gs->why, r->why, sizeof gs->why);
    r->next = gs->free_runs;
    gs->free_runs = r;
    pthread_mutex_unlock(&gs->lock);
    if (e != gpuSuccess) return rt_fail(err, e, "the run");
    if (bad) {
        const kiln_node *n = bad > 0 && bad <= gs->g->n_nodes ? gs->g->nodes[bad - 1] : NULL;
        return kiln_errf(err, KILN_ERR_SHAPE, "node '%s' (%s): seqlens_k or position_ids (read on the device) out of "
                         "range for the KV cache or the rotary caches", n ? n->name : "?", n ? n->op_type : "?");
    }
    return KILN_OK;
}

kiln_status kiln_gpu_check_word(kiln_run_ctx *c, int32_t **word, int32_t *code)
{
    kiln_gpu_run *r = c->dev;
    if (!r->check) {
        if (r->capturing) return kiln_run_fail(c, KILN_ERR_RUNTIME, "GPU: no check word while recording");
        gpuError_t e = gpuMalloc((void **)&r->check, sizeof *r->check);
        if (e == gpuSuccess) e = gpuMemsetAsync(r->check, 0, sizeof *r->check, r->stream);
        if (e == gpuSuccess) e = gpuHostAlloc((void **)&r->check_host, sizeof *r->check_host);
        if (e != gpuSuccess) {
            gpuFree(r->check);
            r->check = NULL;
            return kiln_gpu_check(c, e, "allocating the check word");
        }
    }
    r->check_used = true;
    *word = r->check;
    *code = c->node->index + 1;
    return KILN_OK;
}

kiln_status kiln_gpu_tickets(kiln_run_ctx *c, int64_t n, int32_t **tickets)
{
    kiln_gpu_run *r = c->dev;
    *tickets = NULL;
    if (n > KILN_GPU_TICKETS) return KILN_OK;
    if (!r->tickets) {
        if (r->capturing) return KILN_OK; /* allocated by an unrecorded run first */
        gpuError_t e = gpuMalloc((void **)&r->tickets, KILN_GPU_TICKETS * sizeof *r->tickets);
        if (e == gpuSuccess) e = gpuMemsetAsync(r->tickets, 0, KILN_GPU_TICKETS * sizeof *r->tickets, r->stream);
        if (e != gpuSuccess) {
            gpuFree(r->tickets);
            r->tickets = NULL;
            return kiln_gpu_check(c, e, "allocating the tickets");
        }
    }
    *tickets = r->tickets;
    return KILN_OK;
}

unsigned char *kiln_gpu_run_arena(kiln_gpu_run *r) { return r->arena; }

void kiln_gpu_run_count_node(kiln_gpu_run *r, bool on_gpu)
{
    if (on_gpu) r->nodes_gpu++;
    else r->nodes_cpu++;
}

/* ---- device tensors and copies ---- */

static void pool_release(void *data, void *ctx)
{
    kiln_gpu_run *r = ctx;
    gpuFreeAsync(data, r->stream);
}

kiln_status kiln_gpu_tensor(kiln_gpu_run *r, kiln_dtype dt, int rank, const int64_t *dims, void *dst,
                            kiln_value **out, kiln_err *err)
{
    if (dt == KILN_DTYPE_STRING) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "GPU: string tensors stay on the host");
    kiln_value *v;
    KILN_TRY(kiln_value_view(dt, rank, dims, dst, &v, err));
    v->on_device = true;
    if (v->nbytes && !dst) {
        /* recordable: a capture records the allocation and the release (the value is
         * released before the capture ends; outputs must be in the arena, see capture_end) */
        void *p = NULL;
        gpuError_t e = gpuMallocAsync(&p, v->nbytes, r->stream);
        if (e != gpuSuccess) {
            kiln_value_free(v);
            return kiln_errf(err, KILN_ERR_NOMEM, "GPU: cannot allocate %zu bytes: %s", v->nbytes, gpuGetErrorString(e));
        }
        v->data = p;
        v->owns_data = true;
        v->release = pool_release;
        v->release_ctx = r;
    }
    *out = v;
    return KILN_OK;
}

/* Room for n bytes in the pinned staging buffer; waits for the queued copies when full. */
static kiln_status staging(kiln_gpu_run *r, size_t n, unsigned char **p, kiln_err *err)
{
    n = align_up(n);
    if (r->pinned_used + n > r->pinned_size) {
        gpuError_t e = gpuStreamSynchronize(r->stream);
        if (e != gpuSuccess) return rt_fail(err, e, "the run");
        r->pinned_used = 0;
        if (n > r->pinned_size) {
            size_t size = n > PINNED_MIN ? n : PINNED_MIN;
            if (r->pinned) gpuFreeHost(r->pinned);
            r->pinned = NULL;
            r->pinned_size = 0;
            e = gpuHostAlloc((void **)&r->pinned, size);
            if (e != gpuSuccess) return rt_fail(err, e, "allocating pinned memory");
            r->pinned_size = size;
        }
    }
    *p = r->pinned + r->pinned_used;
    r->pinned_used += n;
    return KILN_OK;
}

/* During a capture, memory the recording keeps for its replays: pinned host bytes it
 * uploads from and device buffers it leaves outputs in. A value the host computed in the
 * middle of a recordable run depends on the binding's shapes alone (device.h), so the
 * recorded copy from its bytes is right on every replay of that binding. */
static kiln_status held_alloc(kiln_gpu_run *r, size_t n, bool device, void **p, kiln_err *err)
{
    held_buf *grown = realloc(r->held, ((size_t)r->n_held + 1) * sizeof *grown);
    if (!grown) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    r->held = grown;
    gpuError_t e = device ? gpuMalloc(p, n) : gpuHostAlloc(p, n);
    if (e != gpuSuccess) return rt_fail(err, e, device ? "allocating device memory" : "allocating pinned memory");
    r->held[r->n_held++] = (held_buf){*p, device};
    return KILN_OK;
}

kiln_status kiln_gpu_capture_output(kiln_gpu_run *r, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    void *at = x->data;
    const unsigned char *p = x->data;
    if (x->nbytes && (p < r->arena || p + x->nbytes > r->arena + r->arena_size)) {
        /* from the pool, released before the recording ends: copied to memory it keeps */
        KILN_TRY(held_alloc(r, x->nbytes, true, &at, err));
        gpuError_t e = gpuMemcpyAsync(at, x->data, x->nbytes, gpuMemcpyDeviceToDevice, r->stream);
        if (e != gpuSuccess) return rt_fail(err, e, "copying an output");
    }
    KILN_TRY(kiln_value_view(x->dtype, x->rank, x->dims, at, out, err));
    (*out)->on_device = true;
    return KILN_OK;
}

kiln_status kiln_gpu_to_device(kiln_gpu_run *r, const kiln_ir_value *iv, const kiln_value *host, void *dst,
                               kiln_value **out, kiln_err *err)
{
    *out = NULL;
    const kiln_gpu_session *gs = r->gs;
    if (iv && iv->graph == gs->g && gs->weight && gs->weight[iv->id]) {
        const kiln_value *w = gs->weight[iv->id];
        KILN_TRY(kiln_value_view(w->dtype, w->rank, w->dims, w->data, out, err));
        (*out)->on_device = true;
        return KILN_OK;
    }
    KILN_TRY(kiln_gpu_tensor(r, host->dtype, host->rank, host->dims, dst, out, err));
    if (!host->nbytes) return KILN_OK;
    if (host->on_device) { /* the caller's device tensor */
        gpuError_t e = gpuMemcpyAsync((*out)->data, host->data, host->nbytes, gpuMemcpyDeviceToDevice, r->stream);
        if (e != gpuSuccess) {
            kiln_value_free(*out);
            *out = NULL;
            return rt_fail(err, e, "copying an input on the device");
        }
        return KILN_OK;
    }
    unsigned char *stage;
    kiln_status st = r->capturing ? held_alloc(r, host->nbytes, false, (void **)&stage, err)
                                  : staging(r, host->nbytes, &stage, err);
    if (!st) {
        memcpy(stage, host->data, host->nbytes);
        gpuError_t e = gpuMemcpyAsync((*out)->data, stage, host->nbytes, gpuMemcpyHostToDevice, r->stream);
        if (e != gpuSuccess) st = rt_fail(err, e, "copying to the device");
    }
    if (st) {
        kiln_value_free(*out);
        *out = NULL;
        return st;
    }
    r->to_device++;
    return KILN_OK;
}

static void caller_release(void *data, void *ctx)
{
    (void)ctx;
    gpuFreeAsync(data, 0);
}

/* A caller-owned device tensor with x's dims, from the stream-ordered pool, on `stream`. */
static kiln_status caller_tensor(const kiln_value *x, gpuStream_t stream, kiln_value **out, kiln_err *err)
{
    KILN_TRY(kiln_value_view(x->dtype, x->rank, x->dims, NULL, out, err));
    (*out)->on_device = true;
    if (!x->nbytes) return KILN_OK;
    void *p = NULL;
    gpuError_t e = gpuMallocAsync(&p, x->nbytes, stream);
    if (e != gpuSuccess) {
        kiln_value_free(*out);
        *out = NULL;
        return kiln_errf(err, KILN_ERR_NOMEM, "GPU: cannot allocate a %zu-byte output: %s", x->nbytes, gpuGetErrorString(e));
    }
    (*out)->data = p;
    (*out)->owns_data = true;
    (*out)->release = caller_release;
    return KILN_OK;
}

kiln_status kiln_gpu_output(kiln_gpu_run *r, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    if (x->dtype == KILN_DTYPE_STRING) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "GPU: string tensors stay on the host");
    KILN_TRY(caller_tensor(x, r->stream, out, err));
    if (!x->nbytes) return KILN_OK;
    gpuError_t e;
    if (x->on_device) {
        e = gpuMemcpyAsync((*out)->data, x->data, x->nbytes, gpuMemcpyDeviceToDevice, r->stream);
    } else {
        unsigned char *stage;
        kiln_status st = staging(r, x->nbytes, &stage, err);
        if (st) {
            kiln_value_free(*out);
            *out = NULL;
            return st;
        }
        memcpy(stage, x->data, x->nbytes);
        e = gpuMemcpyAsync((*out)->data, stage, x->nbytes, gpuMemcpyHostToDevice, r->stream);
        r->to_device++;
    }
    if (e != gpuSuccess) {
        kiln_value_free(*out);
        *out = NULL;
        return rt_fail(err, e, "copying an output");
    }
    return KILN_OK;
}

kiln_status kiln_gpu_clone(kiln_gpu_session *gs, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    gpuError_t e = gpuSetDevice(gs->device);
    if (e != gpuSuccess) return rt_fail(err, e, "selecting the device");
    KILN_TRY(caller_tensor(x, 0, out, err));
    if (!x->nbytes) return KILN_OK;
    e = gpuMemcpyAsync((*out)->data, x->data, x->nbytes, gpuMemcpyDeviceToDevice, 0);
    if (e == gpuSuccess) e = gpuStreamSynchronize(0);
    if (e != gpuSuccess) {
        kiln_value_free(*out);
        *out = NULL;
        return rt_fail(err, e, "copying an output");
    }
    return KILN_OK;
}

kiln_status kiln_gpu_mem_alloc(kiln_gpu_session *gs, size_t bytes, void **out, kiln_err *err)
{
    *out = NULL;
    gpuError_t e = gpuSetDevice(gs->device);
    if (e != gpuSuccess) return rt_fail(err, e, "selecting the device");
    void *p = NULL;
    e = gpuMalloc(&p, bytes);
    if (e != gpuSuccess)
        return kiln_errf(err, KILN_ERR_NOMEM, "GPU: cannot allocate %zu bytes: %s", bytes, gpuGetErrorString(e));
    e = gpuMemsetAsync(p, 0, bytes, 0);
    if (e == gpuSuccess) e = gpuStreamSynchronize(0);
    mem_block *b = e == gpuSuccess ? malloc(sizeof *b) : NULL;
    if (!b) {
        gpuFree(p);
        return e != gpuSuccess ? rt_fail(err, e, "zeroing device memory") : kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    *b = (mem_block){p, bytes, NULL};
    pthread_mutex_lock(&gs->lock);
    b->next = gs->blocks;
    gs->blocks = b;
    pthread_mutex_unlock(&gs->lock);
    dev_bytes_add(gs, (int64_t)bytes);
    *out = p;
    return KILN_OK;
}

void kiln_gpu_mem_free(kiln_gpu_session *gs, void *p)
{
    if (!p) return;
    gpuSetDevice(gs->device);
    gpuFree(p);
    size_t n = 0;
    pthread_mutex_lock(&gs->lock);
    for (mem_block **b = &gs->blocks; *b; b = &(*b)->next)
        if ((*b)->p == p) {
            mem_block *f = *b;
            n = f->n;
            *b = f->next;
            free(f);
            break;
        }
    pthread_mutex_unlock(&gs->lock);
    dev_bytes_add(gs, -(int64_t)n);
}

kiln_status kiln_gpu_to_host(kiln_gpu_run *r, const kiln_value *dev, void *dst, kiln_value **out, kiln_err *err)
{
    *out = NULL;
    kiln_value *h;
    if (dst) KILN_TRY(kiln_value_view(dev->dtype, dev->rank, dev->dims, dst, &h, err));
    else KILN_TRY(kiln_tensor_new(dev->dtype, dev->rank, dev->dims, &h, err));
    if (dev->nbytes) {
        unsigned char *stage;
        kiln_status st = staging(r, dev->nbytes, &stage, err);
        if (!st) {
            gpuError_t e = gpuMemcpyAsync(stage, dev->data, dev->nbytes, gpuMemcpyDeviceToHost, r->stream);
            if (e == gpuSuccess) e = gpuStreamSynchronize(r->stream);
            if (e != gpuSuccess) st = rt_fail(err, e, "copying to the host");
        }
        if (st) {
            kiln_value_free(h);
            return st;
        }
        memcpy(h->data, stage, dev->nbytes);
        r->to_host++;
    }
    *out = h;
    return KILN_OK;
}

/* ---- the run context of a GPU kernel ---- */

gpuStream_t kiln_gpu_stream(kiln_run_ctx *c) { return c->dev->stream; }
kiln_status kiln_gpu_blas(kiln_run_ctx *c, void **handle)
{
    *handle = NULL;
    kiln_err *err = kiln_run_err(c);
    kiln_status st = blas_ready(c->dev, err);
    if (st) return kiln_err_prefix(err, "node '%s' (%s)", c->node->name, c->node->op_type);
    *handle = c->dev->blas;
    return KILN_OK;
}

kiln_status kiln_gpu_blaslt(kiln_run_ctx *c, void **handle, void **ws, size_t *ws_size)
{
    *handle = *ws = NULL;
    *ws_size = 0;
#if !defined(KILN_HIP)
    kiln_gpu_run *r = c->dev;
    if (!r->blaslt && !r->blaslt_tried && !r->capturing) { /* a recorded binding ran plainly first */
        r->blaslt_tried = true;
        kiln_err quiet = {0};
        cublasLtHandle_t h;
        if (!kiln_gpu_blaslt_open(&quiet) && kiln_blaslt.create(&h) == CUBLAS_STATUS_SUCCESS) r->blaslt = h;
    }
    if (!r->blaslt) return KILN_OK;
    void *blas;
    KILN_TRY(kiln_gpu_blas(c, &blas)); /* the workspace both share (one stream: never at once) */
    *handle = r->blaslt, *ws = r->blas_ws, *ws_size = BLAS_WORKSPACE;
#else
    (void)c;
#endif
    return KILN_OK;
}

kiln_status kiln_gpu_dnn(kiln_run_ctx *c, void **handle)
{
    kiln_gpu_run *r = c->dev;
    *handle = r->dnn;
#if defined(KILN_HIP)
    return KILN_OK;
#else
    if (r->dnn || r->capturing) return KILN_OK; /* a recorded binding ran plainly first */
    kiln_err quiet = {0};
    if (kiln_gpu_dnn_open(&quiet)) return KILN_OK; /* no cuDNN: the callers' own kernels */
    cudnnHandle_t h;
    cudnnStatus_t st = kiln_dnn.create(&h);
    if (st != CUDNN_STATUS_SUCCESS)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "GPU: cannot create a cuDNN handle: %s", kiln_dnn.error_string(st));
    st = kiln_dnn.set_stream(h, r->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
        kiln_dnn.destroy(h);
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "GPU: cannot set up the cuDNN handle: %s", kiln_dnn.error_string(st));
    }
    *handle = r->dnn = h;
    return KILN_OK;
#endif
}

/* The memo slot of (node, key): FNV-1a over the node's address and the key. */
static memo *memo_slot(kiln_gpu_run *r, const kiln_node *node, const int64_t *key, int n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)node;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
    return &r->memos[(h ^ h >> 32) % MEMO_SLOTS];
}

static void *memo_get(kiln_gpu_run *r, const kiln_node *node, const int64_t *key, int n)
{
    if (n > KILN_GPU_MEMO_KEY) return NULL;
    memo *m = memo_slot(r, node, key, n);
    if (m->node != node || m->n_key != n || memcmp(m->key, key, (size_t)n * sizeof *key)) return NULL;
    return m->state;
}

static void memo_put(kiln_gpu_run *r, const kiln_node *node, const int64_t *key, int n, void *state,
                     void (*release)(void *state))
{
    if (n > KILN_GPU_MEMO_KEY) {
        if (release) release(state);
        return;
    }
    memo *m = memo_slot(r, node, key, n);
    if (m->node && m->release) m->release(m->state);
    m->node = node;
    memcpy(m->key, key, (size_t)n * sizeof *key);
    m->n_key = n;
    m->state = state;
    m->release = release;
}

void *kiln_gpu_memo_get(kiln_run_ctx *c, const int64_t *key, int n) { return memo_get(c->dev, c->node, key, n); }

void kiln_gpu_memo_put(kiln_run_ctx *c, const int64_t *key, int n, void *state, void (*release)(void *state))
{
    memo_put(c->dev, c->node, key, n, state, release);
}

/* The shared entries' owner in the table: the run context's own address, which no node has. */
#define SHARED(r) ((const kiln_node *)(const void *)(r))

void *kiln_gpu_memo_shared_get(kiln_run_ctx *c, const int64_t *key, int n)
{
    return memo_get(c->dev, SHARED(c->dev), key, n);
}

void kiln_gpu_memo_shared_put(kiln_run_ctx *c, const int64_t *key, int n, void *state, void (*release)(void *state))
{
    memo_put(c->dev, SHARED(c->dev), key, n, state, release);
}

int64_t kiln_gpu_run_serial(kiln_run_ctx *c) { return c->dev->serial; }

int kiln_gpu_sm_count(kiln_run_ctx *c) { return c->dev->gs->sm_count; }

void *kiln_gpu_generated_kernel(kiln_run_ctx *c) { return kiln_gpu_fused_kernel(c->dev->gs->fused, kiln_run_node(c)); }

unsigned kiln_gpu_blocks(int64_t n, unsigned block)
{
    int64_t b = (n + block - 1) / block;
    if (b < 1) b = 1;
    if (b > INT32_MAX) b = INT32_MAX;
    return (unsigned)b;
}

kiln_status kiln_gpu_workspace(kiln_run_ctx *c, size_t bytes, void **p)
{
    kiln_gpu_run *r = c->dev;
    gpuError_t e = grow(r, &r->workspace, &r->workspace_size, align_up(bytes ? bytes : 1));
    if (e != gpuSuccess)
        return kiln_run_fail(c, KILN_ERR_NOMEM, "GPU: cannot allocate a %zu-byte workspace: %s", bytes,
                             gpuGetErrorString(e));
    *p = r->workspace;
    return KILN_OK;
}

kiln_status kiln_gpu_upload(kiln_run_ctx *c, void *dst, const void *src, size_t bytes)
{
    kiln_gpu_run *r = c->dev;
    if (!bytes) return KILN_OK;
    unsigned char *stage;
    kiln_status st = r->capturing ? held_alloc(r, bytes, false, (void **)&stage, c->err) : staging(r, bytes, &stage, c->err);
    if (st) return kiln_err_prefix(c->err, "node '%s' (%s)", c->node->name, c->node->op_type);
    memcpy(stage, src, bytes);
    r->to_device++;
    return kiln_gpu_check(c, gpuMemcpyAsync(dst, stage, bytes, gpuMemcpyHostToDevice, r->stream), "an upload");
}

kiln_status kiln_gpu_check(kiln_run_ctx *c, gpuError_t e, const char *what)
{
    if (e == gpuSuccess) return KILN_OK;
    if (c->dev && c->dev->error == gpuSuccess) c->dev->error = e;
    return kiln_run_fail(c, KILN_ERR_RUNTIME, "GPU: %s failed: %s", what, gpuGetErrorString(e));
}

kiln_status kiln_gpu_launched(kiln_run_ctx *c, const char *kernel) { return kiln_gpu_check(c, gpuGetLastError(), kernel); }

kiln_status kiln_gpu_fallback(kiln_run_ctx *c)
{
    const kiln_node *n = c->node;
    kiln_gpu_run *r = c->dev;
    kiln_gpu_mark_unrecordable(r, "node '%s' (%s) fell back to its CPU kernel", n->name, n->op_type);
    int ni = n->n_in, no = n->n_out;
    kiln_value **tmp_in = calloc((size_t)ni + 1, sizeof *tmp_in);
    const kiln_value **in = calloc((size_t)ni + 1, sizeof *in);
    kiln_value **out = calloc((size_t)no + 1, sizeof *out);
    kiln_status st = !tmp_in || !in || !out ? kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory") : KILN_OK;
    for (int i = 0; i < ni && !st; i++) {
        in[i] = c->in[i];
        if (in[i] && in[i]->kind == KILN_VALUE_TENSOR && in[i]->on_device) {
            st = kiln_gpu_to_host(r, in[i], NULL, &tmp_in[i], c->err);
            in[i] = tmp_in[i];
        }
    }
    for (int i = 0; i < no && !st; i++)
        if (c->out[i]) st = kiln_tensor_new(c->out[i]->dtype, c->out[i]->rank, c->out[i]->dims, &out[i], c->err);
    if (!st) {
        kiln_run_ctx h = {.node = n, .frame = c->frame, .pool = c->pool, .in = in, .out = out, .err = c->err,
                          .subgraph = c->subgraph};
        st = n->op->run(&h);
    }
    for (int i = 0; i < no && !st; i++) {
        if (!out[i] || out[i]->kind != KILN_VALUE_TENSOR) continue;
        kiln_value *d = c->out[i];
        if (d && d->rank == out[i]->rank && d->dtype == out[i]->dtype &&
            !memcmp(d->dims, out[i]->dims, (size_t)d->rank * sizeof *d->dims)) {
            kiln_value *unused;
            /* same shape: into the output's own buffer */
            st = kiln_gpu_to_device(r, NULL, out[i], d->data, &unused, c->err);
            kiln_value_free(unused);
        } else {
            st = kiln_gpu_to_device(r, NULL, out[i], NULL, &d, c->err);
            if (!st) {
                kiln_value_free(c->out[i]);
                c->out[i] = d;
            }
        }
    }
    /* the copies read the staging buffer, not out[]: free now */
    for (int i = 0; i < ni; i++) kiln_value_free(tmp_in ? tmp_in[i] : NULL);
    for (int i = 0; i < no; i++) kiln_value_free(out ? out[i] : NULL);
    free(tmp_in);
    free(in);
    free(out);
    return st;
}

/* ---- CUDA graphs ---- */

static gpu_graph *graph_find(kiln_gpu_run *r, const int64_t *key, int n)
{
    for (int i = 0; i < GRAPHS_PER_RUN; i++) {
        gpu_graph *g = &r->graphs[i];
        if (g->key && g->n_key == n && !memcmp(g->key, key, (size_t)n * sizeof *key)) {
            g->used = ++r->tick;
            return g;
        }
    }
    return NULL;
}

kiln_capture_mode kiln_gpu_graph_mode(kiln_gpu_run *r, const int64_t *key, int n)
{
    const gpu_graph *g = graph_find(r, key, n);
    if (!g || g->unrecordable) return KILN_CAPTURE_OFF;
    return g->exec ? KILN_CAPTURE_REPLAY : KILN_CAPTURE_RECORD;
}

void kiln_gpu_graph_note(kiln_gpu_run *r, const int64_t *key, int n)
{
    gpu_graph *g = graph_find(r, key, n);
    if (!g) {
        g = &r->graphs[0];
        for (int i = 1; i < GRAPHS_PER_RUN; i++)
            if (r->graphs[i].used < g->used) g = &r->graphs[i];
        graph_clear(g);
        g->key = malloc(((size_t)n + 1) * sizeof *key);
        if (!g->key) return;
        memcpy(g->key, key, (size_t)n * sizeof *key);
        g->n_key = n;
        g->used = ++r->tick;
    }
    g->plain_runs++;
    if (r->unrecordable) g->unrecordable = true;
}

void kiln_gpu_mark_unrecordable(kiln_gpu_run *r, const char *fmt, ...)
{
    if (r->unrecordable) return;
    r->unrecordable = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
}
bool kiln_gpu_capturing(const kiln_gpu_run *r) { return r->capturing; }

kiln_status kiln_gpu_capture_begin(kiln_gpu_run *r, kiln_err *err)
{
    gpuError_t e = gpuStreamBeginCapture(r->stream);
    if (e != gpuSuccess) return rt_fail(err, e, "starting a graph capture");
    r->capturing = true;
    r->unrecordable = false;
    return KILN_OK;
}

kiln_status kiln_gpu_capture_end(kiln_gpu_run *r, const int64_t *key, int n, bool ok, int n_out,
                                 kiln_value *const *outs, bool *recorded, kiln_err *err)
{
    *recorded = false;
    gpuGraph_t graph = NULL;
    gpuError_t e = gpuStreamEndCapture(r->stream, &graph);
    r->capturing = false;
    gpu_graph *g = graph_find(r, key, n);
    ok = ok && e == gpuSuccess && graph && !r->unrecordable && g;
    for (int j = 0; ok && j < n_out; j++) ok = outs[j] && outs[j]->kind == KILN_VALUE_TENSOR && outs[j]->on_device;
    gpuGraphExec_t exec = NULL;
    if (ok && gpuGraphInstantiate(&exec, graph) != gpuSuccess) ok = false;
    if (graph) gpuGraphDestroy(graph);
    if (!ok) {
        gpuGetLastError(); /* a failed capture leaves no lasting error */
        kiln_gpu_mark_unrecordable(r, "the capture failed (%s)", e != gpuSuccess ? gpuGetErrorString(e) : "instantiation, or an output not on the device");
        if (exec) gpuGraphExecDestroy(exec);
        if (g) g->unrecordable = true;
        held_free(&r->held, &r->n_held);
        return KILN_OK;
    }
    g->held = r->held;
    g->n_held = r->n_held;
    r->held = NULL;
    r->n_held = 0;
    g->out = calloc((size_t)n_out + 1, sizeof *g->out);
    if (!g->out) {
        gpuGraphExecDestroy(exec);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    for (int j = 0; j < n_out; j++) {
        const kiln_value *v = outs[j];
        kiln_status st = kiln_value_view(v->dtype, v->rank, v->dims, v->data, &g->out[j], err);
        if (st) {
            graph_clear(g);
            gpuGraphExecDestroy(exec);
            return st;
        }
        g->out[j]->on_device = true;
        g->n_out = j + 1;
    }
    g->exec = exec;
    g->checks = r->check_used;
    g->nodes_gpu = r->nodes_gpu;
    g->nodes_cpu = r->nodes_cpu;
    r->captured++;
    *recorded = true;
    return KILN_OK;
}

kiln_status kiln_gpu_replay(kiln_gpu_run *r, const int64_t *key, int n, int *n_out, kiln_value *const **outs,
                            kiln_err *err)
{
    gpu_graph *g = graph_find(r, key, n);
    if (!g || !g->exec) return kiln_errf(err, KILN_ERR_RUNTIME, "internal: no recorded graph for this binding");
    gpuError_t e = gpuGraphLaunch(g->exec, r->stream);
    if (e != gpuSuccess) return rt_fail(err, e, "launching the recorded graph");
    r->replayed++;
    r->check_used |= g->checks;
    r->nodes_gpu += g->nodes_gpu;
    r->nodes_cpu += g->nodes_cpu;
    *n_out = g->n_out;
    *outs = g->out;
    return KILN_OK;
}

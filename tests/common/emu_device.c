/* emu_device.c - a device provider for tests on any CPU (emu_device.h). Its "device memory" is
 * host memory holding every byte XOR EMU_KEY, so a host kernel that reads a device value
 * without a copy, or a device kernel handed a host value, computes garbage or fails, as it
 * would on a GPU. Its kernels are the registry's reference kernels, run on unscrambled copies. */
#include "emu_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/value.h"
#include "ir/graph.h"
#include "ops/ctx.h"

#define EMU_KEY 0xA5u
/* what a fresh run's arena holds before the plan's values are written there */
#define EMU_ARENA_FILL 0x7Fu

static emu_device_mode mode = EMU_DEVICE_ALL;

void emu_device_set_mode(emu_device_mode m) { mode = m; }

struct kiln_provider {
    const kiln_graph *g;  /* the main graph, after prepare */
    kiln_value **uploads; /* by value id of g: the scrambled copy of each constant, or NULL */
    int n_uploads;
};

struct kiln_provider_run {
    kiln_provider *p;
    unsigned char *arena;
};

static void scramble(void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) d[i] = s[i] ^ EMU_KEY;
}

/* An owned tensor of x's type, on the device when `device`, holding x's elements (scrambled
 * or unscrambled as the two sides need). */
static kiln_status copy_tensor(const kiln_value *x, bool device, void *dst, kiln_value **out, kiln_err *err)
{
    if (dst) KILN_TRY(kiln_value_view(x->dtype, x->rank, x->dims, dst, out, err));
    else KILN_TRY(kiln_tensor_new_unset(x->dtype, x->rank, x->dims, out, err));
    if (x->nbytes) {
        if (x->on_device == device) memmove((*out)->data, x->data, x->nbytes);
        else scramble((*out)->data, x->data, x->nbytes);
    }
    (*out)->on_device = device;
    return KILN_OK;
}

static kiln_status emu_open(const kiln_session_options *opt, kiln_provider **out, kiln_err *err)
{
    (void)opt;
    *out = calloc(1, sizeof **out);
    return *out ? KILN_OK : kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
}

static void emu_close(kiln_provider *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_uploads; i++) kiln_value_free(p->uploads[i]);
    free(p->uploads);
    free(p);
}

/* A stable hash of the node's name: EMU_DEVICE_SPLIT puts about half the nodes on each side. */
static unsigned name_hash(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static bool plain_tensor(const kiln_ir_value *v)
{
    return !v || (v->type.kind == KILN_VALUE_TENSOR && v->type.dtype != KILN_DTYPE_STRING &&
                  v->type.dtype != KILN_DTYPE_UNDEFINED);
}

static bool emu_supports(const kiln_provider *p, const kiln_node *n, char *why, size_t size)
{
    (void)p;
    if (!n->op || !n->op->run) return snprintf(why, size, "no reference kernel"), false;
    if (n->op->flags & KILN_OP_READS_TYPE_ONLY) return snprintf(why, size, "reads only the type"), false;
    if (kiln_node_has_subgraphs(n)) return snprintf(why, size, "has subgraphs"), false;
    for (int i = 0; i < n->n_in; i++)
        if (!plain_tensor(n->in[i])) return snprintf(why, size, "input %d is not a numeric tensor", i), false;
    for (int i = 0; i < n->n_out; i++)
        if (!plain_tensor(n->out[i])) return snprintf(why, size, "output %d is not a numeric tensor", i), false;
    if (mode == EMU_DEVICE_SPLIT && (name_hash(n->name) >> 7) % 2)
        return snprintf(why, size, "emu split: host side"), false;
    return true;
}

/* The kernel of every device node: checks that each input is on the side the node reads it
 * on, runs the reference kernel on host copies, writes the outputs back scrambled. */
static kiln_status emu_kernel(kiln_run_ctx *c)
{
    const kiln_node *n = c->node;
    int ni = n->n_in, no = n->n_out;
    kiln_value **tmp_in = calloc((size_t)ni + 1, sizeof *tmp_in);
    const kiln_value **in = calloc((size_t)ni + 1, sizeof *in);
    kiln_value **out = calloc((size_t)no + 1, sizeof *out);
    kiln_status st = !tmp_in || !in || !out ? kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory") : KILN_OK;
    for (int i = 0; i < ni && !st; i++) {
        in[i] = c->in[i];
        if (!in[i] || in[i]->kind != KILN_VALUE_TENSOR) continue;
        bool want_device = !(n->op->host_inputs & KILN_OP_IN(i));
        if (in[i]->on_device != want_device) {
            st = kiln_run_fail(c, KILN_ERR_RUNTIME, "emu device: input %d ('%s') is in %s memory, read on the %s", i,
                               n->in[i] ? n->in[i]->name : "", in[i]->on_device ? "device" : "host",
                               want_device ? "device" : "host");
            break;
        }
        if (in[i]->on_device) {
            st = copy_tensor(in[i], false, NULL, &tmp_in[i], c->err);
            in[i] = tmp_in[i];
        }
    }
    for (int i = 0; i < no && !st; i++) {
        const kiln_value *d = c->out[i];
        if (!d || d->kind != KILN_VALUE_TENSOR) continue;
        if (!d->on_device) {
            st = kiln_run_fail(c, KILN_ERR_RUNTIME, "emu device: output %d ('%s') was allocated in host memory", i,
                               n->out[i] ? n->out[i]->name : "");
            break;
        }
        st = kiln_tensor_new(d->dtype, d->rank, d->dims, &out[i], c->err);
    }
    if (!st) {
        kiln_run_ctx h = {.node = n, .frame = c->frame, .pool = c->pool, .scratch = c->scratch, .in = in, .out = out,
                          .err = c->err, .subgraph = c->subgraph, .alloc_limit = c->alloc_limit};
        st = n->op->run(&h);
    }
    for (int i = 0; i < no && !st; i++) {
        if (!out[i] || out[i]->kind != KILN_VALUE_TENSOR) continue;
        kiln_value *d = c->out[i];
        if (d && d->rank == out[i]->rank && d->dtype == out[i]->dtype &&
            !memcmp(d->dims, out[i]->dims, (size_t)d->rank * sizeof *d->dims)) {
            scramble(d->data, out[i]->data, out[i]->nbytes);
        } else { /* the kernel sized it at run time */
            kiln_value *nd;
            st = copy_tensor(out[i], true, NULL, &nd, c->err);
            if (!st) {
                kiln_value_free(c->out[i]);
                c->out[i] = nd;
            }
        }
    }
    for (int i = 0; i < ni; i++) kiln_value_free(tmp_in ? tmp_in[i] : NULL);
    for (int i = 0; i < no; i++) kiln_value_free(out ? out[i] : NULL);
    free(tmp_in);
    free(in);
    free(out);
    return st;
}

static kiln_kernel_fn emu_select(kiln_provider *p, kiln_node *n, unsigned *host_inputs)
{
    (void)p;
    *host_inputs = n->op ? n->op->host_inputs : 0;
    return emu_kernel;
}

/* Uploads every tensor constant of the main graph (scrambled), as a GPU provider would upload
 * the ones its nodes read. */
static kiln_status emu_prepare(kiln_provider *p, const kiln_graph *g, kiln_err *err)
{
    p->g = g;
    p->uploads = calloc((size_t)g->n_values + 1, sizeof *p->uploads);
    if (!p->uploads) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    p->n_uploads = g->n_values;
    for (int i = 0; i < g->n_values; i++) {
        const kiln_value *w = kiln_ir_constant(g->values[i]);
        /* (a constant a pass left unread may have given its bytes back: data NULL) */
        if (w && w->kind == KILN_VALUE_TENSOR && w->dtype != KILN_DTYPE_STRING && !w->on_device && (w->data || !w->nbytes))
            KILN_TRY(copy_tensor(w, true, NULL, &p->uploads[i], err));
    }
    return KILN_OK;
}

static kiln_status emu_run_begin(kiln_provider *p, size_t arena_bytes, kiln_provider_run **out, kiln_err *err)
{
    kiln_provider_run *r = calloc(1, sizeof *r);
    if (r) r->arena = malloc(arena_bytes ? arena_bytes : 1);
    if (!r || !r->arena) {
        free(r);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    memset(r->arena, EMU_ARENA_FILL, arena_bytes);
    r->p = p;
    *out = r;
    return KILN_OK;
}

static kiln_status emu_run_end(kiln_provider *p, kiln_provider_run *r, kiln_err *err)
{
    (void)p;
    (void)err;
    if (r) free(r->arena);
    free(r);
    return KILN_OK;
}

static unsigned char *emu_run_arena(kiln_provider_run *r) { return r->arena; }

static void emu_count_node(kiln_provider_run *r, bool on_device)
{
    (void)r;
    (void)on_device;
}

static kiln_status emu_tensor(kiln_provider_run *r, kiln_dtype dt, int rank, const int64_t *dims, void *dst,
                              kiln_value **out, kiln_err *err)
{
    (void)r;
    if (dst) KILN_TRY(kiln_value_view(dt, rank, dims, dst, out, err));
    else KILN_TRY(kiln_tensor_new_unset(dt, rank, dims, out, err));
    (*out)->on_device = true;
    return KILN_OK;
}

static kiln_status emu_to_device(kiln_provider_run *r, const kiln_ir_value *iv, const kiln_value *host, void *dst,
                                 kiln_value **out, kiln_err *err)
{
    const kiln_provider *p = r->p;
    if (iv && iv->graph == p->g && iv->id < p->n_uploads && p->uploads[iv->id]) {
        const kiln_value *w = p->uploads[iv->id];
        KILN_TRY(kiln_value_view(w->dtype, w->rank, w->dims, w->data, out, err));
        (*out)->on_device = true;
        return KILN_OK;
    }
    return copy_tensor(host, true, dst, out, err);
}

static kiln_status emu_to_host(kiln_provider_run *r, const kiln_value *dev, void *dst, kiln_value **out, kiln_err *err)
{
    (void)r;
    if (!dev->on_device) return kiln_errf(err, KILN_ERR_RUNTIME, "emu device: to_host of a host tensor");
    return copy_tensor(dev, false, dst, out, err);
}

static kiln_status emu_output(kiln_provider_run *r, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    (void)r;
    return copy_tensor(x, true, NULL, out, err);
}

static kiln_status emu_clone(kiln_provider *p, const kiln_value *x, kiln_value **out, kiln_err *err)
{
    (void)p;
    return copy_tensor(x, true, NULL, out, err);
}

/* Zeroed device memory: zero bytes, scrambled. */
static kiln_status emu_mem_alloc(kiln_provider *p, size_t bytes, void **out, kiln_err *err)
{
    (void)p;
    *out = malloc(bytes);
    if (!*out) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    memset(*out, EMU_KEY, bytes);
    return KILN_OK;
}

static void emu_mem_free(kiln_provider *p, void *ptr)
{
    (void)p;
    free(ptr);
}

const kiln_provider_i emu_device = {
    .api_version = KILN_PROVIDER_API,
    .name = "emu",
    .kind = KILN_PROVIDER_CUDA,
    .device = true,
    .open = emu_open,
    .close = emu_close,
    .supports = emu_supports,
    .select = emu_select,
    .prepare = emu_prepare,
    .run_begin = emu_run_begin,
    .run_end = emu_run_end,
    .run_arena = emu_run_arena,
    .count_node = emu_count_node,
    .tensor = emu_tensor,
    .to_device = emu_to_device,
    .to_host = emu_to_host,
    .output = emu_output,
    .clone = emu_clone,
    .mem_alloc = emu_mem_alloc,
    .mem_free = emu_mem_free,
};

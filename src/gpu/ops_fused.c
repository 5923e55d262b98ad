/* ops_fused.c - kiln.FusedElementwise on the GPU: each node's program (src/ops/fused.h) becomes
 * CUDA C source, the session's kernels are compiled together by NVRTC when the session is
 * created (rtc.h) and kept in the on-disk cache (src/core/cache.h) under a hash of the source,
 * the compiler's version and the device's architecture, so a second process loads them
 * without compiling. The kernels are shape-generic: dims and strides are arguments, so a new
 * shape never compiles anything. Nodes with identical programs share one kernel.
 *
 * Also the GPU pipeline's element-wise fusion: the pass runs only when kernels can be
 * generated here (NVRTC and the driver load), else the nodes stay as they are. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cache.h"
#include "gpu/generated.h"
#include "gpu/gpu.h"
#include "gpu/kshape.h"
#include "gpu/rtc.h"
#include "ops/fused.h"
#include "ops/semantics.h"
#include "passes/passes.h"

#define EWP_RANK KILN_EWP_MAX_RANK
#define EWP_THREADS 256

/* The kernel's one argument; the generated source declares the same struct. */
typedef struct ewp_args {
    void *y;
    long long n;
    int rank, pad;                             /* Y's dims after merging, the innermost apart */
    long long dims[EWP_RANK];                  /* [rank - 1] outer dims */
    long long inner;                           /* the innermost dim (1 for a scalar) */
    const void *x[KILN_EWP_MAX_IN];
    long long st[KILN_EWP_MAX_IN][EWP_RANK];   /* input j's strides along the outer dims */
    long long ist[KILN_EWP_MAX_IN];            /* and along the innermost */
    int mode[KILN_EWP_MAX_IN]; /* 0: strided, 1: contiguous (offset = index), 2: one element */
} ewp_args;

static const char prelude[] =
    "typedef unsigned short kiln_u16;\n"
    "struct kiln_ewp_args { void *y; long long n; int rank, pad; long long dims[8]; long long inner;\n"
    "    const void *x[16]; long long st[16][8]; long long ist[16]; int mode[16]; };\n"
    "static __device__ __forceinline__ float kiln_h2f(kiln_u16 h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) "
    ": \"h\"(h)); return f; }\n"
    "static __device__ __forceinline__ kiln_u16 kiln_f2h(float f) { kiln_u16 h; asm(\"cvt.rn.f16.f32 %0, %1;\" : "
    "\"=h\"(h) : \"f\"(f)); return h; }\n"
    "static __device__ __forceinline__ float kiln_b2f(kiln_u16 b) { return __uint_as_float(((unsigned)b) << 16); }\n"
    "static __device__ __forceinline__ kiln_u16 kiln_f2b(float f) { unsigned u = __float_as_uint(f);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_u16)0x7fc0;\n"
    "    u += 0x7fffu + ((u >> 16) & 1u); return (kiln_u16)(u >> 16); }\n"
    "static __device__ __forceinline__ float kiln_rh(float f) { return kiln_h2f(kiln_f2h(f)); }\n"
    "static __device__ __forceinline__ float kiln_rb(float f) { return kiln_b2f(kiln_f2b(f)); }\n"
    "static __device__ __forceinline__ float kiln_c01(float v) { return v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v; }\n"
    "static __device__ __forceinline__ float kiln_softplus(float x) { return x > 0.0f ? x + log1pf(expf(-x)) : "
    "log1pf(expf(x)); }\n"
    "#define KILN_NAN __int_as_float(0x7fc00000)\n"
    "#define KILN_INF __int_as_float(0x7f800000)\n";

/* ---- source generation ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap <= b->n + (size_t)w) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* A float literal (inf and NaN spelled through their bits). */
static const char *lit(char *buf, size_t size, double v)
{
    float f = (float)v;
    if (isnan(f)) snprintf(buf, size, "KILN_NAN");
    else if (isinf(f)) snprintf(buf, size, "%sKILN_INF", f < 0 ? "-" : "");
    else snprintf(buf, size, "%.9ef", (double)f);
    return buf;
}

/* The float expression of unary op `op` of x, its attributes p (kiln_ops_unary_code's), as
 * k_ew.cu's kernels compute it; false when the op has none here. */
static bool unary_expr(sbuf *b, const char *op, const double *p)
{
    char A[40], B[40], G[40];
    lit(A, sizeof A, p[0]), lit(B, sizeof B, p[1]), lit(G, sizeof G, p[2]);
    static const struct {
        const char *op, *expr;
    } plain[] = {
        {"Abs", "fabsf(x)"}, {"Neg", "-x"}, {"Sign", "(isnan(x) ? x : (float)((x > 0.0f) - (x < 0.0f)))"},
        {"Relu", "(x < 0.0f ? 0.0f : x)"}, {"Reciprocal", "1.0f / x"}, {"Floor", "floorf(x)"}, {"Ceil", "ceilf(x)"},
        {"Round", "rintf(x)"}, {"Sqrt", "sqrtf(x)"}, {"Exp", "expf(x)"}, {"Log", "logf(x)"}, {"Sin", "sinf(x)"},
        {"Cos", "cosf(x)"}, {"Tan", "tanf(x)"}, {"Asin", "asinf(x)"}, {"Acos", "acosf(x)"}, {"Atan", "atanf(x)"},
        {"Sinh", "sinhf(x)"}, {"Cosh", "coshf(x)"}, {"Asinh", "asinhf(x)"}, {"Acosh", "acoshf(x)"},
        {"Atanh", "atanhf(x)"}, {"Erf", "erff(x)"}, {"Sigmoid", "1.0f / (1.0f + expf(-x))"}, {"Tanh", "tanhf(x)"},
        {"HardSwish", "x * kiln_c01(x / 6.0f + 0.5f)"}, {"Softplus", "kiln_softplus(x)"},
        {"Softsign", "x / (1.0f + fabsf(x))"}, {"Mish", "x * tanhf(kiln_softplus(x))"},
    };
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(op, plain[i].op)) {
            put(b, "%s", plain[i].expr);
            return true;
        }
    if (!strcmp(op, "LeakyRelu")) put(b, "(x < 0.0f ? %s * x : x)", A);
    else if (!strcmp(op, "Elu")) put(b, "(x < 0.0f ? %s * expm1f(x) : x)", A);
    else if (!strcmp(op, "Selu")) put(b, "%s * (x <= 0.0f ? %s * expm1f(x) : x)", G, A);
    else if (!strcmp(op, "Celu")) put(b, "(x > 0.0f ? x : %s * expm1f(x / %s))", A, A);
    else if (!strcmp(op, "HardSigmoid")) put(b, "kiln_c01(%s * x + %s)", A, B);
    else if (!strcmp(op, "ThresholdedRelu")) put(b, "(x > %s ? x : 0.0f)", A);
    else if (!strcmp(op, "Swish")) put(b, "x / (1.0f + expf(-%s * x))", A);
    else if (!strcmp(op, "Gelu") && p[3] != 0)
        put(b, "0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))");
    else if (!strcmp(op, "Gelu")) put(b, "0.5f * x * (1.0f + erff(x * 0.7071067811865476f))");
    else return false;
    return true;
}

/* The float expression of binary op `op` of p and q. */
static bool binary_expr(sbuf *b, const char *op)
{
    static const struct {
        const char *op, *expr;
    } ops[] = {
        {"Add", "p + q"}, {"Sub", "p - q"}, {"Mul", "p * q"}, {"Div", "p / q"}, {"Pow", "powf(p, q)"},
        {"Max", "((isnan(p) || isnan(q)) ? KILN_NAN : fmaxf(p, q))"},
        {"Min", "((isnan(p) || isnan(q)) ? KILN_NAN : fminf(p, q))"}, {"PRelu", "(p < 0.0f ? p * q : p)"},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (!strcmp(op, ops[i].op)) {
            put(b, "%s", ops[i].expr);
            return true;
        }
    return false;
}

/* Register r of type dt read at offset o of input j, as float. */
static bool load_expr(sbuf *b, kiln_dtype dt, int j)
{
    switch (dt) {
    case KILN_DTYPE_FLOAT32: put(b, "((const float *)a.x[%d])[o%d]", j, j); return true;
    case KILN_DTYPE_FLOAT16: put(b, "kiln_h2f(((const kiln_u16 *)a.x[%d])[o%d])", j, j); return true;
    case KILN_DTYPE_BFLOAT16: put(b, "kiln_b2f(((const kiln_u16 *)a.x[%d])[o%d])", j, j); return true;
    case KILN_DTYPE_INT64: put(b, "(float)((const long long *)a.x[%d])[o%d]", j, j); return true;
    case KILN_DTYPE_INT32: put(b, "(float)((const int *)a.x[%d])[o%d]", j, j); return true;
    case KILN_DTYPE_INT16: put(b, "(float)((const short *)a.x[%d])[o%d]", j, j); return true;
    case KILN_DTYPE_INT8: put(b, "(float)((const signed char *)a.x[%d])[o%d]", j, j); return true;
    case KILN_DTYPE_UINT8: put(b, "(float)((const unsigned char *)a.x[%d])[o%d]", j, j); return true;
    case KILN_DTYPE_BOOL: put(b, "(((const unsigned char *)a.x[%d])[o%d] ? 1.0f : 0.0f)", j, j); return true;
    default: return false;
    }
}

static const char *round_fn(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT16 ? "kiln_rh" : dt == KILN_DTYPE_BFLOAT16 ? "kiln_rb" : "";
}

/* The body of node n's kernel (everything after its name): false when some instruction has
 * no expression here (the node then runs its reference on the host). */
static bool kernel_body(sbuf *b, const kiln_node *n)
{
    const kiln_ewp *p = n->params;
    const kiln_attr *ops = kiln_node_attr_typed(n, "ops", KILN_ATTR_STRINGS);
    if (!p || !ops || ops->n != p->n_ins) return false;
    put(b, "(const kiln_ewp_args &a, I i");
    for (int j = 0; j < p->n_in; j++) put(b, ", I o%d", j);
    put(b, ")\n{\n");
    for (int j = 0; j < p->n_in; j++) {
        put(b, "    float r%d = ", j);
        if (!load_expr(b, p->dtype[j], j)) return false;
        put(b, ";\n");
    }
    char c[40];
    for (int k = 0; k < p->n_ins; k++) {
        const kiln_ewp_ins *in = &p->ins[k];
        int r = p->n_in + k;
        kiln_dtype dt = p->dtype[r];
        put(b, "    float r%d;\n    {\n", r);
        switch (in->kind) {
        case KILN_EWP_CONST: put(b, "        float v = %s;\n", lit(c, sizeof c, in->p[0])); break;
        case KILN_EWP_CAST: put(b, "        float v = r%d;\n", in->a); break;
        case KILN_EWP_CLIP:
            put(b, "        float x = r%d, v = isnan(x) ? x : fminf(fmaxf(x, ", in->a);
            put(b, "%s), ", lit(c, sizeof c, in->p[0]));
            put(b, "%s);\n", lit(c, sizeof c, in->p[1]));
            break;
        case KILN_EWP_WHERE: put(b, "        float v = r%d != 0.0f ? r%d : r%d;\n", in->a, in->b, in->c); break;
        case KILN_EWP_UNARY:
            put(b, "        float x = r%d, v = ", in->a);
            if (!unary_expr(b, ops->strings[k], in->p)) return false;
            put(b, ";\n");
            break;
        case KILN_EWP_BINARY:
            put(b, "        float p = r%d, q = r%d, v = ", in->a, in->b);
            if (!binary_expr(b, ops->strings[k])) return false;
            put(b, ";\n");
            break;
        }
        put(b, "        r%d = %s(v);\n    }\n", r, round_fn(dt));
    }
    int y = p->n_in + p->n_ins - 1;
    switch (p->dtype[y]) {
    case KILN_DTYPE_FLOAT32: put(b, "    ((float *)a.y)[i] = r%d;\n}\n", y); break;
    case KILN_DTYPE_FLOAT16: put(b, "    ((kiln_u16 *)a.y)[i] = kiln_f2h(r%d);\n}\n", y); break;
    case KILN_DTYPE_BFLOAT16: put(b, "    ((kiln_u16 *)a.y)[i] = kiln_f2b(r%d);\n}\n", y); break;
    default: return false;
    }
    return !b->oom;
}

/* The kernel around element function `name`_at of n_in inputs: each thread takes chunks of 4
 * elements along the innermost dim, decodes the chunk's row once (the outer dims, unrolled to
 * constant indices so the arguments stay in parameter space) and steps each input's offset by
 * its innermost stride; 32-bit index arithmetic while the counts fit. */
static void kernel_entry(sbuf *b, const char *name, int n_in)
{
    put(b, "template <typename I> static __device__ __forceinline__ void %s_run(const kiln_ewp_args &a)\n{\n", name);
    put(b, "    const I inner = (I)a.inner, cpr = (inner + 3) / 4, chunks = (I)(a.n / a.inner) * cpr;\n");
    put(b, "    for (long long c0 = (long long)blockIdx.x * blockDim.x + threadIdx.x; c0 < (long long)chunks;\n");
    put(b, "         c0 += (long long)gridDim.x * blockDim.x) {\n");
    put(b, "        I c = (I)c0, row = c / cpr, col = (c - row * cpr) * 4, i = row * inner + col;\n");
    for (int j = 0; j < n_in; j++)
        put(b, "        I o%d = a.mode[%d] == 1 ? i : a.mode[%d] == 2 ? 0 : col * (I)a.ist[%d];\n", j, j, j, j);
    put(b, "        I rem = row;\n#pragma unroll\n        for (int k = %d; k >= 0; k--) {\n", EWP_RANK - 2);
    put(b, "            if (k < a.rank - 1) {\n");
    put(b, "                I dim = (I)a.dims[k], q = k ? rem / dim : 0, cc = k ? rem - q * dim : rem;\n");
    put(b, "                rem = q;\n");
    for (int j = 0; j < n_in; j++)
        put(b, "                if (a.mode[%d] == 0) o%d += cc * (I)a.st[%d][k];\n", j, j, j);
    put(b, "            }\n        }\n");
    for (int j = 0; j < n_in; j++)
        put(b, "        const I s%d = a.mode[%d] == 1 ? 1 : a.mode[%d] == 2 ? 0 : (I)a.ist[%d];\n", j, j, j, j);
    put(b, "        const I cnt = inner - col < 4 ? inner - col : 4;\n#pragma unroll\n");
    put(b, "        for (int v = 0; v < 4; v++)\n            if (v < cnt) %s_at<I>(a, i + v", name);
    for (int j = 0; j < n_in; j++) put(b, ", o%d + v * s%d", j, j);
    put(b, ");\n    }\n}\n");
    put(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const kiln_ewp_args a)\n{\n", EWP_THREADS, name);
    put(b, "    if (a.n <= 0x7fffffffLL) %s_run<int>(a);\n    else %s_run<long long>(a);\n}\n", name, name);
}

/* ---- the session's kernels ---- */

struct kiln_gpu_fused {
    kiln_gpu_module *mod;
    const kiln_graph *g;
    void **fn; /* [g->n_nodes]: node k's kernel, or NULL */
    int kernels, from_cache;
    char note[192];
};

static bool is_fused_ew(const kiln_node *n, bool device_only)
{
    return (n->on_device || !device_only) && !strcmp(n->domain, "kiln") && !strcmp(n->op_type, "FusedElementwise");
}

/* The module source of g's FusedElementwise nodes (those on the device only, or all): into
 * src, with node k's kernel name in names[k] ("" for none) and one kernel per distinct body
 * (*kernels of them). False when out of memory. */
static bool module_source(const kiln_graph *g, bool device_only, sbuf *src, char (*names)[40], int *kernels)
{
    sbuf body = {0};
    uint64_t *hashes = calloc((size_t)g->n_nodes + 1, sizeof *hashes);
    *kernels = 0;
    put(src, "%s", prelude);
    for (int k = 0; k < g->n_nodes && hashes; k++) {
        const kiln_node *n = g->nodes[k];
        names[k][0] = 0;
        if (!is_fused_ew(n, device_only)) continue;
        body.n = 0;
        if (!kernel_body(&body, n)) continue; /* no kernel: this node runs on the host */
        hashes[k] = kiln_hash64(body.p, body.n, KILN_HASH64_SEED) | 1;
        snprintf(names[k], sizeof names[k], "kiln_ewp_%016" PRIx64, hashes[k]);
        bool seen = false;
        for (int j = 0; j < k && !seen; j++) seen = hashes[j] == hashes[k];
        if (seen) continue;
        put(src, "template <typename I> static __device__ __forceinline__ void %s_at", names[k]);
        put(src, "%s", body.p);
        kernel_entry(src, names[k], n->n_in);
        ++*kernels;
    }
    bool ok = hashes && !body.oom && !src->oom;
    free(hashes);
    free(body.p);
    return ok;
}

kiln_status kiln_gpu_fused_source(const kiln_graph *g, char **out, int *kernels, kiln_err *err)
{
    *out = NULL;
    sbuf src = {0};
    char (*names)[40] = calloc((size_t)g->n_nodes + 1, sizeof *names);
    bool ok = names && module_source(g, false, &src, names, kernels);
    free(names);
    if (!ok) {
        free(src.p);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    *out = src.p;
    return KILN_OK;
}

/* The module image of src for `device`: from the cache when it has it (*hit), else compiled
 * and stored; the note says what could not be used. */
static kiln_status module_image(int device, const sbuf *src, void **image, size_t *size, bool *hit, char *note,
                                size_t note_size, kiln_err *err)
{
    *hit = false;
    int major = 0, minor = 0;
    if (gpuDeviceGetAttribute(&major, gpuDevAttrComputeCapabilityMajor, device) != gpuSuccess ||
        gpuDeviceGetAttribute(&minor, gpuDevAttrComputeCapabilityMinor, device) != gpuSuccess)
        return kiln_errf(err, KILN_ERR_RUNTIME, "cannot read the compute capability of device %d", device);
    /* the cache's key: the source, the compiler and the device */
    char key[96], why[160] = "", arch[32];
    snprintf(key, sizeof key, "ewp-sm%d%d-rtc%d-%016" PRIx64, major, minor, kiln_gpu_rtc_version(),
             kiln_hash64(src->p, src->n, KILN_HASH64_SEED));
    kiln_cache *cache = kiln_cache_open(NULL, 0, why, sizeof why);
    if (!cache) snprintf(note, note_size, "kernel cache off: %s", why);
    if (cache && kiln_cache_get(cache, key, image, size, why, sizeof why)) {
        *hit = true;
    } else {
        if (cache && why[0]) snprintf(note, note_size, "kernel cache: %s", why);
        kiln_status st = kiln_gpu_rtc_compile(major * 10 + minor, src->p, image, size, arch, sizeof arch, err);
        if (!st && cache && !kiln_cache_put(cache, key, *image, *size, why, sizeof why))
            snprintf(note, note_size, "kernel cache: %s", why);
        if (st) {
            kiln_cache_free(cache);
            return st;
        }
    }
    kiln_cache_free(cache);
    return KILN_OK;
}

kiln_status kiln_gpu_fused_prepare(int device, const kiln_graph *g, kiln_gpu_fused **out, kiln_err *err)
{
    *out = NULL;
    int count = 0;
    for (int k = 0; k < g->n_nodes; k++) count += is_fused_ew(g->nodes[k], true);
    if (!count) return KILN_OK;
    kiln_gpu_fused *f = calloc(1, sizeof *f);
    char (*names)[40] = calloc((size_t)g->n_nodes, sizeof *names);
    sbuf src = {0};
    if (!f || !names || !(f->fn = calloc((size_t)g->n_nodes, sizeof *f->fn)) ||
        !module_source(g, true, &src, names, &f->kernels)) {
        free(names);
        free(src.p);
        kiln_gpu_fused_free(f);
        return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    }
    f->g = g;
    kiln_err e = {0};
    void *image = NULL;
    size_t size = 0;
    bool hit = false;
    if (!f->kernels) {
        snprintf(f->note, sizeof f->note, "no generated kernel for the fused element-wise nodes");
    } else if (module_image(device, &src, &image, &size, &hit, f->note, sizeof f->note, &e) ||
               kiln_gpu_module_load(image, &f->mod, &e)) {
        snprintf(f->note, sizeof f->note, "%s", e.msg);
    } else {
        f->from_cache = hit ? f->kernels : 0;
        for (int k = 0; k < g->n_nodes; k++)
            if (names[k][0] && !(f->fn[k] = kiln_gpu_module_kernel(f->mod, names[k], &e)))
                snprintf(f->note, sizeof f->note, "%s", e.msg);
    }
    free(image);
    free(names);
    free(src.p);
    *out = f;
    return KILN_OK;
}

void kiln_gpu_fused_free(kiln_gpu_fused *f)
{
    if (!f) return;
    kiln_gpu_module_free(f->mod);
    free(f->fn);
    free(f);
}

void kiln_gpu_fused_stats(const kiln_gpu_fused *f, int *kernels, int *from_cache, char *note, size_t size)
{
    *kernels = f ? f->kernels : 0;
    *from_cache = f ? f->from_cache : 0;
    snprintf(note, size, "%s", f ? f->note : "");
}

void *kiln_gpu_fused_kernel(const kiln_gpu_fused *f, const kiln_node *n)
{
    return f && n->graph == f->g && n->index >= 0 && n->index < f->g->n_nodes && f->g->nodes[n->index] == n
               ? f->fn[n->index]
               : NULL;
}

/* ---- the kernel ---- */

static kiln_status fused_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    void *fn = kiln_gpu_generated_kernel(c);
    if (!fn) return kiln_gpu_fallback(c);
    const kiln_ewp *p = n->params;
    kiln_value *y = kiln_run_out(c, 0);
    if (!y->numel) return KILN_OK;
    if (y->rank > EWP_RANK) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "rank %d above %d", y->rank, EWP_RANK);
    ewp_args a;
    memset(&a, 0, sizeof a);
    a.y = y->data;
    a.n = y->numel;
    /* Y's dims without the 1s, and each input's broadcast strides along them */
    int rank = 0;
    int64_t st[KILN_EWP_MAX_IN][KILN_MAX_RANK];
    for (int j = 0; j < p->n_in; j++) {
        const kiln_value *x = kiln_run_in(c, j);
        a.x[j] = x->data;
        kiln_bcast_strides(y->rank, y->dims, x->rank, x->dims, st[j]);
    }
    for (int d = 0; d < y->rank; d++) {
        if (y->dims[d] == 1) continue;
        /* merge into the previous kept dim when every input's strides allow */
        bool merge = rank > 0;
        for (int j = 0; j < p->n_in && merge; j++) merge = a.st[j][rank - 1] == st[j][d] * y->dims[d];
        if (merge) {
            a.dims[rank - 1] *= y->dims[d];
            for (int j = 0; j < p->n_in; j++) a.st[j][rank - 1] = st[j][d];
            continue;
        }
        a.dims[rank] = y->dims[d];
        for (int j = 0; j < p->n_in; j++) a.st[j][rank] = st[j][d];
        rank++;
    }
    a.rank = rank;
    for (int j = 0; j < p->n_in; j++) {
        bool contiguous = true, scalar = true;
        int64_t want = 1;
        for (int d = rank - 1; d >= 0; d--) {
            contiguous = contiguous && a.st[j][d] == want;
            scalar = scalar && a.st[j][d] == 0;
            want *= a.dims[d];
        }
        a.mode[j] = contiguous ? 1 : scalar ? 2 : 0;
        a.ist[j] = rank ? a.st[j][rank - 1] : 0;
    }
    a.inner = rank ? a.dims[rank - 1] : 1; /* the kernel takes dims[0 .. rank - 2] as the outer ones */
    int64_t chunks = y->numel / a.inner * ((a.inner + 3) / 4);
    int64_t blocks = (chunks + EWP_THREADS - 1) / EWP_THREADS, cap = (int64_t)kiln_gpu_sm_count(c) * 16;
    if (blocks > cap) blocks = cap;
    gpuError_t e = kiln_gpu_module_launch(fn, (unsigned)(blocks < 1 ? 1 : blocks), EWP_THREADS, &a, sizeof a,
                                          kiln_gpu_stream(c));
    return kiln_gpu_check(c, e, "launching a generated element-wise kernel");
}

static bool fused_supports(const kiln_node *n, char *why, size_t size)
{
    const kiln_type *y = &n->out[0]->type;
    if (y->rank > EWP_RANK) {
        snprintf(why, size, "rank %d above %d", y->rank, EWP_RANK);
        return false;
    }
    return true;
}

static const kiln_gpu_op ops[] = {
    {"kiln", "FusedElementwise", fused_supports, fused_run, 0},
};

const kiln_gpu_op_table kiln_gpu_ops_fused = {ops, sizeof ops / sizeof ops[0]};

/* ---- the pass ---- */

kiln_status kiln_gpu_pass_fuse_elementwise(kiln_graph *g, int *fused, kiln_err *err)
{
    *fused = 0;
    kiln_err ignored = {0};
    if (kiln_gpu_rtc_open(&ignored)) return KILN_OK; /* nothing could compile the groups */
    return kiln_pass_fuse_elementwise(g, fused, err);
}

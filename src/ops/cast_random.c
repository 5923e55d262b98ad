/* cast_random.c - random generators: RandomUniform, RandomNormal, their *Like forms, Bernoulli
 * and Multinomial. A `seed` attribute gives a deterministic stream (the same on every run) from
 * splitmix64; without it each run draws a fresh seed from the clock. The streams differ from
 * numpy's, so values never match ONNX's reference outputs, only their distribution does. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "ops/cast_internal.h"
#include "ops/util.h"

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static double rng_uniform(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

/* standard normal (Box-Muller) */
static double rng_normal(rng *r)
{
    double u = 1.0 - rng_uniform(r), v = rng_uniform(r); /* u in (0, 1] */
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static void rng_init(const kiln_node *n, rng *r)
{
    const kiln_attr *a = kiln_node_attr(n, "seed");
    if (a) {
        float seed = a->f;
        uint32_t bits;
        memcpy(&bits, &seed, sizeof bits);
        r->s = bits;
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->s = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)r;
}

static bool random_float_type(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT64 || dt == KILN_DTYPE_FLOAT16 ||
           dt == KILN_DTYPE_BFLOAT16;
}

/* Output dtype: the `dtype` attribute, else `def`; must be a float type. */
static kiln_status random_dtype(kiln_infer_ctx *c, kiln_dtype def, kiln_dtype *dt)
{
    *dt = (kiln_dtype)kiln_attr_int(kiln_infer_node(c), "dtype", def);
    if (*dt && !random_float_type(*dt))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "dtype %s is not a float type", kiln_dtype_name(*dt));
    return KILN_OK;
}

static kiln_status random_shape_infer(kiln_infer_ctx *c)
{
    kiln_dtype dt;
    KILN_TRY(random_dtype(c, KILN_DTYPE_FLOAT32, &dt));
    int rank = 0;
    const int64_t *shape = kiln_attr_ints(kiln_infer_node(c), "shape", &rank);
    if (!kiln_node_attr(kiln_infer_node(c), "shape"))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "attribute shape is required");
    if (rank > KILN_MAX_RANK) return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "shape rank %d too large", rank);
    kiln_dim dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) {
        if (shape[k] < 0) return kiln_infer_fail(c, KILN_ERR_MODEL, "shape[%d] = %lld is negative", k, (long long)shape[k]);
        dims[k] = kiln_dim_const(shape[k]);
    }
    return kiln_infer_set_out(c, 0, dt, rank, dims);
}

static kiln_status random_like_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input is missing");
    kiln_dtype dt;
    KILN_TRY(random_dtype(c, x->dtype, &dt));
    return kiln_cast_infer_like(c, 0, 0, dt);
}

/* Fills Y with low + (high - low) * U (uniform) or mean + scale * N (normal). */
static kiln_status random_fill(kiln_run_ctx *c, bool normal)
{
    const kiln_node *n = kiln_run_node(c);
    kiln_value *Y = kiln_run_out(c, 0);
    rng r;
    rng_init(n, &r);
    double a = normal ? kiln_attr_float(n, "mean", 0.0f) : kiln_attr_float(n, "low", 0.0f);
    double b = normal ? kiln_attr_float(n, "scale", 1.0f) : kiln_attr_float(n, "high", 1.0f) - a;
    for (int64_t i = 0; i < Y->numel; i++)
        kiln_store_f64(Y->dtype, Y->data, i, a + b * (normal ? rng_normal(&r) : rng_uniform(&r)));
    return KILN_OK;
}

kiln_status kiln_cast_random_uniform_infer(kiln_infer_ctx *c) { return random_shape_infer(c); }
kiln_status kiln_cast_random_normal_infer(kiln_infer_ctx *c) { return random_shape_infer(c); }
kiln_status kiln_cast_random_uniform_like_infer(kiln_infer_ctx *c) { return random_like_infer(c); }
kiln_status kiln_cast_random_normal_like_infer(kiln_infer_ctx *c) { return random_like_infer(c); }
kiln_status kiln_cast_random_uniform_run(kiln_run_ctx *c) { return random_fill(c, false); }
kiln_status kiln_cast_random_normal_run(kiln_run_ctx *c) { return random_fill(c, true); }
kiln_status kiln_cast_random_uniform_like_run(kiln_run_ctx *c) { return random_fill(c, false); }
kiln_status kiln_cast_random_normal_like_run(kiln_run_ctx *c) { return random_fill(c, true); }

/* ---- Bernoulli: Y[i] = 1 with probability X[i] ---- */

kiln_status kiln_cast_bernoulli_infer(kiln_infer_ctx *c)
{
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input is missing");
    if (x->dtype && !random_float_type(x->dtype))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input must be float, is %s", kiln_dtype_name(x->dtype));
    kiln_dtype dt = (kiln_dtype)kiln_attr_int(kiln_infer_node(c), "dtype", x->dtype);
    if (dt && !kiln_dtype_is_float(dt) && !kiln_dtype_is_int(dt) && dt != KILN_DTYPE_BOOL)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "dtype %s is not numeric", kiln_dtype_name(dt));
    return kiln_cast_infer_like(c, 0, 0, dt);
}

kiln_status kiln_cast_bernoulli_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    rng r;
    rng_init(kiln_run_node(c), &r);
    for (int64_t i = 0; i < X->numel; i++)
        kiln_store_i64(Y->dtype, Y->data, i, rng_uniform(&r) < kiln_load_f64(X->dtype, X->data, i));
    return KILN_OK;
}

/* ---- Multinomial: X [batch, classes] unnormalized log-probabilities -> [batch, sample_size] ---- */

kiln_status kiln_cast_multinomial_infer(kiln_infer_ctx *c)
{
    const kiln_node *n = kiln_infer_node(c);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input is missing");
    kiln_dtype dt = (kiln_dtype)kiln_attr_int(n, "dtype", KILN_DTYPE_INT32);
    if (dt != KILN_DTYPE_INT32 && dt != KILN_DTYPE_INT64)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "dtype must be int32 or int64, is %s", kiln_dtype_name(dt));
    int64_t samples = kiln_attr_int(n, "sample_size", 1);
    if (samples < 1) return kiln_infer_fail(c, KILN_ERR_MODEL, "sample_size %lld must be positive", (long long)samples);
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, dt);
    if (x->rank != 2) return kiln_infer_fail(c, KILN_ERR_SHAPE, "input must be [batch, classes], has rank %d", x->rank);
    kiln_dim dims[2] = {x->dims[0], kiln_dim_const(samples)};
    return kiln_infer_set_out(c, 0, dt, 2, dims);
}

kiln_status kiln_cast_multinomial_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    rng r;
    rng_init(kiln_run_node(c), &r);
    int64_t B = X->dims[0], K = X->dims[1], S = Y->dims[1];
    if (K == 0 && B * S > 0) return kiln_run_fail(c, KILN_ERR_RUNTIME, "cannot sample from 0 classes");
    for (int64_t b = 0; b < B; b++) {
        double mx = -INFINITY, total = 0;
        for (int64_t k = 0; k < K; k++) mx = fmax(mx, kiln_load_f64(X->dtype, X->data, b * K + k));
        for (int64_t k = 0; k < K; k++) total += exp(kiln_load_f64(X->dtype, X->data, b * K + k) - mx);
        for (int64_t s = 0; s < S; s++) {
            double u = rng_uniform(&r) * total, acc = 0;
            int64_t pick = K - 1;
            for (int64_t k = 0; k < K; k++) {
                acc += exp(kiln_load_f64(X->dtype, X->data, b * K + k) - mx);
                if (u < acc) {
                    pick = k;
                    break;
                }
            }
            kiln_store_i64(Y->dtype, Y->data, b * S + s, pick);
        }
    }
    return KILN_OK;
}

/* verify.c - `kiln verify`: runs the model through the normal session (the path that serves
 * requests: memory plan, in-place reuse, every optimisation) and through the reference
 * session, taps every intermediate value of both with the public observer hook, and compares
 * them in execution order. It names the first node whose output diverges, and tells "same
 * values, wrong places" (a layout bug) from wrong values by comparing sorted copies too. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "exec/test_hooks.h"
#include "verify.h"

typedef struct tap {
    char *value, *node_name, *op;
    int node;
    char inputs[512]; /* "name [dims], ..." as the node saw them */
    kiln_value *v;
} tap;

typedef struct taps {
    tap *t;
    int n, cap;
    bool oom;
} taps;

static void shape_str(const kiln_value *v, char *buf, size_t size)
{
    if (!v) {
        snprintf(buf, size, "-");
        return;
    }
    if (kiln_value_kind_of(v) != KILN_VALUE_TENSOR) {
        snprintf(buf, size, "%s", cli_kind_name(kiln_value_kind_of(v)));
        return;
    }
    size_t at = (size_t)snprintf(buf, size, "%s[", kiln_dtype_name(kiln_value_dtype(v)));
    for (int k = 0; k < kiln_value_rank(v) && at < size; k++)
        at += (size_t)snprintf(buf + at, size - at, "%s%" PRId64, k ? ", " : "", kiln_value_dims(v)[k]);
    if (at < size) snprintf(buf + at, size - at, "]");
}

static int record(void *user, const kiln_node_event *ev)
{
    taps *ts = user;
    char in[512] = "", sh[160];
    for (int i = 0; i < ev->n_inputs; i++) {
        if (!ev->inputs[i]) continue;
        shape_str(ev->inputs[i], sh, sizeof sh);
        size_t l = strlen(in);
        snprintf(in + l, sizeof in - l, "%s'%s' %s", l ? ", " : "", ev->input_names[i], sh);
    }
    for (int i = 0; i < ev->n_outputs; i++) {
        if (!ev->outputs[i]) continue;
        if (ts->n == ts->cap) {
            int cap = ts->cap ? ts->cap * 2 : 64;
            tap *t = realloc(ts->t, (size_t)cap * sizeof *t);
            if (!t) return ts->oom = true, 1;
            ts->t = t;
            ts->cap = cap;
        }
        tap *t = &ts->t[ts->n];
        memset(t, 0, sizeof *t);
        t->value = strdup(ev->output_names[i]);
        t->node_name = strdup(ev->node_name);
        t->op = strdup(ev->op_type);
        t->node = ev->node;
        snprintf(t->inputs, sizeof t->inputs, "%s", in);
        if (!t->value || !t->node_name || !t->op || kiln_value_clone(ev->outputs[i], &t->v)) {
            free(t->value);
            free(t->node_name);
            free(t->op);
            return ts->oom = true, 1;
        }
        ts->n++;
    }
    return 0;
}

static void taps_free(taps *ts)
{
    for (int i = 0; i < ts->n; i++) {
        free(ts->t[i].value);
        free(ts->t[i].node_name);
        free(ts->t[i].op);
        kiln_value_free(ts->t[i].v);
    }
    free(ts->t);
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);
    else if (exp == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)man, -24);
    else u = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i as a double, for the types verify compares numerically; false for others. */
static bool element(const kiln_value *v, int64_t i, double *out)
{
    const void *p = kiln_value_data(v);
    switch (kiln_value_dtype(v)) {
    case KILN_DTYPE_FLOAT32: *out = ((const float *)p)[i]; return true;
    case KILN_DTYPE_FLOAT64: *out = ((const double *)p)[i]; return true;
    case KILN_DTYPE_FLOAT16: *out = half_to_float(((const uint16_t *)p)[i]); return true;
    case KILN_DTYPE_BFLOAT16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        *out = f;
        return true;
    }
    case KILN_DTYPE_INT8: *out = ((const int8_t *)p)[i]; return true;
    case KILN_DTYPE_UINT8:
    case KILN_DTYPE_BOOL: *out = ((const uint8_t *)p)[i]; return true;
    case KILN_DTYPE_INT16: *out = ((const int16_t *)p)[i]; return true;
    case KILN_DTYPE_UINT16: *out = ((const uint16_t *)p)[i]; return true;
    case KILN_DTYPE_INT32: *out = ((const int32_t *)p)[i]; return true;
    case KILN_DTYPE_UINT32: *out = ((const uint32_t *)p)[i]; return true;
    case KILN_DTYPE_INT64: *out = (double)((const int64_t *)p)[i]; return true;
    case KILN_DTYPE_UINT64: *out = (double)((const uint64_t *)p)[i]; return true;
    default: return false;
    }
}

static bool close_enough(double a, double b, double rtol, double atol)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs(a - b) <= atol + rtol * fabs(b);
}

typedef enum verdict { V_OK, V_DIFF, V_PLACES, V_SHAPE, V_SKIP } verdict;

typedef struct cmp_result {
    verdict v;
    double max_abs, max_rel, sorted_max;
} cmp_result;

static cmp_result compare(const kiln_value *a, const kiln_value *b, double rtol, double atol)
{
    cmp_result r = {V_OK, 0, 0, 0};
    char sa[256], sb[256];
    shape_str(a, sa, sizeof sa);
    shape_str(b, sb, sizeof sb);
    if (strcmp(sa, sb)) return (cmp_result){V_SHAPE, NAN, NAN, NAN};
    if (kiln_value_kind_of(a) != KILN_VALUE_TENSOR) return (cmp_result){V_SKIP, NAN, NAN, NAN};
    int64_t n = kiln_value_numel(a);
    double x, y;
    if (n && !element(a, 0, &x)) {
        if (kiln_value_dtype(a) == KILN_DTYPE_STRING) {
            for (int64_t i = 0; i < n; i++)
                if (strcmp(((char *const *)kiln_value_data(a))[i], ((char *const *)kiln_value_data(b))[i]))
                    return (cmp_result){V_DIFF, NAN, NAN, NAN};
            return r;
        }
        return (cmp_result){V_SKIP, NAN, NAN, NAN};
    }
    double *da = malloc((size_t)(n ? n : 1) * sizeof *da), *db = malloc((size_t)(n ? n : 1) * sizeof *db);
    if (!da || !db) {
        free(da);
        free(db);
        return (cmp_result){V_SKIP, NAN, NAN, NAN};
    }
    bool ok = true;
    for (int64_t i = 0; i < n; i++) {
        element(a, i, &x);
        element(b, i, &y);
        da[i] = x;
        db[i] = y;
        if (!close_enough(x, y, rtol, atol)) ok = false;
        double d = fabs(x - y);
        if (!isnan(d) && d > r.max_abs) r.max_abs = d;
        double rel = d / fmax(fabs(y), 1e-30);
        if (!isnan(rel) && !isinf(rel) && rel > r.max_rel) r.max_rel = rel;
    }
    qsort(da, (size_t)n, sizeof *da, cli_cmp_double);
    qsort(db, (size_t)n, sizeof *db, cli_cmp_double);
    bool sorted_ok = true;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(da[i] - db[i]);
        if (!isnan(d) && d > r.sorted_max) r.sorted_max = d;
        if (!close_enough(da[i], db[i], rtol, atol)) sorted_ok = false;
    }
    free(da);
    free(db);
    r.v = ok ? V_OK : sorted_ok ? V_PLACES : V_DIFF;
    return r;
}

static const char *verdict_name(verdict v)
{
    switch (v) {
    case V_OK: return "ok";
    case V_DIFF: return "DIFFERENT VALUES";
    case V_PLACES: return "SAME VALUES, WRONG PLACES";
    case V_SHAPE: return "DIFFERENT SHAPE";
    default: return "not compared";
    }
}

/* fault_node: the test-only hook (src/exec/test_hooks.h) on this session, or NULL */
static int run_tapped(const char *model, const kiln_session_options *opt, const char *fault_node, const run_args *a,
                      taps *out)
{
    kiln_session *s = cli_open_session(model, opt);
    if (!s) return 1;
    if (fault_node && kiln_session_set_test_fault(s, fault_node)) {
        kiln_session_free(s);
        return cli_fail("out of memory");
    }
    int n_in = kiln_session_input_count(s), n_out = kiln_session_output_count(s);
    kiln_value **in = calloc((size_t)n_in + 1, sizeof *in), **res = calloc((size_t)n_out + 1, sizeof *res);
    const char **in_names = calloc((size_t)n_in + 1, sizeof *in_names), **out_names = calloc((size_t)n_out + 1, sizeof *out_names);
    uint64_t rng = a->seed;
    int rc = !in || !res || !in_names || !out_names;
    for (int j = 0; !rc && j < n_out; j++) {
        kiln_io_info io;
        kiln_session_output_info(s, j, &io);
        out_names[j] = io.name;
    }
    if (!rc) rc = cli_make_inputs(s, a, 0, &rng, in, in_names);
    if (!rc && kiln_session_run_observed(s, n_in, in_names, (const kiln_value *const *)in, n_out, out_names, res, record,
                                         out))
        rc = cli_fail("%s", out->oom ? "out of memory capturing values" : kiln_last_error(s));
    if (in) cli_free_values(in, n_in);
    if (res) cli_free_values(res, n_out);
    free(in);
    free(res);
    free(in_names);
    free(out_names);
    kiln_session_free(s);
    return rc;
}

int cmd_verify(int argc, char **argv)
{
    run_args a;
    if (cli_parse_run_args(argc, argv, "verify", &a)) return 2;
    kiln_session_options opt = kiln_session_options_default();
    opt.provider = a.provider;
    opt.num_threads = a.threads;
    kiln_session_options ref_opt = kiln_session_options_default();
    ref_opt.unoptimized = true;
    taps served = {0}, ref = {0};
    int rc = 2;
    if (run_tapped(a.model, &opt, a.fault_node, &a, &served) || run_tapped(a.model, &ref_opt, NULL, &a, &ref)) goto out;
    printf("%-4s %-32s %-20s %-24s %10s %10s %10s  %s\n", "#", "value", "op", "shape", "max abs", "max rel",
           "sorted", "result");
    int compared = 0, bad = 0, first = -1;
    cmp_result first_r = {0};
    for (int i = 0; i < served.n; i++) {
        const tap *t = &served.t[i];
        const tap *r = NULL;
        for (int j = 0; j < ref.n && !r; j++)
            if (!strcmp(ref.t[j].value, t->value)) r = &ref.t[j];
        if (!r) continue;
        cmp_result c = compare(t->v, r->v, a.rtol, a.atol);
        char sh[128];
        shape_str(t->v, sh, sizeof sh);
        printf("%-4d %-32.32s %-20.20s %-24.24s %10.3g %10.3g %10.3g  %s\n", i, t->value, t->op, sh, c.max_abs,
               c.max_rel, c.sorted_max, verdict_name(c.v));
        if (c.v == V_SKIP) continue;
        compared++;
        if (c.v != V_OK) {
            bad++;
            if (first < 0) {
                first = i;
                first_r = c;
            }
        }
    }
    printf("%d values compared (rtol %g, atol %g): %d agree, %d differ\n", compared, a.rtol, a.atol, compared - bad,
           bad);
    if (first >= 0) {
        const tap *t = &served.t[first];
        char desc[1024] = "";
        /* the served configuration: t->node indexes its nodes, fused ones included (the
         * unoptimised session numbers them otherwise) */
        kiln_session_options info_opt = opt;
        info_opt.allow_unsupported = true;
        kiln_session *s = cli_open_session(a.model, &info_opt);
        if (s) kiln_session_node_describe(s, t->node, desc, sizeof desc);
        kiln_session_free(s);
        printf("first divergence: node '%s' (%s), output '%s': %s (max abs %.3g, max after sorting %.3g)\n"
               "  inputs: %s\n",
               t->node_name, desc[0] ? desc : t->op, t->value, verdict_name(first_r.v), first_r.max_abs,
               first_r.sorted_max, t->inputs[0] ? t->inputs : "(none)");
    }
    rc = bad ? 1 : 0;
out:
    taps_free(&served);
    taps_free(&ref);
    cli_free_run_args(&a);
    return rc;
}

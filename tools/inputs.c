/* inputs.c - the kiln tool's shared helpers: errors, sessions, option parsing, inputs from
 * .npy files or random data. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "npy.h"

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

kiln_session *cli_open_session(const char *path, const kiln_session_options *opt)
{
    struct stat st;
    if (stat(path, &st)) {
        cli_fail("cannot open model '%s': %s", path, strerror(errno));
        return NULL;
    }
    kiln_session *s = NULL;
    if (kiln_session_create(path, opt, &s)) {
        cli_fail("%s", kiln_last_error(s));
        kiln_session_free(s);
        return NULL;
    }
    return s;
}

const char *cli_kind_name(kiln_value_kind k)
{
    return k == KILN_VALUE_SEQUENCE ? "sequence" : k == KILN_VALUE_OPTIONAL ? "optional" : "tensor";
}

/* ---- info ---- */


static int parse_dims(const char *s, int64_t *dims, int *rank)
{
    *rank = 0;
    if (!*s) return 0; /* a scalar */
    while (*s) {
        char *end;
        long long d = strtoll(s, &end, 10);
        if (end == s || d < 0 || *rank == KILN_MAX_RANK) return -1;
        dims[(*rank)++] = d;
        if (*end == 'x' || *end == 'X' || *end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return 0;
}

int cli_parse_provider(const char *name, kiln_provider_kind *out)
{
    if (!strcmp(name, "cpu")) *out = KILN_PROVIDER_CPU;
    else if (!strcmp(name, "cuda")) *out = KILN_PROVIDER_CUDA;
    else return cli_fail("--provider expects cpu or cuda, got '%s'", name);
    return 0;
}

void cli_free_run_args(run_args *a)
{
    for (int j = 0; j < a->n_specs; j++) free(a->specs[j].name);
    free(a->specs);
    a->specs = NULL;
    a->n_specs = 0;
}

static int parse_run_args(int argc, char **argv, const char *cmd, run_args *a);

int cli_parse_run_args(int argc, char **argv, const char *cmd, run_args *a)
{
    int rc = parse_run_args(argc, argv, cmd, a);
    if (rc) cli_free_run_args(a);
    return rc;
}

static int parse_run_args(int argc, char **argv, const char *cmd, run_args *a)
{
    bool run = !strcmp(cmd, "run"), bench = !strcmp(cmd, "bench"), verify = !strcmp(cmd, "verify");
    memset(a, 0, sizeof *a);
    a->warmup = 3;
    a->runs = 20;
    a->rtol = 1e-4;
    a->atol = 1e-5;
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i];
        bool has_val = i + 1 < argc;
        if ((!strcmp(opt, "--input") || !strcmp(opt, "--shape")) && has_val) {
            char *arg = argv[++i];
            char *eq = strrchr(arg, '=');
            if (!eq || eq == arg) return cli_fail("%s expects NAME=VALUE, got '%s'", opt, arg);
            if (!(a->n_specs & (a->n_specs - 1))) { /* 0, 1, 2, 4, ...: grows to twice */
                spec *grown = realloc(a->specs, (size_t)(a->n_specs ? 2 * a->n_specs : 1) * sizeof *grown);
                if (!grown) return cli_fail("out of memory");
                a->specs = grown;
            }
            spec *sp = &a->specs[a->n_specs++];
            memset(sp, 0, sizeof *sp);
            if (!(sp->name = strndup(arg, (size_t)(eq - arg)))) return cli_fail("out of memory");
            if (!strcmp(opt, "--input")) {
                sp->file = eq + 1;
            } else if (parse_dims(eq + 1, sp->dims, &sp->rank)) {
                return cli_fail("--shape %s: dims must look like 1x3x224x224", arg);
            }
        } else if (!strcmp(opt, "--threads") && has_val) {
            char *end;
            long t = strtol(argv[++i], &end, 10);
            if (*end || t < 0 || t > 1024) return cli_fail("--threads expects a count in [0, 1024], got '%s'", argv[i]);
            a->threads = (int)t;
        } else if (!strcmp(opt, "--seed") && has_val) {
            a->seed = strtoull(argv[++i], NULL, 10);
        } else if (!verify && !strcmp(opt, "--stats")) {
            a->stats = true;
        } else if (run && !strcmp(opt, "--output-dir") && has_val) {
            a->out_dir = argv[++i];
        } else if (bench && !strcmp(opt, "--warmup") && has_val) {
            a->warmup = atoi(argv[++i]);
        } else if (bench && !strcmp(opt, "--runs") && has_val) {
            a->runs = atoi(argv[++i]);
        } else if (bench && !strcmp(opt, "--json")) {
            a->json = true;
        } else if (bench && (!strcmp(opt, "--profile") || !strcmp(opt, "--profile-all"))) {
            a->profile = opt[9] ? PROFILE_ALL : PROFILE_COSTLIEST;
        } else if (verify && (!strcmp(opt, "--rtol") || !strcmp(opt, "--atol")) && has_val) {
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end || v < 0) return cli_fail("%s expects a non-negative number, got '%s'", opt, argv[i]);
            *(opt[2] == 'r' ? &a->rtol : &a->atol) = v;
        } else if ((verify || run || bench) && !strcmp(opt, "--provider") && has_val) {
            if (cli_parse_provider(argv[++i], &a->provider)) return 1;
        } else if (verify && !strcmp(opt, "--test-fault-node") && has_val) {
            a->fault_node = argv[++i];
        } else if (opt[0] == '-') {
            return cli_fail("%s: unknown option '%s' (or missing value)", cmd, opt);
        } else if (!a->model) {
            a->model = opt;
        } else {
            return cli_fail("unexpected argument '%s'", opt);
        }
    }
    if (!a->model) return cli_fail("%s: missing MODEL (kiln --help for usage)", cmd);
    if (a->runs < 1 || a->warmup < 0) return cli_fail("--runs must be >= 1 and --warmup >= 0");
    return 0;
}

static uint64_t next_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint16_t float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    int e = (int)exp - 127 + 15;
    if (e <= 0) return (uint16_t)sign; /* random data in [-1, 1): tiny values flush to zero */
    return (uint16_t)(sign | (uint32_t)e << 10 | man >> 13);
}

/* Random tensor: floats uniform in [-1, 1), integers in [0, 10), bools 0/1. */
static int random_tensor(kiln_dtype dt, int rank, const int64_t *dims, uint64_t *rng, kiln_value **out)
{
    if (kiln_value_create_tensor(dt, rank, dims, NULL, 0, out)) return cli_fail("cannot create a %s tensor", kiln_dtype_name(dt));
    int64_t n = kiln_value_numel(*out);
    void *p = kiln_value_data(*out);
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = next_rand(rng);
        double u = (double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0;
        switch (dt) {
        case KILN_DTYPE_FLOAT32: ((float *)p)[i] = (float)u; break;
        case KILN_DTYPE_FLOAT64: ((double *)p)[i] = u; break;
        case KILN_DTYPE_FLOAT16: ((uint16_t *)p)[i] = float_to_half((float)u); break;
        case KILN_DTYPE_BFLOAT16: {
            float f = (float)u;
            uint32_t b;
            memcpy(&b, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)(b >> 16);
            break;
        }
        case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = r & 1; break;
        case KILN_DTYPE_INT8: case KILN_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)(r % 10); break;
        case KILN_DTYPE_INT16: case KILN_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)(r % 10); break;
        case KILN_DTYPE_INT32: case KILN_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)(r % 10); break;
        case KILN_DTYPE_INT64: case KILN_DTYPE_UINT64: ((uint64_t *)p)[i] = r % 10; break;
        default:
            kiln_value_free(*out);
            *out = NULL;
            return cli_fail("cannot generate random %s data: give the input with --input", kiln_dtype_name(dt));
        }
    }
    return 0;
}

/* The inputs of run number k: the k-th --input/--shape for each input (the last one when it
 * has fewer), random data where only a shape or nothing is given. */
int cli_make_inputs(kiln_session *s, const run_args *a, int k, uint64_t *rng, kiln_value **vals, const char **names)
{
    int n = kiln_session_input_count(s);
    for (int i = 0; i < n; i++) {
        kiln_io_info io;
        kiln_session_input_info(s, i, &io);
        names[i] = io.name;
        const spec *sp = NULL;
        for (int j = 0, seen = 0; j < a->n_specs; j++)
            if (!strcmp(a->specs[j].name, io.name) && seen++ <= k) sp = &a->specs[j];
        if (sp && sp->file) {
            char why[512];
            if (npy_read(sp->file, io.dtype, &vals[i], why, sizeof why)) return cli_fail("input '%s': %s", io.name, why);
            continue;
        }
        if (io.kind != KILN_VALUE_TENSOR) return cli_fail("input '%s' is a %s: give it with --input", io.name, cli_kind_name(io.kind));
        int64_t dims[KILN_MAX_RANK];
        int rank;
        if (sp) {
            rank = sp->rank;
            memcpy(dims, sp->dims, sizeof dims);
        } else {
            if (io.rank < 0) return cli_fail("input '%s' has no declared shape: give --shape %s=DIMS", io.name, io.name);
            rank = io.rank;
            for (int d = 0; d < rank; d++) {
                if (io.dims[d] < 0)
                    return cli_fail("input '%s' has symbolic dim '%s': give --shape %s=DIMS", io.name, io.dim_names[d], io.name);
                dims[d] = io.dims[d];
            }
        }
        if (random_tensor(io.dtype ? io.dtype : KILN_DTYPE_FLOAT32, rank, dims, rng, &vals[i])) return 1;
    }
    for (int j = 0; j < a->n_specs; j++) {
        bool known = false;
        for (int i = 0; i < n; i++) known = known || !strcmp(a->specs[j].name, names[i]);
        if (!known) return cli_fail("the model has no input named '%s'", a->specs[j].name);
    }
    return 0;
}

int cli_run_count(const run_args *a)
{
    int most = 1;
    for (int j = 0; j < a->n_specs; j++) {
        int c = 0;
        for (int q = 0; q < a->n_specs; q++) c += !strcmp(a->specs[q].name, a->specs[j].name);
        if (c > most) most = c;
    }
    return most;
}

void cli_safe_name(const char *name, char *out, size_t size)
{
    size_t i = 0;
    for (const unsigned char *p = (const unsigned char *)name; *p && i + 1 < size; p++) {
        unsigned char ch = *p;
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                  ch == '_' || ch == '-';
        out[i++] = ok ? (char)ch : '_';
        /* one '_' per character: skip the continuation bytes of a UTF-8 sequence */
        if (ch >= 0xc0)
            while ((p[1] & 0xc0) == 0x80) p++;
    }
    out[i] = '\0';
    if (!i || !strcmp(out, ".") || !strcmp(out, "..")) snprintf(out, size, "_%s", name[0] ? "" : "output");
}

void cli_free_values(kiln_value **v, int n)
{
    for (int i = 0; i < n; i++) {
        kiln_value_free(v[i]);
        v[i] = NULL;
    }
}

int cli_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    if (isnan(x) || isnan(y)) return isnan(x) - isnan(y);
    return x < y ? -1 : x > y;
}

/* test_api.c - the public API end to end: the header's usage example, symbolic dims binding,
 * every kind of bad call and bad model giving a clean error with the session still usable,
 * external data confinement, outputs that are inputs or listed twice, outputs into caller
 * storage. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"
#include "modelgen.h"
#include "unit.h"

enum { FLOAT = 1, INT64 = 7 };

static char tmpdir[256];

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
}

/* X [N, 3] float -> Identity -> Y ; also Z = X listed twice as output, and the input itself */
static unsigned char *identity_model(size_t *len)
{
    mg_model *m = mg_new(13);
    int64_t dims[2] = {-1, 3};
    const char *names[2] = {"N", NULL};
    mg_input(m, "X", FLOAT, 2, dims, names);
    mg_node(m, "Identity", "", (const char *[]){"X", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    mg_output(m, "Y");
    mg_output(m, "X");
    unsigned char *buf = mg_serialize(m, len);
    mg_free(m);
    return buf;
}

/* The usage example of include/kiln.h, verbatim but for the model path. */
static int header_example(const char *path)
{
    kiln_session *s = NULL;
    kiln_session_options opt = kiln_session_options_default();
    if (kiln_session_create(path, &opt, &s) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_last_error(s));
        kiln_session_free(s);
        return 1;
    }
    int64_t dims[2] = {2, 3};
    float x[6] = {1, 2, 3, 4, 5, 6};
    kiln_value *in = NULL, *out = NULL;
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, dims, x, sizeof x, &in);
    const char *in_names[] = {"X"}, *out_names[] = {"Y"};
    int rc = 1;
    if (kiln_session_run(s, 1, in_names, (const kiln_value *const *)&in, 1, out_names, &out) == KILN_OK)
        rc = ((const float *)kiln_value_data(out))[5] == 6.0f ? 0 : 1;
    kiln_value_free(out);
    kiln_value_free(in);
    kiln_session_free(s);
    return rc;
}

static void test_example_and_outputs(void)
{
    size_t len;
    unsigned char *buf = identity_model(&len);
    char path[512];
    snprintf(path, sizeof path, "%s/identity.onnx", tmpdir);
    write_file(path, buf, len);
    CHECK(header_example(path) == 0);

    kiln_session *s = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, NULL, NULL, &s) == KILN_OK);
    CHECK(kiln_session_input_count(s) == 1 && kiln_session_output_count(s) == 3);
    kiln_io_info io;
    CHECK(kiln_session_input_info(s, 0, &io) == KILN_OK);
    CHECK(io.rank == 2 && io.dims[0] < 0 && !strcmp(io.dim_names[0], "N") && io.dims[1] == 3);
    CHECK(kiln_session_input_info(s, 1, &io) == KILN_ERR_INVALID_ARG);
    /* several shapes in one session; the same output twice; an output that is an input */
    for (int n = 1; n <= 5; n += 2) {
        int64_t dims[2] = {n, 3};
        float x[15];
        for (int i = 0; i < n * 3; i++) x[i] = (float)i * 0.5f - 1;
        kiln_value *in, *out[3] = {0};
        kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, dims, x, (size_t)n * 3 * sizeof(float), &in);
        const char *names[] = {"X"}, *outs[] = {"Y", "Y", "X"};
        CHECK(kiln_session_run(s, 1, names, (const kiln_value *const *)&in, 3, outs, out) == KILN_OK);
        for (int j = 0; j < 3; j++) {
            CHECK(out[j] && kiln_value_dims(out[j])[0] == n);
            CHECK(out[j] && !memcmp(kiln_value_data(out[j]), x, (size_t)n * 3 * sizeof(float)));
            kiln_value_free(out[j]);
        }
        CHECK(out[0] != out[1]);
        kiln_value_free(in);
    }
    kiln_session_free(s);
    free(buf);
}

static void expect_run_error(kiln_session *s, const char *name, kiln_value *in, kiln_status want, const char *needle)
{
    kiln_value *out = NULL;
    const char *names[] = {name}, *outs[] = {"Y"};
    kiln_status st = kiln_session_run(s, 1, names, (const kiln_value *const *)&in, 1, outs, &out);
    CHECK(st == want);
    CHECK(out == NULL);
    if (needle && !strstr(kiln_last_error(s), needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", kiln_last_error(s), needle);
        CHECK(0);
    }
}

static void test_bad_calls(void)
{
    size_t len;
    unsigned char *buf = identity_model(&len);
    kiln_session *s = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, NULL, NULL, &s) == KILN_OK);
    float x[6] = {0};
    int64_t good[2] = {2, 3}, bad_dim[2] = {2, 4}, r1[1] = {6};
    kiln_value *v;
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, good, x, sizeof x, &v);
    expect_run_error(s, "nope", v, KILN_ERR_INVALID_ARG, "no input named 'nope'");
    kiln_value_free(v);
    int64_t xi[6] = {0};
    kiln_value_wrap_tensor(KILN_DTYPE_INT64, 2, good, xi, sizeof xi, &v);
    expect_run_error(s, "X", v, KILN_ERR_INVALID_ARG, "expected element type float32, got int64");
    kiln_value_free(v);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, r1, x, sizeof x, &v);
    expect_run_error(s, "X", v, KILN_ERR_SHAPE, "expected rank 2");
    kiln_value_free(v);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, bad_dim, (float[8]){0}, 8 * sizeof(float), &v);
    expect_run_error(s, "X", v, KILN_ERR_SHAPE, "dim 1 must be 3");
    kiln_value_free(v);
    /* missing input, NULL arrays, NULL session */
    kiln_value *out = NULL;
    const char *outs[] = {"Y"};
    CHECK(kiln_session_run(s, 0, NULL, NULL, 1, outs, &out) == KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(s), "'X' is required") != NULL);
    CHECK(kiln_session_run(NULL, 0, NULL, NULL, 0, NULL, NULL) == KILN_ERR_INVALID_ARG);
    CHECK(kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, good, NULL, sizeof x, &v) == KILN_ERR_INVALID_ARG);
    /* zero-size dims are valid */
    int64_t empty[2] = {0, 3};
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, empty, NULL, 0, &v);
    const char *names[] = {"X"};
    CHECK(kiln_session_run(s, 1, names, (const kiln_value *const *)&v, 1, outs, &out) == KILN_OK);
    CHECK(out && kiln_value_numel(out) == 0);
    kiln_value_free(out);
    kiln_value_free(v);
    /* device tensors: a CPU session refuses them before touching the pointer (never
     * dereferenced here); they cannot be cloned or put into sequences or optionals */
    CHECK(kiln_value_wrap_device_tensor(KILN_DTYPE_FLOAT32, 2, good, (void *)(uintptr_t)0x1000, sizeof x, &v) == KILN_OK);
    CHECK(kiln_value_on_device(v));
    expect_run_error(s, "X", v, KILN_ERR_INVALID_ARG, "input 'X' is in device memory");
    kiln_value *c = (kiln_value *)1;
    CHECK(kiln_value_clone(v, &c) == KILN_ERR_INVALID_ARG && c == NULL);
    CHECK(kiln_value_create_sequence(KILN_DTYPE_FLOAT32, &v, 1, &c) == KILN_ERR_INVALID_ARG && c == NULL); /* takes v */
    kiln_value_wrap_device_tensor(KILN_DTYPE_FLOAT32, 2, good, (void *)(uintptr_t)0x1000, sizeof x, &v);
    CHECK(kiln_value_create_optional(KILN_DTYPE_FLOAT32, v, &c) == KILN_ERR_INVALID_ARG && c == NULL); /* takes v */
    CHECK(kiln_value_wrap_device_tensor(KILN_DTYPE_STRING, 2, good, (void *)(uintptr_t)0x1000, 6 * sizeof(char *), &v) ==
          KILN_ERR_INVALID_ARG);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, good, x, sizeof x, &v);
    CHECK(!kiln_value_on_device(v) && !kiln_value_on_device(NULL));
    kiln_value_free(v);
    /* device outputs need the CUDA provider */
    kiln_session_options opt = kiln_session_options_default();
    opt.device_outputs = true;
    kiln_session *d = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, NULL, &opt, &d) == KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(d), "device_outputs needs the CUDA provider") != NULL);
    kiln_session_free(d);
    /* still usable */
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, good, x, sizeof x, &v);
    CHECK(kiln_session_run(s, 1, names, (const kiln_value *const *)&v, 1, outs, &out) == KILN_OK);
    kiln_value_free(out);
    kiln_value_free(v);
    kiln_session_free(s);
    kiln_session_free(NULL);
    kiln_value_free(NULL);
    free(buf);
}

static void test_symbol_binding(void)
{
    mg_model *m = mg_new(13);
    int64_t dims[1] = {-1};
    const char *names[1] = {"N"};
    mg_input(m, "A", FLOAT, 1, dims, names);
    mg_input(m, "B", FLOAT, 1, dims, names);
    mg_node(m, "Identity", "", (const char *[]){"A", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    size_t len;
    unsigned char *buf = mg_serialize(m, &len);
    mg_free(m);
    kiln_session *s = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, NULL, NULL, &s) == KILN_OK);
    float a[3] = {1, 2, 3}, b[4] = {0};
    kiln_value *in[2], *out = NULL;
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, (int64_t[]){3}, a, sizeof a, &in[0]);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, (int64_t[]){4}, b, sizeof b, &in[1]);
    const char *in_names[] = {"A", "B"}, *outs[] = {"Y"};
    CHECK(kiln_session_run(s, 2, in_names, (const kiln_value *const *)in, 1, outs, &out) == KILN_ERR_SHAPE);
    CHECK(strstr(kiln_last_error(s), "'N'") != NULL);
    kiln_value_free(in[1]);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, (int64_t[]){3}, b, 3 * sizeof(float), &in[1]);
    CHECK(kiln_session_run(s, 2, in_names, (const kiln_value *const *)in, 1, outs, &out) == KILN_OK);
    kiln_value_free(out);
    kiln_value_free(in[0]);
    kiln_value_free(in[1]);
    kiln_session_free(s);
    free(buf);
}

static void expect_create_error(const unsigned char *buf, size_t len, const char *dir, kiln_status want, const char *needle)
{
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create_from_memory(buf, len, dir, NULL, &s);
    CHECK(st == want);
    if (needle && !strstr(kiln_last_error(s), needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", kiln_last_error(s), needle);
        CHECK(0);
    }
    kiln_session_free(s);
}

static void test_bad_models(void)
{
    size_t len;
    unsigned char *buf = identity_model(&len);
    /* every truncation, and deterministic byte corruption: errors or valid sessions, no crash */
    for (size_t cut = 0; cut < len; cut++) {
        kiln_session *s = NULL;
        kiln_session_create_from_memory(buf, cut, NULL, NULL, &s);
        kiln_session_free(s);
    }
    uint64_t r = 88172645463325252ull;
    for (int it = 0; it < 3000; it++) {
        unsigned char *mut = malloc(len);
        memcpy(mut, buf, len);
        for (int k = 0; k < 1 + it % 4; k++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            mut[r % len] ^= (unsigned char)(r >> 32);
        }
        kiln_session *s = NULL;
        if (kiln_session_create_from_memory(mut, len, NULL, NULL, &s) == KILN_OK) {
            /* run it too: a mutated but loadable model must still fail cleanly or work */
            float x[6] = {0};
            kiln_value *v, *out = NULL;
            kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, (int64_t[]){2, 3}, x, sizeof x, &v);
            const char *names[] = {"X"}, *outs[] = {"Y"};
            kiln_session_run(s, 1, names, (const kiln_value *const *)&v, 1, outs, &out);
            kiln_value_free(out);
            kiln_value_free(v);
        }
        kiln_session_free(s);
        free(mut);
    }
    free(buf);
    expect_create_error((const unsigned char *)"garbage!", 8, NULL, KILN_ERR_MODEL, "not a valid ONNX model");

    /* unknown operator */
    mg_model *m = mg_new(13);
    int64_t dims[1] = {2};
    mg_input(m, "X", FLOAT, 1, dims, NULL);
    mg_node(m, "NoSuchOp", "", (const char *[]){"X", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    buf = mg_serialize(m, &len);
    mg_free(m);
    expect_create_error(buf, len, NULL, KILN_ERR_UNSUPPORTED, "NoSuchOp");
    free(buf);

    /* a cycle */
    m = mg_new(13);
    mg_input(m, "X", FLOAT, 1, dims, NULL);
    mg_node(m, "Identity", "", (const char *[]){"B", NULL}, (const char *[]){"A", NULL});
    mg_node(m, "Identity", "", (const char *[]){"A", NULL}, (const char *[]){"B", NULL});
    mg_output(m, "B");
    buf = mg_serialize(m, &len);
    mg_free(m);
    expect_create_error(buf, len, NULL, KILN_ERR_MODEL, "cycle");
    free(buf);

    /* undefined input and an output nobody produces */
    m = mg_new(13);
    mg_input(m, "X", FLOAT, 1, dims, NULL);
    mg_node(m, "Identity", "", (const char *[]){"missing", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    buf = mg_serialize(m, &len);
    mg_free(m);
    expect_create_error(buf, len, NULL, KILN_ERR_MODEL, "'missing' is not defined");
    free(buf);
}

static unsigned char *external_model(const char *location, size_t *len)
{
    mg_model *m = mg_new(13);
    int64_t dims[1] = {4};
    mg_init_float(m, "W", 1, dims, NULL, location, 0);
    mg_node(m, "Identity", "", (const char *[]){"W", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    unsigned char *buf = mg_serialize(m, len);
    mg_free(m);
    return buf;
}

static void test_external_data(void)
{
    char dir[512], path[600], outside[600];
    snprintf(dir, sizeof dir, "%s/model", tmpdir);
    mkdir(dir, 0777);
    float w[4] = {1.5f, -2, 3, 4};
    snprintf(path, sizeof path, "%s/w.bin", dir);
    write_file(path, w, sizeof w);
    snprintf(outside, sizeof outside, "%s/secret.bin", tmpdir);
    write_file(outside, w, sizeof w);
    char link[600];
    snprintf(link, sizeof link, "%s/link.bin", dir);
    CHECK(symlink(outside, link) == 0);

    size_t len;
    unsigned char *buf = external_model("w.bin", &len);
    kiln_session *s = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, dir, NULL, &s) == KILN_OK);
    kiln_value *out = NULL;
    const char *outs[] = {"Y"};
    CHECK(kiln_session_run(s, 0, NULL, NULL, 1, outs, &out) == KILN_OK);
    CHECK(out && !memcmp(kiln_value_data(out), w, sizeof w));
    kiln_value_free(out);
    kiln_session_free(s);
    free(buf);
    /* no folder: external data is refused */
    buf = external_model("w.bin", &len);
    expect_create_error(buf, len, NULL, KILN_ERR_MODEL, "no folder");
    free(buf);
    const char *escapes[] = {"../secret.bin", "/etc/passwd", "link.bin", "sub/../../secret.bin"};
    for (int i = 0; i < 4; i++) {
        buf = external_model(escapes[i], &len);
        kiln_session *e = NULL;
        kiln_status st = kiln_session_create_from_memory(buf, len, dir, NULL, &e);
        CHECK(st == KILN_ERR_MODEL);
        CHECK(strstr(kiln_last_error(e), "model's folder") != NULL);
        kiln_session_free(e);
        free(buf);
    }
    /* length beyond the file */
    mg_model *m = mg_new(13);
    mg_init_float(m, "W", 1, (int64_t[]){400}, NULL, "w.bin", 0);
    mg_node(m, "Identity", "", (const char *[]){"W", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    buf = mg_serialize(m, &len);
    mg_free(m);
    expect_create_error(buf, len, dir, KILN_ERR_MODEL, "beyond the file");
    free(buf);
}

/* NaN and Inf flow through kernels like any other value. */
static void test_nan_inf(void)
{
    mg_model *m = mg_new(13);
    mg_input(m, "X", FLOAT, 1, (int64_t[]){-1}, (const char *[]){"N"});
    mg_node(m, "Relu", "", (const char *[]){"X", NULL}, (const char *[]){"R", NULL});
    mg_node(m, "Add", "", (const char *[]){"R", "X", NULL}, (const char *[]){"Y", NULL});
    mg_output(m, "Y");
    size_t len;
    unsigned char *buf = mg_serialize(m, &len);
    mg_free(m);
    kiln_session *s = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, NULL, NULL, &s) == KILN_OK);
    float x[4] = {NAN, INFINITY, -INFINITY, 2.0f};
    kiln_value *in, *out = NULL;
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, (int64_t[]){4}, x, sizeof x, &in);
    const char *names[] = {"X"}, *outs[] = {"Y"};
    CHECK(kiln_session_run(s, 1, names, (const kiln_value *const *)&in, 1, outs, &out) == KILN_OK);
    const float *y = out ? kiln_value_data(out) : NULL;
    /* Relu(x) + x: NaN, +Inf, 0 + -Inf = -Inf, 4 */
    CHECK(y && isnan(y[0]) && isinf(y[1]) && y[1] > 0 && isinf(y[2]) && y[2] < 0 && y[3] == 4.0f);
    kiln_value_free(out);
    kiln_value_free(in);
    kiln_session_free(s);
    free(buf);
}

/* kiln_session_run_with_outputs on the host: storage that fits is written in place (the output
 * a view of it), storage of another dtype or too small is left alone, on_device is refused
 * without a device provider, and an output that is an input lands in its storage too. */
static void test_output_binding(void)
{
    size_t len;
    unsigned char *buf = identity_model(&len);
    kiln_session *s = NULL;
    CHECK(kiln_session_create_from_memory(buf, len, NULL, NULL, &s) == KILN_OK);
    int64_t dims[2] = {2, 3}, small_dims[1] = {2};
    float x[6] = {1, 2, 3, 4, 5, 6}, y[8] = {0}, z[6] = {0}, tiny[2] = {0};
    int64_t wrong[6] = {0};
    kiln_value *in, *sy, *sz, *stiny, *swrong, *out[2] = {0};
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, dims, x, sizeof x, &in);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, (int64_t[]){8}, y, sizeof y, &sy);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 2, dims, z, sizeof z, &sz);
    kiln_value_wrap_tensor(KILN_DTYPE_FLOAT32, 1, small_dims, tiny, sizeof tiny, &stiny);
    kiln_value_wrap_tensor(KILN_DTYPE_INT64, 2, dims, wrong, sizeof wrong, &swrong);
    const char *names[] = {"X"}, *outs[] = {"Y", "X"};
    kiln_output_binding b[2] = {{.storage = sy}, {.storage = sz}};
    CHECK(kiln_session_run_with_outputs(s, 1, names, (const kiln_value *const *)&in, 2, outs, b, out) == KILN_OK);
    CHECK(out[0] && kiln_value_data(out[0]) == (void *)y && kiln_value_dims(out[0])[0] == 2);
    CHECK(out[1] && kiln_value_data(out[1]) == (void *)z);
    CHECK(!memcmp(y, x, sizeof x) && !memcmp(z, x, sizeof x) && y[6] == 0);
    for (int j = 0; j < 2; j++) {
        CHECK(out[j] && !memcmp(kiln_value_data(out[j]), x, sizeof x));
        kiln_value_free(out[j]);
    }
    b[0] = (kiln_output_binding){.storage = stiny};
    CHECK(kiln_session_run_with_outputs(s, 1, names, (const kiln_value *const *)&in, 1, outs, b, out) == KILN_OK);
    CHECK(out[0] && kiln_value_data(out[0]) != (void *)tiny && kiln_value_numel(out[0]) == 6 && tiny[0] == 0);
    kiln_value_free(out[0]);
    b[0] = (kiln_output_binding){.storage = swrong};
    CHECK(kiln_session_run_with_outputs(s, 1, names, (const kiln_value *const *)&in, 1, outs, b, out) == KILN_OK);
    CHECK(out[0] && kiln_value_data(out[0]) != (void *)wrong && wrong[0] == 0);
    kiln_value_free(out[0]);
    b[0] = (kiln_output_binding){.on_device = true};
    CHECK(kiln_session_run_with_outputs(s, 1, names, (const kiln_value *const *)&in, 1, outs, b, out) ==
          KILN_ERR_INVALID_ARG);
    CHECK(out[0] == NULL && strstr(kiln_last_error(s), "device provider"));
    CHECK(!kiln_session_node_fallback(s, 0) && !kiln_session_node_fallback(s, 99) && !kiln_session_node_fallback(NULL, 0));
    kiln_session_stats st;
    CHECK(kiln_session_stats_get(s, &st) == KILN_OK && st.nodes_fallback == 0); /* no device provider */
    CHECK(kiln_session_run_with_outputs(s, 1, names, (const kiln_value *const *)&in, 1, outs, NULL, out) == KILN_OK);
    CHECK(out[0] && !memcmp(kiln_value_data(out[0]), x, sizeof x));
    kiln_value_free(out[0]);
    kiln_value_free(in);
    kiln_value_free(sy);
    kiln_value_free(sz);
    kiln_value_free(stiny);
    kiln_value_free(swrong);
    kiln_session_free(s);
    free(buf);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_test_api_XXXXXX");
    if (!mkdtemp(tmpdir)) return 2;
    test_example_and_outputs();
    test_bad_calls();
    test_symbol_binding();
    test_bad_models();
    test_external_data();
    test_nan_inf();
    test_output_binding();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
    return unit_report("test_api");
}

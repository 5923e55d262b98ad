/* test_fused_emu.c - kiln.FusedElementwise as the GPU pipeline makes it, on the emulated device
 * of tests/common/emu_device.c (CI has no GPU): the encoder of tests/models/make_models.py with the
 * fuse_elementwise pass added to the device's pipeline. Its outputs equal the CPU provider's at
 * several bindings, and its device arena stays within 1.10x the planner's lower bound (a fused
 * node runs in place on input 0, as the elements it replaces did: without that, a fused GELU kept
 * two FFN-sized buffers alive and the arena was 1.12x).
 *
 * usage: test_fused_emu MODELS_DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_device.h"
#include "exec/test_hooks.h"
#include "kiln.h"
#include "passes/pass.h"
#include "passes/passes.h"
#include "unit.h"

static const kiln_pass fuse_pass[] = {{"fuse_elementwise", kiln_pass_fuse_elementwise}};

#define N_OUT 3
static const char *const out_names[N_OUT] = {"hidden", "pooled", "frames"};

/* Runs s on tokens [b, t]; outputs into out (the caller frees them). */
static kiln_status run(kiln_session *s, int64_t b, int64_t t, kiln_value **out)
{
    int64_t dims[2] = {b, t}, n = b * t;
    int64_t *tok = malloc((size_t)n * sizeof *tok);
    if (!tok) return KILN_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) tok[i] = (i * 7 + b) % 50;
    kiln_value *in = NULL;
    const char *in_name = "tokens";
    kiln_status st = kiln_value_wrap_tensor(KILN_DTYPE_INT64, 2, dims, tok, (size_t)n * sizeof *tok, &in);
    if (!st) st = kiln_session_run(s, 1, &in_name, (const kiln_value *const *)&in, N_OUT, out_names, out);
    if (st) fprintf(stderr, "test_fused_emu: run %lldx%lld: %s\n", (long long)b, (long long)t, kiln_last_error(s));
    kiln_value_free(in);
    free(tok);
    return st;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_fused_emu MODELS_DIR\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/encoder.onnx", argv[1]);
    kiln_provider_i dev = emu_device;
    dev.passes = fuse_pass;
    dev.n_passes = 1;
    kiln_session_options o = kiln_session_options_default();
    kiln_session *cpu = NULL, *emu = NULL;
    CHECK(kiln_session_create(path, &o, &cpu) == KILN_OK);
    kiln_test_device_provider(&dev);
    o.provider = KILN_PROVIDER_CUDA;
    CHECK(kiln_session_create(path, &o, &emu) == KILN_OK);
    kiln_test_device_provider(NULL);
    if (unit_failures) return unit_report("test_fused_emu");
    int fused = 0;
    for (int i = 0; i < kiln_session_node_count(emu); i++) {
        const char *name, *domain, *op;
        bool sup;
        if (!kiln_session_node(emu, i, &name, &domain, &op, &sup) && !strcmp(op, "FusedElementwise")) fused++;
    }
    CHECK(fused > 0);
    const int64_t shapes[][2] = {{3, 27}, {1, 27}, {2, 64}, {4, 9}, {1, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        kiln_value *want[N_OUT] = {0}, *got[N_OUT] = {0};
        CHECK(run(cpu, shapes[k][0], shapes[k][1], want) == KILN_OK);
        CHECK(run(emu, shapes[k][0], shapes[k][1], got) == KILN_OK);
        for (int j = 0; j < N_OUT; j++) {
            if (!want[j] || !got[j]) continue;
            CHECK(kiln_value_numel(want[j]) == kiln_value_numel(got[j]));
            const float *w = kiln_value_data(want[j]), *g = kiln_value_data(got[j]);
            double worst = 0;
            for (int64_t i = 0; i < kiln_value_numel(want[j]) && i < kiln_value_numel(got[j]); i++) {
                double d = fabs((double)w[i] - (double)g[i]) / (1.0 + fabs((double)w[i]));
                if (!(d <= worst)) worst = d; /* NaN stays */
            }
            if (!(worst < 1e-5))
                fprintf(stderr, "test_fused_emu: %lldx%lld %s: relative difference %g\n", (long long)shapes[k][0],
                        (long long)shapes[k][1], out_names[j], worst);
            CHECK(worst < 1e-5);
        }
        kiln_session_stats st;
        CHECK(kiln_session_stats_get(emu, &st) == KILN_OK);
        if (!(st.arena_last_bytes <= st.lower_bound_last_bytes * 11 / 10))
            fprintf(stderr, "test_fused_emu: %lldx%lld: arena %lld, lower bound %lld\n", (long long)shapes[k][0],
                    (long long)shapes[k][1], (long long)st.arena_last_bytes, (long long)st.lower_bound_last_bytes);
        CHECK(st.arena_last_bytes <= st.lower_bound_last_bytes * 11 / 10);
        for (int j = 0; j < N_OUT; j++) kiln_value_free(want[j]), kiln_value_free(got[j]);
    }
    printf("test_fused_emu: %d FusedElementwise nodes\n", fused);
    kiln_session_free(cpu);
    kiln_session_free(emu);
    return unit_report("test_fused_emu");
}

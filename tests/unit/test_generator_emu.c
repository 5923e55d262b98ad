/* test_generator_emu.c - the generator's device path (a KV cache in device memory, past inputs
 * read where they are, presents written in place, decode steps fed max_length-wide masks) on
 * the emulated device (tests/common/emu_device.h), against the same folder on the CPU provider:
 * greedy tokens equal and logits close at every step, batch 1 and batch 2 with right-padded
 * prompts, one compilation. usage: test_generator_emu FOLDER...  */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emu_device.h"
#include "exec/test_hooks.h"
#include "kiln.h"
#include "passes/pass.h"
#include "passes/passes.h"
#include "unit.h"

#define STEPS 24

typedef struct run {
    int64_t tokens[2][STEPS];
    float *logits; /* [STEPS][batch * vocab] */
    int64_t vocab;
    kiln_session_stats stats;
} run;

static kiln_status generate(const char *dir, kiln_provider_kind provider, int batch, run *r)
{
    static const int64_t prompt[2][5] = {{5, 17, 33, 100, 7}, {9, 44, 0, 0, 0}}, lens[2] = {5, 2};
    kiln_generator_params p = kiln_generator_params_default();
    p.batch_size = batch;
    p.max_length = 5 + STEPS;
    p.provider = provider;
    kiln_generator *g = NULL;
    kiln_status st = kiln_generator_create(dir, &p, &g);
    if (!st) st = kiln_generator_append_tokens(g, batch, lens, &prompt[0][0]);
    for (int k = 0; k < STEPS && !st; k++) {
        const float *lg;
        int64_t v;
        st = kiln_generator_get_logits(g, &lg, &v);
        if (st) break;
        if (!r->logits) {
            r->vocab = v;
            r->logits = calloc((size_t)STEPS * (size_t)batch * (size_t)v, sizeof *r->logits);
            if (!r->logits) st = KILN_ERR_NOMEM;
        }
        if (st || v != r->vocab) break;
        memcpy(r->logits + (size_t)k * (size_t)batch * (size_t)v, lg, (size_t)batch * (size_t)v * sizeof *lg);
        st = kiln_generator_generate_next(g);
        const int64_t *next;
        if (!st) st = kiln_generator_get_next_tokens(g, &next, NULL);
        for (int b = 0; b < batch && !st; b++) r->tokens[b][k] = next[b];
    }
    if (!st) st = kiln_generator_session_stats(g, &r->stats);
    if (st) fprintf(stderr, "test_generator_emu: %s: %s\n", dir, kiln_generator_last_error(g));
    kiln_generator_free(g);
    return st;
}

/* The GPU provider's LLM passes on the emulated device: kiln.SiluMul, and the gate and up products
 * as one over the stacked weights, which the SiluMul reads packed. */
static const kiln_pass llm_passes[] = {{"fuse_silu_mul", kiln_pass_fuse_silu_mul}, {"fuse_gate_up", kiln_pass_fuse_gate_up}};

/* Returns the device's node count. */
static int compare(const char *dir, int batch, bool passes)
{
    run cpu = {0}, emu = {0};
    kiln_test_device_provider(NULL);
    CHECK(generate(dir, KILN_PROVIDER_CPU, batch, &cpu) == KILN_OK);
    kiln_provider_i dev = emu_device;
    if (passes) dev.passes = llm_passes, dev.n_passes = 2;
    kiln_test_device_provider(&dev);
    CHECK(generate(dir, KILN_PROVIDER_CUDA, batch, &emu) == KILN_OK);
    kiln_test_device_provider(NULL);
    if (cpu.logits && emu.logits && cpu.vocab == emu.vocab) {
        int same = 1;
        double worst = 0;
        for (int k = 0; k < STEPS && same; k++) {
            for (int b = 0; b < batch; b++) same &= cpu.tokens[b][k] == emu.tokens[b][k];
            for (int64_t i = 0; i < batch * cpu.vocab; i++) {
                size_t at = (size_t)k * (size_t)batch * (size_t)cpu.vocab + (size_t)i;
                double d = fabs((double)cpu.logits[at] - (double)emu.logits[at]) / (1.0 + fabs((double)cpu.logits[at]));
                if (d > worst) worst = d;
            }
        }
        printf("test_generator_emu: %s batch %d%s: tokens %s, max relative logit difference %.3g\n", dir, batch,
               passes ? " (LLM passes)" : "", same ? "equal" : "differ", worst);
        CHECK(same);
        CHECK(worst < 1e-3);
        CHECK(emu.stats.compilations == 1);
    } else {
        CHECK(!"both providers generated");
    }
    free(cpu.logits);
    free(emu.logits);
    return emu.stats.nodes_gpu;
}

int main(int argc, char **argv)
{
    if (argc < 2) printf("test_generator_emu: no model folder given\n");
    for (int i = 1; i < argc; i++)
        for (int batch = 1; batch <= 2; batch++) {
            int plain = compare(argv[i], batch, false), fused = compare(argv[i], batch, true);
            printf("test_generator_emu: %s: %d device nodes, %d with the LLM passes\n", argv[i], plain, fused);
            CHECK(fused < plain); /* a layer's Sigmoid, Mul and up product fewer */
        }
    return unit_report("test_generator_emu");
}

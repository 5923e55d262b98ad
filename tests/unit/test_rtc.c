/* test_rtc.c - the CUDA provider's generated kernels compile (src/gpu/ops_fused.c, rtc.h):
 * element-wise chains over every op the generator knows, in float32, float16 and bfloat16,
 * with integer and bool inputs, go through the GPU's fusion pass; the module source of the
 * fused nodes then compiles with NVRTC for sm_90 (a cubin) and sm_75, and identical chains
 * share one kernel. A broken source fails with NVRTC's log. Built with the CUDA provider only;
 * needs the toolkit's libnvrtc, not a GPU (skipped, saying so, without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/generated.h"
#include "gpu/rtc.h"
#include "modelgen.h"
#include "onnx/load.h"
#include "ops/eval.h"
#include "passes/pass.h"
#include "passes/passes.h"
#include "unit.h"

enum { F32 = 1, I64 = 7, BOOL = 9, F16 = 10, BF16 = 16 };

static const char *const unary[] = {"Abs", "Neg", "Sign", "Relu", "Reciprocal", "Floor", "Ceil", "Round", "Sqrt",
                                    "Exp", "Log", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
                                    "Asinh", "Acosh", "Atanh", "Erf", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu",
                                    "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "ThresholdedRelu",
                                    "Gelu", "Mish"};
static const char *const binary[] = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"};

static int chains;

/* Y_<tag> = Mul(op(Add(Cast(X, dt), Cast(B, dt))), Cast(half, dt)): one group of five nodes */
static void chain(mg_model *m, int dt, const char *op, bool is_binary, int tag)
{
    char x[24], b[24], s[24], u[24], h[24], y[24];
    snprintf(x, sizeof x, "x%d", tag), snprintf(b, sizeof b, "b%d", tag), snprintf(s, sizeof s, "s%d", tag);
    snprintf(u, sizeof u, "u%d", tag), snprintf(h, sizeof h, "h%d", tag), snprintf(y, sizeof y, "Y%d", tag);
    mg_node(m, "Cast", "", (const char *[]){"X", NULL}, (const char *[]){x, NULL});
    mg_attr_int(m, "to", dt);
    mg_node(m, "Cast", "", (const char *[]){"B", NULL}, (const char *[]){b, NULL});
    mg_attr_int(m, "to", dt);
    mg_node(m, "Add", "", (const char *[]){x, b, NULL}, (const char *[]){s, NULL});
    if (is_binary) mg_node(m, op, "", (const char *[]){s, !strcmp(op, "PRelu") ? b : x, NULL}, (const char *[]){u, NULL});
    else mg_node(m, op, "", (const char *[]){s, NULL}, (const char *[]){u, NULL});
    if (!strcmp(op, "Gelu") && tag % 2) mg_attr_string(m, "approximate", "tanh");
    mg_node(m, "Cast", "", (const char *[]){"half", NULL}, (const char *[]){h, NULL});
    mg_attr_int(m, "to", dt);
    mg_node(m, "Mul", "", (const char *[]){u, h, NULL}, (const char *[]){y, NULL});
    mg_output(m, y);
    chains++;
}

static kiln_model *build(void)
{
    mg_model *m = mg_new(20);
    int64_t xd[3] = {2, 3, 8}, bd[1] = {8};
    mg_input(m, "X", F32, 3, xd, NULL);
    mg_input(m, "B", F32, 1, bd, NULL);
    float half = 0.5f, lo = -1.0f, hi = 2.0f;
    mg_init_float(m, "half", 0, NULL, &half, NULL, 0);
    mg_init_float(m, "lo", 0, NULL, &lo, NULL, 0);
    mg_init_float(m, "hi", 0, NULL, &hi, NULL, 0);
    static const int dts[] = {F32, F16, BF16};
    int tag = 0;
    for (int d = 0; d < 3; d++) {
        for (size_t i = 0; i < sizeof unary / sizeof *unary; i++) chain(m, dts[d], unary[i], false, tag++);
        for (size_t i = 0; i < sizeof binary / sizeof *binary; i++) chain(m, dts[d], binary[i], true, tag++);
    }
    chain(m, F32, "Sigmoid", false, 1000); /* the same program as an earlier chain: one kernel */
    /* a mask: Add(X, Mul(Sub(1, Cast(Cast(B, int64), float)), -3)), Where on Greater, Clip */
    float one = 1.0f, neg = -3.0f;
    mg_init_float(m, "one", 0, NULL, &one, NULL, 0);
    mg_init_float(m, "neg", 0, NULL, &neg, NULL, 0);
    mg_node(m, "Cast", "", (const char *[]){"B", NULL}, (const char *[]){"bi", NULL});
    mg_attr_int(m, "to", I64);
    mg_node(m, "Cast", "", (const char *[]){"bi", NULL}, (const char *[]){"bf", NULL});
    mg_attr_int(m, "to", F32);
    mg_node(m, "Sub", "", (const char *[]){"one", "bf", NULL}, (const char *[]){"sb", NULL});
    mg_node(m, "Mul", "", (const char *[]){"sb", "neg", NULL}, (const char *[]){"mb", NULL});
    mg_node(m, "Greater", "", (const char *[]){"X", "one", NULL}, (const char *[]){"gt", NULL});
    mg_node(m, "Add", "", (const char *[]){"X", "mb", NULL}, (const char *[]){"am", NULL});
    mg_node(m, "Where", "", (const char *[]){"gt", "am", "X", NULL}, (const char *[]){"wh", NULL});
    mg_node(m, "Clip", "", (const char *[]){"wh", "lo", "hi", NULL}, (const char *[]){"Ymask", NULL});
    mg_output(m, "Ymask");
    chains++;
    size_t len;
    unsigned char *buf = mg_serialize(m, &len);
    mg_free(m);
    kiln_model *md = NULL;
    kiln_err err = {0};
    if (kiln_onnx_load(buf, len, NULL, &md, &err) || kiln_bind_ops(md->graph, true, &err) ||
        kiln_graph_infer(md->graph, NULL)) {
        fprintf(stderr, "load: %s\n", err.msg);
        kiln_model_free(md);
        md = NULL;
    }
    free(buf);
    return md;
}

int main(void)
{
    kiln_err err = {0};
    void *probe = NULL;
    size_t probe_size = 0;
    char probe_arch[32];
    if (kiln_gpu_rtc_compile(90, "extern \"C\" __global__ void k() {}", &probe, &probe_size, probe_arch,
                             sizeof probe_arch, &err) == KILN_ERR_UNSUPPORTED) {
        printf("SKIP test_rtc: %s\n", err.msg);
        return unit_report("test_rtc");
    }
    free(probe);
    kiln_model *md = build();
    CHECK(md != NULL);
    if (!md) return unit_report("test_rtc");
    const kiln_pass pass = {"fuse_elementwise", kiln_pass_fuse_elementwise};
    int fused = -1;
    CHECK(kiln_passes_run(md->graph, &pass, 1, &fused, &err) == KILN_OK);
    CHECK(fused == chains);
    char *src = NULL;
    int kernels = 0;
    CHECK(kiln_gpu_fused_source(md->graph, &src, &kernels, &err) == KILN_OK && src);
    CHECK(kernels == chains - 1); /* the repeated Sigmoid chain shares its kernel */
    static const int ccs[] = {90, 75};
    for (size_t i = 0; i < sizeof ccs / sizeof *ccs && src; i++) {
        void *image = NULL;
        size_t size = 0;
        char arch[32] = "";
        kiln_status st = kiln_gpu_rtc_compile(ccs[i], src, &image, &size, arch, sizeof arch, &err);
        if (st) fprintf(stderr, "compile for %d: %s\n", ccs[i], err.msg);
        CHECK(st == KILN_OK && image && size > 1000);
        char want[16];
        snprintf(want, sizeof want, "sm_%d", ccs[i]);
        CHECK(!strcmp(arch, want));
        free(image);
    }
    /* a broken source: an error naming NVRTC, no image */
    void *image = (void *)1;
    size_t size = 1;
    char arch[32];
    CHECK(kiln_gpu_rtc_compile(90, "extern \"C\" __global__ void k() { undefined_name(); }", &image, &size, arch,
                               sizeof arch, &err) == KILN_ERR_RUNTIME);
    CHECK(!image && !size && strstr(err.msg, "NVRTC") && strstr(err.msg, "undefined_name"));
    free(src);
    kiln_model_free(md);
    return unit_report("test_rtc");
}

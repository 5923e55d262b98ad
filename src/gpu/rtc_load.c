/* rtc_load.c - NVRTC and the CUDA driver's module API, opened at run time (rtc.h). */
#include "gpu/rtc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/libload.h"

#if defined(KILN_HIP)
kiln_status kiln_gpu_rtc_open(kiln_err *err)
{
    return kiln_errf(err, KILN_ERR_UNSUPPORTED, "no run-time compiler wired in HIP builds");
}
kiln_status kiln_gpu_rtc_compile(int cc, const char *src, void **image, size_t *size, char *arch, size_t arch_size,
                                 kiln_err *err)
{
    return kiln_gpu_rtc_open(err);
}
int kiln_gpu_rtc_version(void) { return 0; }
kiln_status kiln_gpu_module_load(const void *image, kiln_gpu_module **out, kiln_err *err)
{
    *out = NULL;
    return kiln_gpu_rtc_open(err);
}
void *kiln_gpu_module_kernel(kiln_gpu_module *m, const char *name, kiln_err *err) { return NULL; }
void kiln_gpu_module_free(kiln_gpu_module *m) {}
gpuError_t kiln_gpu_module_launch(void *fn, unsigned grid, unsigned block, const void *arg, size_t bytes,
                                  gpuStream_t s)
{
    return gpuErrorInvalidValue;
}
#else
#include <cuda.h>
#include <nvrtc.h>

static struct {
    __typeof__(nvrtcVersion) *version;
    __typeof__(nvrtcGetErrorString) *error_string;
    __typeof__(nvrtcCreateProgram) *create;
    __typeof__(nvrtcDestroyProgram) *destroy;
    __typeof__(nvrtcCompileProgram) *compile;
    __typeof__(nvrtcGetProgramLogSize) *log_size;
    __typeof__(nvrtcGetProgramLog) *log;
    __typeof__(nvrtcGetCUBINSize) *cubin_size;
    __typeof__(nvrtcGetCUBIN) *cubin;
    __typeof__(nvrtcGetPTXSize) *ptx_size;
    __typeof__(nvrtcGetPTX) *ptx;
    __typeof__(nvrtcGetNumSupportedArchs) *n_archs;
    __typeof__(nvrtcGetSupportedArchs) *archs;
} nv;

static struct {
    __typeof__(cuModuleLoadData) *load;
    __typeof__(cuModuleUnload) *unload;
    __typeof__(cuModuleGetFunction) *get_function;
    __typeof__(cuLaunchKernel) *launch;
    __typeof__(cuGetErrorString) *error_string;
} drv;

/* CUDA 13's and 12's compiler, by soname and where the toolkit puts it */
static const char *const nvrtc_files[] = {"libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.13", "libnvrtc.so.12",
                                          "/usr/local/cuda/lib64/libnvrtc.so.12", "libnvrtc.so"};
#define NVRTC_SYMBOLS(X)                                                                                       \
    X(version, "nvrtcVersion") X(error_string, "nvrtcGetErrorString") X(create, "nvrtcCreateProgram")          \
    X(destroy, "nvrtcDestroyProgram") X(compile, "nvrtcCompileProgram") X(log_size, "nvrtcGetProgramLogSize")   \
    X(log, "nvrtcGetProgramLog") X(cubin_size, "nvrtcGetCUBINSize") X(cubin, "nvrtcGetCUBIN")                  \
    X(ptx_size, "nvrtcGetPTXSize") X(ptx, "nvrtcGetPTX") X(n_archs, "nvrtcGetNumSupportedArchs")                \
    X(archs, "nvrtcGetSupportedArchs")
static const char *const driver_files[] = {"libcuda.so.1", "libcuda.so"};
#define DRIVER_SYMBOLS(X)                                                                                      \
    X(load, "cuModuleLoadData") X(unload, "cuModuleUnload") X(get_function, "cuModuleGetFunction")             \
    X(launch, "cuLaunchKernel") X(error_string, "cuGetErrorString")

#define NAME(field, name) name,
#define NV_SLOT(field, name) (void **)&nv.field,
#define DRV_SLOT(field, name) (void **)&drv.field,
static const char *const nvrtc_names[] = {NVRTC_SYMBOLS(NAME)};
static void **const nvrtc_slots[] = {NVRTC_SYMBOLS(NV_SLOT)};
static const char *const driver_names[] = {DRIVER_SYMBOLS(NAME)};
static void **const driver_slots[] = {DRIVER_SYMBOLS(DRV_SLOT)};
static kiln_gpu_lib nvrtc_lib = {
    .what = "NVRTC", .files = nvrtc_files, .n_files = sizeof nvrtc_files / sizeof *nvrtc_files,
    .names = nvrtc_names, .slots = nvrtc_slots, .n = sizeof nvrtc_names / sizeof *nvrtc_names,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};
static kiln_gpu_lib driver_lib = {
    .what = "the CUDA driver", .files = driver_files, .n_files = sizeof driver_files / sizeof *driver_files,
    .names = driver_names, .slots = driver_slots, .n = sizeof driver_names / sizeof *driver_names,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

kiln_status kiln_gpu_rtc_open(kiln_err *err)
{
    const char *off = getenv("KILN_RTC");
    if (off && !strcmp(off, "0")) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "generated kernels turned off (KILN_RTC=0)");
    KILN_TRY(kiln_gpu_lib_open(&nvrtc_lib, err));
    return kiln_gpu_lib_open(&driver_lib, err);
}

int kiln_gpu_rtc_version(void)
{
    int major = 0, minor = 0;
    if (nv.version) nv.version(&major, &minor);
    return major * 1000 + minor;
}

static kiln_status nvrtc_fail(kiln_err *err, nvrtcResult r, const char *what)
{
    return kiln_errf(err, KILN_ERR_RUNTIME, "NVRTC: %s: %s", what, nv.error_string(r));
}

kiln_status kiln_gpu_rtc_compile(int cc, const char *src, void **image, size_t *size, char *arch, size_t arch_size,
                                 kiln_err *err)
{
    *image = NULL;
    *size = 0;
    KILN_TRY(kiln_gpu_lib_open(&nvrtc_lib, err));
    /* the device's own architecture when NVRTC knows it (a cubin), else PTX for the newest
     * architecture below it that NVRTC knows, which the driver compiles when loading */
    int want = cc, best = 0, n = 0;
    bool exact = false;
    if (nv.n_archs(&n) == NVRTC_SUCCESS && n > 0 && n < 256) {
        int archs[256];
        if (nv.archs(archs) == NVRTC_SUCCESS)
            for (int i = 0; i < n; i++) {
                if (archs[i] == want) exact = true;
                if (archs[i] <= want && archs[i] > best) best = archs[i];
            }
    }
    if (!exact && !best) return kiln_errf(err, KILN_ERR_UNSUPPORTED, "NVRTC knows no architecture up to sm_%d", want);
    char opt_arch[48];
    snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s_%d", exact ? "sm" : "compute", exact ? want : best);
    snprintf(arch, arch_size, "%s_%d", exact ? "sm" : "compute", exact ? want : best);
    const char *opts[] = {opt_arch, "--std=c++17", "-default-device"};
    nvrtcProgram prog;
    nvrtcResult r = nv.create(&prog, src, "kiln_generated.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) return nvrtc_fail(err, r, "creating the program");
    r = nv.compile(prog, (int)(sizeof opts / sizeof *opts), opts);
    kiln_status st = KILN_OK;
    if (r != NVRTC_SUCCESS) {
        size_t n_log = 0;
        char log[600] = "";
        if (nv.log_size(prog, &n_log) == NVRTC_SUCCESS && n_log > 1) {
            char *full = malloc(n_log);
            if (full && nv.log(prog, full) == NVRTC_SUCCESS) snprintf(log, sizeof log, "%s", full);
            free(full);
        }
        st = kiln_errf(err, KILN_ERR_RUNTIME, "NVRTC: compiling a generated kernel for %s failed: %s", arch, log);
    }
    if (!st) {
        r = exact ? nv.cubin_size(prog, size) : nv.ptx_size(prog, size);
        if (r == NVRTC_SUCCESS && !(*image = malloc(*size ? *size : 1))) st = kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
        else if (r == NVRTC_SUCCESS) r = exact ? nv.cubin(prog, *image) : nv.ptx(prog, *image);
        if (!st && r != NVRTC_SUCCESS) st = nvrtc_fail(err, r, "reading the compiled image");
    }
    nv.destroy(&prog);
    if (st) {
        free(*image);
        *image = NULL;
        *size = 0;
    }
    return st;
}

struct kiln_gpu_module {
    CUmodule m;
};

static kiln_status drv_fail(kiln_err *err, CUresult r, const char *what)
{
    const char *s = NULL;
    if (drv.error_string) drv.error_string(r, &s);
    return kiln_errf(err, KILN_ERR_RUNTIME, "CUDA driver: %s: %s", what, s ? s : "unknown error");
}

kiln_status kiln_gpu_module_load(const void *image, kiln_gpu_module **out, kiln_err *err)
{
    *out = NULL;
    KILN_TRY(kiln_gpu_lib_open(&driver_lib, err));
    kiln_gpu_module *m = calloc(1, sizeof *m);
    if (!m) return kiln_errf(err, KILN_ERR_NOMEM, "out of memory");
    CUresult r = drv.load(&m->m, image);
    if (r != CUDA_SUCCESS) {
        free(m);
        return drv_fail(err, r, "loading a generated module");
    }
    *out = m;
    return KILN_OK;
}

void *kiln_gpu_module_kernel(kiln_gpu_module *m, const char *name, kiln_err *err)
{
    CUfunction f = NULL;
    CUresult r = drv.get_function(&f, m->m, name);
    if (r != CUDA_SUCCESS) {
        drv_fail(err, r, name);
        return NULL;
    }
    return f;
}

void kiln_gpu_module_free(kiln_gpu_module *m)
{
    if (!m) return;
    drv.unload(m->m);
    free(m);
}

gpuError_t kiln_gpu_module_launch(void *fn, unsigned grid, unsigned block, const void *arg, size_t bytes,
                                  gpuStream_t s)
{
    void *config[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, (void *)arg, CU_LAUNCH_PARAM_BUFFER_SIZE, &bytes,
                      CU_LAUNCH_PARAM_END};
    CUresult r = drv.launch((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, (CUstream)s, NULL, config);
    return r == CUDA_SUCCESS ? gpuSuccess : gpuErrorInvalidValue;
}
#endif

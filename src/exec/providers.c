/* providers.c - the list of execution providers built into this kiln: the one file that knows
 * which exist, and the only build switch among them. */
#include "exec/providers.h"
#include "exec/test_hooks.h"

extern const kiln_provider_i kiln_provider_cpu;
#ifdef KILN_CUDA
extern const kiln_provider_i kiln_provider_cuda;
#endif

static const kiln_provider_i *const providers[] = {
    &kiln_provider_cpu,
#ifdef KILN_CUDA
    &kiln_provider_cuda,
#endif
};

/* kiln_test_device_provider's table (exec/test_hooks.h), or NULL */
static const kiln_provider_i *test_device;

void kiln_test_device_provider(const kiln_provider_i *p) { test_device = p; }

const kiln_provider_i *kiln_provider_find(kiln_provider_kind kind)
{
    if (test_device && test_device->kind == kind) return test_device;
    for (size_t i = 0; i < sizeof providers / sizeof providers[0]; i++)
        if (providers[i]->kind == kind && providers[i]->api_version == KILN_PROVIDER_API) return providers[i];
    return NULL;
}

const char *kiln_provider_missing(kiln_provider_kind kind)
{
    if (kind == KILN_PROVIDER_CUDA)
        return "CUDA provider: this kiln was built without it (configure with a CUDA toolkit, KILN_CUDA=ON)";
    return "unknown provider";
}

/* providers.h - the registry of the providers built into this kiln (providers.c). */
#ifndef KILN_EXEC_PROVIDERS_H
#define KILN_EXEC_PROVIDERS_H

#include "ops/provider.h"

/* The provider table for kind, or NULL when this build does not have it. */
const kiln_provider_i *kiln_provider_find(kiln_provider_kind kind);
/* Why kiln_provider_find(kind) is NULL: "built without it" or "unknown provider". */
const char *kiln_provider_missing(kiln_provider_kind kind);

#endif

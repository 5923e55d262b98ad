/* registry.c - the list of operator families; the one place an op family is registered. */
#include <string.h>

#include "ops/op.h"

#define FAMILIES(X) \
    X(kiln_ops_elementwise) \
    X(kiln_ops_shape) \
    X(kiln_ops_index) \
    X(kiln_ops_reduce) \
    X(kiln_ops_nn) \
    X(kiln_ops_image) \
    X(kiln_ops_cast) \
    X(kiln_ops_control) \
    X(kiln_ops_attention) \
    X(kiln_ops_attention_variants) \
    X(kiln_ops_rnn) \
    X(kiln_ops_contrib) \
    X(kiln_ops_contrib_quant) \
    X(kiln_ops_contrib_attention) \
    X(kiln_ops_contrib_qlinear) \
    X(kiln_ops_llm_attention) \
    X(kiln_ops_llm_nbits) \
    X(kiln_ops_llm_norm) \
    X(kiln_ops_contrib_qops) \
    X(kiln_ops_contrib_nchwc) \
    X(kiln_ops_contrib_qattn) \
    X(kiln_ops_basic) \
    X(kiln_ops_fused) \
    X(kiln_ops_fused_ew) \
    X(kiln_ops_memcpy)

#define DECLARE(name) extern const kiln_op_table name;
FAMILIES(DECLARE)
#undef DECLARE

#define ENTRY(name) &name,
static const kiln_op_table *const families[] = {FAMILIES(ENTRY)};
#undef ENTRY

const kiln_op_def *kiln_op_lookup(const char *domain, const char *op_type, int64_t opset)
{
    if (!domain || !strcmp(domain, "ai.onnx")) domain = "";
    const kiln_op_def *best = NULL;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (int i = 0; i < families[f]->n; i++) {
            const kiln_op_def *d = &families[f]->defs[i];
            if (strcmp(d->op_type, op_type) || strcmp(d->domain, domain)) continue;
            if (d->since_version <= opset && (!best || d->since_version > best->since_version)) best = d;
        }
    return best;
}

int kiln_op_domain_latest(const char *domain)
{
    if (!domain || !strcmp(domain, "ai.onnx")) domain = "";
    int v = 0;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (int i = 0; i < families[f]->n; i++) {
            const kiln_op_def *d = &families[f]->defs[i];
            if (!strcmp(d->domain, domain) && d->since_version > v) v = d->since_version;
        }
    return v;
}

int kiln_operator_count(void)
{
    int n = 0;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) n += families[f]->n;
    return n;
}

kiln_status kiln_operator_info(int i, const char **domain, const char **op_type, int *since_version)
{
    if (i < 0) return KILN_ERR_INVALID_ARG;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        if (i >= families[f]->n) {
            i -= families[f]->n;
            continue;
        }
        const kiln_op_def *d = &families[f]->defs[i];
        if (domain) *domain = d->domain;
        if (op_type) *op_type = d->op_type;
        if (since_version) *since_version = d->since_version;
        return KILN_OK;
    }
    return KILN_ERR_INVALID_ARG;
}

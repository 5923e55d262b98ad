/* support.c - the GPU families' shared placement-check helpers (support.h). */
#include "gpu/support.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/dtype.h"

bool kiln_gpu_refuse(char *why, size_t size, const char *fmt, ...)
{
    if (why && size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, size, fmt, ap);
        va_end(ap);
    }
    return false;
}

const kiln_type *kiln_gpu_in_type(const kiln_node *n, int i)
{
    return i < n->n_in && n->in[i] ? &n->in[i]->type : NULL;
}

bool kiln_gpu_dtype_in(kiln_dtype dt, const kiln_dtype *ok)
{
    for (int k = 0; ok[k] != KILN_DTYPE_UNDEFINED; k++)
        if (dt == ok[k]) return true;
    return false;
}

bool kiln_gpu_input_is(const kiln_node *n, int i, bool required, const kiln_dtype *ok, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i);
    if (!t) return required ? kiln_gpu_refuse(why, size, "input %d is missing", i) : true;
    if (t->kind != KILN_VALUE_TENSOR) return kiln_gpu_refuse(why, size, "input %d is not a tensor", i);
    if (t->dtype == KILN_DTYPE_UNDEFINED || kiln_gpu_dtype_in(t->dtype, ok)) return true;
    return kiln_gpu_refuse(why, size, "input %d dtype %s", i, kiln_dtype_name(t->dtype));
}

bool kiln_gpu_same_dtype(const kiln_node *n, int i, int ref, char *why, size_t size)
{
    const kiln_type *t = kiln_gpu_in_type(n, i), *x = kiln_gpu_in_type(n, ref);
    if (!t || !x || t->dtype == x->dtype) return true;
    return kiln_gpu_refuse(why, size, "input %d dtype %s differs from input %d's %s", i, kiln_dtype_name(t->dtype), ref,
                           kiln_dtype_name(x->dtype));
}

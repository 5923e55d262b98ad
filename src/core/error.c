/* error.c - formatting of error messages. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

kiln_status kiln_errf(kiln_err *e, kiln_status code, const char *fmt, ...)
{
    if (!e) return code;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

kiln_status kiln_errv_node(kiln_err *e, kiln_status code, const char *node, const char *op, const char *fmt,
                           va_list ap)
{
    char msg[KILN_ERR_MSG_SIZE];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return kiln_errf(e, code, "node '%s' (%s): %s", node, op, msg);
}

kiln_status kiln_err_prefix(kiln_err *e, const char *fmt, ...)
{
    if (!e) return KILN_ERR_RUNTIME;
    char prefix[KILN_ERR_MSG_SIZE], old[KILN_ERR_MSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s: %s", prefix, old);
    return e->code;
}

void kiln_err_clear(kiln_err *e)
{
    if (!e) return;
    e->code = KILN_OK;
    e->msg[0] = '\0';
}

const char *kiln_status_name(kiln_status st)
{
    switch (st) {
    case KILN_OK: return "KILN_OK";
    case KILN_ERR_INVALID_ARG: return "KILN_ERR_INVALID_ARG";
    case KILN_ERR_MODEL: return "KILN_ERR_MODEL";
    case KILN_ERR_UNSUPPORTED: return "KILN_ERR_UNSUPPORTED";
    case KILN_ERR_SHAPE: return "KILN_ERR_SHAPE";
    case KILN_ERR_NOMEM: return "KILN_ERR_NOMEM";
    case KILN_ERR_IO: return "KILN_ERR_IO";
    case KILN_ERR_RUNTIME: return "KILN_ERR_RUNTIME";
    }
    return "KILN_ERR_UNKNOWN";
}

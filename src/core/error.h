/* error.h - error values: a status code plus a formatted message, carried by the handle that failed. */
#ifndef KILN_CORE_ERROR_H
#define KILN_CORE_ERROR_H

#include <stdarg.h>

#include "kiln.h"

#define KILN_ERR_MSG_SIZE 1024

typedef struct kiln_err {
    kiln_status code;
    char msg[KILN_ERR_MSG_SIZE];
} kiln_err;

/* Records code and a printf-style message in e (e may be NULL) and returns code. */
kiln_status kiln_errf(kiln_err *e, kiln_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records code and "node 'NAME' (OP): message" in e; returns code. */
kiln_status kiln_errv_node(kiln_err *e, kiln_status code, const char *node, const char *op, const char *fmt,
                           va_list ap);
/* Prepends "prefix: " to the message already in e; returns e->code. */
kiln_status kiln_err_prefix(kiln_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kiln_err_clear(kiln_err *e);

/* Propagate a failing status. */
#define KILN_TRY(expr)                                                                    \
    do {                                                                                  \
        kiln_status kiln_try_st_ = (expr);                                                \
        if (kiln_try_st_ != KILN_OK) return kiln_try_st_;                                  \
    } while (0)

#endif

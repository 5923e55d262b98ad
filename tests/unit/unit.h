/* unit.h - the tiny check macro the C unit tests share. */
#ifndef KILN_UNIT_H
#define KILN_UNIT_H

#include <stdio.h>

static int unit_checks, unit_failures;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        unit_checks++;                                                                  \
        if (!(cond)) {                                                                  \
            unit_failures++;                                                            \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);     \
        }                                                                               \
    } while (0)

static inline int unit_report(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, unit_checks, unit_failures);
    return unit_failures ? 1 : 0;
}

#endif

/* unit.h - the tiny check macro the C unit tests share. */
#ifndef KILN_UNIT_H
#define KILN_UNIT_H

#include <stdint.h>
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

/* The tests' random numbers: xorshift64 from UNIT_SEED (a file may define its own before
 * including this), unit_rnd() 64 random bits, unit_unif(lo, hi) a float in [lo, hi). */
#ifndef UNIT_SEED
#define UNIT_SEED 0x9e3779b97f4a7c15ull
#endif
static uint64_t unit_rng = UNIT_SEED;

static inline uint64_t unit_rnd(void)
{
    unit_rng ^= unit_rng << 13;
    unit_rng ^= unit_rng >> 7;
    unit_rng ^= unit_rng << 17;
    return unit_rng;
}

static inline float unit_unif(float lo, float hi)
{
    return lo + (hi - lo) * (float)(unit_rnd() >> 40) / (float)(1 << 24);
}

static inline int unit_report(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, unit_checks, unit_failures);
    return unit_failures ? 1 : 0;
}

#endif

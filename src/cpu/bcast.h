/* bcast.h - two operands broadcast to an output, walked row by row: the output's dims with 1s
 * dropped and neighbours merged where both operands step through them alike, the last merged dim
 * a row. Each operand is, along a row, either a row of its own (stride 1) or one value repeated
 * (stride 0). Shared by the element-wise kernels that take any broadcast (kernels_ew.c,
 * kernels_qlinear_ew.c). */
#ifndef KILN_CPU_BCAST_H
#define KILN_CPU_BCAST_H

#include <stdbool.h>
#include <stdint.h>

#include "core/value.h"

enum { KILN_BCAST_ROWS_MAX_RANK = 8 }; /* merged dims at most */

typedef struct kiln_bcast_rows {
    int rank;                            /* merged dims, >= 1 */
    int64_t dims[KILN_BCAST_ROWS_MAX_RANK];   /* the last is `inner` */
    int64_t sa[KILN_BCAST_ROWS_MAX_RANK], sb[KILN_BCAST_ROWS_MAX_RANK]; /* element strides of A and B */
    int64_t inner, rows;                 /* elements per row; rows = numel / inner */
} kiln_bcast_rows;

/* Sets b up for A and B broadcast to Y (the caller has checked that they do); false when more
 * than KILN_BCAST_ROWS_MAX_RANK dims remain after merging. */
bool kiln_bcast_rows_setup(kiln_bcast_rows *b, const kiln_value *A, const kiln_value *B, const kiln_value *Y);

/* Element offsets in A and B of row r's first element. */
static inline void kiln_bcast_rows_at(const kiln_bcast_rows *b, int64_t r, int64_t *oa, int64_t *ob)
{
    int64_t a = 0, o = 0;
    for (int d = b->rank - 2; d >= 0; d--) {
        int64_t i = r % b->dims[d];
        r /= b->dims[d];
        a += i * b->sa[d], o += i * b->sb[d];
    }
    *oa = a, *ob = o;
}

#endif

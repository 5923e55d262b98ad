/* bcast.c - the row walk of two broadcast operands (bcast.h). */
#include "cpu/bcast.h"

bool kiln_bcast_rows_setup(kiln_bcast_rows *b, const kiln_value *A, const kiln_value *B, const kiln_value *Y)
{
    int64_t sa = 1, sb = 1; /* the operands' element strides at the current dim, innermost first */
    int n = 0;
    int64_t dims[KILN_BCAST_ROWS_MAX_RANK], as[KILN_BCAST_ROWS_MAX_RANK], bs[KILN_BCAST_ROWS_MAX_RANK]; /* innermost first */
    for (int k = Y->rank - 1; k >= 0; k--) {
        int64_t d = Y->dims[k];
        if (d == 1) continue;
        int ka = k - (Y->rank - A->rank), kb = k - (Y->rank - B->rank);
        int64_t da = ka >= 0 ? A->dims[ka] : 1, db = kb >= 0 ? B->dims[kb] : 1;
        int64_t xa = da == 1 ? 0 : sa, xb = db == 1 ? 0 : sb;
        /* merged into the dim inside when both operands continue it (stride = inner stride * inner dim) */
        if (n && (as[n - 1] ? xa == as[n - 1] * dims[n - 1] : xa == 0) &&
            (bs[n - 1] ? xb == bs[n - 1] * dims[n - 1] : xb == 0))
            dims[n - 1] *= d;
        else {
            if (n == KILN_BCAST_ROWS_MAX_RANK) return false;
            dims[n] = d, as[n] = xa, bs[n] = xb, n++;
        }
        sa *= da, sb *= db;
    }
    if (!n) dims[0] = 1, as[0] = bs[0] = 0, n = 1;
    b->rank = n;
    for (int d = 0; d < n; d++) {
        b->dims[d] = dims[n - 1 - d];
        b->sa[d] = as[n - 1 - d];
        b->sb[d] = bs[n - 1 - d];
    }
    b->inner = b->dims[n - 1];
    b->rows = Y->numel / b->inner;
    return true;
}

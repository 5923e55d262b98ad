/* test_blas_load.c - the CUDA provider opens cuBLAS itself (src/gpu/blas_load.c): it resolves
 * every entry point, twice gives the same answer, and a BLAS call that needs no GPU answers
 * through it. Built with the CUDA provider only; needs the toolkit's libcublas, not a GPU. */
#include <string.h>

#include "gpu/blas.h"
#include "unit.h"

int main(void)
{
    kiln_err err = {0};
    CHECK(kiln_gpu_blas_open(&err) == KILN_OK);
    CHECK(kiln_gpu_blas_open(&err) == KILN_OK);
    CHECK(kiln_blas.create && kiln_blas.destroy && kiln_blas.set_stream && kiln_blas.set_workspace &&
          kiln_blas.gemm_strided_batched_ex && kiln_blas.status_string);
    const char *s = kiln_blas.status_string ? gpublasGetStatusString(GPUBLAS_STATUS_SUCCESS) : NULL;
    CHECK(s && *s); /* "success" in cuBLAS 13 */
    return unit_report("test_blas_load");
}

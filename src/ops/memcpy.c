/* memcpy.c - kiln.MemcpyToDevice and kiln.MemcpyToHost: the copy nodes that partitioning
 * inserts where a value crosses between the host and a device provider (src/exec/partition.c).
 * Their output is their input; the executor runs them through the device provider's copies
 * (KILN_OP_COPY), and the reference kernel below copies host memory (what the oracle sees).
 * In place: where the copy is its input's last reader, its output takes the input's arena
 * offset, in the other side's arena (a recorded run uploads a graph input into its slot: the
 * copy to the device then finds it there). */
#include <string.h>

#include "ops/op.h"

static kiln_status memcpy_infer(kiln_infer_ctx *c) { return kiln_infer_same_as_input(c, 0, 0); }

static kiln_status memcpy_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    if (!X || X->kind != KILN_VALUE_TENSOR || X->on_device || !Y || Y->nbytes != X->nbytes)
        return kiln_run_fail(c, KILN_ERR_RUNTIME, "the reference copy takes a host tensor");
    if (X->nbytes) memcpy(Y->data, X->data, X->nbytes);
    return KILN_OK;
}

static const kiln_op_def defs[] = {
    {"kiln", "MemcpyToDevice", 1, memcpy_infer, memcpy_run, KILN_OP_COPY | KILN_OP_INPLACE},
    {"kiln", "MemcpyToHost", 1, memcpy_infer, memcpy_run, KILN_OP_COPY | KILN_OP_INPLACE},
};

const kiln_op_table kiln_ops_memcpy = {defs, (int)(sizeof defs / sizeof defs[0])};

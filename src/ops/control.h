/* control.h - internal interface between the control-flow ops (control.c: If, Loop, Scan) and
 * the sequence/optional ops (control_sequence.c): shared tensor helpers and the entry points that
 * control.c lists in the one table kiln_ops_control. */
#ifndef KILN_OPS_CONTROL_H
#define KILN_OPS_CONTROL_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Sub-tensor of X along axis: [start, start + len) keeping the axis (keep), or the single index
 * `start` with the axis removed (!keep, len 1). The caller checks the range. */
kiln_status kiln_control_slice(kiln_run_ctx *c, const kiln_value *X, int axis, int64_t start, int64_t len,
                               bool keep, kiln_value **out);

/* Joins n tensors of one dtype along axis. Their dims must agree except along axis; with
 * new_axis all dims agree and a new axis of size n is inserted at axis (stacking). reverse
 * places item t at position n-1-t. Fails (KILN_ERR_SHAPE) naming the mismatch. */
kiln_status kiln_control_concat(kiln_run_ctx *c, const kiln_value *const *items, int64_t n, int axis,
                                bool new_axis, bool reverse, kiln_value **out);

/* Least specific type covering a and b: unequal dims become fresh symbols (one value) or make
 * the rank unknown (per_item: the type describes items of a sequence, which may differ), an
 * unequal rank an unknown rank, unequal kinds an unknown type. Compile time only. */
void kiln_control_merge_type(kiln_infer_ctx *c, const kiln_type *a, const kiln_type *b, bool per_item,
                             kiln_type *t);

/* Outer-scope view of a subgraph's type: constant dims kept, symbolic ones made fresh. */
void kiln_control_outer_type(kiln_infer_ctx *c, const kiln_type *body, kiln_type *t);

/* Sequence and optional ops (control_sequence.c). */
kiln_status kiln_control_seq_construct_infer(kiln_infer_ctx *c);
kiln_status kiln_control_seq_construct_run(kiln_run_ctx *c);
kiln_status kiln_control_seq_empty_infer(kiln_infer_ctx *c);
kiln_status kiln_control_seq_empty_run(kiln_run_ctx *c);
kiln_status kiln_control_seq_insert_infer(kiln_infer_ctx *c);
kiln_status kiln_control_seq_insert_run(kiln_run_ctx *c);
kiln_status kiln_control_seq_at_infer(kiln_infer_ctx *c);
kiln_status kiln_control_seq_at_run(kiln_run_ctx *c);
kiln_status kiln_control_seq_erase_infer(kiln_infer_ctx *c);
kiln_status kiln_control_seq_erase_run(kiln_run_ctx *c);
kiln_status kiln_control_seq_length_infer(kiln_infer_ctx *c);
kiln_status kiln_control_seq_length_run(kiln_run_ctx *c);
kiln_status kiln_control_split_to_seq_infer(kiln_infer_ctx *c);
kiln_status kiln_control_split_to_seq_run(kiln_run_ctx *c);
kiln_status kiln_control_concat_from_seq_infer(kiln_infer_ctx *c);
kiln_status kiln_control_concat_from_seq_run(kiln_run_ctx *c);
kiln_status kiln_control_seq_map_infer(kiln_infer_ctx *c);
kiln_status kiln_control_seq_map_run(kiln_run_ctx *c);
kiln_status kiln_control_optional_infer(kiln_infer_ctx *c);
kiln_status kiln_control_optional_run(kiln_run_ctx *c);
kiln_status kiln_control_opt_has_infer(kiln_infer_ctx *c);
kiln_status kiln_control_opt_has_run(kiln_run_ctx *c);
kiln_status kiln_control_opt_get_infer(kiln_infer_ctx *c);
kiln_status kiln_control_opt_get_run(kiln_run_ctx *c);

#endif

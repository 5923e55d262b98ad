/* image_internal.h - shared declarations of the image family (image*.c): the entry points that
 * the one table kiln_ops_image in image.c lists, and small helpers the files share. */
#ifndef KILN_OPS_IMAGE_INTERNAL_H
#define KILN_OPS_IMAGE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/op.h"

/* Stores v into element i of an array of dtype dt the way ONNX's reference saturate_cast
 * does: integer types round half to even and clamp to their range, floats round. */
void kiln_image_store_sat(kiln_dtype dt, void *base, int64_t i, double v);
/* A scalar (or one-element) integer input, at run time or when constant; false if unknown. */
bool kiln_image_scalar_i64(const kiln_value *v, int64_t *out);
/* Real-valued element types the kernels read with kiln_load_f64 (floats and integers). */
bool kiln_image_real(kiln_dtype dt);

/* image_sample.c */
kiln_status kiln_gridsample_infer(kiln_infer_ctx *c);
kiln_status kiln_gridsample_run(kiln_run_ctx *c);
kiln_status kiln_affinegrid_infer(kiln_infer_ctx *c);
kiln_status kiln_affinegrid_run(kiln_run_ctx *c);
kiln_status kiln_roialign_infer(kiln_infer_ctx *c);
kiln_status kiln_roialign_run(kiln_run_ctx *c);
kiln_status kiln_nms_infer(kiln_infer_ctx *c);
kiln_status kiln_nms_run(kiln_run_ctx *c);

/* image_signal.c */
kiln_status kiln_dft_infer(kiln_infer_ctx *c);
kiln_status kiln_dft_run(kiln_run_ctx *c);
kiln_status kiln_stft_infer(kiln_infer_ctx *c);
kiln_status kiln_stft_run(kiln_run_ctx *c);
kiln_status kiln_window_infer(kiln_infer_ctx *c);
kiln_status kiln_window_run(kiln_run_ctx *c);
kiln_status kiln_melweight_infer(kiln_infer_ctx *c);
kiln_status kiln_melweight_run(kiln_run_ctx *c);

#endif

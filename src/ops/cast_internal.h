/* cast_internal.h - shared by the cast family's files (cast.c, cast_quant.c, cast_string.c,
 * cast_ml.c, cast_random.c): their entry points, gathered into kiln_ops_cast by cast.c, and
 * small helpers. */
#ifndef KILN_OPS_CAST_INTERNAL_H
#define KILN_OPS_CAST_INTERNAL_H

#include "ops/op.h"

/* Output `out` gets the dims of input `in` (unknown rank if unknown) and dtype dt. */
kiln_status kiln_cast_infer_like(kiln_infer_ctx *c, int out, int in, kiln_dtype dt);

#define KILN_CAST_OP(name)                                                                    \
    kiln_status kiln_cast_##name##_infer(kiln_infer_ctx *c);                                  \
    kiln_status kiln_cast_##name##_run(kiln_run_ctx *c)

/* cast_quant.c */
KILN_CAST_OP(quantize);
KILN_CAST_OP(dequantize);
KILN_CAST_OP(dynquant);
/* cast_string.c */
KILN_CAST_OP(strnorm);
KILN_CAST_OP(strsplit);
KILN_CAST_OP(strconcat);
KILN_CAST_OP(regex);
KILN_CAST_OP(tfidf);
/* cast_ml.c */
KILN_CAST_OP(label_encoder);
KILN_CAST_OP(array_feature);
KILN_CAST_OP(binarizer);
KILN_CAST_OP(tree_ensemble);
/* cast_random.c */
KILN_CAST_OP(random_uniform);
KILN_CAST_OP(random_normal);
KILN_CAST_OP(random_uniform_like);
KILN_CAST_OP(random_normal_like);
KILN_CAST_OP(bernoulli);
KILN_CAST_OP(multinomial);

#endif

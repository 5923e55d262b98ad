#!/usr/bin/env python3
"""Writes the int8 benchmark forms of the repo's model families, quantized by ONNX Runtime's own
tools (random weights and calibration data from fixed seeds):

  encoder_qd_s8.onnx / encoder_qd_u8.onnx  make_models.py's encoder through quantize_dynamic
                                           (QInt8 / QUInt8 weights); input tokens [batch, seq]
  minilm_qd_s8.onnx / minilm_qd_u8.onnx    make_bench_models.py's encoder(6, 384, 12, 1536), the same;
                                           inputs input_ids, attention_mask [batch, seq]
  convnet_qdq.onnx                         a small conv net (strided, depthwise, pointwise, residual,
                                           MaxPool, GlobalAveragePool, Gemm) through quantize_static,
                                           QDQ format, per channel, u8 activations / s8 weights;
                                           input x [N, 3, H, W]
  convnet_qop_conv.onnx                    the same in QOperator format, Conv and MaxPool quantized
                                           (kiln has no QLinearAdd / QLinearGlobalAveragePool / QGemm yet)

usage: make_int8_models.py OUT_DIR
then:  scripts/bench_peer.py OUT_DIR/convnet_qdq.onnx --shape x=1x3x224x224 --kiln build/kiln
"""
import os
import sys

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    import make_bench_models
    import make_models
    fp = os.path.join(out, "encoder_f32.onnx")
    make_models.save(make_models.encoder(), fp)
    g, y, ins = make_bench_models.encoder(6, 384, 12, 1536)
    mp = os.path.join(out, "minilm_f32.onnx")
    make_bench_models.save(g, y, ins, "hidden", mp, ["batch", "seq", 384])
    for src, name in ((fp, "encoder"), (mp, "minilm")):
        for wt, tag in ((QuantType.QInt8, "s8"), (QuantType.QUInt8, "u8")):
            quantize_dynamic(src, os.path.join(out, f"{name}_qd_{tag}.onnx"), weight_type=wt)

    sys.argv = [sys.argv[0]]
    import test_int8  # the conv net the QDQ tests quantize
    cp = os.path.join(out, "convnet_f32.onnx")
    onnx.save(test_int8.qdq_convnet(), cp)
    rng = np.random.default_rng(3)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.standard_normal([1, 3, 64, 64]).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(cp, os.path.join(out, "convnet_qdq.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    quantize_static(cp, os.path.join(out, "convnet_qop_conv.onnx"), Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                    op_types_to_quantize=["Conv", "MaxPool"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

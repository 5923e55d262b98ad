/* k_quant.h - launchers of the 'quant' family's GPU kernels (k_quant.cu): QuantizeLinear and
 * DequantizeLinear (per tensor, per axis, blocked), the dynamic quantization of
 * DynamicQuantizeLinear and DynamicQuantizeMatMul (a min/max reduction, then the scale and zero
 * point computed on the device in the reference's float32 operations), an exact integer matrix
 * product of 8-bit operands with zero points (int32 accumulators, wrapping like the reference's
 * int32 outputs), the epilogues of MatMulIntegerToFloat, QLinearMatMul and QGemm, and the
 * element-wise, pooling and softmax com.microsoft QLinear operators. Plain C types; dtypes are kiln_dtype codes;
 * pointers are device pointers. Every launcher queues its work on stream s, returns
 * gpuGetLastError() (or an invalid-value error for a dtype it does not take) and launches
 * nothing for empty work. Float steps use the reference's operations in its order, without
 * contraction into fused multiply-adds (__fmaf_rn where the reference calls fmaf), so that
 * results are bit-identical. */
#ifndef KILN_GPU_K_QUANT_H
#define KILN_GPU_K_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/kshape.h"
#include "gpu/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where the parameter (scale, zero point) of element i of x lives, x viewed as [outer, D, inner]
 * around the axis: 0 (kind 0, per tensor), a (kind 1, per axis) or (o * ceil(D / block) + a /
 * block) * inner + r (kind 2, blocked): ops/quant_internal.h's kiln_qmap. */
typedef struct kiln_gpu_qmap {
    int kind;
    int64_t D, inner, block;
} kiln_gpu_qmap;

/* QuantizeLinear: y[i] = saturate(rint(p(p(x[i]) / p(s[m(i)]))) + zp[m(i)]), p rounding to the
 * precision dtype prec (float32, float16, bfloat16), the quotient formed in double; NaN gives
 * 0 (+ nothing). x float32/float16/bfloat16, s float32/float16/bfloat16, zp (NULL: 0) and y of
 * dtype ydt (uint8, int8, uint16, int16). */
gpuError_t kiln_gpu_quant_quantize(gpuStream_t s, int xdt, const void *x, int sdt, const void *scale, const void *zp,
                                   int ydt, void *y, int64_t n, kiln_gpu_qmap m, int prec);

/* DequantizeLinear: y[i] = (x[i] - zp[m(i)]) * s[m(i)] in double, then stored as ydt (float32,
 * float16 through float32, bfloat16 through float32). x and zp (NULL: 0) of dtype xdt (uint8,
 * int8, uint16, int16, int32); s float32/float16/bfloat16. */
gpuError_t kiln_gpu_quant_dequantize(gpuStream_t s, int xdt, const void *x, const void *zp, int sdt, const void *scale,
                                     int ydt, void *y, int64_t n, kiln_gpu_qmap m);

/* Workspace bytes kiln_gpu_quant_dynamic needs for n elements. */
size_t kiln_gpu_quant_dynamic_ws(int64_t n);

/* Dynamic uint8 quantization of x (float32 [n]): the min and max of x and 0, then the scale and
 * zero point, written to scale (float32 [1]) and zp (uint8 [1]) when not NULL, and y (uint8
 * [n], NULL: none) = saturate(rint(x / scale) + zp). form 0: DynamicQuantizeLinear's formula
 * (scale = (max == min ? 1 : max - min) / 255, zp = rint(min(255, max(0, 0 - min / scale)))),
 * form 1: kiln_dynquant_params (ops/contrib_quant.h). ws: kiln_gpu_quant_dynamic_ws(n) bytes. */
gpuError_t kiln_gpu_quant_dynamic(gpuStream_t s, const float *x, int64_t n, int form, uint8_t *y, float *scale,
                                  uint8_t *zp, void *ws);

#define KILN_GPU_QMM_MAX_BATCH 6

/* One integer matrix product: y[b, i, j] = sum_k (A[b, i, k] - azp(b, i)) * (B[b, k, j] - bzp(b,
 * j)) in int32 (wrapping), y contiguous [batches, M, N]. A (uint8 or int8: a_dt) at element
 * A + a_off(b) + i * a_m + k * a_k, B (b_dt) likewise; batches over ydims[0..yb) with per-dim
 * element strides a_bs, b_bs (0: broadcast). Zero points (NULL: 0) of dtype azp_dt / bzp_dt
 * (uint8, int8, int32): azp(b, i) = azp[(a_off(b) / a_mat * M + i) % azp_len] and bzp(b, j) =
 * bzp[(b_off(b) / b_mat * N + j) % bzp_len], the reference's per-row / per-column indexing. */
typedef struct kiln_gpu_qmm {
    int a_dt, b_dt;
    const void *A, *B;
    int32_t *y;
    int64_t M, N, K;
    int64_t a_m, a_k, b_k, b_n;
    int yb;
    int64_t ydims[KILN_GPU_QMM_MAX_BATCH], a_bs[KILN_GPU_QMM_MAX_BATCH], b_bs[KILN_GPU_QMM_MAX_BATCH];
    int64_t a_mat, b_mat;
    const void *azp, *bzp;
    int azp_dt, bzp_dt;
    int64_t azp_len, bzp_len;
} kiln_gpu_qmm;

gpuError_t kiln_gpu_quant_matmul(gpuStream_t s, const kiln_gpu_qmm *a);

/* MatMulIntegerToFloat / DynamicQuantizeMatMul's epilogue over acc [rows, N] (int32): y = (float)
 * acc * (a_scale[0] * b_scale[j or 0]) (+ bias[j]), float32; bs_len 1 or N. */
gpuError_t kiln_gpu_quant_to_float(gpuStream_t s, const int32_t *acc, float *y, int64_t rows, int64_t N,
                                   const float *a_scale, const float *b_scale, int64_t bs_len, const float *bias);

/* QLinearMatMul's epilogue over acc [batches, M, N]: v = (double)acc * r(r(as[a] * bs[b]) / ys[0])
 * with r rounding to the scales' dtype sdt (float32, float16, bfloat16) and a = (e / N) % as_len,
 * b = ((e / (M N)) N + e % N) % bs_len for output element e; y (ydt uint8/int8/uint16/int16) =
 * saturate(nearbyint(v) + yzp[0]) (NaN: 0). */
gpuError_t kiln_gpu_quant_requant_mm(gpuStream_t s, const int32_t *acc, int ydt, void *y, const void *yzp, int64_t n,
                                     int64_t M, int64_t N, int sdt, const void *as, int64_t as_len, const void *bs,
                                     int64_t bs_len, const void *ys);

/* QGemm's epilogue over acc [M, N]: acc += C[..] (int32, c_len 1, M N, N or M: broadcast as the
 * reference takes it; NULL: none), scale = alpha * as[0] * bs[j or 0]; ys NULL: y float32 =
 * (float)acc * scale; else scale /= ys[0] and y (ydt uint8/int8) = MLAS's requantize of (float)acc
 * * scale with zero point yzp[0] (of ydt). */
gpuError_t kiln_gpu_quant_qgemm_out(gpuStream_t s, const int32_t *acc, const int32_t *C, int64_t c_len, int64_t M,
                                    int64_t N, float alpha, const float *as, const float *bs, int64_t bs_len,
                                    const float *ys, const void *yzp, int ydt, void *y);

/* im2col of 8-bit x [nb, G * Cg, in...] (nsp 1 to 3 spatial dims) into col [nb, G, Cg * ksz, osz]
 * (ksz kernel offsets row-major, osz output positions): col = x at o * stride - pad + q *
 * dilation, or pad_value (the zero point of x: the product then adds nothing) outside. */
typedef struct kiln_gpu_qwindow {
    int nsp;
    int64_t in[3], out[3], k[3], stride[3], pad[3], dil[3];
} kiln_gpu_qwindow;

gpuError_t kiln_gpu_quant_im2col(gpuStream_t s, const void *x, void *col, int64_t nb, int64_t C, kiln_gpu_qwindow w,
                                 const void *pad_value, int pad_dt);

/* QLinearConv's epilogue over acc [N, M, plane] (int32): v = acc + B[m] (int32, NULL: 0) exact,
 * r = r(r(xs[0] * ws[m or 0]) / ys[0]) in the scales' dtype sdt; y (ydt uint8/int8) =
 * saturate(nearbyint(v * r) + yzp[0] (NULL: 0)), the product in float32 for float32 scales (as the
 * reference and ONNX Runtime), in double otherwise. */
gpuError_t kiln_gpu_quant_requant_conv(gpuStream_t s, const int32_t *acc, const int32_t *B, int ydt, void *y,
                                       const void *yzp, int64_t n, int64_t M, int64_t plane, int sdt, const void *xs,
                                       const void *ws, int64_t ws_len, const void *ys);

/* QLinearAdd (mul false) / QLinearMul: c[i] = the reference's float32 formula on a[..], b[..]
 * read through broadcast shapes sa, sb (the output's dims, operand strides), dtype dt (uint8 or
 * int8) for all three; the scales (float32 [1]) and zero points (dt [1], NULL: 0) on the
 * device. swap: ONNX Runtime's kernel takes B first (kiln_contrib_qbinary_swaps). */
gpuError_t kiln_gpu_quant_qlinear_binary(gpuStream_t s, bool mul, int dt, const void *a, kiln_gpu_shape sa, const void *b,
                                         kiln_gpu_shape sb, void *c, int64_t n, const float *a_scale, const void *a_zp,
                                         const float *b_scale, const void *b_zp, const float *c_scale, const void *c_zp,
                                         bool swap);

/* QLinearSigmoid / QLinearLeakyRelu: y[i] = table[x[i] - lo] + lo over n codes of dtype dt (uint8
 * or int8, lo its low end); table: 256 bytes (kiln_contrib_q8_unary_table's) on the device. */
gpuError_t kiln_gpu_quant_lut(gpuStream_t s, int dt, const uint8_t *table, const void *x, void *y, int64_t n);

/* QLinearConcat's share of one input x [outer, len] (dtype dt, uint8 or int8): row o goes to y +
 * o * y_row + at. A copy when xs[0] == ys[0] and the zero points are equal (the reference's test),
 * else MLAS's quantize of (float)(x - xz) * xs with ys and yz (the reference's identity table).
 * Scales float32 [1], zero points dt [1] (NULL: 0), on the device. */
gpuError_t kiln_gpu_quant_qconcat(gpuStream_t s, int dt, const void *x, int64_t outer, int64_t len, void *y, int64_t y_row,
                                  int64_t at, const float *xs, const void *xz, const float *ys, const void *yz);

/* QLinearGlobalAveragePool over x [N, C, img] (channels_last: [N, img, C]), dtype dt: y[n, c] =
 * quantize((float)(int32)(sum - xz * img) * (xs / (ys * img)), yz), the sum exact (int64). Scales
 * float32 [1], zero points dt [1] (NULL: 0), on the device. */
gpuError_t kiln_gpu_quant_qgap(gpuStream_t s, int dt, const void *x, void *y, int64_t N, int64_t C, int64_t img,
                               bool channels_last, const float *xs, const void *xz, const float *ys, const void *yz);

/* QLinearAveragePool's geometry: ops/quant_internal.h's kiln_qpool_geom. */
typedef struct kiln_gpu_qpool {
    int64_t N, C;
    bool channels_last, count_include_pad;
    int64_t k[3], s[3], pb[3], pe[3], in[3], out[3];
} kiln_gpu_qpool;

/* QLinearAveragePool: per output, the float32 sum of (float)(x - xz) * xs over the window in the
 * reference's order, divided by the count, then MLAS's quantize with ys and yz. dt uint8 or int8;
 * scales float32 [1], zero points dt [1] (NULL: 0), on the device. */
gpuError_t kiln_gpu_quant_qavgpool(gpuStream_t s, int dt, const void *x, void *y, kiln_gpu_qpool g, const float *xs,
                                   const void *xz, const float *ys, const void *yz);

/* QLinearSoftmax over rows of d codes `inner` apart (outer * inner rows; ops/quant_internal.h's
 * kiln_qsoftmax_args), dtype dt: a thread per row sums table[code] in the reference's order, then
 * y = saturate(nearbyint(table[code] * yscale / sum) + yz) as the reference's float32 steps (the
 * double quotient where the product overflows, x86's conversion of out-of-range values). table:
 * 256 floats on the device. */
gpuError_t kiln_gpu_quant_qsoftmax(gpuStream_t s, int dt, const void *x, void *y, const float *table, int64_t outer,
                                   int64_t d, int64_t inner, float yscale, int yz);

#ifdef __cplusplus
}
#endif

#endif

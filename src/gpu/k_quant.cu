/* k_quant.cu - the quant family's GPU kernels (launchers in k_quant.h). QuantizeLinear and
 * DequantizeLinear are grid-stride loops that follow the reference (ops/cast_quant.c) step by
 * step in double, rounding where it rounds; the dynamic quantization reduces min and max in two
 * steps (per-block partials, then every block of the quantizing kernel folds the partials and
 * computes the scale and zero point itself, so no value goes back to the host); the integer
 * matrix product is a shared-memory tiled kernel (64 x 64 tiles, a thread per 4 x 4 outputs)
 * whose operands enter the tiles with their zero points subtracted and whose int32 sums wrap
 * exactly as the reference's int32 outputs do; the epilogues use __fmul_rn / __fadd_rn /
 * __fdiv_rn so that no multiply-add is contracted and the float32 results equal the CPU's. */
#include <math.h>

#include "core/dtype.h"
#include "gpu/k_quant.h"
#include "gpu/kcommon.cuh"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#define THREADS 256

static gpuError_t bad_value(void)
{
#if defined(KILN_HIP)
    return hipErrorInvalidValue;
#else
    return cudaErrorInvalidValue;
#endif
}

/* ---- element access ---- */

__device__ __forceinline__ float load_f(int dt, const void *p, int64_t i)
{
    if (dt == KILN_DTYPE_FLOAT16) return kiln_to_f<kiln_gpu_half>(((const kiln_gpu_half *)p)[i]);
    if (dt == KILN_DTYPE_BFLOAT16) return kiln_to_f<kiln_gpu_bf16>(((const kiln_gpu_bf16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void store_f(int dt, void *p, int64_t i, float v)
{
    if (dt == KILN_DTYPE_FLOAT16) ((kiln_gpu_half *)p)[i] = kiln_from_f<kiln_gpu_half>(v);
    else if (dt == KILN_DTYPE_BFLOAT16) ((kiln_gpu_bf16 *)p)[i] = kiln_from_f<kiln_gpu_bf16>(v);
    else ((float *)p)[i] = v;
}

__device__ __forceinline__ int32_t load_i(int dt, const void *p, int64_t i)
{
    switch (dt) {
    case KILN_DTYPE_INT8: return ((const int8_t *)p)[i];
    case KILN_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case KILN_DTYPE_INT16: return ((const int16_t *)p)[i];
    case KILN_DTYPE_INT32: return ((const int32_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

__device__ __forceinline__ void store_i(int dt, void *p, int64_t i, int32_t v)
{
    switch (dt) {
    case KILN_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case KILN_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case KILN_DTYPE_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

/* v rounded to float dtype dt's precision, as the reference's round_to (float16 and bfloat16
 * through float32, as kiln_store_f64 does). */
__device__ __forceinline__ double round_to(int dt, double v)
{
    float f = (float)v;
    if (dt == KILN_DTYPE_FLOAT16) return (double)kiln_to_f<kiln_gpu_half>(kiln_from_f<kiln_gpu_half>(f));
    if (dt == KILN_DTYPE_BFLOAT16) return (double)kiln_to_f<kiln_gpu_bf16>(kiln_from_f<kiln_gpu_bf16>(f));
    return (double)f;
}

static bool is_float_dt(int dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16;
}

static bool int_range(int dt, double *lo, double *hi)
{
    switch (dt) {
    case KILN_DTYPE_UINT8: *lo = 0, *hi = 255; return true;
    case KILN_DTYPE_INT8: *lo = -128, *hi = 127; return true;
    case KILN_DTYPE_UINT16: *lo = 0, *hi = 65535; return true;
    case KILN_DTYPE_INT16: *lo = -32768, *hi = 32767; return true;
    default: return false;
    }
}

__device__ __forceinline__ int64_t qmap_index(const kiln_gpu_qmap &m, int64_t i)
{
    if (m.kind == 0) return 0;
    int64_t a = (i / m.inner) % m.D;
    if (m.kind == 1) return a;
    int64_t o = i / (m.inner * m.D), r = i % m.inner;
    int64_t nb = (m.D + m.block - 1) / m.block;
    return (o * nb + a / m.block) * m.inner + r;
}

/* ---- QuantizeLinear, DequantizeLinear ---- */

__global__ void quantize_kernel(int xdt, const void *x, int sdt, const void *scale, const void *zp, int ydt, void *y,
                                int64_t n, kiln_gpu_qmap m, int prec, double lo, double hi)
{
    KILN_GRID_LOOP(i, n) {
        int64_t p = qmap_index(m, i);
        double xr = round_to(prec, (double)load_f(xdt, x, i)), sr = round_to(prec, (double)load_f(sdt, scale, p));
        double q = round_to(prec, xr / sr);
        double r = rint(q) + (zp ? (double)load_i(ydt, zp, p) : 0.0);
        if (isnan(r)) r = 0;
        store_i(ydt, y, i, (int32_t)fmin(fmax(r, lo), hi));
    }
}

extern "C" gpuError_t kiln_gpu_quant_quantize(gpuStream_t s, int xdt, const void *x, int sdt, const void *scale,
                                              const void *zp, int ydt, void *y, int64_t n, kiln_gpu_qmap m, int prec)
{
    double lo, hi;
    if (!is_float_dt(xdt) || !is_float_dt(sdt) || !is_float_dt(prec) || !int_range(ydt, &lo, &hi)) return bad_value();
    if (n <= 0) return gpuSuccess;
    quantize_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(xdt, x, sdt, scale, zp, ydt, y, n, m, prec, lo, hi);
    return gpuGetLastError();
}

__global__ void dequantize_kernel(int xdt, const void *x, const void *zp, int sdt, const void *scale, int ydt, void *y,
                                  int64_t n, kiln_gpu_qmap m)
{
    KILN_GRID_LOOP(i, n) {
        int64_t p = qmap_index(m, i);
        int64_t v = (int64_t)load_i(xdt, x, i) - (zp ? (int64_t)load_i(xdt, zp, p) : 0);
        double d = (double)v * (double)load_f(sdt, scale, p);
        store_f(ydt, y, i, (float)d);
    }
}

extern "C" gpuError_t kiln_gpu_quant_dequantize(gpuStream_t s, int xdt, const void *x, const void *zp, int sdt,
                                                const void *scale, int ydt, void *y, int64_t n, kiln_gpu_qmap m)
{
    double lo, hi;
    if ((!int_range(xdt, &lo, &hi) && xdt != KILN_DTYPE_INT32) || !is_float_dt(sdt) || !is_float_dt(ydt)) return bad_value();
    if (n <= 0) return gpuSuccess;
    dequantize_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(xdt, x, zp, sdt, scale, ydt, y, n, m);
    return gpuGetLastError();
}

/* ---- dynamic quantization ---- */

#define DYN_MAX_PARTS 1024

static unsigned dyn_parts(int64_t n)
{
    unsigned b = kiln_gpu_blocks(n, THREADS);
    return b > DYN_MAX_PARTS ? DYN_MAX_PARTS : b;
}

extern "C" size_t kiln_gpu_quant_dynamic_ws(int64_t n) { return (size_t)dyn_parts(n > 0 ? n : 1) * 2 * sizeof(float); }

/* part[2b], part[2b+1]: min and max of block b's share of x and 0 */
__global__ void minmax_kernel(const float *x, int64_t n, float *part)
{
    __shared__ float smn[THREADS], smx[THREADS];
    float mn = 0.0f, mx = 0.0f;
    KILN_GRID_LOOP(i, n) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
    }
    smn[threadIdx.x] = mn, smx[threadIdx.x] = mx;
    __syncthreads();
    for (int h = THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            smn[threadIdx.x] = fminf(smn[threadIdx.x], smn[threadIdx.x + h]);
            smx[threadIdx.x] = fmaxf(smx[threadIdx.x], smx[threadIdx.x + h]);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) part[2 * blockIdx.x] = smn[0], part[2 * blockIdx.x + 1] = smx[0];
}

/* The scale and zero point from the nparts partials, then y. min and max are exact whatever the
 * order (fminf / fmaxf drop NaNs, and the sign of a zero changes neither formula's result). */
__global__ void dyn_quant_kernel(const float *x, int64_t n, int form, const float *part, unsigned nparts, uint8_t *y,
                                 float *scale_out, uint8_t *zp_out)
{
    __shared__ float smn[THREADS], smx[THREADS];
    float mn = 0.0f, mx = 0.0f;
    for (unsigned k = threadIdx.x; k < nparts; k += THREADS) {
        mn = fminf(mn, part[2 * k]);
        mx = fmaxf(mx, part[2 * k + 1]);
    }
    smn[threadIdx.x] = mn, smx[threadIdx.x] = mx;
    __syncthreads();
    for (int h = THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            smn[threadIdx.x] = fminf(smn[threadIdx.x], smn[threadIdx.x + h]);
            smx[threadIdx.x] = fmaxf(smx[threadIdx.x], smx[threadIdx.x + h]);
        }
        __syncthreads();
    }
    mn = smn[0], mx = smx[0];
    float scale, zp;
    if (form == 0) { /* cast_quant.c's DynamicQuantizeLinear */
        scale = __fdiv_rn(mx == mn ? 1.0f : __fsub_rn(mx, mn), 255.0f);
        zp = rintf(fminf(255.0f, fmaxf(0.0f, __fsub_rn(0.0f, __fdiv_rn(mn, scale)))));
    } else { /* kiln_dynquant_params */
        mn = fminf(mn, 0.0f), mx = fmaxf(mx, 0.0f);
        scale = mx == mn ? 1.0f : __fdiv_rn(__fsub_rn(mx, mn), 255.0f);
        float z = __fsub_rn(0.0f, __fdiv_rn(mn, scale));
        zp = (float)(int32_t)rintf(fmaxf(0.0f, fminf(255.0f, z)));
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (scale_out) *scale_out = scale;
        if (zp_out) *zp_out = (uint8_t)zp;
    }
    if (!y) return;
    KILN_GRID_LOOP(i, n) {
        float q = __fadd_rn(rintf(__fdiv_rn(x[i], scale)), zp);
        y[i] = (uint8_t)fminf(255.0f, fmaxf(0.0f, q));
    }
}

extern "C" gpuError_t kiln_gpu_quant_dynamic(gpuStream_t s, const float *x, int64_t n, int form, uint8_t *y,
                                             float *scale, uint8_t *zp, void *ws)
{
    if (n < 0) return bad_value();
    unsigned parts = n > 0 ? dyn_parts(n) : 0;
    float *part = (float *)ws;
    if (parts) {
        minmax_kernel<<<parts, THREADS, 0, s>>>(x, n, part);
        gpuError_t e = gpuGetLastError();
        if (e != gpuSuccess) return e;
    }
    unsigned nb = y && n > 0 ? kiln_gpu_blocks(n, THREADS) : 1;
    dyn_quant_kernel<<<nb, THREADS, 0, s>>>(x, n, form, part, parts, y, scale, zp);
    return gpuGetLastError();
}

/* ---- the integer matrix product ---- */

#define TM 64
#define TN 64
#define TK 16

__device__ __forceinline__ int32_t load_q8(int dt, const void *p, int64_t i)
{
    return dt == KILN_DTYPE_INT8 ? (int32_t)((const int8_t *)p)[i] : (int32_t)((const uint8_t *)p)[i];
}

__global__ __launch_bounds__(THREADS) void qmm_kernel(kiln_gpu_qmm a, int64_t batches, int64_t tiles_m)
{
    __shared__ int32_t As[TK][TM + 1], Bs[TK][TN + 1];
    __shared__ int32_t za[TM], zb[TN];
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int64_t j0 = (int64_t)blockIdx.x * TN;
    for (int64_t z = blockIdx.z; z < batches; z += gridDim.z) {
        int64_t a_off = 0, b_off = 0, rem = z;
        for (int k = a.yb - 1; k >= 0; k--) {
            int64_t d = rem % a.ydims[k];
            rem /= a.ydims[k];
            a_off += d * a.a_bs[k];
            b_off += d * a.b_bs[k];
        }
        const void *A = (const int8_t *)a.A + a_off, *B = (const int8_t *)a.B + b_off;
        int64_t abatch = a.a_mat ? a_off / a.a_mat : 0, bbatch = a.b_mat ? b_off / a.b_mat : 0;
        for (int64_t tmi = blockIdx.y; tmi < tiles_m; tmi += gridDim.y) {
            int64_t i0 = tmi * TM;
            __syncthreads(); /* the previous tile's zero points may still be read */
            if (tid < TM) {
                int64_t i = i0 + tid;
                za[tid] = a.azp && i < a.M ? load_i(a.azp_dt, a.azp, (abatch * a.M + i) % a.azp_len) : 0;
            } else if (tid < TM + TN) {
                int64_t j = j0 + tid - TM;
                zb[tid - TM] = a.bzp && j < a.N ? load_i(a.bzp_dt, a.bzp, (bbatch * a.N + j) % a.bzp_len) : 0;
            }
            uint32_t acc[4][4] = {};
            for (int64_t k0 = 0; k0 < a.K; k0 += TK) {
                __syncthreads();
                for (int l = tid; l < TM * TK; l += THREADS) {
                    int r = l / TK, kk = l % TK;
                    int64_t i = i0 + r, k = k0 + kk;
                    As[kk][r] = i < a.M && k < a.K ? load_q8(a.a_dt, A, i * a.a_m + k * a.a_k) - za[r] : 0;
                }
                for (int l = tid; l < TN * TK; l += THREADS) {
                    int cc = l % TN, kk = l / TN;
                    int64_t j = j0 + cc, k = k0 + kk;
                    Bs[kk][cc] = j < a.N && k < a.K ? load_q8(a.b_dt, B, k * a.b_k + j * a.b_n) - zb[cc] : 0;
                }
                __syncthreads();
#pragma unroll
                for (int kk = 0; kk < TK; kk++) {
                    int32_t av[4], bv[4];
#pragma unroll
                    for (int r = 0; r < 4; r++) av[r] = As[kk][ty + 16 * r], bv[r] = Bs[kk][tx + 16 * r];
#pragma unroll
                    for (int r = 0; r < 4; r++)
#pragma unroll
                        for (int q = 0; q < 4; q++) acc[r][q] += (uint32_t)(av[r] * bv[q]);
                }
            }
            int32_t *y = a.y + z * a.M * a.N;
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int64_t i = i0 + ty + 16 * r, j = j0 + tx + 16 * q;
                    if (i < a.M && j < a.N) y[i * a.N + j] = (int32_t)acc[r][q];
                }
        }
    }
}

extern "C" gpuError_t kiln_gpu_quant_matmul(gpuStream_t s, const kiln_gpu_qmm *a)
{
    if (a->yb < 0 || a->yb > KILN_GPU_QMM_MAX_BATCH) return bad_value();
    int64_t batches = 1;
    for (int k = 0; k < a->yb; k++) batches *= a->ydims[k];
    if (batches <= 0 || a->M <= 0 || a->N <= 0) return gpuSuccess;
    int64_t tiles_m = (a->M + TM - 1) / TM, tiles_n = (a->N + TN - 1) / TN;
    if (tiles_n > 0x7fffffff) return bad_value();
    dim3 grid((unsigned)tiles_n, (unsigned)(tiles_m < 65535 ? tiles_m : 65535), (unsigned)(batches < 65535 ? batches : 65535));
    qmm_kernel<<<grid, THREADS, 0, s>>>(*a, batches, tiles_m);
    return gpuGetLastError();
}

/* ---- epilogues ---- */

__global__ void to_float_kernel(const int32_t *acc, float *y, int64_t n, int64_t N, const float *as, const float *bs,
                                int64_t bs_len, const float *bias)
{
    KILN_GRID_LOOP(e, n) {
        int64_t j = e % N;
        float scale = __fmul_rn(as[0], bs[bs_len == 1 ? 0 : j]);
        float v = __fmul_rn((float)acc[e], scale);
        if (bias) v = __fadd_rn(v, bias[j]);
        y[e] = v;
    }
}

extern "C" gpuError_t kiln_gpu_quant_to_float(gpuStream_t s, const int32_t *acc, float *y, int64_t rows, int64_t N,
                                              const float *a_scale, const float *b_scale, int64_t bs_len, const float *bias)
{
    int64_t n = rows * N;
    if (n <= 0) return gpuSuccess;
    to_float_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(acc, y, n, N, a_scale, b_scale, bs_len, bias);
    return gpuGetLastError();
}

__global__ void requant_mm_kernel(const int32_t *acc, int ydt, void *y, const void *yzp, int64_t n, int64_t M, int64_t N,
                                  int sdt, const void *as, int64_t as_len, const void *bs, int64_t bs_len, const void *ys,
                                  double lo, double hi)
{
    double ysv = (double)load_f(sdt, ys, 0), zp = (double)load_i(ydt, yzp, 0);
    KILN_GRID_LOOP(e, n) {
        int64_t ai = (e / N) % as_len, bi = ((e / (M * N)) * N + e % N) % bs_len;
        double r = round_to(sdt, round_to(sdt, (double)load_f(sdt, as, ai) * (double)load_f(sdt, bs, bi)) / ysv);
        double q = nearbyint((double)acc[e] * r) + zp;
        if (isnan(q)) q = 0;
        store_i(ydt, y, e, (int32_t)(q < lo ? lo : q > hi ? hi : q));
    }
}

extern "C" gpuError_t kiln_gpu_quant_requant_mm(gpuStream_t s, const int32_t *acc, int ydt, void *y, const void *yzp,
                                                int64_t n, int64_t M, int64_t N, int sdt, const void *as, int64_t as_len,
                                                const void *bs, int64_t bs_len, const void *ys)
{
    double lo, hi;
    if (!int_range(ydt, &lo, &hi) || !is_float_dt(sdt) || as_len <= 0 || bs_len <= 0) return bad_value();
    if (n <= 0) return gpuSuccess;
    requant_mm_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(acc, ydt, y, yzp, n, M, N, sdt, as, as_len, bs,
                                                                      bs_len, ys, lo, hi);
    return gpuGetLastError();
}

/* MLAS's requantize (contrib_qops.c's requant): v clamped to [lo - zp, hi - zp], rounded half to
 * even, plus zp; NaN saturates low, as lrintf's x86 result does. */
__device__ __forceinline__ int32_t mlas_requant(float v, int32_t zp, int32_t lo, int32_t hi)
{
    if (v != v) return lo;
    float a = (float)(lo - zp), b = (float)(hi - zp);
    v = v < a ? a : v;
    v = v > b ? b : v;
    int32_t r = __float2int_rn(v) + zp;
    return r < lo ? lo : r > hi ? hi : r;
}

__global__ void qgemm_out_kernel(const int32_t *acc, const int32_t *C, int64_t c_len, int64_t M, int64_t N, float alpha,
                                 const float *as, const float *bs, int64_t bs_len, const float *ys, const void *yzp, int ydt,
                                 void *y)
{
    int32_t zp = ys ? load_i(ydt, yzp, 0) : 0, lo = ydt == KILN_DTYPE_INT8 ? -128 : 0, hi = ydt == KILN_DTYPE_INT8 ? 127 : 255;
    KILN_GRID_LOOP(e, M * N) {
        int64_t i = e / N, j = e % N;
        uint32_t v = (uint32_t)acc[e];
        if (C) {
            int64_t ci = c_len == 1 ? 0 : c_len == M * N ? e : c_len == N ? j : i;
            v += (uint32_t)C[ci];
        }
        float scale = __fmul_rn(__fmul_rn(alpha, as[0]), bs[bs_len == 1 ? 0 : j]);
        float f = (float)(int32_t)v;
        if (ys) store_i(ydt, y, e, mlas_requant(__fmul_rn(f, __fdiv_rn(scale, ys[0])), zp, lo, hi));
        else ((float *)y)[e] = __fmul_rn(f, scale);
    }
}

extern "C" gpuError_t kiln_gpu_quant_qgemm_out(gpuStream_t s, const int32_t *acc, const int32_t *C, int64_t c_len,
                                               int64_t M, int64_t N, float alpha, const float *as, const float *bs,
                                               int64_t bs_len, const float *ys, const void *yzp, int ydt, void *y)
{
    if (ys && ydt != KILN_DTYPE_UINT8 && ydt != KILN_DTYPE_INT8) return bad_value();
    int64_t n = M * N;
    if (n <= 0) return gpuSuccess;
    qgemm_out_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(acc, C, c_len, M, N, alpha, as, bs, bs_len, ys, yzp,
                                                                     ydt, y);
    return gpuGetLastError();
}

/* ---- convolutions ---- */

__global__ void qim2col_kernel(const uint8_t *x, uint8_t *col, int64_t total, int64_t C, kiln_gpu_qwindow w, int pad_dt,
                               const void *pad_value)
{
    uint8_t pv = pad_value ? (uint8_t)load_q8(pad_dt, pad_value, 0) : 0;
    int64_t ksz = w.k[0] * w.k[1] * w.k[2], osz = w.out[0] * w.out[1] * w.out[2], isz = w.in[0] * w.in[1] * w.in[2];
    KILN_GRID_LOOP(e, total) {
        int64_t o = e % osz, r = e / osz, kp = r % ksz, nc = r / ksz; /* nc: image * C + channel */
        int64_t o2 = o % w.out[2], o1 = (o / w.out[2]) % w.out[1], o0 = o / (w.out[2] * w.out[1]);
        int64_t q2 = kp % w.k[2], q1 = (kp / w.k[2]) % w.k[1], q0 = kp / (w.k[2] * w.k[1]);
        int64_t p0 = o0 * w.stride[0] - w.pad[0] + q0 * w.dil[0], p1 = o1 * w.stride[1] - w.pad[1] + q1 * w.dil[1],
                p2 = o2 * w.stride[2] - w.pad[2] + q2 * w.dil[2];
        bool in = p0 >= 0 && p0 < w.in[0] && p1 >= 0 && p1 < w.in[1] && p2 >= 0 && p2 < w.in[2];
        col[e] = in ? x[nc * isz + (p0 * w.in[1] + p1) * w.in[2] + p2] : pv;
    }
}

extern "C" gpuError_t kiln_gpu_quant_im2col(gpuStream_t s, const void *x, void *col, int64_t nb, int64_t C,
                                            kiln_gpu_qwindow w, const void *pad_value, int pad_dt)
{
    if (w.nsp < 1 || w.nsp > 3) return bad_value();
    for (int i = w.nsp; i < 3; i++) w.in[i] = w.out[i] = w.k[i] = w.stride[i] = w.dil[i] = 1, w.pad[i] = 0;
    int64_t total = nb * C * w.k[0] * w.k[1] * w.k[2] * w.out[0] * w.out[1] * w.out[2];
    if (total <= 0) return gpuSuccess;
    qim2col_kernel<<<kiln_gpu_blocks(total, THREADS), THREADS, 0, s>>>((const uint8_t *)x, (uint8_t *)col, total, C, w,
                                                                       pad_dt, pad_value);
    return gpuGetLastError();
}

__global__ void requant_conv_kernel(const int32_t *acc, const int32_t *B, int ydt, void *y, const void *yzp, int64_t n,
                                    int64_t M, int64_t plane, int sdt, const void *xs, const void *ws, int64_t ws_len,
                                    const void *ys, double lo, double hi)
{
    double xsv = (double)load_f(sdt, xs, 0), ysv = (double)load_f(sdt, ys, 0), zp = yzp ? (double)load_i(ydt, yzp, 0) : 0.0;
    KILN_GRID_LOOP(i, n) {
        int64_t m = (i / plane) % M;
        int64_t v = (int64_t)acc[i] + (B ? (int64_t)B[m] : 0);
        double r = round_to(sdt, round_to(sdt, xsv * (double)load_f(sdt, ws, ws_len == 1 ? 0 : m)) / ysv);
        double p = sdt == KILN_DTYPE_FLOAT32 ? (double)__fmul_rn((float)v, (float)r) : (double)v * r;
        double q = nearbyint(p) + zp;
        if (isnan(q)) q = 0;
        store_i(ydt, y, i, (int32_t)(q < lo ? lo : q > hi ? hi : q));
    }
}

extern "C" gpuError_t kiln_gpu_quant_requant_conv(gpuStream_t s, const int32_t *acc, const int32_t *B, int ydt, void *y,
                                                  const void *yzp, int64_t n, int64_t M, int64_t plane, int sdt,
                                                  const void *xs, const void *ws, int64_t ws_len, const void *ys)
{
    double lo, hi;
    if (!int_range(ydt, &lo, &hi) || !is_float_dt(sdt) || M <= 0 || plane <= 0) return bad_value();
    if (n <= 0) return gpuSuccess;
    requant_conv_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(acc, B, ydt, y, yzp, n, M, plane, sdt, xs, ws,
                                                                        ws_len, ys, lo, hi);
    return gpuGetLastError();
}

/* ---- QLinearAdd, QLinearMul ---- */

__global__ void qlinear_binary_kernel(bool mul, int dt, const void *a, kiln_gpu_shape sa, const void *b, kiln_gpu_shape sb,
                                      void *c, int64_t n, const float *as, const void *azp, const float *bs, const void *bzp,
                                      const float *cs, const void *czp, bool swap)
{
    int32_t za = azp ? load_q8(dt, azp, 0) : 0, zb = bzp ? load_q8(dt, bzp, 0) : 0, zc = czp ? load_q8(dt, czp, 0) : 0;
    int32_t lo = dt == KILN_DTYPE_INT8 ? -128 : 0, hi = dt == KILN_DTYPE_INT8 ? 127 : 255;
    /* x, y: ONNX Runtime's first and second operand, A and B or exchanged */
    int32_t zx = swap ? zb : za, zy = swap ? za : zb;
    float sc = cs[0], rx = __fdiv_rn(swap ? bs[0] : as[0], sc), ry = __fdiv_rn(swap ? as[0] : bs[0], sc);
    float rmul = __fdiv_rn(__fmul_rn(as[0], bs[0]), sc);
    float fixed = __fsub_rn((float)zc, __fmaf_rn(rx, (float)zx, __fmul_rn(ry, (float)zy)));
    KILN_GRID_LOOP(i, n) {
        int32_t p = load_q8(dt, a, kiln_strided_offset(sa, i)), q = load_q8(dt, b, kiln_strided_offset(sb, i));
        int32_t x = swap ? q : p, y = swap ? p : q;
        float v = mul ? __fadd_rn(__fmul_rn((float)((x - zx) * (y - zy)), rmul), (float)zc)
                      : __fmaf_rn((float)x, rx, __fmaf_rn((float)y, ry, fixed));
        /* clamped to one past the range (NaN to the low end), rounded half to even */
        v = fminf(fmaxf(v, (float)(lo - 1)), (float)(hi + 1));
        int32_t r = __float2int_rn(v);
        store_i(dt, c, i, r < lo ? lo : r > hi ? hi : r);
    }
}

extern "C" gpuError_t kiln_gpu_quant_qlinear_binary(gpuStream_t s, bool mul, int dt, const void *a, kiln_gpu_shape sa,
                                                    const void *b, kiln_gpu_shape sb, void *c, int64_t n,
                                                    const float *a_scale, const void *a_zp, const float *b_scale,
                                                    const void *b_zp, const float *c_scale, const void *c_zp, bool swap)
{
    if (dt != KILN_DTYPE_UINT8 && dt != KILN_DTYPE_INT8) return bad_value();
    if (n <= 0) return gpuSuccess;
    qlinear_binary_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(mul, dt, a, sa, b, sb, c, n, a_scale, a_zp,
                                                                          b_scale, b_zp, c_scale, c_zp, swap);
    return gpuGetLastError();
}

/* ---- QLinearSigmoid, QLinearLeakyRelu: a 256-entry table ---- */

/* Bytes of code v of an 8-bit dtype less its low end, and back: the top bit flipped for int8. */
__global__ void lut_kernel(const uint8_t *table, const uint8_t *x, uint8_t *y, int64_t n, uint8_t flip)
{
    __shared__ uint8_t t[256];
    t[threadIdx.x] = table[threadIdx.x];
    __syncthreads();
    KILN_GRID_LOOP(i, n) y[i] = t[x[i] ^ flip] ^ flip;
}

extern "C" gpuError_t kiln_gpu_quant_lut(gpuStream_t s, int dt, const uint8_t *table, const void *x, void *y, int64_t n)
{
    if (dt != KILN_DTYPE_UINT8 && dt != KILN_DTYPE_INT8) return bad_value();
    if (n <= 0) return gpuSuccess;
    lut_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(table, (const uint8_t *)x, (uint8_t *)y, n,
                                                               dt == KILN_DTYPE_INT8 ? 0x80 : 0);
    return gpuGetLastError();
}

/* ---- QLinearConcat ---- */

/* MLAS's quantize of x with scale and zero point (contrib_qlinear.c's quantize): x / scale, then
 * the requantize. */
__device__ __forceinline__ int32_t mlas_quantize(float x, float scale, int32_t zp, int32_t lo, int32_t hi)
{
    return mlas_requant(__fdiv_rn(x, scale), zp, lo, hi);
}

__global__ void qconcat_kernel(int dt, const void *x, int64_t n, int64_t len, void *y, int64_t y_row, int64_t at,
                               const float *xs, const void *xz, const float *ys, const void *yz)
{
    int32_t zx = xz ? load_q8(dt, xz, 0) : 0, zy = yz ? load_q8(dt, yz, 0) : 0;
    int32_t lo = dt == KILN_DTYPE_INT8 ? -128 : 0, hi = dt == KILN_DTYPE_INT8 ? 127 : 255;
    float sx = xs[0], sy = ys[0];
    bool same = sx == sy && zx == zy;
    KILN_GRID_LOOP(i, n) {
        int64_t o = i / len, r = i - o * len, yi = o * y_row + at + r;
        if (same) ((uint8_t *)y)[yi] = ((const uint8_t *)x)[i];
        else store_i(dt, y, yi, mlas_quantize(__fmul_rn((float)(load_q8(dt, x, i) - zx), sx), sy, zy, lo, hi));
    }
}

extern "C" gpuError_t kiln_gpu_quant_qconcat(gpuStream_t s, int dt, const void *x, int64_t outer, int64_t len, void *y,
                                             int64_t y_row, int64_t at, const float *xs, const void *xz, const float *ys,
                                             const void *yz)
{
    if (dt != KILN_DTYPE_UINT8 && dt != KILN_DTYPE_INT8) return bad_value();
    int64_t n = outer * len;
    if (n <= 0) return gpuSuccess;
    qconcat_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(dt, x, n, len, y, y_row, at, xs, xz, ys, yz);
    return gpuGetLastError();
}

/* ---- QLinearGlobalAveragePool: 32 threads per output, an exact int64 sum ---- */

#define GAP_LANES 32

__global__ __launch_bounds__(THREADS) void qgap_kernel(int dt, const void *x, void *y, int64_t N, int64_t C, int64_t img,
                                                       bool last, const float *xs, const void *xz, const float *ys,
                                                       const void *yz)
{
    __shared__ long long part[THREADS];
    int lane = threadIdx.x % GAP_LANES, group = threadIdx.x / GAP_LANES, groups = THREADS / GAP_LANES;
    int32_t zx = xz ? load_q8(dt, xz, 0) : 0, zy = yz ? load_q8(dt, yz, 0) : 0;
    int32_t lo = dt == KILN_DTYPE_INT8 ? -128 : 0, hi = dt == KILN_DTYPE_INT8 ? 127 : 255;
    float scale = __fdiv_rn(xs[0], __fmul_rn(ys[0], (float)img));
    int64_t outs = N * C;
    for (int64_t base = (int64_t)blockIdx.x * groups; base < outs; base += (int64_t)gridDim.x * groups) {
        int64_t e = base + group; /* (b, ch) */
        long long acc = 0;
        if (e < outs) {
            int64_t b = e / C, ch = e % C;
            for (int64_t p = lane; p < img; p += GAP_LANES)
                acc += load_q8(dt, x, last ? (b * img + p) * C + ch : e * img + p);
        }
        part[threadIdx.x] = acc;
        __syncthreads();
        for (int h = GAP_LANES / 2; h > 0; h >>= 1) {
            if (lane < h) part[threadIdx.x] += part[threadIdx.x + h];
            __syncthreads();
        }
        if (lane == 0 && e < outs) {
            long long sum = part[threadIdx.x] - (long long)zx * img;
            float v = __fmul_rn((float)(int32_t)sum, scale);
            store_i(dt, y, e, mlas_quantize(v, 1.0f, zy, lo, hi));
        }
        __syncthreads();
    }
}

extern "C" gpuError_t kiln_gpu_quant_qgap(gpuStream_t s, int dt, const void *x, void *y, int64_t N, int64_t C, int64_t img,
                                          bool channels_last, const float *xs, const void *xz, const float *ys,
                                          const void *yz)
{
    if (dt != KILN_DTYPE_UINT8 && dt != KILN_DTYPE_INT8) return bad_value();
    if (N * C <= 0) return gpuSuccess;
    qgap_kernel<<<kiln_gpu_blocks(N * C, THREADS / GAP_LANES), THREADS, 0, s>>>(dt, x, y, N, C, img, channels_last, xs, xz,
                                                                                ys, yz);
    return gpuGetLastError();
}

/* ---- QLinearAveragePool: a thread per output, the window summed in the reference's order ---- */

__global__ void qavgpool_kernel(int dt, const void *x, void *y, kiln_gpu_qpool g, const float *xs, const void *xz,
                                const float *ys, const void *yz)
{
    int32_t zx = xz ? load_q8(dt, xz, 0) : 0, zy = yz ? load_q8(dt, yz, 0) : 0;
    int32_t lo = dt == KILN_DTYPE_INT8 ? -128 : 0, hi = dt == KILN_DTYPE_INT8 ? 127 : 255;
    float sx = xs[0], sy = ys[0];
    int64_t C = g.C, ipix = g.in[0] * g.in[1] * g.in[2], opix = g.out[0] * g.out[1] * g.out[2];
    KILN_GRID_LOOP(e, g.N * C * opix) {
        /* e: the output's own index, [N, C, opix] or [N, opix, C] */
        int64_t b, ch, o;
        if (g.channels_last) ch = e % C, o = (e / C) % opix, b = e / (C * opix);
        else o = e % opix, ch = (e / opix) % C, b = e / (C * opix);
        int64_t od[3] = {o / (g.out[1] * g.out[2]), (o / g.out[2]) % g.out[1], o % g.out[2]}, wlo[3], whi[3];
        int64_t cnt = 1;
        for (int i = 0; i < 3; i++) {
            int64_t s0 = od[i] * g.s[i] - g.pb[i], e0 = s0 + g.k[i];
            int64_t e_pad = e0 < g.in[i] + g.pe[i] ? e0 : g.in[i] + g.pe[i];
            wlo[i] = s0 < 0 ? 0 : s0;
            whi[i] = e0 < g.in[i] ? e0 : g.in[i];
            cnt *= g.count_include_pad ? e_pad - s0 : whi[i] - wlo[i];
        }
        float sum = 0.0f;
        for (int64_t p0 = wlo[0]; p0 < whi[0]; p0++)
            for (int64_t p1 = wlo[1]; p1 < whi[1]; p1++)
                for (int64_t p2 = wlo[2]; p2 < whi[2]; p2++) {
                    int64_t pix = (p0 * g.in[1] + p1) * g.in[2] + p2;
                    int64_t xi = g.channels_last ? (b * ipix + pix) * C + ch : (b * C + ch) * ipix + pix;
                    sum = __fadd_rn(sum, __fmul_rn((float)(load_q8(dt, x, xi) - zx), sx));
                }
        float avg = cnt > 0 ? __fdiv_rn(sum, (float)cnt) : 0.0f;
        store_i(dt, y, e, mlas_quantize(avg, sy, zy, lo, hi));
    }
}

extern "C" gpuError_t kiln_gpu_quant_qavgpool(gpuStream_t s, int dt, const void *x, void *y, kiln_gpu_qpool g,
                                              const float *xs, const void *xz, const float *ys, const void *yz)
{
    if (dt != KILN_DTYPE_UINT8 && dt != KILN_DTYPE_INT8) return bad_value();
    int64_t n = g.N * g.C * g.out[0] * g.out[1] * g.out[2];
    if (n <= 0) return gpuSuccess;
    qavgpool_kernel<<<kiln_gpu_blocks(n, THREADS), THREADS, 0, s>>>(dt, x, y, g, xs, xz, ys, yz);
    return gpuGetLastError();
}

/* ---- QLinearSoftmax: a thread per row ---- */

/* x86's conversion of float v to int32 (cvttss2si, what the reference's (int32_t) compiles to):
 * the integer indefinite 0x80000000 for NaN and values out of range. v is integral here. */
__device__ __forceinline__ int32_t x86_f2i(float v)
{
    return v >= -2147483648.0f && v < 2147483648.0f ? (int32_t)v : INT32_MIN;
}

__global__ void qsoftmax_kernel(int dt, const uint8_t *x, uint8_t *y, const float *table, int64_t outer, int64_t d,
                                int64_t inner, float yscale, int yz)
{
    __shared__ float t[256];
    t[threadIdx.x] = table[threadIdx.x];
    __syncthreads();
    bool sg = dt == KILN_DTYPE_INT8;
    int32_t lo = sg ? -128 : 0, hi = sg ? 127 : 255;
    KILN_GRID_LOOP(row, outer * inner) {
        int64_t base = (row / inner) * d * inner + row % inner;
        int32_t xmax = -1000;
        for (int64_t k = 0; k < d; k++) {
            int32_t v = load_q8(dt, x, base + k * inner);
            xmax = v > xmax ? v : xmax;
        }
        int32_t adj = sg ? 127 - xmax : 255 - xmax;
        float sum = 0.0f;
        for (int64_t k = 0; k < d; k++) sum = __fadd_rn(sum, t[(uint8_t)(load_q8(dt, x, base + k * inner) + adj)]);
        if (sum == 0.0f) continue; /* as the reference, which never meets it (the maximum's entry is >= 1) */
        for (int64_t k = 0; k < d; k++) {
            float vt = t[(uint8_t)(load_q8(dt, x, base + k * inner) + adj)];
            float prod = __fmul_rn(vt, yscale);
            float qf = isinf(prod) ? __double2float_rn(__ddiv_rn(__dmul_rn((double)vt, (double)yscale), (double)sum))
                                   : __fdiv_rn(prod, sum);
            /* the reference's int32 sum wraps as x86's add */
            int32_t vq = (int32_t)((uint32_t)x86_f2i(rintf(qf)) + (uint32_t)yz);
            store_i(dt, y, base + k * inner, vq > hi ? hi : vq < lo ? lo : vq);
        }
    }
}

extern "C" gpuError_t kiln_gpu_quant_qsoftmax(gpuStream_t s, int dt, const void *x, void *y, const float *table,
                                              int64_t outer, int64_t d, int64_t inner, float yscale, int yz)
{
    if (dt != KILN_DTYPE_UINT8 && dt != KILN_DTYPE_INT8) return bad_value();
    int64_t rows = outer * inner;
    if (rows <= 0 || d <= 0) return gpuSuccess;
    qsoftmax_kernel<<<kiln_gpu_blocks(rows, THREADS), THREADS, 0, s>>>(dt, (const uint8_t *)x, (uint8_t *)y, table, outer, d,
                                                                       inner, yscale, yz);
    return gpuGetLastError();
}

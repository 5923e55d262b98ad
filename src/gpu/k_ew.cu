/* k_ew.cu - element-wise GPU kernels (launchers in k_ew.h): unary math and activations,
 * broadcasting binary ops, Where and Cast. Half and bfloat16 compute in float, integers in
 * their own width with the reference's wrapping rules (src/ops/elementwise.c, core/dtype.c).
 *
 * Binary and Where kernels read each operand through an ew_operand: the flat output index
 * itself (same shape, contiguous), a block pattern (i / inner) % mid (scalar, row and channel
 * broadcasts), or general strides. Contiguous and scalar operands take a flat kernel that
 * moves four elements per access when the pointers allow. */
#include <type_traits>

#include "gpu/k_ew.h"
#include "gpu/kcommon.cuh"

/* gpu.h's grid sizing (gpu.h itself is C-only) */
extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

namespace {

const unsigned EW_THREADS = 256;
/* what a launcher returns for a dtype or op it does not take (cudaErrorInvalidValue and
 * hipErrorInvalidValue are both 1); the C side never asks for those */
const gpuError_t EW_BAD_ARGS = (gpuError_t)1;

typedef uint8_t ew_bool; /* bool elements: one byte, 0 or 1 */

template <typename T> struct ew_is_float : std::false_type {};
template <> struct ew_is_float<float> : std::true_type {};
template <> struct ew_is_float<kiln_gpu_half> : std::true_type {};
template <> struct ew_is_float<kiln_gpu_bf16> : std::true_type {};

/* Four elements moved in one access (pointers aligned to the pack's size). */
template <typename T> struct alignas(4 * sizeof(T)) ew_pack {
    T v[4];
};

bool ew_aligned(const void *p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

/* ======================================================================================
 * Unary ops
 * ====================================================================================== */

__device__ __forceinline__ float ew_clamp01(float v) { return v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v; }

/* log(1 + e^x) without overflow for large x */
__device__ __forceinline__ float ew_softplus(float x) { return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }

template <int OP> __device__ __forceinline__ float un_f(float x, const kiln_gpu_ew_params &p)
{
    switch (OP) {
    case KILN_EW_ABS: return fabsf(x);
    case KILN_EW_NEG: return -x;
    case KILN_EW_SIGN: return isnan(x) ? x : (float)((x > 0.0f) - (x < 0.0f));
    case KILN_EW_RELU: return x < 0.0f ? 0.0f : x;
    case KILN_EW_RECIPROCAL: return 1.0f / x;
    case KILN_EW_FLOOR: return floorf(x);
    case KILN_EW_CEIL: return ceilf(x);
    case KILN_EW_ROUND: return rintf(x); /* half to even */
    case KILN_EW_SQRT: return sqrtf(x);
    case KILN_EW_EXP: return expf(x);
    case KILN_EW_LOG: return logf(x);
    case KILN_EW_SIN: return sinf(x);
    case KILN_EW_COS: return cosf(x);
    case KILN_EW_TAN: return tanf(x);
    case KILN_EW_ASIN: return asinf(x);
    case KILN_EW_ACOS: return acosf(x);
    case KILN_EW_ATAN: return atanf(x);
    case KILN_EW_SINH: return sinhf(x);
    case KILN_EW_COSH: return coshf(x);
    case KILN_EW_ASINH: return asinhf(x);
    case KILN_EW_ACOSH: return acoshf(x);
    case KILN_EW_ATANH: return atanhf(x);
    case KILN_EW_ERF: return erff(x);
    case KILN_EW_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case KILN_EW_TANH: return tanhf(x);
    case KILN_EW_LEAKY_RELU: return x < 0.0f ? p.alpha * x : x;
    case KILN_EW_ELU: return x < 0.0f ? p.alpha * expm1f(x) : x;
    case KILN_EW_SELU: return p.gamma * (x <= 0.0f ? p.alpha * expm1f(x) : x);
    case KILN_EW_CELU: return x > 0.0f ? x : p.alpha * expm1f(x / p.alpha);
    case KILN_EW_HARD_SIGMOID: return ew_clamp01(p.alpha * x + p.beta);
    case KILN_EW_HARD_SWISH: return x * ew_clamp01(x / 6.0f + 0.5f);
    case KILN_EW_SOFTPLUS: return ew_softplus(x);
    case KILN_EW_SOFTSIGN: return x / (1.0f + fabsf(x));
    case KILN_EW_THRESHOLDED_RELU: return x > p.alpha ? x : 0.0f;
    case KILN_EW_SHRINK: return x < -p.alpha ? x + p.beta : x > p.alpha ? x - p.beta : 0.0f;
    case KILN_EW_GELU:
        if (p.flags & 1) return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
        return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case KILN_EW_MISH: return x * tanhf(ew_softplus(x));
    case KILN_EW_SWISH: return x / (1.0f + expf(-p.alpha * x));
    case KILN_EW_CLIP: return isnan(x) ? x : fminf(fmaxf(x, p.lo), p.hi);
    case KILN_EW_DIV_CONST: return x / p.alpha;
    default: return x;
    }
}

/* Integer unary ops, wrapping like the reference (negating the minimum gives itself). */
template <int OP, typename T> __device__ __forceinline__ T un_i(T x, const kiln_gpu_ew_params &p)
{
    typedef typename std::make_unsigned<T>::type U;
    if constexpr (OP == KILN_EW_ABS) return x < 0 ? (T)((U)0 - (U)x) : x;
    else if constexpr (OP == KILN_EW_NEG) return (T)((U)0 - (U)x);
    else if constexpr (OP == KILN_EW_SIGN) return (T)((x > 0) - (x < 0));
    else if constexpr (OP == KILN_EW_RELU) return x < 0 ? (T)0 : x;
    else if constexpr (OP == KILN_EW_CLIP) {
        int64_t v = (int64_t)x;
        v = v < p.ilo ? p.ilo : v; /* then the upper bound: min > max gives max, as np.clip */
        return (T)(v > p.ihi ? p.ihi : v);
    } else return x;
}

template <int OP, typename T, typename TY> __device__ __forceinline__ TY un_apply(T x, const kiln_gpu_ew_params &p)
{
    if constexpr (OP == KILN_EW_ISNAN) {
        return (TY)(isnan(kiln_to_f<T>(x)) ? 1 : 0);
    } else if constexpr (OP == KILN_EW_ISINF) {
        float v = kiln_to_f<T>(x);
        bool hit = isinf(v) && (v > 0.0f ? (p.flags & 1) != 0 : (p.flags & 2) != 0);
        return (TY)(hit ? 1 : 0);
    } else if constexpr (OP == KILN_EW_NOT) {
        return (TY)(x ? 0 : 1);
    } else if constexpr (ew_is_float<T>::value) {
        return kiln_from_f<TY>(un_f<OP>(kiln_to_f<T>(x), p));
    } else {
        return un_i<OP, T>(x, p);
    }
}

/* Y[i] = op(X[i]); vec: X and Y are aligned for ew_pack (the last n % 4 go one by one). */
template <int OP, typename T, typename TY>
__global__ void ew_unary_kernel(const T *x, TY *y, int64_t n, kiln_gpu_ew_params p, bool vec)
{
    if (vec) {
        int64_t nv = n / 4;
        const ew_pack<T> *xv = (const ew_pack<T> *)x;
        ew_pack<TY> *yv = (ew_pack<TY> *)y;
        KILN_GRID_LOOP(i, nv) {
            ew_pack<T> a = xv[i];
            ew_pack<TY> r;
#pragma unroll
            for (int k = 0; k < 4; k++) r.v[k] = un_apply<OP, T, TY>(a.v[k], p);
            yv[i] = r;
        }
        KILN_GRID_LOOP(j, n - nv * 4) y[nv * 4 + j] = un_apply<OP, T, TY>(x[nv * 4 + j], p);
    } else {
        KILN_GRID_LOOP(i, n) y[i] = un_apply<OP, T, TY>(x[i], p);
    }
}

template <int OP, typename T, typename TY>
gpuError_t un_go(const void *x, void *y, int64_t n, const kiln_gpu_ew_params &p, gpuStream_t s)
{
    bool vec = ew_aligned(x, sizeof(ew_pack<T>)) && ew_aligned(y, sizeof(ew_pack<TY>));
    int64_t work = vec ? (n + 3) / 4 : n;
    ew_unary_kernel<OP, T, TY><<<kiln_gpu_blocks(work, EW_THREADS), EW_THREADS, 0, s>>>((const T *)x, (TY *)y, n, p, vec);
    return gpuGetLastError();
}

#define EW_UNARY_FLOAT_OPS(X)                                                                 \
    X(ABS) X(NEG) X(SIGN) X(RELU) X(RECIPROCAL) X(FLOOR) X(CEIL) X(ROUND) X(SQRT) X(EXP)        \
    X(LOG) X(SIN) X(COS) X(TAN) X(ASIN) X(ACOS) X(ATAN) X(SINH) X(COSH) X(ASINH) X(ACOSH)       \
    X(ATANH) X(ERF) X(SIGMOID) X(TANH) X(LEAKY_RELU) X(ELU) X(SELU) X(CELU) X(HARD_SIGMOID)    \
    X(HARD_SWISH) X(SOFTPLUS) X(SOFTSIGN) X(THRESHOLDED_RELU) X(SHRINK) X(GELU) X(MISH)         \
    X(SWISH) X(CLIP) X(DIV_CONST)
#define EW_UNARY_INT_OPS(X) X(ABS) X(NEG) X(SIGN) X(RELU) X(CLIP)

template <typename T>
gpuError_t un_float(int op, const void *x, void *y, int64_t n, const kiln_gpu_ew_params &p, gpuStream_t s)
{
#define EW_CASE(o) \
    case KILN_EW_##o: return un_go<KILN_EW_##o, T, T>(x, y, n, p, s);
    switch (op) {
        EW_UNARY_FLOAT_OPS(EW_CASE)
    case KILN_EW_ISNAN: return un_go<KILN_EW_ISNAN, T, ew_bool>(x, y, n, p, s);
    case KILN_EW_ISINF: return un_go<KILN_EW_ISINF, T, ew_bool>(x, y, n, p, s);
    default: return EW_BAD_ARGS;
    }
#undef EW_CASE
}

template <typename T>
gpuError_t un_int(int op, const void *x, void *y, int64_t n, const kiln_gpu_ew_params &p, gpuStream_t s)
{
#define EW_CASE(o) \
    case KILN_EW_##o: return un_go<KILN_EW_##o, T, T>(x, y, n, p, s);
    switch (op) {
        EW_UNARY_INT_OPS(EW_CASE)
    default: return EW_BAD_ARGS;
    }
#undef EW_CASE
}

/* ======================================================================================
 * Binary ops
 * ====================================================================================== */

/* numpy's floating mod: the result takes the sign of the divisor. */
__device__ __forceinline__ float ew_py_mod(float a, float b)
{
    float m = fmodf(a, b);
    if (b == 0.0f || isnan(m)) return m;
    if (m == 0.0f) return copysignf(0.0f, b);
    if ((b < 0.0f) != (m < 0.0f)) m += b;
    return m;
}

template <int OP> __device__ __forceinline__ float bin_f(float a, float b)
{
    switch (OP) {
    case KILN_EW_ADD: return a + b;
    case KILN_EW_SUB: return a - b;
    case KILN_EW_MUL: return a * b;
    case KILN_EW_DIV: return a / b;
    case KILN_EW_MOD: return ew_py_mod(a, b);
    case KILN_EW_FMOD: return fmodf(a, b);
    case KILN_EW_POW: return powf(a, b);
    case KILN_EW_MAX: return isnan(a) || isnan(b) ? a + b : fmaxf(a, b); /* NaN propagates */
    case KILN_EW_MIN: return isnan(a) || isnan(b) ? a + b : fminf(a, b);
    case KILN_EW_PRELU: return a < 0.0f ? a * b : a;
    case KILN_EW_EQ: return a == b ? 1.0f : 0.0f;
    case KILN_EW_LT: return a < b ? 1.0f : 0.0f;
    case KILN_EW_LE: return a <= b ? 1.0f : 0.0f;
    case KILN_EW_GT: return a > b ? 1.0f : 0.0f;
    case KILN_EW_GE: return a >= b ? 1.0f : 0.0f;
    default: return 0.0f;
    }
}

/* Integer binary ops of T's width: wrapping arithmetic, division truncating toward zero,
 * division or mod by 0 giving 0 (and by -1 the wrapped negation, resp. 0). */
template <int OP, typename T> __device__ __forceinline__ T bin_i(T a, T b)
{
    typedef typename std::make_unsigned<T>::type U;
    U ua = (U)a, ub = (U)b;
    if constexpr (OP == KILN_EW_ADD) return (T)(U)(ua + ub);
    else if constexpr (OP == KILN_EW_SUB) return (T)(U)(ua - ub);
    else if constexpr (OP == KILN_EW_MUL) return (T)(U)(ua * ub);
    else if constexpr (OP == KILN_EW_DIV) return b == 0 ? (T)0 : b == (T)-1 ? (T)(U)((U)0 - ua) : (T)(a / b);
    else if constexpr (OP == KILN_EW_FMOD) return b == 0 || b == (T)-1 ? (T)0 : (T)(a % b);
    else if constexpr (OP == KILN_EW_MOD) {
        if (b == 0 || b == (T)-1) return (T)0;
        T m = a % b;
        return m != 0 && (m < 0) != (b < 0) ? (T)(m + b) : m;
    } else if constexpr (OP == KILN_EW_POW) {
        if (b >= 0) {
            U r = 1, base = ua;
            for (U e = ub; e; e >>= 1, base = (U)(base * base))
                if (e & 1) r = (U)(r * base);
            return (T)r;
        }
        return a == 1 ? (T)1 : a == (T)-1 ? ((b & 1) ? (T)-1 : (T)1) : (T)0;
    } else if constexpr (OP == KILN_EW_MAX) return a > b ? a : b;
    else if constexpr (OP == KILN_EW_MIN) return a < b ? a : b;
    else if constexpr (OP == KILN_EW_PRELU) return a < 0 ? (T)(U)(ua * ub) : a;
    else if constexpr (OP == KILN_EW_EQ) return (T)(a == b);
    else if constexpr (OP == KILN_EW_LT) return (T)(a < b);
    else if constexpr (OP == KILN_EW_LE) return (T)(a <= b);
    else if constexpr (OP == KILN_EW_GT) return (T)(a > b);
    else if constexpr (OP == KILN_EW_GE) return (T)(a >= b);
    else if constexpr (OP == KILN_EW_AND) return (T)(a & b);
    else if constexpr (OP == KILN_EW_OR) return (T)(a | b);
    else if constexpr (OP == KILN_EW_XOR) return (T)(a ^ b);
    else return (T)0;
}

template <int OP, typename TA, typename TB, typename TY> __device__ __forceinline__ TY bin_apply(TA a, TB b)
{
    if constexpr (ew_is_float<TA>::value || ew_is_float<TB>::value) {
        float r = bin_f<OP>(kiln_to_f<TA>(a), kiln_to_f<TB>(b));
        if constexpr (std::is_same<TY, ew_bool>::value) return (TY)(r != 0.0f ? 1 : 0);
        else return kiln_from_f<TY>(r);
    } else {
        return (TY)bin_i<OP, TA>(a, (TA)b);
    }
}

/* How an operand's element index follows from the flat output index i. */
enum { EW_IDX_FULL, EW_IDX_BLOCK, EW_IDX_STRIDED };

struct ew_operand {
    int kind;
    int64_t inner, mid; /* EW_IDX_BLOCK: index (i / inner) % mid */
    kiln_gpu_shape s;   /* EW_IDX_STRIDED: the operand's dims and strides */
};

ew_operand ew_classify(const kiln_gpu_shape &s)
{
    ew_operand o;
    o.kind = EW_IDX_STRIDED;
    o.inner = 1;
    o.mid = 1;
    o.s = s;
    int64_t st = 1, inner = 1;
    bool contiguous = true;
    int nonzero = 0, at = -1;
    for (int k = s.rank - 1; k >= 0; k--) {
        if (s.dims[k] != 1) {
            if (s.strides[k] != st) contiguous = false;
            if (s.strides[k] != 0) {
                nonzero++;
                at = k;
                o.inner = inner;
            }
        }
        st *= s.dims[k];
        inner *= s.dims[k];
    }
    if (contiguous) o.kind = EW_IDX_FULL;
    else if (nonzero == 0) o.kind = EW_IDX_BLOCK; /* a scalar: inner = mid = 1 */
    else if (nonzero == 1 && s.strides[at] == 1) {
        o.kind = EW_IDX_BLOCK;
        o.mid = s.dims[at];
    }
    if (o.kind != EW_IDX_BLOCK) o.inner = 1;
    return o;
}

bool ew_is_scalar(const ew_operand &o) { return o.kind == EW_IDX_BLOCK && o.mid == 1; }

/* Offset of the element at flat index i under s, in 32-bit arithmetic (every offset < 2^32). */
__device__ __forceinline__ uint32_t ew_offset32(const kiln_gpu_shape &s, uint32_t i)
{
    uint32_t off = 0;
#pragma unroll
    for (int k = KILN_GPU_MAX_RANK - 1; k >= 0; k--) {
        if (k >= s.rank) continue;
        uint32_t d = (uint32_t)s.dims[k], q = i / d;
        off += (i - q * d) * (uint32_t)s.strides[k];
        i = q;
    }
    return off;
}

__device__ __forceinline__ int64_t ew_offset64(const kiln_gpu_shape &s, int64_t i)
{
    int64_t off = 0;
#pragma unroll
    for (int k = KILN_GPU_MAX_RANK - 1; k >= 0; k--) {
        if (k >= s.rank) continue;
        int64_t d = s.dims[k], q = i / d;
        off += (i - q * d) * s.strides[k];
        i = q;
    }
    return off;
}

/* small: the iteration space has fewer than 2^32 elements, so 32-bit division serves. */
__device__ __forceinline__ int64_t ew_index(const ew_operand &o, int64_t i, bool small)
{
    if (o.kind == EW_IDX_FULL) return i;
    if (o.kind == EW_IDX_BLOCK) {
        if (small) return (int64_t)(((uint32_t)i / (uint32_t)o.inner) % (uint32_t)o.mid);
        return i / o.inner % o.mid;
    }
    return small ? (int64_t)ew_offset32(o.s, (uint32_t)i) : ew_offset64(o.s, i);
}

template <int OP, typename TA, typename TB, typename TY>
__global__ void ew_binary_kernel(const TA *a, ew_operand oa, const TB *b, ew_operand ob, TY *y, int64_t n, bool small)
{
    KILN_GRID_LOOP(i, n) y[i] = bin_apply<OP, TA, TB, TY>(a[ew_index(oa, i, small)], b[ew_index(ob, i, small)]);
}

/* Both operands contiguous or scalar (a_scalar / b_scalar); vec: the non-scalar pointers and
 * y are aligned for ew_pack. */
template <int OP, typename TA, typename TB, typename TY>
__global__ void ew_binary_flat_kernel(const TA *a, bool a_scalar, const TB *b, bool b_scalar, TY *y, int64_t n,
                                      bool vec)
{
    TA a0 = a_scalar ? a[0] : TA();
    TB b0 = b_scalar ? b[0] : TB();
    if (vec) {
        int64_t nv = n / 4;
        KILN_GRID_LOOP(i, nv) {
            ew_pack<TA> va;
            ew_pack<TB> vb;
            ew_pack<TY> r;
            if (a_scalar) {
#pragma unroll
                for (int k = 0; k < 4; k++) va.v[k] = a0;
            } else {
                va = ((const ew_pack<TA> *)a)[i];
            }
            if (b_scalar) {
#pragma unroll
                for (int k = 0; k < 4; k++) vb.v[k] = b0;
            } else {
                vb = ((const ew_pack<TB> *)b)[i];
            }
#pragma unroll
            for (int k = 0; k < 4; k++) r.v[k] = bin_apply<OP, TA, TB, TY>(va.v[k], vb.v[k]);
            ((ew_pack<TY> *)y)[i] = r;
        }
        KILN_GRID_LOOP(j, n - nv * 4) {
            int64_t i = nv * 4 + j;
            y[i] = bin_apply<OP, TA, TB, TY>(a_scalar ? a0 : a[i], b_scalar ? b0 : b[i]);
        }
    } else {
        KILN_GRID_LOOP(i, n) y[i] = bin_apply<OP, TA, TB, TY>(a_scalar ? a0 : a[i], b_scalar ? b0 : b[i]);
    }
}

/* One operand contiguous, the other a row of `mid` values repeated along the output (a bias
 * over the last axis: BLOCK with inner 1), mid a multiple of 4 and the pointers aligned: four
 * elements per access and one modulo per four (the general kernel's division per element had
 * bert-base's bias Adds at a third of the copy bandwidth). row_first: A is the row. */
template <int OP, typename TA, typename TB, typename TY>
__global__ void ew_binary_row_kernel(const TA *a, const TB *b, TY *y, int64_t n, uint32_t mid, bool row_first)
{
    int64_t nv = n / 4;
    KILN_GRID_LOOP(i, nv) {
        uint32_t r = (uint32_t)((i * 4) % mid);
        ew_pack<TA> va;
        ew_pack<TB> vb;
        ew_pack<TY> out;
        if (row_first) va = *(const ew_pack<TA> *)(a + r), vb = ((const ew_pack<TB> *)b)[i];
        else va = ((const ew_pack<TA> *)a)[i], vb = *(const ew_pack<TB> *)(b + r);
#pragma unroll
        for (int k = 0; k < 4; k++) out.v[k] = bin_apply<OP, TA, TB, TY>(va.v[k], vb.v[k]);
        ((ew_pack<TY> *)y)[i] = out;
    }
}

/* The arguments every binary launch carries. */
struct ew_bin_args {
    const void *a, *b;
    ew_operand oa, ob;
    void *y;
    int64_t n;
    gpuStream_t s;
};

template <int OP, typename TA, typename TB, typename TY> gpuError_t bin_go(const ew_bin_args &g)
{
    bool a_flat = g.oa.kind == EW_IDX_FULL || ew_is_scalar(g.oa), b_flat = g.ob.kind == EW_IDX_FULL || ew_is_scalar(g.ob);
    if (a_flat && b_flat) {
        bool as = g.oa.kind != EW_IDX_FULL, bs = g.ob.kind != EW_IDX_FULL;
        bool vec = (as || ew_aligned(g.a, sizeof(ew_pack<TA>))) && (bs || ew_aligned(g.b, sizeof(ew_pack<TB>))) &&
                   ew_aligned(g.y, sizeof(ew_pack<TY>));
        int64_t work = vec ? (g.n + 3) / 4 : g.n;
        ew_binary_flat_kernel<OP, TA, TB, TY><<<kiln_gpu_blocks(work, EW_THREADS), EW_THREADS, 0, g.s>>>(
            (const TA *)g.a, as, (const TB *)g.b, bs, (TY *)g.y, g.n, vec);
    } else if (((g.oa.kind == EW_IDX_FULL && g.ob.kind == EW_IDX_BLOCK && g.ob.inner == 1) ||
                (g.ob.kind == EW_IDX_FULL && g.oa.kind == EW_IDX_BLOCK && g.oa.inner == 1)) &&
               (g.oa.kind == EW_IDX_FULL ? g.ob.mid : g.oa.mid) % 4 == 0 &&
               (g.oa.kind == EW_IDX_FULL ? g.ob.mid : g.oa.mid) <= (int64_t)UINT32_MAX &&
               ew_aligned(g.a, sizeof(ew_pack<TA>)) && ew_aligned(g.b, sizeof(ew_pack<TB>)) &&
               ew_aligned(g.y, sizeof(ew_pack<TY>))) {
        bool row_first = g.oa.kind != EW_IDX_FULL;
        uint32_t mid = (uint32_t)(row_first ? g.oa.mid : g.ob.mid); /* n is a multiple of mid, so of 4 */
        ew_binary_row_kernel<OP, TA, TB, TY><<<kiln_gpu_blocks(g.n / 4, EW_THREADS), EW_THREADS, 0, g.s>>>(
            (const TA *)g.a, (const TB *)g.b, (TY *)g.y, g.n, mid, row_first);
    } else {
        bool small = g.n <= (int64_t)UINT32_MAX;
        ew_binary_kernel<OP, TA, TB, TY><<<kiln_gpu_blocks(g.n, EW_THREADS), EW_THREADS, 0, g.s>>>(
            (const TA *)g.a, g.oa, (const TB *)g.b, g.ob, (TY *)g.y, g.n, small);
    }
    return gpuGetLastError();
}

#define EW_ARITH_OPS(X) X(ADD) X(SUB) X(MUL) X(DIV) X(MOD) X(FMOD) X(POW) X(MAX) X(MIN) X(PRELU)
#define EW_CMP_OPS(X) X(EQ) X(LT) X(LE) X(GT) X(GE)
#define EW_LOGIC_OPS(X) X(AND) X(OR) X(XOR)

/* A and B both of type T (bool: comparisons and logic only). */
template <typename T> gpuError_t bin_same(int op, const ew_bin_args &g)
{
#define EW_ARITH(o) \
    case KILN_EW_##o: return bin_go<KILN_EW_##o, T, T, T>(g);
#define EW_CMP(o) \
    case KILN_EW_##o: return bin_go<KILN_EW_##o, T, T, ew_bool>(g);
    if constexpr (std::is_same<T, ew_bool>::value) {
        switch (op) {
            EW_CMP_OPS(EW_CMP)
            EW_LOGIC_OPS(EW_ARITH)
        default: return EW_BAD_ARGS;
        }
    } else {
        switch (op) {
            EW_ARITH_OPS(EW_ARITH)
            EW_CMP_OPS(EW_CMP)
        default: return EW_BAD_ARGS;
        }
    }
#undef EW_ARITH
#undef EW_CMP
}

/* Pow with a floating base TA and an exponent of another dtype. */
template <typename TA> gpuError_t pow_mixed(kiln_dtype tb, const ew_bin_args &g)
{
    switch (tb) {
    case KILN_DTYPE_FLOAT32: return bin_go<KILN_EW_POW, TA, float, TA>(g);
    case KILN_DTYPE_FLOAT16: return bin_go<KILN_EW_POW, TA, kiln_gpu_half, TA>(g);
    case KILN_DTYPE_BFLOAT16: return bin_go<KILN_EW_POW, TA, kiln_gpu_bf16, TA>(g);
    case KILN_DTYPE_INT32: return bin_go<KILN_EW_POW, TA, int32_t, TA>(g);
    case KILN_DTYPE_INT64: return bin_go<KILN_EW_POW, TA, int64_t, TA>(g);
    default: return EW_BAD_ARGS;
    }
}

/* ======================================================================================
 * Where
 * ====================================================================================== */

template <typename T>
__global__ void ew_where_kernel(const ew_bool *c, ew_operand oc, const T *x, ew_operand ox, const T *y,
                                ew_operand oy, T *out, int64_t n, bool small)
{
    KILN_GRID_LOOP(i, n) out[i] = c[ew_index(oc, i, small)] ? x[ew_index(ox, i, small)] : y[ew_index(oy, i, small)];
}

template <typename T>
gpuError_t where_go(const void *c, const ew_operand &oc, const void *x, const ew_operand &ox, const void *y,
                    const ew_operand &oy, void *out, int64_t n, gpuStream_t s)
{
    bool small = n <= (int64_t)UINT32_MAX;
    ew_where_kernel<T><<<kiln_gpu_blocks(n, EW_THREADS), EW_THREADS, 0, s>>>((const ew_bool *)c, oc, (const T *)x, ox,
                                                                          (const T *)y, oy, (T *)out, n, small);
    return gpuGetLastError();
}

/* ======================================================================================
 * Cast
 * ====================================================================================== */

template <kiln_dtype DT> struct ew_ctype;
template <> struct ew_ctype<KILN_DTYPE_FLOAT32> { typedef float type; };
template <> struct ew_ctype<KILN_DTYPE_FLOAT16> { typedef kiln_gpu_half type; };
template <> struct ew_ctype<KILN_DTYPE_BFLOAT16> { typedef kiln_gpu_bf16 type; };
template <> struct ew_ctype<KILN_DTYPE_FLOAT64> { typedef double type; };
template <> struct ew_ctype<KILN_DTYPE_INT32> { typedef int32_t type; };
template <> struct ew_ctype<KILN_DTYPE_INT64> { typedef int64_t type; };
template <> struct ew_ctype<KILN_DTYPE_INT8> { typedef int8_t type; };
template <> struct ew_ctype<KILN_DTYPE_UINT8> { typedef uint8_t type; };
template <> struct ew_ctype<KILN_DTYPE_BOOL> { typedef ew_bool type; };

constexpr bool ew_dt_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_FLOAT32 || dt == KILN_DTYPE_FLOAT16 || dt == KILN_DTYPE_BFLOAT16 ||
           dt == KILN_DTYPE_FLOAT64;
}

/* The reference's float-to-int64: NaN gives 0, out of range saturates, else truncation. */
__device__ __forceinline__ int64_t ew_f64_to_i64_sat(double v)
{
    if (isnan(v)) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

template <kiln_dtype F> __device__ __forceinline__ double ew_load_f64(typename ew_ctype<F>::type x)
{
    if constexpr (F == KILN_DTYPE_FLOAT16 || F == KILN_DTYPE_BFLOAT16) return (double)kiln_to_f(x);
    else return (double)x;
}

/* The reference stores a double into float16/bfloat16 through float32. */
template <kiln_dtype T> __device__ __forceinline__ typename ew_ctype<T>::type ew_store_float(double v)
{
    if constexpr (T == KILN_DTYPE_FLOAT64) return v;
    else return kiln_from_f<typename ew_ctype<T>::type>((float)v);
}

template <kiln_dtype F, kiln_dtype T>
__device__ __forceinline__ typename ew_ctype<T>::type cast_val(typename ew_ctype<F>::type x)
{
    typedef typename ew_ctype<T>::type D;
    if constexpr (!ew_dt_float(F) && !ew_dt_float(T)) { /* exact through int64, then wrap */
        int64_t v = (int64_t)x;
        if constexpr (T == KILN_DTYPE_BOOL) return (D)(v != 0 ? 1 : 0);
        else return (D)v;
    } else if constexpr (!ew_dt_float(F)) {
        return ew_store_float<T>((double)(int64_t)x);
    } else {
        double v = ew_load_f64<F>(x);
        if constexpr (T == KILN_DTYPE_BOOL) return (D)(v != 0.0 ? 1 : 0);
        else if constexpr (!ew_dt_float(T)) return (D)ew_f64_to_i64_sat(v);
        else return ew_store_float<T>(v);
    }
}

template <kiln_dtype F, kiln_dtype T>
__global__ void ew_cast_kernel(const typename ew_ctype<F>::type *x, typename ew_ctype<T>::type *y, int64_t n)
{
    KILN_GRID_LOOP(i, n) y[i] = cast_val<F, T>(x[i]);
}

template <kiln_dtype F, kiln_dtype T> gpuError_t cast_go(const void *x, void *y, int64_t n, gpuStream_t s)
{
    ew_cast_kernel<F, T><<<kiln_gpu_blocks(n, EW_THREADS), EW_THREADS, 0, s>>>(
        (const typename ew_ctype<F>::type *)x, (typename ew_ctype<T>::type *)y, n);
    return gpuGetLastError();
}

#define EW_CAST_TYPES(X) X(FLOAT32) X(FLOAT16) X(BFLOAT16) X(FLOAT64) X(INT32) X(INT64) X(INT8) X(UINT8) X(BOOL)

template <kiln_dtype F> gpuError_t cast_from(kiln_dtype to, const void *x, void *y, int64_t n, gpuStream_t s)
{
#define EW_CASE(t) \
    case KILN_DTYPE_##t: return cast_go<F, KILN_DTYPE_##t>(x, y, n, s);
    switch (to) {
        EW_CAST_TYPES(EW_CASE)
    default: return EW_BAD_ARGS;
    }
#undef EW_CASE
}

} /* namespace */

/* ======================================================================================
 * Launchers
 * ====================================================================================== */

extern "C" gpuError_t kiln_gpu_ew_unary_launch(kiln_gpu_ew_unary op, kiln_dtype dt, const void *X, void *Y, int64_t n,
                                               kiln_gpu_ew_params p, gpuStream_t s)
{
    if (n <= 0) return gpuSuccess;
    switch (dt) {
    case KILN_DTYPE_FLOAT32: return un_float<float>(op, X, Y, n, p, s);
    case KILN_DTYPE_FLOAT16: return un_float<kiln_gpu_half>(op, X, Y, n, p, s);
    case KILN_DTYPE_BFLOAT16: return un_float<kiln_gpu_bf16>(op, X, Y, n, p, s);
    case KILN_DTYPE_INT32: return un_int<int32_t>(op, X, Y, n, p, s);
    case KILN_DTYPE_INT64: return un_int<int64_t>(op, X, Y, n, p, s);
    case KILN_DTYPE_BOOL:
        if (op == KILN_EW_NOT) return un_go<KILN_EW_NOT, ew_bool, ew_bool>(X, Y, n, p, s);
        return EW_BAD_ARGS;
    default: return EW_BAD_ARGS;
    }
}

static int64_t ew_numel(const kiln_gpu_shape &s)
{
    int64_t n = 1;
    for (int k = 0; k < s.rank; k++) n *= s.dims[k];
    return n;
}

extern "C" gpuError_t kiln_gpu_ew_binary_launch(kiln_gpu_ew_binary op, kiln_dtype ta, kiln_dtype tb, const void *A,
                                                kiln_gpu_shape sa, const void *B, kiln_gpu_shape sb, void *Y,
                                                gpuStream_t s)
{
    ew_bin_args g;
    g.a = A;
    g.b = B;
    g.y = Y;
    g.s = s;
    g.n = ew_numel(sa);
    if (g.n <= 0) return gpuSuccess;
    g.oa = ew_classify(sa);
    g.ob = ew_classify(sb);
    if (ta != tb) {
        if (op != KILN_EW_POW) return EW_BAD_ARGS;
        switch (ta) {
        case KILN_DTYPE_FLOAT32: return pow_mixed<float>(tb, g);
        case KILN_DTYPE_FLOAT16: return pow_mixed<kiln_gpu_half>(tb, g);
        case KILN_DTYPE_BFLOAT16: return pow_mixed<kiln_gpu_bf16>(tb, g);
        default: return EW_BAD_ARGS;
        }
    }
    switch (ta) {
    case KILN_DTYPE_FLOAT32: return bin_same<float>(op, g);
    case KILN_DTYPE_FLOAT16: return bin_same<kiln_gpu_half>(op, g);
    case KILN_DTYPE_BFLOAT16: return bin_same<kiln_gpu_bf16>(op, g);
    case KILN_DTYPE_INT32: return bin_same<int32_t>(op, g);
    case KILN_DTYPE_INT64: return bin_same<int64_t>(op, g);
    case KILN_DTYPE_BOOL: return bin_same<ew_bool>(op, g);
    default: return EW_BAD_ARGS;
    }
}

extern "C" gpuError_t kiln_gpu_ew_where_launch(size_t elem_size, const void *cond, kiln_gpu_shape sc, const void *X,
                                               kiln_gpu_shape sx, const void *Y, kiln_gpu_shape sy, void *Out,
                                               gpuStream_t s)
{
    int64_t n = ew_numel(sc);
    if (n <= 0) return gpuSuccess;
    ew_operand oc = ew_classify(sc), ox = ew_classify(sx), oy = ew_classify(sy);
    switch (elem_size) {
    case 1: return where_go<uint8_t>(cond, oc, X, ox, Y, oy, Out, n, s);
    case 2: return where_go<uint16_t>(cond, oc, X, ox, Y, oy, Out, n, s);
    case 4: return where_go<uint32_t>(cond, oc, X, ox, Y, oy, Out, n, s);
    case 8: return where_go<uint64_t>(cond, oc, X, ox, Y, oy, Out, n, s);
    default: return EW_BAD_ARGS;
    }
}

extern "C" gpuError_t kiln_gpu_ew_cast_launch(kiln_dtype from, kiln_dtype to, const void *X, void *Y, int64_t n,
                                              gpuStream_t s)
{
    if (n <= 0) return gpuSuccess;
#define EW_CASE(t) \
    case KILN_DTYPE_##t: return cast_from<KILN_DTYPE_##t>(to, X, Y, n, s);
    switch (from) {
        EW_CAST_TYPES(EW_CASE)
    default: return EW_BAD_ARGS;
    }
#undef EW_CASE
}

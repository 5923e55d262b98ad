/* k_reduce.cu - the reduce family's GPU kernels: reductions over axis sets, ArgMax/ArgMin,
 * Softmax/LogSoftmax, row normalizations, BatchNormalization (inference) and CumSum. Rows
 * reduce with one warp (short rows) or one block (long rows) each, combining through warp
 * shuffles and shared memory; reductions along a strided axis give each thread a column so
 * that neighbouring threads read neighbouring elements. */
#include <math.h>
#include <type_traits>

#include "gpu/k_reduce.h"
#include "gpu/kcommon.cuh"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#define BLOCK 256

/* Rows at least this long get a whole block each, shorter ones a warp. */
#define BLOCK_ROW_MIN 1024

/* ---- element access ---- */


template <typename T> struct is_int_t {
    static const bool value = std::is_same<T, int32_t>::value || std::is_same<T, int64_t>::value;
};

/* Accumulator: float for floating dtypes, int64 (wrapping through uint64) for integers. */
template <typename T> struct acc_of { typedef float type; };
template <> struct acc_of<int32_t> { typedef long long type; };
template <> struct acc_of<int64_t> { typedef long long type; };

template <typename T> __device__ __forceinline__ typename acc_of<T>::type load_acc(const T *p, int64_t i)
{
    if constexpr (is_int_t<T>::value) return (long long)p[i];
    else return kiln_to_f<T>(p[i]);
}

template <typename T> __device__ __forceinline__ T store_acc(typename acc_of<T>::type v)
{
    if constexpr (is_int_t<T>::value) return (T)v;
    else return kiln_from_f<T>(v);
}

/* Lowest and highest values of T (the identities of max and min). */
template <typename T> __device__ __forceinline__ typename acc_of<T>::type lowest_of()
{
    if constexpr (std::is_same<T, int32_t>::value) return (long long)INT32_MIN;
    else if constexpr (std::is_same<T, int64_t>::value) return (long long)INT64_MIN;
    else return -INFINITY;
}

template <typename T> __device__ __forceinline__ typename acc_of<T>::type highest_of()
{
    if constexpr (std::is_same<T, int32_t>::value) return (long long)INT32_MAX;
    else if constexpr (std::is_same<T, int64_t>::value) return (long long)INT64_MAX;
    else return INFINITY;
}

/* A floating parameter of any floating dtype, as float. */
__device__ __forceinline__ float load_param(kiln_dtype dt, const void *p, int64_t i)
{
    if (dt == KILN_DTYPE_FLOAT16) return kiln_to_f<kiln_gpu_half>(((const kiln_gpu_half *)p)[i]);
    if (dt == KILN_DTYPE_BFLOAT16) return kiln_to_f<kiln_gpu_bf16>(((const kiln_gpu_bf16 *)p)[i]);
    return ((const float *)p)[i];
}

/* ---- group reductions: TPO threads (32: a warp, BLOCK: the block) cooperate on one row ---- */

/* Combines a and b under op (a functor: A operator()(A, A)). */
template <typename A, typename Op> __device__ __forceinline__ A warp_all(A v, Op op)
{
    for (int d = 16; d > 0; d >>= 1) v = op(v, __shfl_xor_sync(KILN_FULL_MASK, v, d));
    return v;
}

/* The combination of v over the TPO threads of a group; every thread gets it. With
 * TPO == BLOCK every thread of the block must call it. */
template <int TPO, typename A, typename Op> __device__ __forceinline__ A group_all(A v, Op op)
{
    v = warp_all(v, op);
    if constexpr (TPO == 32) {
        return v;
    } else {
        __shared__ A part[BLOCK / 32];
        int w = threadIdx.x / 32, lane = threadIdx.x % 32;
        if (lane == 0) part[w] = v;
        __syncthreads();
        v = part[0];
        for (int k = 1; k < BLOCK / 32; k++) v = op(v, part[k]);
        __syncthreads(); /* part is reused by the next call */
        return v;
    }
}

struct op_add_f { __device__ float operator()(float a, float b) const { return a + b; } };
/* max and min that propagate NaN, as the reference's `v > a || isnan(v)` */
struct op_max_f {
    __device__ float operator()(float a, float b) const { return (a != a || a > b) ? a : (b != b ? b : (a > b ? a : b)); }
};
struct op_min_f {
    __device__ float operator()(float a, float b) const { return (a != a || a < b) ? a : (b != b ? b : (a < b ? a : b)); }
};

/* ---- Reduce* ---- */

/* One reduction kind on accumulator A: identity, per-element step, combination, result. */
template <typename T> struct rk {
    typedef typename acc_of<T>::type A;
    int kind;
    A mx; /* LOGSUMEXP: the maximum, subtracted before exp */

    __device__ A init() const
    {
        switch (kind) {
        case KILN_GPU_RK_PROD: return (A)1;
        case KILN_GPU_RK_MAX: return lowest_of<T>();
        case KILN_GPU_RK_MIN: return highest_of<T>();
        default: return (A)0;
        }
    }
    __device__ A pre(A v) const
    {
        if constexpr (is_int_t<T>::value) {
            if (kind == KILN_GPU_RK_L1) return v < 0 ? (A)(0ull - (unsigned long long)v) : v;
            if (kind == KILN_GPU_RK_SUMSQ) return (A)((unsigned long long)v * (unsigned long long)v);
            return v;
        } else {
            switch (kind) {
            case KILN_GPU_RK_L1: return fabsf(v);
            case KILN_GPU_RK_L2: case KILN_GPU_RK_SUMSQ: return v * v;
            case KILN_GPU_RK_LOGSUMEXP: return expf(v - mx);
            default: return v;
            }
        }
    }
    __device__ A operator()(A a, A b) const
    {
        if constexpr (is_int_t<T>::value) {
            switch (kind) {
            case KILN_GPU_RK_PROD: return (A)((unsigned long long)a * (unsigned long long)b);
            case KILN_GPU_RK_MAX: return a > b ? a : b;
            case KILN_GPU_RK_MIN: return a < b ? a : b;
            default: return (A)((unsigned long long)a + (unsigned long long)b);
            }
        } else {
            switch (kind) {
            case KILN_GPU_RK_PROD: return a * b;
            case KILN_GPU_RK_MAX: return op_max_f()(a, b);
            case KILN_GPU_RK_MIN: return op_min_f()(a, b);
            default: return a + b;
            }
        }
    }
    __device__ A fin(A a, int64_t count) const
    {
        if constexpr (is_int_t<T>::value) {
            return kind == KILN_GPU_RK_MEAN && count > 0 ? a / (long long)count : a;
        } else {
            switch (kind) {
            case KILN_GPU_RK_MEAN: return a / (float)count;
            case KILN_GPU_RK_L2: return sqrtf(a);
            case KILN_GPU_RK_LOGSUM: return logf(a);
            case KILN_GPU_RK_LOGSUMEXP: return isinf(mx) ? mx : mx + logf(a);
            default: return a;
            }
        }
    }
};

/* NaN-ignoring maximum for LOGSUMEXP's shift (the reference's `v > mx`). */
struct op_max_shift {
    __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

/* Input offset of reduced element r: red is usually one merged dim. */
__device__ __forceinline__ int64_t red_offset(const kiln_gpu_shape &red, int64_t r)
{
    return red.rank == 1 ? r * red.strides[0] : kiln_strided_offset(red, r);
}

template <typename T, int TPO>
__global__ void reduce_rows_kernel(int kind, const T *x, T *y, int64_t n_out, kiln_gpu_shape keep,
                                   kiln_gpu_shape red, int64_t count)
{
    typedef typename acc_of<T>::type A;
    const int per_block = BLOCK / TPO;
    const int lane = threadIdx.x % TPO;
    rk<T> op{kind, (A)0};
    /* o is uniform over the group, so group_all is reached by all of its threads */
    for (int64_t o = (int64_t)blockIdx.x * per_block + threadIdx.x / TPO; o < n_out;
         o += (int64_t)gridDim.x * per_block) {
        int64_t base = kiln_strided_offset(keep, o);
        if constexpr (!is_int_t<T>::value) {
            if (kind == KILN_GPU_RK_LOGSUMEXP) {
                float m = -INFINITY;
                for (int64_t r = lane; r < count; r += TPO) m = op_max_shift()(m, load_acc(x, base + red_offset(red, r)));
                op.mx = group_all<TPO>(m, op_max_shift());
            }
        }
        A a = op.init();
        if (red.rank == 1) {
            const T *xb = x + base;
            int64_t rs = red.strides[0];
            for (int64_t r = lane; r < count; r += TPO) a = op(a, op.pre(load_acc(xb, r * rs)));
        } else {
            for (int64_t r = lane; r < count; r += TPO) a = op(a, op.pre(load_acc(x, base + kiln_strided_offset(red, r))));
        }
        a = group_all<TPO>(a, op);
        if (lane == 0) y[o] = store_acc<T>(op.fin(a, count));
    }
}

/* x [outer, n, inner]: blocks of RX columns by RY threads that split n. */
template <typename T, int RY>
__global__ void reduce_cols_kernel(int kind, const T *x, T *y, int64_t outer, int64_t n, int64_t inner)
{
    typedef typename acc_of<T>::type A;
    const int RX = BLOCK / RY;
    __shared__ A part[RY][RX];
    const int tx = threadIdx.x % RX, ty = threadIdx.x / RX;
    int64_t tiles_i = (inner + RX - 1) / RX, tiles = outer * tiles_i;
    rk<T> op{kind, (A)0};
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        int64_t o = t / tiles_i, i = (t % tiles_i) * RX + tx;
        bool ok = i < inner;
        const T *xo = x + o * n * inner + i;
        if constexpr (!is_int_t<T>::value) {
            if (kind == KILN_GPU_RK_LOGSUMEXP) {
                float m = -INFINITY;
                if (ok)
                    for (int64_t r = ty; r < n; r += RY) m = op_max_shift()(m, load_acc(xo, r * inner));
                if (RY > 1) {
                    part[ty][tx] = m;
                    __syncthreads();
                    m = part[0][tx];
                    for (int k = 1; k < RY; k++) m = op_max_shift()(m, part[k][tx]);
                    __syncthreads();
                }
                op.mx = m;
            }
        }
        A a = op.init();
        if (ok) {
#pragma unroll 4
            for (int64_t r = ty; r < n; r += RY) a = op(a, op.pre(load_acc(xo, r * inner)));
        }
        if (RY > 1) {
            part[ty][tx] = a;
            __syncthreads();
            a = part[0][tx];
            for (int k = 1; k < RY; k++) a = op(a, part[k][tx]);
            __syncthreads();
        }
        if (ok && ty == 0) y[o * inner + i] = store_acc<T>(op.fin(a, n));
    }
}

template <typename T>
static void reduce_rows_t(gpuStream_t s, int kind, const void *x, void *y, int64_t n_out, kiln_gpu_shape keep,
                          kiln_gpu_shape red, int64_t count)
{
    if (count >= BLOCK_ROW_MIN || (n_out < 256 && count >= 128))
        reduce_rows_kernel<T, BLOCK><<<kiln_gpu_blocks(n_out, 1), BLOCK, 0, s>>>(kind, (const T *)x, (T *)y, n_out,
                                                                                  keep, red, count);
    else
        reduce_rows_kernel<T, 32><<<kiln_gpu_blocks(n_out, BLOCK / 32), BLOCK, 0, s>>>(
            kind, (const T *)x, (T *)y, n_out, keep, red, count);
}

template <typename T>
static void reduce_cols_t(gpuStream_t s, int kind, const void *x, void *y, int64_t outer, int64_t n,
                          int64_t inner)
{
    if (n >= 64 && outer * ((inner + 31) / 32) < 1024) {
        /* few columns: 8-wide tiles (32-byte sectors of float) and 32 threads along n */
        const int RX = BLOCK / 32;
        reduce_cols_kernel<T, 32><<<kiln_gpu_blocks(outer * ((inner + RX - 1) / RX), 1), BLOCK, 0, s>>>(
            kind, (const T *)x, (T *)y, outer, n, inner);
    } else if (n >= 16) {
        const int RX = BLOCK / 8;
        reduce_cols_kernel<T, 8><<<kiln_gpu_blocks(outer * ((inner + RX - 1) / RX), 1), BLOCK, 0, s>>>(
            kind, (const T *)x, (T *)y, outer, n, inner);
    } else {
        reduce_cols_kernel<T, 1><<<kiln_gpu_blocks(outer * ((inner + BLOCK - 1) / BLOCK), 1), BLOCK, 0, s>>>(
            kind, (const T *)x, (T *)y, outer, n, inner);
    }
}

/* Calls F<T>(args...) for the floating dtype dt; DISPATCH_FI also takes int32 and int64. */
#define DISPATCH_CASES_F(F, ...)                                                           \
    case KILN_DTYPE_FLOAT32: F<float>(__VA_ARGS__); break;                                 \
    case KILN_DTYPE_FLOAT16: F<kiln_gpu_half>(__VA_ARGS__); break;                         \
    case KILN_DTYPE_BFLOAT16: F<kiln_gpu_bf16>(__VA_ARGS__); break;
#define DISPATCH_F(dt, F, ...)                                                             \
    do {                                                                                   \
        switch (dt) {                                                                      \
        DISPATCH_CASES_F(F, __VA_ARGS__)                                                   \
        default: return kiln_gpu_bad_arg();                                                       \
        }                                                                                  \
    } while (0)
#define DISPATCH_FI(dt, F, ...)                                                            \
    do {                                                                                   \
        switch (dt) {                                                                      \
        DISPATCH_CASES_F(F, __VA_ARGS__)                                                   \
        case KILN_DTYPE_INT32: F<int32_t>(__VA_ARGS__); break;                             \
        case KILN_DTYPE_INT64: F<int64_t>(__VA_ARGS__); break;                             \
        default: return kiln_gpu_bad_arg();                                                       \
        }                                                                                  \
    } while (0)

extern "C" gpuError_t kiln_gpu_reduce_rows(gpuStream_t s, int kind, kiln_dtype dt, const void *x, void *y,
                                           int64_t n_out, kiln_gpu_shape keep, kiln_gpu_shape red, int64_t count)
{
    if (n_out <= 0) return gpuSuccess;
    DISPATCH_FI(dt, reduce_rows_t, s, kind, x, y, n_out, keep, red, count);
    return gpuGetLastError();
}

extern "C" gpuError_t kiln_gpu_reduce_cols(gpuStream_t s, int kind, kiln_dtype dt, const void *x, void *y,
                                           int64_t outer, int64_t n, int64_t inner)
{
    if (outer <= 0 || inner <= 0) return gpuSuccess;
    DISPATCH_FI(dt, reduce_cols_t, s, kind, x, y, outer, n, inner);
    return gpuGetLastError();
}

/* ---- ArgMax, ArgMin ---- */

/* A candidate: its value as a key (float or int64) and its index (-1: none yet). */
template <typename K> struct cand {
    K v;
    long long i;
};

/* Whether a is greater than b, with NaN the greatest (kiln_index_cmp); 0 when equal. */
template <typename K> __device__ __forceinline__ int key_cmp(K a, K b)
{
    if constexpr (std::is_same<K, float>::value) {
        bool na = a != a, nb = b != b;
        if (na || nb) return nb ? (na ? 0 : -1) : 1;
    }
    return (a > b) - (a < b);
}

template <typename K> struct arg_better {
    int sign;
    bool last;
    __device__ cand<K> operator()(cand<K> a, cand<K> b) const
    {
        if (a.i < 0) return b;
        if (b.i < 0) return a;
        int c = sign * key_cmp(b.v, a.v);
        if (c > 0 || (c == 0 && (last ? b.i > a.i : b.i < a.i))) return b;
        return a;
    }
};

template <typename K, int TPO, typename Op> __device__ __forceinline__ cand<K> arg_group(cand<K> c, Op op)
{
    for (int d = 16; d > 0; d >>= 1) {
        cand<K> o;
        o.v = __shfl_xor_sync(KILN_FULL_MASK, c.v, d);
        o.i = __shfl_xor_sync(KILN_FULL_MASK, c.i, d);
        c = op(c, o);
    }
    if constexpr (TPO == 32) {
        return c;
    } else {
        __shared__ K pv[BLOCK / 32];
        __shared__ long long pi[BLOCK / 32];
        int w = threadIdx.x / 32;
        if (threadIdx.x % 32 == 0) pv[w] = c.v, pi[w] = c.i;
        __syncthreads();
        c.v = pv[0], c.i = pi[0];
        for (int k = 1; k < BLOCK / 32; k++) c = op(c, cand<K>{pv[k], pi[k]});
        __syncthreads();
        return c;
    }
}

template <typename T> struct key_of { typedef float type; };
template <> struct key_of<int32_t> { typedef long long type; };
template <> struct key_of<int64_t> { typedef long long type; };

/* inner == 1: TPO threads per row of n. */
template <typename T, int TPO>
__global__ void argext_rows_kernel(const T *x, int64_t *y, int64_t outer, int64_t n, int sign, bool last)
{
    typedef typename key_of<T>::type K;
    const int per_block = BLOCK / TPO, lane = threadIdx.x % TPO;
    arg_better<K> op{sign, last};
    for (int64_t o = (int64_t)blockIdx.x * per_block + threadIdx.x / TPO; o < outer;
         o += (int64_t)gridDim.x * per_block) {
        cand<K> c{(K)0, -1};
        for (int64_t j = lane; j < n; j += TPO) c = op(c, cand<K>{(K)load_acc(x, o * n + j), (long long)j});
        c = arg_group<K, TPO>(c, op);
        if (lane == 0) y[o] = c.i;
    }
}

/* inner > 1: one thread per column. */
template <typename T>
__global__ void argext_cols_kernel(const T *x, int64_t *y, int64_t outer, int64_t n, int64_t inner, int sign,
                                   bool last)
{
    typedef typename key_of<T>::type K;
    arg_better<K> op{sign, last};
    KILN_GRID_LOOP(t, outer * inner)
    {
        int64_t o = t / inner, i = t - o * inner;
        const T *xo = x + o * n * inner + i;
        cand<K> c{(K)0, -1};
        for (int64_t j = 0; j < n; j++) c = op(c, cand<K>{(K)load_acc(xo, j * inner), (long long)j});
        y[t] = c.i;
    }
}

template <typename T>
static void argext_t(gpuStream_t s, const void *x, int64_t *y, int64_t outer, int64_t n, int64_t inner, int sign,
                     bool last)
{
    const T *xt = (const T *)x;
    if (inner > 1)
        argext_cols_kernel<T><<<kiln_gpu_blocks(outer * inner, BLOCK), BLOCK, 0, s>>>(xt, y, outer, n, inner, sign,
                                                                                     last);
    else if (n >= BLOCK_ROW_MIN || (outer < 256 && n >= 128))
        argext_rows_kernel<T, BLOCK><<<kiln_gpu_blocks(outer, 1), BLOCK, 0, s>>>(xt, y, outer, n, sign, last);
    else
        argext_rows_kernel<T, 32><<<kiln_gpu_blocks(outer, BLOCK / 32), BLOCK, 0, s>>>(xt, y, outer, n, sign, last);
}

extern "C" gpuError_t kiln_gpu_argext(gpuStream_t s, kiln_dtype dt, const void *x, int64_t *y, int64_t outer,
                                      int64_t n, int64_t inner, int sign, bool select_last)
{
    if (outer <= 0 || inner <= 0 || n <= 0) return gpuSuccess;
    DISPATCH_FI(dt, argext_t, s, x, y, outer, n, inner, sign, select_last);
    return gpuGetLastError();
}

/* ---- Softmax, LogSoftmax ---- */

template <typename T, int TPO>
__global__ void softmax_rows_kernel(const T *x, T *y, int64_t outer, int64_t n, bool lg)
{
    const int per_block = BLOCK / TPO, lane = threadIdx.x % TPO;
    for (int64_t o = (int64_t)blockIdx.x * per_block + threadIdx.x / TPO; o < outer;
         o += (int64_t)gridDim.x * per_block) {
        const T *xr = x + o * n;
        T *yr = y + o * n;
        float m = -INFINITY, sum = 0.f;
        for (int64_t j = lane; j < n; j += TPO) m = op_max_shift()(m, kiln_to_f<T>(xr[j]));
        m = group_all<TPO>(m, op_max_shift());
        for (int64_t j = lane; j < n; j += TPO) sum += expf(kiln_to_f<T>(xr[j]) - m);
        sum = group_all<TPO>(sum, op_add_f());
        float ls = logf(sum), inv = 1.f / sum;
        for (int64_t j = lane; j < n; j += TPO) {
            float d = kiln_to_f<T>(xr[j]) - m;
            yr[j] = kiln_from_f<T>(lg ? d - ls : expf(d) * inv);
        }
    }
}

template <typename T>
__global__ void softmax_cols_kernel(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, bool lg)
{
    KILN_GRID_LOOP(t, outer * inner)
    {
        int64_t o = t / inner, i = t - o * inner, base = o * n * inner + i;
        float m = -INFINITY, sum = 0.f;
        for (int64_t j = 0; j < n; j++) m = op_max_shift()(m, kiln_to_f<T>(x[base + j * inner]));
        for (int64_t j = 0; j < n; j++) sum += expf(kiln_to_f<T>(x[base + j * inner]) - m);
        float ls = logf(sum), inv = 1.f / sum;
        for (int64_t j = 0; j < n; j++) {
            float d = kiln_to_f<T>(x[base + j * inner]) - m;
            y[base + j * inner] = kiln_from_f<T>(lg ? d - ls : expf(d) * inv);
        }
    }
}

/* Rows of n <= 32 R elements a warp each, held in registers: one read and one write of memory
 * and one exp per element (softmax_rows_kernel reads a row three times and takes exp twice);
 * the same arithmetic in the same order. */
template <typename T, int R>
__global__ void softmax_held_kernel(const T *x, T *y, int64_t outer, int n, bool lg)
{
    const int per_block = BLOCK / 32, lane = threadIdx.x % 32;
    for (int64_t o = (int64_t)blockIdx.x * per_block + threadIdx.x / 32; o < outer;
         o += (int64_t)gridDim.x * per_block) {
        const T *xr = x + o * n;
        T *yr = y + o * n;
        float v[R], m = -INFINITY, sum = 0.f;
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int j = lane + 32 * k;
            v[k] = j < n ? kiln_to_f<T>(xr[j]) : -INFINITY;
            m = op_max_shift()(m, v[k]);
        }
        m = group_all<32>(m, op_max_shift());
#pragma unroll
        for (int k = 0; k < R; k++) {
            const float d = v[k] - m, e = lane + 32 * k < n ? expf(d) : 0.f;
            sum += e;
            v[k] = lg ? d : e;
        }
        sum = group_all<32>(sum, op_add_f());
        const float ls = logf(sum), inv = 1.f / sum;
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int j = lane + 32 * k;
            if (j < n) yr[j] = kiln_from_f<T>(lg ? v[k] - ls : v[k] * inv);
        }
    }
}

/* Elements a lane holds for rows of n (0: more than the held kernels take). */
static int held_per_lane(int64_t n)
{
    return n <= 128 ? 4 : n <= 256 ? 8 : n <= 512 ? 16 : n <= 1024 ? 32 : 0;
}

template <typename T>
static void softmax_t(gpuStream_t s, const void *x, void *y, int64_t outer, int64_t n, int64_t inner, bool lg)
{
    const T *xt = (const T *)x;
    T *yt = (T *)y;
    unsigned warps = kiln_gpu_blocks(outer, BLOCK / 32);
    int held = held_per_lane(n);
#define HELD(R) softmax_held_kernel<T, R><<<warps, BLOCK, 0, s>>>(xt, yt, outer, (int)n, lg)
    if (inner > 1)
        softmax_cols_kernel<T><<<kiln_gpu_blocks(outer * inner, BLOCK), BLOCK, 0, s>>>(xt, yt, outer, n, inner, lg);
    else if (n >= BLOCK_ROW_MIN || (outer < 256 && n >= 128))
        softmax_rows_kernel<T, BLOCK><<<kiln_gpu_blocks(outer, 1), BLOCK, 0, s>>>(xt, yt, outer, n, lg);
    else if (held == 4) HELD(4);
    else if (held == 8) HELD(8);
    else if (held == 16) HELD(16);
    else if (held == 32) HELD(32);
    else
        softmax_rows_kernel<T, 32><<<warps, BLOCK, 0, s>>>(xt, yt, outer, n, lg);
#undef HELD
}

extern "C" gpuError_t kiln_gpu_softmax(gpuStream_t s, kiln_dtype dt, const void *x, void *y, int64_t outer,
                                       int64_t n, int64_t inner, bool log_softmax)
{
    if (outer <= 0 || inner <= 0 || n <= 0) return gpuSuccess;
    DISPATCH_F(dt, softmax_t, s, x, y, outer, n, inner, log_softmax);
    return gpuGetLastError();
}

/* ---- row normalizations ---- */

struct norm_params {
    const void *scale, *bias;
    int pmode;
    kiln_gpu_shape scale_s, bias_s;
    int64_t groups, cg, spatial; /* cg: channels per group */
};

/* Offsets of the scale (o[0]) and bias (o[1]) of element j of row r. */
__device__ __forceinline__ void norm_param_offsets(const norm_params &p, int64_t r, int64_t cols, int64_t j,
                                                   int64_t o[2])
{
    switch (p.pmode) {
    case KILN_GPU_NP_COL: o[0] = o[1] = j; break;
    case KILN_GPU_NP_STRIDED:
        o[0] = kiln_strided_offset(p.scale_s, r * cols + j);
        o[1] = kiln_strided_offset(p.bias_s, r * cols + j);
        break;
    case KILN_GPU_NP_CHANNEL: o[0] = o[1] = (r % p.groups) * p.cg + j / p.spatial; break;
    default: o[0] = o[1] = r % p.groups; break;
    }
}

/* CH: KILN_GPU_NP_CHANNEL with planes of at least TPO elements, written channel by channel.
 * P: the dtype of scale and bias, which may differ from X's T (exporters keep a float32 X with
 * float16 parameters, or the reverse); everything computes in float. */
template <typename T, typename P, int TPO, bool CH>
__global__ void norm_rows_kernel(const T *x, T *y, int64_t rows, int64_t cols, float eps, bool center,
                                 norm_params p, float *mean_out, float *inv_out)
{
    const int per_block = BLOCK / TPO, lane = threadIdx.x % TPO;
    const P *sc = (const P *)p.scale, *bs = (const P *)p.bias;
    for (int64_t r = (int64_t)blockIdx.x * per_block + threadIdx.x / TPO; r < rows;
         r += (int64_t)gridDim.x * per_block) {
        const T *xr = x + r * cols;
        T *yr = y + r * cols;
        float mean = 0.f, var = 0.f;
        if (center) {
            for (int64_t j = lane; j < cols; j += TPO) mean += kiln_to_f<T>(xr[j]);
            mean = group_all<TPO>(mean, op_add_f()) / (float)cols;
        }
        for (int64_t j = lane; j < cols; j += TPO) {
            float d = kiln_to_f<T>(xr[j]) - mean;
            var += d * d;
        }
        var = group_all<TPO>(var, op_add_f()) / (float)cols;
        float inv = 1.f / sqrtf(var + eps);
        if constexpr (CH) {
            /* no division per element */
            int64_t c0 = (r % p.groups) * p.cg;
            for (int64_t cl = 0; cl < p.cg; cl++) {
                float sv = kiln_to_f<P>(sc[c0 + cl]) * inv, bv = bs ? kiln_to_f<P>(bs[c0 + cl]) : 0.f;
                const T *xc = xr + cl * p.spatial;
                T *yc = yr + cl * p.spatial;
                for (int64_t q = lane; q < p.spatial; q += TPO)
                    yc[q] = kiln_from_f<T>((kiln_to_f<T>(xc[q]) - mean) * sv + bv);
            }
        } else {
            for (int64_t j = lane; j < cols; j += TPO) {
                int64_t o[2];
                norm_param_offsets(p, r, cols, j, o);
                float v = (kiln_to_f<T>(xr[j]) - mean) * inv * kiln_to_f<P>(sc[o[0]]);
                if (bs) v += kiln_to_f<P>(bs[o[1]]);
                yr[j] = kiln_from_f<T>(v);
            }
        }
        if (lane == 0) {
            if (mean_out) mean_out[r] = mean;
            if (inv_out) inv_out[r] = inv;
        }
    }
}

template <typename T, typename P, int TPO>
static void norm_rows_launch(gpuStream_t s, unsigned blocks, const void *x, void *y, int64_t rows, int64_t cols,
                             float eps, bool center, const norm_params &p, float *mean_out, float *inv_out)
{
    if (p.pmode == KILN_GPU_NP_CHANNEL && p.spatial >= TPO)
        norm_rows_kernel<T, P, TPO, true><<<blocks, BLOCK, 0, s>>>((const T *)x, (T *)y, rows, cols, eps, center,
                                                                   p, mean_out, inv_out);
    else
        norm_rows_kernel<T, P, TPO, false><<<blocks, BLOCK, 0, s>>>((const T *)x, (T *)y, rows, cols, eps, center,
                                                                    p, mean_out, inv_out);
}

/* norm_rows_kernel for KILN_GPU_NP_COL parameters and rows of cols <= 32 R elements, a warp a row
 * holding it in registers: one read and one write of memory a row (norm_rows_kernel reads it
 * three times and decodes the parameters' offsets per element); the same arithmetic in the same
 * order. */
template <typename T, typename P, int R>
__global__ void norm_held_kernel(const T *x, T *y, int64_t rows, int cols, float eps, bool center, const P *sc,
                                 const P *bs, float *mean_out, float *inv_out)
{
    const int per_block = BLOCK / 32, lane = threadIdx.x % 32;
    for (int64_t r = (int64_t)blockIdx.x * per_block + threadIdx.x / 32; r < rows;
         r += (int64_t)gridDim.x * per_block) {
        const T *xr = x + r * cols;
        T *yr = y + r * cols;
        float v[R], mean = 0.f, var = 0.f;
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int j = lane + 32 * k;
            v[k] = j < cols ? kiln_to_f<T>(xr[j]) : 0.f;
            mean += v[k];
        }
        mean = center ? group_all<32>(mean, op_add_f()) / (float)cols : 0.f;
#pragma unroll
        for (int k = 0; k < R; k++) {
            const float d = v[k] - mean;
            if (lane + 32 * k < cols) var += d * d;
        }
        var = group_all<32>(var, op_add_f()) / (float)cols;
        const float inv = 1.f / sqrtf(var + eps);
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int j = lane + 32 * k;
            if (j >= cols) continue;
            float o = (v[k] - mean) * inv * kiln_to_f<P>(sc[j]);
            if (bs) o += kiln_to_f<P>(bs[j]);
            yr[j] = kiln_from_f<T>(o);
        }
        if (lane == 0) {
            if (mean_out) mean_out[r] = mean;
            if (inv_out) inv_out[r] = inv;
        }
    }
}

template <typename T, typename P>
static void norm_rows_tp(gpuStream_t s, const void *x, void *y, int64_t rows, int64_t cols, float eps, bool center,
                         const norm_params &p, float *mean_out, float *inv_out)
{
    unsigned warps = kiln_gpu_blocks(rows, BLOCK / 32);
    int held = p.pmode == KILN_GPU_NP_COL ? held_per_lane(cols) : 0;
    const T *xt = (const T *)x;
    T *yt = (T *)y;
    const P *sc = (const P *)p.scale, *bs = (const P *)p.bias;
#define HELD(R) norm_held_kernel<T, P, R><<<warps, BLOCK, 0, s>>>(xt, yt, rows, (int)cols, eps, center, sc, bs, mean_out, inv_out)
    if (cols >= BLOCK_ROW_MIN || (rows < 256 && cols >= 128))
        norm_rows_launch<T, P, BLOCK>(s, kiln_gpu_blocks(rows, 1), x, y, rows, cols, eps, center, p, mean_out,
                                      inv_out);
    else if (held == 4) HELD(4);
    else if (held == 8) HELD(8);
    else if (held == 16) HELD(16);
    else if (held == 32) HELD(32);
    else
        norm_rows_launch<T, P, 32>(s, warps, x, y, rows, cols, eps, center, p, mean_out, inv_out);
#undef HELD
}

/* norm_rows_tp<T, P> for the parameters' floating dtype pdt; false for another dtype. */
template <typename T>
static bool norm_rows_t(kiln_dtype pdt, gpuStream_t s, const void *x, void *y, int64_t rows, int64_t cols, float eps,
                        bool center, const norm_params &p, float *mean_out, float *inv_out)
{
    switch (pdt) {
    case KILN_DTYPE_FLOAT32: norm_rows_tp<T, float>(s, x, y, rows, cols, eps, center, p, mean_out, inv_out); break;
    case KILN_DTYPE_FLOAT16:
        norm_rows_tp<T, kiln_gpu_half>(s, x, y, rows, cols, eps, center, p, mean_out, inv_out);
        break;
    case KILN_DTYPE_BFLOAT16:
        norm_rows_tp<T, kiln_gpu_bf16>(s, x, y, rows, cols, eps, center, p, mean_out, inv_out);
        break;
    default: return false;
    }
    return true;
}

extern "C" gpuError_t kiln_gpu_norm_rows(gpuStream_t s, kiln_dtype dt, kiln_dtype pdt, const void *x, void *y,
                                         int64_t rows, int64_t cols, float eps, bool center, const void *scale,
                                         const void *bias, int pmode, kiln_gpu_shape scale_s, kiln_gpu_shape bias_s,
                                         int64_t groups, int64_t C, int64_t spatial, float *mean_out, float *inv_out)
{
    if (rows <= 0) return gpuSuccess;
    norm_params p = {scale, bias, pmode, scale_s, bias_s, groups > 0 ? groups : 1,
                     groups > 0 ? C / groups : C, spatial > 0 ? spatial : 1};
    bool ok = true;
    switch (dt) {
    case KILN_DTYPE_FLOAT32: ok = norm_rows_t<float>(pdt, s, x, y, rows, cols, eps, center, p, mean_out, inv_out); break;
    case KILN_DTYPE_FLOAT16:
        ok = norm_rows_t<kiln_gpu_half>(pdt, s, x, y, rows, cols, eps, center, p, mean_out, inv_out);
        break;
    case KILN_DTYPE_BFLOAT16:
        ok = norm_rows_t<kiln_gpu_bf16>(pdt, s, x, y, rows, cols, eps, center, p, mean_out, inv_out);
        break;
    default: ok = false;
    }
    if (!ok) return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

/* ---- BatchNormalization (inference) ---- */

/* work[c] = mean, work[C + c] = scale / sqrt(var + eps), work[2C + c] = bias. */
__global__ void batchnorm_prep_kernel(int64_t C, float eps, const void *sc, const void *bs, const void *mn,
                                      const void *vr, kiln_dtype dsc, kiln_dtype dbs, kiln_dtype dmn, kiln_dtype dvr,
                                      float *work)
{
    KILN_GRID_LOOP(c, C)
    {
        work[c] = load_param(dmn, mn, c);
        work[C + c] = load_param(dsc, sc, c) / sqrtf(load_param(dvr, vr, c) + eps);
        work[2 * C + c] = load_param(dbs, bs, c);
    }
}

template <typename T>
__global__ void batchnorm_apply_kernel(const T *x, T *y, int64_t total, int64_t C, int64_t spatial,
                                       const float *work)
{
    KILN_GRID_LOOP(i, total)
    {
        int64_t c = (i / spatial) % C;
        y[i] = kiln_from_f<T>((kiln_to_f<T>(x[i]) - work[c]) * work[C + c] + work[2 * C + c]);
    }
}

/* Large planes: blocks walk the [n, c] planes along x (one division per plane) and split each
 * plane's spatial elements gridDim.y ways. */
template <typename T>
__global__ void batchnorm_plane_kernel(const T *x, T *y, int64_t planes, int64_t C, int64_t spatial,
                                       const float *work)
{
    for (int64_t pl = blockIdx.x; pl < planes; pl += gridDim.x) {
        int64_t c = pl % C;
        float m = work[c], a = work[C + c], b = work[2 * C + c];
        const T *xp = x + pl * spatial;
        T *yp = y + pl * spatial;
        for (int64_t q = (int64_t)blockIdx.y * BLOCK + threadIdx.x; q < spatial; q += (int64_t)gridDim.y * BLOCK)
            yp[q] = kiln_from_f<T>((kiln_to_f<T>(xp[q]) - m) * a + b);
    }
}

template <typename T>
static void batchnorm_t(gpuStream_t s, const void *x, void *y, int64_t total, int64_t C, int64_t spatial,
                        const float *work)
{
    if (spatial >= BLOCK) {
        int64_t planes = total / spatial, split = (spatial + BLOCK * 8 - 1) / (BLOCK * 8);
        dim3 grid(kiln_gpu_blocks(planes, 1), (unsigned)(split < 64 ? split : 64));
        batchnorm_plane_kernel<T><<<grid, BLOCK, 0, s>>>((const T *)x, (T *)y, planes, C, spatial, work);
    } else {
        batchnorm_apply_kernel<T><<<kiln_gpu_blocks(total, BLOCK), BLOCK, 0, s>>>((const T *)x, (T *)y, total, C,
                                                                                   spatial, work);
    }
}

extern "C" gpuError_t kiln_gpu_batchnorm(gpuStream_t s, kiln_dtype dt, const void *x, void *y, int64_t N,
                                         int64_t C, int64_t spatial, float eps, const void *const params[4],
                                         const kiln_dtype pdt[4], float *work)
{
    int64_t total = N * C * spatial;
    if (total <= 0) return gpuSuccess;
    batchnorm_prep_kernel<<<kiln_gpu_blocks(C, BLOCK), BLOCK, 0, s>>>(C, eps, params[0], params[1], params[2],
                                                                      params[3], pdt[0], pdt[1], pdt[2], pdt[3],
                                                                      work);
    DISPATCH_F(dt, batchnorm_t, s, x, y, total, C, spatial, work);
    return gpuGetLastError();
}

/* ---- CumSum ---- */

/* Accumulator of a running sum: float, or uint64 (wrapping) for integers. */
template <typename T> struct sum_of { typedef float type; };
template <> struct sum_of<int32_t> { typedef unsigned long long type; };
template <> struct sum_of<int64_t> { typedef unsigned long long type; };

template <typename T> __device__ __forceinline__ typename sum_of<T>::type load_sum(const T *p, int64_t i)
{
    if constexpr (is_int_t<T>::value) return (unsigned long long)(long long)p[i];
    else return kiln_to_f<T>(p[i]);
}

template <typename T> __device__ __forceinline__ T store_sum(typename sum_of<T>::type v)
{
    if constexpr (is_int_t<T>::value) return (T)(long long)v;
    else return kiln_from_f<T>(v);
}

/* inner == 1: a warp per row scans 32 elements at a time, carrying the running sum. */
template <typename T>
__global__ void cumsum_rows_kernel(const T *x, T *y, int64_t outer, int64_t n, bool excl, bool rev)
{
    typedef typename sum_of<T>::type S;
    const int per_block = BLOCK / 32, lane = threadIdx.x % 32;
    for (int64_t o = (int64_t)blockIdx.x * per_block + threadIdx.x / 32; o < outer;
         o += (int64_t)gridDim.x * per_block) {
        const T *xr = x + o * n;
        T *yr = y + o * n;
        S carry = (S)0;
        for (int64_t s0 = 0; s0 < n; s0 += 32) {
            int64_t sidx = s0 + lane, idx = rev ? n - 1 - sidx : sidx;
            bool ok = sidx < n;
            S v = ok ? load_sum(xr, idx) : (S)0, incl = v;
            for (int d = 1; d < 32; d <<= 1) {
                S u = __shfl_up_sync(KILN_FULL_MASK, incl, d);
                if (lane >= d) incl += u;
            }
            S before = __shfl_up_sync(KILN_FULL_MASK, incl, 1);
            if (lane == 0) before = (S)0;
            if (ok) yr[idx] = store_sum<T>(carry + (excl ? before : incl));
            carry += __shfl_sync(KILN_FULL_MASK, incl, 31);
        }
    }
}

/* inner == 1, long rows: a block per row, BLOCK * 4 elements a step; each thread sums 4
 * neighbours, the block scans those sums (warp scans, then the warps' totals). */
template <typename T>
__global__ void cumsum_block_kernel(const T *x, T *y, int64_t outer, int64_t n, bool excl, bool rev)
{
    typedef typename sum_of<T>::type S;
    __shared__ S wsum[BLOCK / 32];
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
        const T *xr = x + o * n;
        T *yr = y + o * n;
        S carry = (S)0;
        for (int64_t s0 = 0; s0 < n; s0 += BLOCK * 4) {
            S v[4], t = (S)0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int64_t sidx = s0 + threadIdx.x * 4 + k;
                v[k] = sidx < n ? load_sum(xr, rev ? n - 1 - sidx : sidx) : (S)0;
                t += v[k];
            }
            S incl = t;
            for (int d = 1; d < 32; d <<= 1) {
                S u = __shfl_up_sync(KILN_FULL_MASK, incl, d);
                if (lane >= d) incl += u;
            }
            S before = __shfl_up_sync(KILN_FULL_MASK, incl, 1);
            if (lane == 0) before = (S)0;
            if (lane == 31) wsum[w] = incl;
            __syncthreads();
            S wbefore = (S)0, total = (S)0;
            for (int k = 0; k < BLOCK / 32; k++) {
                if (k < w) wbefore += wsum[k];
                total += wsum[k];
            }
            __syncthreads(); /* wsum is rewritten by the next step */
            S run = carry + wbefore + before;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int64_t sidx = s0 + threadIdx.x * 4 + k;
                S prev = run;
                run += v[k];
                if (sidx < n) yr[rev ? n - 1 - sidx : sidx] = store_sum<T>(excl ? prev : run);
            }
            carry += total;
        }
    }
}

/* inner > 1: one thread per column, sequential along n. */
template <typename T>
__global__ void cumsum_cols_kernel(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, bool excl, bool rev)
{
    typedef typename sum_of<T>::type S;
    KILN_GRID_LOOP(t, outer * inner)
    {
        int64_t o = t / inner, i = t - o * inner, base = o * n * inner + i;
        S acc = (S)0;
        for (int64_t sidx = 0; sidx < n; sidx++) {
            int64_t idx = base + (rev ? n - 1 - sidx : sidx) * inner;
            S v = load_sum(x, idx), before = acc;
            acc += v;
            y[idx] = store_sum<T>(excl ? before : acc);
        }
    }
}

template <typename T>
static void cumsum_t(gpuStream_t s, const void *x, void *y, int64_t outer, int64_t n, int64_t inner, bool excl,
                     bool rev)
{
    if (inner > 1)
        cumsum_cols_kernel<T><<<kiln_gpu_blocks(outer * inner, BLOCK), BLOCK, 0, s>>>((const T *)x, (T *)y, outer, n,
                                                                                      inner, excl, rev);
    else if (n >= 1024)
        cumsum_block_kernel<T><<<kiln_gpu_blocks(outer, 1), BLOCK, 0, s>>>((const T *)x, (T *)y, outer, n, excl, rev);
    else
        cumsum_rows_kernel<T><<<kiln_gpu_blocks(outer, BLOCK / 32), BLOCK, 0, s>>>((const T *)x, (T *)y, outer, n,
                                                                                   excl, rev);
}

extern "C" gpuError_t kiln_gpu_cumsum(gpuStream_t s, kiln_dtype dt, const void *x, void *y, int64_t outer,
                                      int64_t n, int64_t inner, bool exclusive, bool reverse)
{
    if (outer <= 0 || inner <= 0 || n <= 0) return gpuSuccess;
    DISPATCH_FI(dt, cumsum_t, s, x, y, outer, n, inner, exclusive, reverse);
    return gpuGetLastError();
}
